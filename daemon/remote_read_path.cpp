// Reading the remote tier: Lookup asks the cluster about the rest of a prefix, Load
// reads it into RAM slots, BeginTurn of an unknown session resumes it from its record
// (remote_path.h).
#include "daemon/remote_path.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <deque>
#include <optional>

#include "common/log.h"
#include "daemon/load_path.h"
#include "daemon/save_path.h"
#include "daemon/session_journal.h"
#include "daemon/turn_path.h"

namespace kvtier::daemon {

Result<std::optional<PendingWrite>> RemotePath::reserve_staging(const BlockKey& key,
                                                                uint64_t block_bytes) {
  // Host-addressable engine-facing tiers, lowest first: the worker writes the bytes there.
  std::vector<Tier> tiers;
  const std::span<const Tier> facing = ctx_.topology.engine_facing();
  for (auto it = facing.rbegin(); it != facing.rend(); ++it) {
    if (ctx_.store->memory(*it)->host_data() != nullptr) tiers.push_back(*it);
  }
  if (tiers.empty()) return not_supported("no host memory tier to read remote blocks into");
  auto reserved = ctx_.store->reserve(key, tiers, now_ms());
  if (reserved.is_ok() || reserved.status().code() != StatusCode::kResourceExhausted) {
    return reserved;
  }
  ctx_.sessions.expire_priorities(ctx_.sessions.now_ms());
  for (Tier tier : tiers) {
    auto moves = ctx_.planner.make_room(tier, block_bytes, ctx_.sessions, *ctx_.view);
    if (moves.empty()) continue;
    ctx_.mover->apply(moves);
    return ctx_.store->reserve(key, tiers, now_ms());
  }
  return reserved;
}

// One fetch_remote call's reads: the keys it started, read in chunks of at most
// kFetchChunkBytes with at most `window` chunks at the worker at once, so a prefix of
// any length is read (in turn) and slots are reserved only as their chunk starts.
struct RemotePath::RemoteFetch {
  std::string namespace_name;
  std::deque<BlockKey> to_read;
  size_t chunks_in_flight = 0;
};

namespace {
constexpr uint64_t kFetchChunkBytes = 32ull << 20;
}  // namespace

void RemotePath::fetch_remote(const std::string& namespace_name, const std::vector<BlockKey>& keys,
                              std::function<void(size_t, const Status&)> done) {
  auto answer = std::make_shared<std::function<void(size_t, const Status&)>>(std::move(done));
  std::vector<std::pair<size_t, Status>> at_once;
  if (!remote_->worker->connected()) {
    for (size_t i = 0; i < keys.size(); ++i) {
      (*answer)(i, ctx_.store->lookup(keys[i]) ? Status::ok()
                                               : unavailable("the remote tier is not connected"));
    }
    return;
  }
  auto fetch = std::make_shared<RemoteFetch>();
  fetch->namespace_name = namespace_name;
  for (size_t i = 0; i < keys.size(); ++i) {
    const BlockKey& key = keys[i];
    auto waiter = [answer, i](const Status& status) { (*answer)(i, status); };
    if (auto it = remote_->fetching.find(key); it != remote_->fetching.end()) {
      it->second.push_back(std::move(waiter));  // joins the read already under way
      continue;
    }
    if (ctx_.store->lookup(key)) {
      at_once.emplace_back(i, Status::ok());
      continue;
    }
    remote_->fetching[key].push_back(std::move(waiter));
    fetch->to_read.push_back(key);
  }
  pump_fetch(fetch);
  for (const auto& [i, status] : at_once) (*answer)(i, status);
}

void RemotePath::settle_fetch(const BlockKey& key, PendingWrite* slot, const Status& status) {
  if (slot != nullptr) {
    if (status.is_ok()) {
      slot->commit();
    } else {
      slot->abort();
    }
    // A Save that found the block being written (our reservation) waits for it.
    ctx_.parts.saves->wake_write_waiters(key, status.is_ok());
  }
  if (status.is_ok()) {
    ++remote_->fetched_blocks;
  } else {
    ++remote_->fetch_misses;
  }
  auto it = remote_->fetching.find(key);
  if (it == remote_->fetching.end()) return;
  auto waiters = std::move(it->second);
  remote_->fetching.erase(it);
  for (auto& waiter : waiters) waiter(status);
}

void RemotePath::pump_fetch(const std::shared_ptr<RemoteFetch>& fetch) {
  if (!remote_) return;
  const uint64_t chunk_limit = std::min(kFetchChunkBytes, ctx_.config.remote_max_in_flight_bytes);
  const size_t window = std::max<uint64_t>(1, ctx_.config.remote_max_in_flight_bytes / chunk_limit);
  while (fetch->chunks_in_flight < window && !fetch->to_read.empty()) {
    std::vector<StorageTier::ReadItem> reads;
    auto slots = std::make_shared<std::vector<PendingWrite>>();
    auto started = std::make_shared<std::vector<BlockKey>>();
    uint64_t bytes = 0;
    while (!fetch->to_read.empty()) {
      const BlockKey key = fetch->to_read.front();
      const uint64_t block_bytes = ctx_.store->block_bytes(key.layout);
      if (!started->empty() && bytes + block_bytes > chunk_limit) break;
      fetch->to_read.pop_front();
      auto reserved = reserve_staging(key, block_bytes);
      if (!reserved.is_ok() || !*reserved) {
        // No room, or present meanwhile but not visible (a Save is writing it).
        settle_fetch(
            key, nullptr,
            reserved.is_ok() ? unavailable("it is being saved; retry") : reserved.status());
        continue;
      }
      PendingWrite& slot = **reserved;
      std::byte* into =
          ctx_.store->memory(slot.location().tier)->host_data() + slot.location().offset;
      reads.push_back({{key, 0, block_bytes}, into});
      slots->push_back(std::move(slot));
      started->push_back(key);
      bytes += block_bytes;
    }
    if (reads.empty()) continue;
    ++fetch->chunks_in_flight;
    // Every started read ends once: its slot committed or given back, its waiters told.
    auto settle = [this, slots, started,
                   fetch](const std::vector<StorageTier::ReadOutcome>& outcomes) {
      for (size_t j = 0; j < started->size(); ++j) {
        settle_fetch((*started)[j], &(*slots)[j], outcomes[j].status);
      }
      --fetch->chunks_in_flight;
      pump_fetch(fetch);
    };
    if (!remote_->tier->try_read(
            std::move(reads),
            [settle](std::vector<StorageTier::ReadOutcome> outcomes) { settle(outcomes); })) {
      // Other reads hold the worker's bound: this chunk and the rest are not read now.
      --fetch->chunks_in_flight;
      const Status busy =
          resource_exhausted("the remote tier has as many bytes in flight as it may; retry");
      for (size_t j = 0; j < started->size(); ++j) {
        settle_fetch((*started)[j], &(*slots)[j], busy);
      }
      while (!fetch->to_read.empty()) {
        const BlockKey key = fetch->to_read.front();
        fetch->to_read.pop_front();
        settle_fetch(key, nullptr, busy);
      }
      return;
    }
  }
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

void RemotePath::lookup_remote(const ConnectionPtr& c, const EngineContext& engine, uint64_t id,
                               std::vector<BlockHash> hashes, std::vector<Tier> tiers) {
  auto answer = [this, c, id, total = hashes.size()](const std::vector<Tier>& found) {
    ctx_.parts.loads->reply_lookup(c, id, total, found);
  };
  // Blocks being read from the cluster already (a BeginTurn's prefetch) need no question.
  while (tiers.size() < hashes.size() &&
         remote_->fetching.contains({engine.layout_key, hashes[tiers.size()]})) {
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
                                    uint64_t id, const std::string& session_id) {
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
      [this, wait, c, id, engine_ref, session_id](Result<std::string> value) {
        if (!wait->take()) return;
        EngineContext& engine = *engine_ref;
        // A Save may have created the session meanwhile: then it is simply known.
        if (policy::Session* known = ctx_.sessions.find(engine.namespace_id, session_id)) {
          ctx_.parts.turns->begin_turn(c, engine, id, *known, 0);
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
        ctx_.parts.journal->restore_from_record(session, *record, now_ms(), wall_now_ms());
        ++remote_->resumed_sessions;
        std::vector<BlockKey> rest;
        for (size_t i = held; i < record->blocks.size(); ++i) {
          rest.push_back({layout, record->blocks[i]});
        }
        const auto fetching = static_cast<uint32_t>(rest.size());
        if (held == 0) remote_->synced[{engine.namespace_id, session_id}] = 0;
        ctx_.parts.journal->note_session_changed(session);  // its NVMe record, when there is a tier
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
        ctx_.parts.turns->begin_turn(c, engine, id, session, fetching);
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
          bool grew = false;
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
            grew = true;
          }
          if (grew) ctx_.parts.journal->note_session_changed(*session);
        };
        fetch_remote(engine.namespace_name, rest, std::move(grow));
      });
}

}  // namespace kvtier::daemon
