// SavePath: a Save from the request to its reply (save_path.h).
#include "daemon/save_path.h"

#include <algorithm>

#include "common/log.h"
#include "daemon/copies.h"
#include "daemon/placement.h"
#include "daemon/session_journal.h"

namespace kvtier::daemon {

// A Save in progress: its own copy, and the blocks it found being written by another
// Save (it may answer only once those landed: never "saved" for bytes not there yet).
struct SavePath::SaveInProgress {
  BlockListRequest request;
  std::vector<PendingWrite> writes;  // the blocks this Save writes
  // Blocks it found held: pinned until the reply, so that making room for its later
  // blocks never evicts them (nothing holds a closed session's prefix; the Save would
  // otherwise record blocks it had just dropped, a hole in its own prefix).
  std::vector<PinnedBlock> kept;
  uint32_t deduplicated = 0;
  bool cut = false;    // no room for all of it: the request keeps the prefix that fit
  size_t waiting = 0;  // its copy (if any) + blocks another Save is writing
  Status copy_status;
  std::optional<size_t> lost_duplicate;  // index of a block whose other writer failed
};

Status SavePath::handle_save(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                             BlockListRequest request) {
  if (!cut_sessions_.empty() && !request.hashes.empty()) {
    auto cut = cut_sessions_.find({engine.namespace_id, request.session_id});
    if (cut != cut_sessions_.end()) {
      if (request.hashes.front() == cut->second) {
        cut_sessions_.erase(cut);  // the prefix sent again from its start
      } else {
        ++ctx_.counters.partial_saves;
        ctx_.counters.blocks_not_saved += request.hashes.size();
        KVTIER_LOG_DEBUG("save of session '{}': {} blocks after a cut this turn, not kept",
                         request.session_id, request.hashes.size());
        if (!request.end_of_turn) {
          reply(c, id, [](wire::Response::Builder response) {
            auto out = response.initSave();
            out.setStored(0);
            out.setDeduplicated(0);
          });
          return Status::ok();
        }
        // The turn's last piece: nothing of it is kept, but the turn ends (the
        // session's idle clock, write-behind), as an empty Save would end it.
        cut_sessions_.erase(cut);
        request.hashes.clear();
        request.engine_block_ids.clear();
        request.block_retention.clear();
      }
    }
  }
  // Behind the Saves already waiting for room, so that none is overtaken for ever.
  if (parked_saves_.empty()) {
    // Without a wait, the first try is the last: the Save keeps what fits now.
    const bool last_try = ctx_.config.save_room_wait_ms == 0;
    auto started = start_save(c, engine, id, request, last_try);
    if (!started.is_ok() || *started) return started.status();
  }
  parked_saves_.push_back({c, id, std::move(request),
                           std::chrono::steady_clock::now() +
                               std::chrono::milliseconds(ctx_.config.save_room_wait_ms)});
  return Status::ok();
}

void SavePath::resume_parked_saves() {
  // Loads waiting for a slot to read an NVMe block into go first: they were there first
  // (a Save parks only once the Loads' reads hold what room there was).
  ctx_.mover->retry_room_waiters();
  if (resuming_saves_ || parked_saves_.empty()) return;
  resuming_saves_ = true;
  const auto now = std::chrono::steady_clock::now();
  while (!parked_saves_.empty()) {
    ParkedSave& parked = parked_saves_.front();
    auto engine = std::static_pointer_cast<EngineContext>(parked.connection->user_state);
    Status status;
    if (engine == nullptr) {
      // The engine left: nobody to answer.
    } else if (ctx_.stopping) {
      status = unavailable("kvtierd is stopping; the Save was not started").with_retryable(true);
    } else if (status = check_request_regions(*engine, parked.request.staging,
                                              parked.request.hashes.size());
               status.is_ok()) {
      // Its wait is over (save-room-wait-ms): it keeps the prefix that fits now, perhaps
      // none, and the engine has its memory back.
      const bool last_try = now >= parked.deadline;
      auto started =
          start_save(parked.connection, *engine, parked.request_id, parked.request, last_try);
      if (started.is_ok() && !*started) break;  // still no room: it stays first in line
      status = started.status();
    }
    if (engine != nullptr && !status.is_ok()) {
      reply_error(parked.connection, parked.request_id, status);
    }
    parked_saves_.pop_front();
  }
  resuming_saves_ = false;
}

// A session holds one layout's blocks. The same id saved under another layout is the
// conversation going on with another model (the operator replaced the weights, or
// another fingerprint): while the session is between turns its engine has moved on,
// and the new layout's Save replaces it (its blocks stay cached, held by no session,
// and leave as the policy decides). In a turn of its own layout it is refused.
Status SavePath::replace_session_of_another_layout(const EngineContext& engine,
                                                   const policy::Session& session) {
  if (session.state == policy::SessionState::kActive) {
    return invalid_argument("session '{}' belongs to another layout, which is in a turn",
                            session.id);
  }
  KVTIER_LOG_INFO(
      "session '{}' (namespace {}) held {} blocks of layout {:016x}; a Save of layout {:016x} "
      "(model {}) replaces it",
      session.id, engine.namespace_name, session.blocks.size(), session.layout.layout_digest,
      engine.layout_key.layout_digest, engine.layout.model_id);
  const std::string id = session.id;                             // `session` goes with the close
  return ctx_.sessions.close(engine.namespace_id, id).status();  // its observers hear of it
}

Result<bool> SavePath::start_save(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                                  BlockListRequest& request, bool last_try) {
  if (const policy::Session* session = ctx_.sessions.find(engine.namespace_id, request.session_id);
      session != nullptr && !(session->layout == engine.layout_key)) {
    KVTIER_RETURN_IF_ERROR(replace_session_of_another_layout(engine, *session));
  }
  CopyBatch batch;
  batch.priority = CopyPriority::kForeground;  // an engine waits for it
  // The blocks this Save writes; any still held when `save` goes are aborted (a slot
  // that could not be reserved, a copy refused), so every exit below cleans up.
  auto save = std::make_shared<SaveInProgress>();
  std::vector<size_t> being_written;  // duplicates another Save has not finished
  for (size_t i = 0; i < request.hashes.size(); ++i) {
    BlockKey key{engine.layout_key, request.hashes[i]};
    const uint64_t rest = (request.hashes.size() - i) * engine.layout.block_bytes;
    auto slot = placement_.reserve_block(key, engine.layout.block_bytes, engine.gpu_part, rest);
    if (!slot.is_ok() && slot.status().code() == StatusCode::kResourceExhausted &&
        (!slot.status().retryable() || last_try)) {
      // The tiers are full of blocks sessions hold, and waiting would not change that
      // (or the Save waited as long as it may): the Save stores the prefix before this
      // block (perhaps none of it) and says so; the engine recomputes the rest next turn.
      keep_prefix_that_fits(engine, request, i, slot.status());
      save->cut = true;
      break;
    }
    if (!slot.is_ok()) {
      // No room even after evicting: the slots reserved so far go back with `save`.
      if (slot.status().code() == StatusCode::kResourceExhausted) return false;
      return slot.status();
    }
    if (!slot->has_value()) {
      ++save->deduplicated;
      if (!ctx_.store->lookup(key)) {
        being_written.push_back(i);  // held, not yet visible
      } else if (PinnedBlock pin = ctx_.store->pin_in_background(key)) {
        save->kept.push_back(std::move(pin));
      }
      continue;
    }
    copies_.add_request_segments(batch, engine, request.staging, i, request.engine_block_ids[i],
                                 (*slot)->location(),
                                 /*to_engine=*/false);
    save->writes.push_back(std::move(**slot));
  }
  save->request = std::move(request);
  save->waiting = being_written.size() + (save->writes.empty() ? 0 : 1);
  auto engine_ref = std::static_pointer_cast<EngineContext>(c->user_state);
  if (!save->writes.empty()) {
    KVTIER_RETURN_IF_ERROR(
        copies_.submit_copy(std::move(batch), [this, c, id, engine_ref, save](Status status) {
          assert_control_thread();
          // Published (or dropped) at once, so that Saves waiting for these blocks go on.
          const bool ok = status.is_ok();
          for (PendingWrite& write : save->writes) {
            const BlockKey key = write.key();
            ok ? write.commit() : write.abort();
            wake_write_waiters(key, ok);
          }
          save->writes.clear();
          save->copy_status = status;
          if (--save->waiting == 0) finish_save(c, id, *engine_ref, *save);
        }));
  }
  for (size_t i : being_written) {
    write_waiters_[{engine_ref->layout_key, save->request.hashes[i]}].push_back(
        [this, c, id, engine_ref, save, i](bool landed) {
          assert_control_thread();
          if (!landed && (!save->lost_duplicate || i < *save->lost_duplicate)) {
            save->lost_duplicate = i;
          }
          if (--save->waiting == 0) finish_save(c, id, *engine_ref, *save);
        });
  }
  if (save->waiting == 0) finish_save(c, id, *engine_ref, *save);
  return true;
}

void SavePath::keep_prefix_that_fits(const EngineContext& engine, BlockListRequest& request,
                                     size_t fit, const Status& no_room) {
  ++ctx_.counters.partial_saves;
  ctx_.counters.blocks_not_saved += request.hashes.size() - fit;
  KVTIER_LOG_DEBUG("save of session '{}': {} of {} blocks fit ({})", request.session_id, fit,
                   request.hashes.size(), no_room.message());
  // The session's first block: its own when it has blocks, else this Save's.
  const policy::Session* existing = ctx_.sessions.find(engine.namespace_id, request.session_id);
  const BlockHash first = existing != nullptr && existing->blocks.size() > 0
                              ? *existing->blocks.begin()
                              : request.hashes.front();
  cut_sessions_[{engine.namespace_id, request.session_id}] = first;
  request.hashes.resize(fit);
  request.engine_block_ids.resize(fit);
}

void SavePath::wake_write_waiters(const BlockKey& key, bool landed) {
  auto waiting = write_waiters_.extract(key);
  if (waiting.empty()) return;
  for (const auto& waiter : waiting.mapped()) waiter(landed);
}

void SavePath::finish_save(const ConnectionPtr& c, uint64_t id, const EngineContext& engine,
                           SaveInProgress& save) {
  if (!save.copy_status.is_ok()) {
    reply_error(c, id, save.copy_status.with_context("copying the blocks in failed"));
    return;
  }
  const BlockListRequest& request = save.request;
  if (save.lost_duplicate) {
    // Its bytes were another Save's, and that copy failed: nothing of this session is
    // recorded (its own blocks stay as prefix cache); sent again, it writes them.
    const size_t i = *save.lost_duplicate;
    reply_error(c, id,
                unavailable("blocks[{}] (hash {}) was being written by another Save whose copy "
                            "failed; send the Save again",
                            i, request.hashes[i].to_hex()));
    return;
  }
  const size_t stored = request.hashes.size() - save.deduplicated;
  ctx_.counters.bytes_saved += stored * engine.layout.block_bytes;
  if (policy::BlockObserver* observer = ctx_.planner.observer()) {
    const uint64_t now = ctx_.sessions.now_ms();
    for (size_t i = 0; i < request.hashes.size(); ++i) {
      observer->block_saved({engine.layout_key, request.hashes[i]}, static_cast<uint32_t>(i), now);
    }
  }
  // A Save cut to nothing (no room at all) opens no session; an empty one does.
  const bool nothing_kept = save.cut && request.hashes.empty() &&
                            ctx_.sessions.find(engine.namespace_id, request.session_id) == nullptr;
  auto session = nothing_kept ? Result<policy::Session*>(not_found("nothing kept"))
                              : ctx_.sessions.get_or_create(engine.namespace_id, request.session_id,
                                                            engine.layout_key);
  if (session.is_ok()) {
    ctx_.sessions.record_uses(engine.layout_key, request.hashes);
    ctx_.sessions.record_save(**session, request.hashes, request.end_of_turn);
    apply_retention(**session, request);
    // Its new blocks' NVMe copies, the remote write-behind at a turn's end and an
    // admin's pins follow from record_save (SessionObserver); a priority changes the record.
    journal_.note_session_changed(**session);
  }
  reply(c, id, [&](wire::Response::Builder response) {
    auto out = response.initSave();
    out.setStored(static_cast<uint32_t>(stored));
    out.setDeduplicated(save.deduplicated);
  });
  if (!session.is_ok() && !nothing_kept) {
    KVTIER_LOG_WARN("save: {}", session.status().to_string());
  }
  save.kept.clear();  // the session holds them now (or the Save failed)
  placement_.plan_soon();
}

namespace {

// When a priority given for `duration_ms` ends (0: never), on the policy's clock.
uint64_t retention_until(uint64_t now_ms, uint64_t duration_ms) {
  if (duration_ms == 0) return 0;
  return duration_ms > UINT64_MAX - now_ms ? UINT64_MAX : now_ms + duration_ms;
}

}  // namespace

void SavePath::apply_retention(policy::Session& session, const BlockListRequest& request) {
  const uint64_t now = ctx_.sessions.now_ms();
  if (request.retention.priority != 0) {
    ctx_.sessions.set_priority(session, request.retention.priority,
                               retention_until(now, request.retention.duration_ms));
  }
  for (const BlockRangeRetention& range : request.block_retention) {
    const uint64_t until = retention_until(now, range.retention.duration_ms);
    const size_t end = std::min<size_t>(size_t{range.first} + range.count, request.hashes.size());
    for (size_t i = range.first; i < end; ++i) {
      // Every block the Save kept is the session's now (record_save): this holds. (A
      // partial Save kept a prefix: ranges past it have nothing to apply to.)
      (void)ctx_.sessions.set_block_priority({session.layout, request.hashes[i]},
                                             range.retention.priority, until);
    }
  }
}

void SavePath::forget_cut(uint32_t namespace_id, const std::string& session_id) {
  if (!cut_sessions_.empty()) cut_sessions_.erase({namespace_id, session_id});
}

void SavePath::forget(const ConnectionPtr& connection) {
  std::erase_if(parked_saves_,
                [&](const ParkedSave& parked) { return parked.connection == connection; });
}

}  // namespace kvtier::daemon
