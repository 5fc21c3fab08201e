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
    if (!ec && wait->take()) answer(tiers);  // what is held here
  });
  remote_->tier->probe(std::move(asked),
                       [this, wait, answer, tiers](std::vector<Result<bool>> found) mutable {
                         if (!wait->take()) return;
                         for (Result<bool>& exists : found) {
                           if (!exists.is_ok() || !*exists) break;
                           tiers.push_back(Tier::kRemote);
                           ++remote_->lookup_hits;
                         }
                         answer(tiers);
                       });
}

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
    if (ec || !wait->take()) return;
    reply_error(c, id,
                not_found("unknown session '{}' (the remote tier did not answer within {} ms)",
                          session_id, ctx_.config.remote_timeout_ms));
  });
  remote_->worker->get_session(
      engine.namespace_name, session_id,
      [this, wait, c, id, engine_ref, session_id, begin_turn](Result<std::string> value) {
        if (!wait->take()) return;
        EngineContext& engine = *engine_ref;
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
        auto created =
            ctx_.sessions.get_or_create(engine.namespace_id, session_id, engine.layout_key);
        if (!created.is_ok()) {
          reply_error(c, id, created.status());
          return;
        }
        policy::Session& session = **created;
        const LayoutKey layout = engine.layout_key;
        // The blocks held here already, then the rest read from the cluster: the session
        // grows by each block once it and all before it are here, and stops at the first
        // that is not.
        size_t held = 0;
        while (held < record->blocks.size() && ctx_.store->lookup({layout, record->blocks[held]})) {
          ++held;
        }
        std::vector<BlockHash> present(record->blocks.begin(),
                                       record->blocks.begin() + static_cast<std::ptrdiff_t>(held));
        ctx_.sessions.record_save(session, present, false);
        journal_.restore_from_record(session, *record, now_ms(), wall_now_ms());
        ++remote_->resumed_sessions;
        std::vector<BlockKey> rest;
        for (size_t i = held; i < record->blocks.size(); ++i) {
          rest.push_back({layout, record->blocks[i]});
        }
        const auto fetching = static_cast<uint32_t>(rest.size());
        if (held == 0) remote_->synced[{engine.namespace_id, session_id}] = 0;
        journal_.note_session_changed(session);  // its NVMe record, when there is a tier
        // The blocks as they land: the session grows by each once it and all before it
        // are here, up to the first that is not, and only while it is still the
        // session this record made (its last block the record's block before).
        struct Growth {
          std::vector<char> landed;
          size_t next = 0;
          size_t limit = 0;  // the first block that did not land (rest.size(): none yet)
        };
        auto growth = std::make_shared<Growth>();
        growth->landed.assign(rest.size(), 0);
        growth->limit = rest.size();
        const policy::SessionKey key{engine.namespace_id, session_id};
        // Before the turn is answered, so that the waits below see a live session.
        begin_turn(session, fetching);
        auto grow = [this, growth, rest, key, held,
                     before = held == 0 ? std::optional<BlockHash>()
                                        : std::optional<BlockHash>(record->blocks[held - 1])](
                        size_t i, const Status& status) {
          if (status.is_ok()) {
            growth->landed[i] = 1;
          } else {
            growth->limit = std::min(growth->limit, i);
          }
          policy::Session* session = ctx_.sessions.find(key.namespace_id, key.id);
          if (session == nullptr) return;
          while (growth->next < growth->limit && growth->landed[growth->next]) {
            const BlockKey& block = rest[growth->next];
            const std::optional<BlockHash> last =
                growth->next == 0 ? before : std::optional<BlockHash>(rest[growth->next - 1].hash);
            // Cut, closed and made again, or grown by a Save meanwhile: not this
            // record's session any more; and a block evicted again ends it here.
            if (session->blocks.size() != held + growth->next ||
                (last.has_value() &&
                 (session->blocks.empty() || session->blocks.back() != *last)) ||
                !ctx_.store->lookup(block)) {
              growth->limit = growth->next;
              break;
            }
            // Appended without touching the session's state: a block landing after the
            // turn's end must not make it active again.
            ctx_.sessions.append_blocks(*session, {block.hash});
            // Read from the cluster: there already, nothing to write behind.
            auto synced = remote_->synced.find(key);
            if (synced != remote_->synced.end() && held == 0 && synced->second == growth->next) {
              ++synced->second;
            }
            ++growth->next;
          }
        };
        fetch_remote(rest, std::move(grow));
      });
}

}  // namespace kvtier::daemon
