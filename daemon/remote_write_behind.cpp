// The remote tier's write-behind: at the end of each turn a session's new blocks, then
// its record, are written to the cluster behind the turn. The executor copies the blocks
// out (MoveExecutor::copy_out); here is how far each session was written.
#include "daemon/remote_path.h"

#include <algorithm>

#include "daemon/session_journal.h"  // a session's record: to_record, encode_session_value

namespace kvtier::daemon {

void RemotePath::write_behind(const policy::Session& session, bool sweeping) {
  if (!remote_) return;
  const policy::SessionKey key{session.namespace_id, session.id};
  uint32_t& synced = remote_->synced[key];
  if (synced > session.blocks.size()) synced = 0;  // defensive: cuts lower it (session_cut)
  const std::string& ns = ctx_.engines.namespaces().name(session.namespace_id);
  const uint32_t from = synced;
  std::vector<BlockKey> keys;
  keys.reserve(session.blocks.size() - from);
  for (size_t i = from; i < session.blocks.size(); ++i)
    keys.push_back({session.layout, session.blocks[i]});
  // The executor copies them out (tiers/move_executor.h), as many as it can start now;
  // it answers later, never from inside copy_out.
  auto taken_by_batch = std::make_shared<size_t>(0);
  const size_t taken = ctx_.mover->copy_out(
      keys, [this, key, ns, from, taken_by_batch](MoveExecutor::CopyOutResult result) {
        assert_control_thread();
        on_written_behind(key, ns, from, *taken_by_batch, result);
      });
  *taken_by_batch = taken;
  // What stays behind though it is held here: a gauge, per session, not a sum of turns.
  uint32_t deferred = 0;
  for (size_t i = taken; i < keys.size(); ++i) {
    if (ctx_.store->lookup(keys[i])) ++deferred;
  }
  uint32_t& was = remote_->deferred[key];
  remote_->deferred_blocks = remote_->deferred_blocks - was + deferred;
  was = deferred;
  // Tried again by the sweep (a staging slot frees, the bound has room again).
  if (deferred > 0) {
    remote_->mark_unsynced(key);
  } else {
    remote_->unsynced.erase(key);
  }
  if (taken == 0) {
    // A sweep that wrote nothing has nothing new to say (and must not keep renewing
    // the record's TTL while its blocks expire).
    if (!sweeping) {
      remote_->worker->put_session(
          ns, session.id, encode_session_value(to_record(session, ns, now_ms(), wall_now_ms())),
          [](Status) {});
    }
    return;
  }
  synced = from + static_cast<uint32_t>(taken);  // handed over; lowered again if some fail
}

void RemotePath::on_written_behind(const policy::SessionKey& key, const std::string& ns,
                                   uint32_t from, size_t taken,
                                   MoveExecutor::CopyOutResult result) {
  if (!remote_) return;
  remote_->written_blocks += result.written;
  remote_->failed_blocks += result.sent - result.written;
  if (result.written < taken) {
    if (result.declined) ++remote_->declined_writes;
    auto it = remote_->synced.find(key);
    if (it != remote_->synced.end()) {
      // Written again from the first that was not, by the sweep.
      it->second = std::min<uint32_t>(it->second, from + static_cast<uint32_t>(result.written));
      remote_->mark_unsynced(key);
    }
  }
  if (result.sent == 0) return;  // declined, or none could be read: nothing new to say
  // The record after its blocks: a node that finds it finds them (or misses). As the
  // session is now, so that an older turn's record never lands after a newer one; none
  // once the session was closed.
  const policy::Session* live = ctx_.sessions.find(key.namespace_id, key.id);
  if (live == nullptr) return;
  remote_->worker->put_session(ns, key.id,
                               encode_session_value(to_record(*live, ns, now_ms(), wall_now_ms())),
                               [](Status) {});
  // All written and more to go (the batch stopped at its bound): the next batch now
  // rather than at the next sweep.
  if (result.written == taken && !ctx_.stopping && remote_->unsynced.contains(key) &&
      live->state == policy::SessionState::kIdle) {
    write_behind(*live, /*sweeping=*/true);
  }
}

void RemotePath::sweep_write_behind() {
  if (!remote_ || remote_->unsynced.empty()) return;
  const uint64_t now = now_ms();
  if (now - std::min(now, remote_->last_sweep_ms) < 1000) return;
  remote_->last_sweep_ms = now;
  constexpr size_t kPerSweep = 256;  // sessions; the rest wait for the next sweep, in turn
  std::vector<policy::SessionKey> keys;
  while (!remote_->unsynced_order.empty() && keys.size() < kPerSweep) {
    policy::SessionKey key = std::move(remote_->unsynced_order.front());
    remote_->unsynced_order.pop_front();
    if (remote_->unsynced.erase(key) == 0) continue;  // closed or written meanwhile
    keys.push_back(std::move(key));
  }
  for (const policy::SessionKey& key : keys) {
    const policy::Session* session = ctx_.sessions.find(key.namespace_id, key.id);
    if (session == nullptr) continue;
    // Mid-turn sessions are written at the end of their turn.
    if (session->state == policy::SessionState::kIdle) {
      write_behind(*session, /*sweeping=*/true);
    } else {
      remote_->mark_unsynced(key);
    }
  }
}

void RemotePath::session_cut(const policy::Session& session) {
  if (!remote_) return;
  auto it = remote_->synced.find({session.namespace_id, session.id});
  // Blocks from the cut on may come back as other blocks: written again from there.
  if (it != remote_->synced.end()) {
    it->second = std::min<uint32_t>(it->second, static_cast<uint32_t>(session.blocks.size()));
  }
}

void RemotePath::session_closed(uint32_t namespace_id, const std::string& session_id) {
  if (!remote_) return;
  // Closed for good: no node resumes it (a write-behind still queued for it writes its
  // blocks, and its completion finds the session gone and writes no record).
  remote_->worker->delete_session(ctx_.engines.namespaces().name(namespace_id), session_id,
                                  [](Status) {});
  const policy::SessionKey key{namespace_id, session_id};
  remote_->synced.erase(key);
  remote_->unsynced.erase(key);
  if (auto it = remote_->deferred.find(key); it != remote_->deferred.end()) {
    remote_->deferred_blocks -= it->second;
    remote_->deferred.erase(it);
  }
}

}  // namespace kvtier::daemon
