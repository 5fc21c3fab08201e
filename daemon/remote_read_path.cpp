// Reading the remote tier: Lookup asks the cluster about the rest of a prefix, Load
// reads it into RAM slots, BeginTurn of an unknown session resumes it from its record
// (remote_path.h).
#include "daemon/remote_path.h"

#include <boost/asio/steady_timer.hpp>

#include <optional>

#include "common/log.h"
#include "daemon/session_journal.h"

namespace kvtier::daemon {

void RemotePath::fetch_remote(const std::vector<BlockKey>& keys,
                              std::function<void(size_t, const Status&)> done) {
  // The executor reads them into memory (MoveExecutor::copy_in), joining reads under way.
  ctx_.mover->copy_in(keys, std::move(done));
}

namespace {

// A reply that waits for the remote tier: the first of its answer and its deadline
// (remote-timeout) sends it.
struct RemoteWait {
  bool answered = false;
  std::unique_ptr<asio::steady_timer> deadline;
  bool take() {
    if (answered) return false;
    answered = true;
    if (deadline) deadline->cancel();
    return true;
  }
};

}  // namespace

void RemotePath::lookup_remote(const EngineContext& engine, std::vector<BlockHash> hashes,
                               std::vector<Tier> tiers, Found answer) {
  // Blocks being read from the cluster already (a BeginTurn's prefetch) need no question.
  while (tiers.size() < hashes.size() &&
         ctx_.mover->copying_in({engine.layout_key, hashes[tiers.size()]})) {
    tiers.push_back(Tier::kRemote);
  }
  // Not connected (the cluster is down or not reached yet): a miss at once, no wait.
  if (tiers.size() == hashes.size() || !remote_->worker->connected()) {
    answer(tiers);
    return;
  }
  std::vector<StorageTier::Slot> asked;
  for (size_t i = tiers.size(); i < hashes.size(); ++i) {
    asked.push_back({{engine.layout_key, hashes[i]}, 0, 0});
  }
  auto wait = std::make_shared<RemoteWait>();
  wait->deadline = std::make_unique<asio::steady_timer>(ctx_.io);
  wait->deadline->expires_after(std::chrono::milliseconds(ctx_.config.remote_timeout_ms));
  wait->deadline->async_wait([wait, answer, tiers](const boost::system::error_code& ec) {
    assert_control_thread();
    if (!ec && wait->take()) answer(tiers);  // what is held here
  });
  remote_->tier->probe(std::move(asked),
                       [this, wait, answer, tiers](std::vector<Result<bool>> found) mutable {
                         assert_control_thread();
                         if (!wait->take()) return;
                         for (Result<bool>& exists : found) {
                           if (!exists.is_ok() || !*exists) break;
                           tiers.push_back(Tier::kRemote);
                           ++remote_->lookup_hits;
                         }
                         answer(tiers);
                       });
}

// A session resumed from its remote record, growing by the record's blocks read from the
// cluster as they land: each once it and all before it are here, up to the first that is
// not, and only while it is still the session this record made (its last block the
// record's block before).
struct RemotePath::ResumedGrowth {
  policy::SessionKey key;
  std::vector<BlockKey> rest;       // the record's blocks after those held here
  size_t held = 0;                  // the record's blocks held here when it was resumed
  std::optional<BlockHash> before;  // the last of those (none when `held` is 0)
  std::vector<char> landed;
  size_t next = 0;
  size_t limit = 0;  // the first block that did not land (rest.size(): none yet)
};

void RemotePath::resume_from_remote(const ConnectionPtr& c, const EngineContext& engine,
                                    uint64_t id, const std::string& session_id,
                                    Resumed begin_turn) {
  if (!remote_->worker->connected()) {
    reply_error(c, id,
                not_found("unknown session '{}' (the remote tier is not connected)", session_id));
    return;
  }
  auto engine_ref = std::static_pointer_cast<EngineContext>(c->user_state);
  auto wait = std::make_shared<RemoteWait>();
  wait->deadline = std::make_unique<asio::steady_timer>(ctx_.io);
  wait->deadline->expires_after(std::chrono::milliseconds(ctx_.config.remote_timeout_ms));
  wait->deadline->async_wait([this, wait, c, id, session_id](const boost::system::error_code& ec) {
    assert_control_thread();
    if (ec || !wait->take()) return;
    reply_error(c, id,
                not_found("unknown session '{}' (the remote tier did not answer within {} ms)",
                          session_id, ctx_.config.remote_timeout_ms));
  });
  remote_->worker->get_session(
      engine.namespace_name, session_id,
      [this, wait, c, id, engine_ref, session_id, begin_turn](Result<std::string> value) {
        assert_control_thread();
        if (!wait->take()) return;
        resume_from_record(c, *engine_ref, id, session_id, begin_turn, std::move(value));
      });
}

void RemotePath::resume_from_record(const ConnectionPtr& c, const EngineContext& engine,
                                    uint64_t id, const std::string& session_id,
                                    const Resumed& begin_turn, Result<std::string> value) {
  // A Save may have created the session meanwhile: then it is simply known.
  if (policy::Session* known = ctx_.sessions.find(engine.namespace_id, session_id)) {
    begin_turn(*known, 0);
    return;
  }
  if (!value.is_ok()) {
    reply_error(c, id,
                not_found("unknown session '{}' (the remote tier: {})", session_id,
                          value.status().to_string()));
    return;
  }
  auto record = decode_session(encode_session_key(engine.namespace_name, session_id), *value);
  if (!record || record->namespace_name != engine.namespace_name ||
      record->session_id != session_id) {
    reply_error(c, id, data_loss("session '{}': its remote record is malformed", session_id));
    return;
  }
  if (record->layout_digest != engine.layout_key.layout_digest) {
    reply_error(c, id,
                not_found("unknown session '{}' (the remote tier has it for another KV "
                          "layout)",
                          session_id));
    return;
  }
  auto created = ctx_.sessions.get_or_create(engine.namespace_id, session_id, engine.layout_key);
  if (!created.is_ok()) {
    reply_error(c, id, created.status());
    return;
  }
  restore_resumed_session(engine, **created, *record, begin_turn);
}

void RemotePath::restore_resumed_session(const EngineContext& engine, policy::Session& session,
                                         const NvmeSessionRecord& record,
                                         const Resumed& begin_turn) {
  const std::string& session_id = record.session_id;  // the request's (resume_from_record)
  const LayoutKey layout = engine.layout_key;
  // The blocks held here already, then the rest read from the cluster: the session
  // grows by each block once it and all before it are here, and stops at the first
  // that is not.
  size_t held = 0;
  while (held < record.blocks.size() && ctx_.store->lookup({layout, record.blocks[held]})) {
    ++held;
  }
  std::vector<BlockHash> present(record.blocks.begin(),
                                 record.blocks.begin() + static_cast<std::ptrdiff_t>(held));
  ctx_.sessions.record_save(session, present, false);
  journal_.restore_from_record(session, record, now_ms(), wall_now_ms());
  ++remote_->resumed_sessions;
  auto growth = std::make_shared<ResumedGrowth>();
  for (size_t i = held; i < record.blocks.size(); ++i) {
    growth->rest.push_back({layout, record.blocks[i]});
  }
  const auto fetching = static_cast<uint32_t>(growth->rest.size());
  if (held == 0) remote_->synced[{engine.namespace_id, session_id}] = 0;
  journal_.note_session_changed(session);  // its NVMe record, when there is a tier
  growth->landed.assign(growth->rest.size(), 0);
  growth->limit = growth->rest.size();
  growth->key = {engine.namespace_id, session_id};
  growth->held = held;
  if (held != 0) growth->before = record.blocks[held - 1];
  // Before the turn is answered, so that the waits below see a live session.
  begin_turn(session, fetching);
  fetch_remote(growth->rest, [this, growth](size_t i, const Status& status) {
    assert_control_thread();
    grow_resumed_session(*growth, i, status);
  });
}

void RemotePath::grow_resumed_session(ResumedGrowth& growth, size_t i, const Status& status) {
  if (status.is_ok()) {
    growth.landed[i] = 1;
  } else {
    growth.limit = std::min(growth.limit, i);
  }
  policy::Session* session = ctx_.sessions.find(growth.key.namespace_id, growth.key.id);
  if (session == nullptr) return;
  while (growth.next < growth.limit && growth.landed[growth.next]) {
    const BlockKey& block = growth.rest[growth.next];
    const std::optional<BlockHash> last =
        growth.next == 0 ? growth.before
                         : std::optional<BlockHash>(growth.rest[growth.next - 1].hash);
    // Cut, closed and made again, or grown by a Save meanwhile: not this
    // record's session any more; and a block evicted again ends it here.
    if (session->blocks.size() != growth.held + growth.next ||
        (last.has_value() && (session->blocks.empty() || session->blocks.back() != *last)) ||
        !ctx_.store->lookup(block)) {
      growth.limit = growth.next;
      break;
    }
    // Appended without touching the session's state: a block landing after the
    // turn's end must not make it active again.
    ctx_.sessions.append_blocks(*session, {block.hash});
    // Read from the cluster: there already, nothing to write behind.
    auto synced = remote_->synced.find(growth.key);
    if (synced != remote_->synced.end() && growth.held == 0 && synced->second == growth.next) {
      ++synced->second;
    }
    ++growth.next;
  }
}

}  // namespace kvtier::daemon
