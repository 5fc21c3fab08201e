// The remote tier's write-behind: at the end of each turn a session's new blocks, then
// its record, are written to the cluster behind the turn, read in place from host
// memory, staged out of GPU memory or read out of NVMe (remote_path.h).
#include "daemon/remote_path.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>

#include "common/log.h"
#include "daemon/copies.h"
#include "daemon/save_path.h"
#include "daemon/session_journal.h"

namespace kvtier::daemon {

void RemotePath::write_behind(const policy::Session& session, bool sweeping) {
  if (!remote_) return;
  const policy::SessionKey key{session.namespace_id, session.id};
  uint32_t& synced = remote_->synced[key];
  if (synced > session.blocks.size()) synced = 0;  // defensive: cuts lower it (note_remote_cut)
  const std::string& ns = ctx_.engines.namespaces().name(session.namespace_id);
  const uint64_t block_bytes = ctx_.store->block_bytes(session.layout);
  auto batch = std::make_shared<WriteBehind>();
  batch->key = key;
  batch->namespace_name = ns;
  batch->from = synced;
  batch->block_bytes = block_bytes;
  CopyBatch staging_copy;  // blocks in GPU memory → staging slots
  staging_copy.priority = CopyPriority::kBackground;
  std::vector<StorageTier::ReadItem> nvme_reads;  // destinations filled in below
  StorageTier* nvme = ctx_.mover->tier(Tier::kNvme);
  // Blocks copied out first (GPU memory, NVMe) only while the cluster can take them:
  // otherwise the copy would be made for nothing (the sweep comes back).
  const bool connected = remote_->worker->connected();
  const uint64_t bound = ctx_.config.remote_max_in_flight_bytes;
  size_t next = synced;
  for (; next < session.blocks.size(); ++next) {
    // One batch stays within half the worker's in-flight bound (a larger one would be
    // declined every time, one as large would keep other writes out): the sweep, or the
    // batch's completion, sends the rest. A block larger than half goes alone.
    const uint64_t batch_bytes = (batch->writes.size() + 1) * block_bytes;
    if (batch_bytes > bound || (!batch->writes.empty() && batch_bytes > bound / 2)) break;
    const BlockKey block{session.layout, session.blocks[next]};
    auto info = ctx_.store->lookup(block);
    if (!info) break;
    const std::shared_ptr<Memory>& memory = ctx_.store->memory(info->location.tier);
    const bool in_place = memory != nullptr && memory->host_data() != nullptr;
    if (!in_place && !connected) break;
    if (memory == nullptr) {
      // On NVMe (demoted before it could be written): read out of NVMe first, into a
      // buffer; all batches' buffers together stay within the in-flight bound.
      if (info->location.tier != Tier::kNvme || nvme == nullptr) break;
      const uint64_t buffer = (nvme_reads.size() + 1) * block_bytes;
      if (*remote_->buffered_bytes + io_buffer_bytes(buffer) > bound) break;
    } else if (!in_place) {
      // GPU memory: copied into a staging slot first (none free: the sweep comes back).
      if (!remote_->staging_slots) break;
    }
    PinnedBlock pinned = ctx_.store->pin_in_background(block);
    if (!pinned) break;
    const size_t at = batch->writes.size();
    StagingSlot slot;
    const std::byte* bytes = nullptr;  // NVMe: set once the buffer exists
    if (memory == nullptr) {
      batch->from_nvme.push_back(at);
      nvme_reads.push_back({{block, pinned.location().offset, block_bytes}, nullptr});
    } else if (in_place) {
      bytes = memory->host_data() + pinned.location().offset;
    } else {
      auto allocated = remote_->staging_slots->allocate(block_bytes);
      if (!allocated.is_ok()) break;
      slot = StagingSlot(remote_->staging_slots, *allocated, block_bytes);
      staging_copy.segments.push_back({staging_copy.memory_index(memory),
                                       staging_copy.memory_index(remote_->staging),
                                       pinned.location().offset, slot.offset(), block_bytes});
      batch->staged.push_back(at);
      bytes = remote_->staging->host_data() + slot.offset();
    }
    batch->writes.push_back({{block, 0, block_bytes}, bytes, 0});
    batch->pins.push_back(std::move(pinned));
    batch->slots.push_back(std::move(slot));
  }
  batch->blocks = batch->writes.size();
  // What stays behind though it is held here: a gauge, per session, not a sum of turns.
  uint32_t deferred = 0;
  for (size_t i = next; i < session.blocks.size(); ++i) {
    if (ctx_.store->lookup({session.layout, session.blocks[i]})) ++deferred;
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

  if (batch->writes.empty()) {
    // A sweep that wrote nothing has nothing new to say (and must not keep renewing
    // the record's TTL while its blocks expire).
    if (!sweeping) {
      remote_->worker->put_session(
          ns, session.id, encode_session_value(to_record(session, ns, now_ms(), wall_now_ms())),
          [](Status) {});
    }
    return;
  }
  synced = static_cast<uint32_t>(next);  // handed over; lowered again if some fail

  batch->waiting = 1;  // this function's own: released by the call at its end
  if (!staging_copy.segments.empty()) {
    ++batch->waiting;
    // Segments are not merged: adjacent GPU offsets may lie in different parts of the
    // pool, and the Device merges what it can.
    Status submitted =
        ctx_.parts.copies->submit_copy(std::move(staging_copy), [this, batch](Status copied) {
          if (copied.is_ok()) {
            remote_->staged_blocks += batch->staged.size();
          } else {
            KVTIER_LOG_WARN("staging {} blocks out of GPU memory for the remote tier failed: {}",
                            batch->staged.size(), copied.to_string());
            batch->readable = std::min(batch->readable, batch->staged.front());
          }
          for (size_t i : batch->staged) batch->pins[i].reset();  // the bytes are staged (or lost)
          write_behind_staged(batch);
        });
    if (!submitted.is_ok()) {
      KVTIER_LOG_WARN("staging {} blocks out of GPU memory for the remote tier failed: {}",
                      batch->staged.size(), submitted.to_string());
      batch->readable = std::min(batch->readable, batch->staged.front());
      --batch->waiting;
    }
  }
  if (!nvme_reads.empty()) read_write_behind(batch, std::move(nvme_reads));
  write_behind_staged(batch);
}

void RemotePath::read_write_behind(const std::shared_ptr<WriteBehind>& batch,
                                   std::vector<StorageTier::ReadItem> reads) {
  const uint64_t block_bytes = batch->block_bytes;
  const uint64_t rounded = io_buffer_bytes(reads.size() * block_bytes);
  batch->nvme_buffer = allocate_io_buffer(rounded);
  if (batch->nvme_buffer == nullptr) {
    batch->readable = std::min(batch->readable, batch->from_nvme.front());
    return;
  }
  batch->buffered = CountedBytes(remote_->buffered_bytes, rounded);
  for (size_t j = 0; j < reads.size(); ++j) {
    std::byte* into = batch->nvme_buffer.get() + j * block_bytes;
    reads[j].destination = into;
    batch->writes[batch->from_nvme[j]].source = into;
  }
  // In jobs of the executor's size, so one session's backlog does not hold the NVMe
  // queue for long.
  StorageTier* nvme = ctx_.mover->tier(Tier::kNvme);
  for (size_t begin = 0; begin < reads.size(); begin += kBlocksPerBufferedRead) {
    const size_t end = std::min(reads.size(), begin + kBlocksPerBufferedRead);
    std::vector<StorageTier::ReadItem> job(reads.begin() + begin, reads.begin() + end);
    ++batch->waiting;
    auto guard = asio::make_work_guard(ctx_.io);
    nvme->read(std::move(job),
               [this, batch, begin, guard](std::vector<StorageTier::ReadOutcome> outcomes) mutable {
                 asio::post(ctx_.io, [this, batch, begin, guard = std::move(guard),
                                      outcomes = std::move(outcomes)] {
                   write_behind_read(batch, begin, outcomes);
                 });
               });
  }
}

void RemotePath::write_behind_read(const std::shared_ptr<WriteBehind>& batch, size_t begin,
                                   const std::vector<StorageTier::ReadOutcome>& outcomes) {
  std::vector<BlockKey> lost;  // bytes that did not verify
  for (size_t j = 0; j < outcomes.size(); ++j) {
    const size_t at = batch->from_nvme[begin + j];
    if (!outcomes[j].status.is_ok()) {
      batch->readable = std::min(batch->readable, at);
      if (outcomes[j].corrupt) lost.push_back(batch->pins[at].key());
      KVTIER_LOG_WARN("reading a block out of NVMe to write it behind failed: {}",
                      outcomes[j].status.to_string());
    }
    batch->pins[at].reset();  // the bytes are in the buffer (or lost)
  }
  // Bad bytes on NVMe: the block goes now (no pin of the batch holds it), as when any
  // read finds it so; nothing from it on is written.
  if (!lost.empty()) ctx_.mover->evict(lost, /*lost=*/true);
  write_behind_staged(batch);
  ctx_.parts.saves->resume_parked_saves();  // the pins are gone: their blocks may move or go
}

void RemotePath::write_behind_staged(const std::shared_ptr<WriteBehind>& batch) {
  if (--batch->waiting > 0) return;
  if (batch->readable < batch->writes.size()) {
    // Only the blocks before the first unreadable one are sent (the session's mark stops
    // there): the others are let go now.
    for (size_t i = batch->readable; i < batch->writes.size(); ++i) {
      batch->pins[i].reset();
      batch->slots[i].reset();
    }
    batch->writes.resize(batch->readable);
  }
  if (batch->writes.empty()) {
    fail_write_behind(*batch, 0, /*declined=*/false);
  } else {
    send_write_behind(batch);
  }
}

void RemotePath::send_write_behind(const std::shared_ptr<WriteBehind>& batch) {
  auto writes = std::move(batch->writes);
  const bool queued =
      remote_->tier->try_write(std::move(writes), [this, batch](std::vector<Status> statuses) {
        size_t ok = 0;
        while (ok < statuses.size() && statuses[ok].is_ok()) ++ok;
        remote_->written_blocks += ok;
        remote_->failed_blocks += statuses.size() - ok;
        if (ok < batch->blocks) {
          fail_write_behind(*batch, ok, /*declined=*/false);
        } else {
          release_write_behind(*batch);
        }
        ctx_.parts.saves
            ->resume_parked_saves();  // the batch's pins are gone: their blocks may move or go
        // The record after its blocks: a node that finds it finds them (or misses). As
        // the session is now, so that an older turn's record never lands after a newer
        // one; none once the session was closed.
        const policy::Session* live = ctx_.sessions.find(batch->key.namespace_id, batch->key.id);
        if (live == nullptr) return;
        remote_->worker->put_session(
            batch->namespace_name, batch->key.id,
            encode_session_value(to_record(*live, batch->namespace_name, now_ms(), wall_now_ms())),
            [](Status) {});
        // All written and more to go (the batch stopped at its bound): the next batch
        // now rather than at the next sweep.
        if (ok == batch->blocks && !ctx_.stopping && remote_->unsynced.contains(batch->key) &&
            live->state == policy::SessionState::kIdle) {
          write_behind(*live, /*sweeping=*/true);
        }
      });
  if (!queued) fail_write_behind(*batch, 0, /*declined=*/true);
}

void RemotePath::fail_write_behind(WriteBehind& batch, size_t written, bool declined) {
  if (declined) ++remote_->declined_writes;
  auto it = remote_->synced.find(batch.key);
  if (it != remote_->synced.end()) {
    // Written again from the first that was not, by the sweep.
    it->second = std::min<uint32_t>(it->second, batch.from + static_cast<uint32_t>(written));
    remote_->mark_unsynced(batch.key);
  }
  release_write_behind(batch);
}

void RemotePath::release_write_behind(WriteBehind& batch) {
  // The worker, the Device and the NVMe tier are done with the slots and the buffer.
  batch.pins.clear();
  batch.slots.clear();
  batch.nvme_buffer.reset();
  batch.buffered.reset();
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

void RemotePath::note_remote_cut(const policy::Session& session) {
  if (!remote_) return;
  auto it = remote_->synced.find({session.namespace_id, session.id});
  // Blocks from the cut on may come back as other blocks: written again from there.
  if (it != remote_->synced.end()) {
    it->second = std::min<uint32_t>(it->second, static_cast<uint32_t>(session.blocks.size()));
  }
}

void RemotePath::note_remote_closed(uint32_t namespace_id, const std::string& session_id) {
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
