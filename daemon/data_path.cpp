// The data path: Save, Lookup, Load, and the moves the planner asks for.
//
// Every copy follows the same pattern: reserve or pin on the control thread (a
// PendingWrite or PinnedBlock handle per block), submit one batch to the Device, and
// finish on the control thread when the batch completes (commit/abort, unpin, reply).
// The handles ride with the batch's completion, so a batch that is refused or fails
// releases them too. A block is published only by PendingWrite::commit, after its bytes
// landed, so no reader ever sees a half-written block.
// Load is in load_path.cpp.
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "common/log.h"
#include "daemon/copy_delay.h"
#include "daemon/persistence.h"
#include "daemon/service.h"

namespace kvtier::daemon {
namespace {

class StorePlacementView final : public policy::PlacementView {
 public:
  StorePlacementView(const BlockStore& store, std::function<uint64_t(Tier)> leaving_bytes)
      : store_(store), leaving_bytes_(std::move(leaving_bytes)) {}

  BlockPlacement placement(const BlockKey& key) const override {
    auto info = store_.lookup(key);
    if (!info) return {Tier::kNone, false, 0, 0, 0};
    return to_placement(key, *info);
  }
  TierSpace space(Tier tier) const override {
    if (!store_.configured(tier)) return {};
    auto usage = store_.usage(tier);
    // NVMe slots waiting for their index delete are free in a moment; counting them as
    // used would make the planner evict again for room already being made. Copies are
    // free too: a write that needs their room drops them first (move_executor.h), so a
    // block never goes for room a copy holds. Blocks being written to the remote tier
    // on their way out are gone in a moment too.
    const uint64_t going =
        store_.unconfirmed_release_bytes(tier) + usage.copy_bytes + leaving_bytes_(tier);
    return {usage.capacity_bytes, usage.used_bytes - std::min(usage.used_bytes, going)};
  }
  void for_each_in_tier(
      Tier tier,
      const std::function<void(const BlockKey&, const BlockPlacement&)>& fn) const override {
    store_.for_each_in_tier(tier, [&](const BlockKey& key, const BlockInfo& info) {
      fn(key, to_placement(key, info));
    });
  }

 private:
  BlockPlacement to_placement(const BlockKey& key, const BlockInfo& info) const {
    return {info.location.tier, info.state == BlockState::kReady && info.pins == 0,
            store_.block_bytes(key.layout), info.session_refs, info.last_access_ms};
  }
  const BlockStore& store_;
  std::function<uint64_t(Tier)> leaving_bytes_;
};

using KeySet = std::unordered_set<BlockKey, BlockKeyHasher>;

// A session is a prefix: once one of its blocks is gone, the blocks after it can never
// be loaded as part of that prefix, so the session is cut there and drops its
// references to the rest. Only the sessions holding a removed block are visited (the
// table's reverse index). `cut` is told about every session it shortened.
void cut_sessions_at(const KeySet& removed, policy::SessionTable& sessions, BlockStore& store,
                     const std::function<void(const policy::Session&)>& cut) {
  std::vector<policy::Session*> holders;
  for (const BlockKey& key : removed) {
    const policy::BlockHolders* h = sessions.holders(key);
    if (h == nullptr) continue;
    h->for_each(
        [&](const policy::Session& s) { holders.push_back(sessions.find(s.namespace_id, s.id)); });
  }
  std::sort(holders.begin(), holders.end());
  holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
  for (policy::Session* session : holders) {
    const auto& blocks = session->blocks;
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (removed.count({session->layout, blocks[i]}) == 0) continue;
      for (const BlockHash& hash : sessions.truncate(*session, i)) {
        BlockKey key{session->layout, hash};
        if (removed.count(key) == 0) store.drop_session_ref(key);
      }
      cut(*session);
      break;
    }
  }
}

}  // namespace

std::unique_ptr<policy::PlacementView> Service::make_placement_view(
    const BlockStore& store, std::function<uint64_t(Tier)> leaving_bytes) {
  return std::make_unique<StorePlacementView>(store, std::move(leaving_bytes));
}

void Service::add_plane_segments(CopyBatch& batch, const EngineContext& engine,
                                 uint64_t engine_block_id, const BlockLocation& slot,
                                 bool to_engine, BlockPlanes planes) {
  const uint32_t tier_index = batch.memory_index(store_->memory(slot.tier));
  for (const PlaneLayout& plane : planes.of(engine.layout)) {
    const uint32_t region_index = batch.memory_index(engine.regions.at(plane.region_id));
    const uint64_t engine_offset = engine.layout.plane_offset(plane, engine_block_id);
    const uint64_t slot_offset = slot.offset + plane.offset_in_block;
    if (to_engine) {
      batch.segments.push_back(
          {tier_index, region_index, slot_offset, engine_offset, plane.bytes_per_block});
    } else {
      batch.segments.push_back(
          {region_index, tier_index, engine_offset, slot_offset, plane.bytes_per_block});
    }
  }
}

Status Service::submit_copy(CopyBatch batch, std::function<void(Status)> done) {
  ++counters_.copies_in_flight;
  // The work guard keeps io_context::run() alive until this completion has run.
  auto guard = asio::make_work_guard(io_);
  auto finish = [this, guard, done = std::move(done)](Status status) {
    --counters_.copies_in_flight;
    done(status);
    // The device let go of the batch's memories before it called us: a region
    // being unregistered may have lost its last copy.
    reply_to_finished_unregisters();
    resume_parked_saves();  // its pins are gone: their blocks may move or go
  };
  // fault-copy-delay-ms (tests only): an engine's copies complete later, in order.
  CopyCompletionDelay* delay =
      batch.priority == CopyPriority::kForeground ? copy_delay_.get() : nullptr;
  auto place = delay != nullptr ? delay->enter() : nullptr;
  Status submitted = device_->submit(
      std::move(batch), [this, guard, place, finish = std::move(finish)](Status status) {
        asio::post(io_, [this, guard, place, finish, status]() {
          if (place != nullptr) {
            copy_delay_->copied(place, [finish, status] { finish(status); });
          } else {
            finish(status);
          }
        });
      });
  if (!submitted.is_ok()) {
    --counters_.copies_in_flight;
    if (delay != nullptr) delay->leave(place);
  }
  return submitted;
}

Result<std::optional<PendingWrite>> Service::reserve_block(const BlockKey& key,
                                                           uint64_t block_bytes, int gpu_part,
                                                           uint64_t room_bytes) {
  static constexpr Tier kSaveTiers[] = {Tier::kHbm, Tier::kRam};
  auto reserved = store_->reserve(key, kSaveTiers, now_ms(), gpu_part);
  if (reserved.is_ok() || reserved.status().code() != StatusCode::kResourceExhausted)
    return reserved;
  sessions_.expire_priorities(sessions_.now_ms());  // a priority whose time is up keeps nothing
  // HBM and RAM are full. Room for the rest of the request at once (`room_bytes`), so
  // that a request plans once, not once per block; for one block when that much cannot
  // be had. With NVMe below RAM, RAM's coldest blocks go down to it: nothing leaves the
  // daemon for room NVMe has. The Save waits for those writes (it parks: ResourceExhausted
  // here), as it does while room already on its way (blocks moving out) comes.
  DemotionRoom room = plan_room_by_demotion(Tier::kRam, std::max(room_bytes, block_bytes),
                                            block_bytes, policy::Room::kDemoteEvictingBelow);
  if (!room.moves.empty()) {
    mover_->apply(room.moves);
    // Demotions onto NVMe copies (and drops) free their slots at once.
    reserved = store_->reserve(key, kSaveTiers, now_ms(), gpu_part);
    if (reserved.is_ok() || reserved.status().code() != StatusCode::kResourceExhausted)
      return reserved;
    // Writes started, or NVMe slots on their way back for them: the room comes. (A
    // move refused at once, its tier failing, leaves neither: then evict, below.)
    room.coming = store_->moving_out_bytes(Tier::kRam) > 0 ||
                  store_->unconfirmed_release_bytes(Tier::kNvme) > 0;
  }
  if (room.coming) {
    return resource_exhausted(
        "no room for a {}-byte block yet: RAM blocks are on their way down to NVMe to make it; "
        "retry",
        block_bytes);
  }
  // No tier below can take them: drop the coldest blocks, from the slowest tier that
  // has any to give (RAM may hold only blocks in flight while HBM holds cold ones).
  for (Tier victim_tier : {Tier::kRam, Tier::kHbm}) {
    if (store_->memory(victim_tier) == nullptr) continue;
    auto moves =
        planner_.make_room(victim_tier, std::max(room_bytes, block_bytes), sessions_, *view_);
    if (moves.empty() && room_bytes > block_bytes) {
      moves = planner_.make_room(victim_tier, block_bytes, sessions_, *view_);
    }
    if (moves.empty()) continue;
    mover_->apply(moves);
    return store_->reserve(key, kSaveTiers, now_ms(), gpu_part);
  }
  return resource_exhausted(
      "no room for a {}-byte block: every tier is full of blocks that are being copied or read; "
      "retry",
      block_bytes);
}

Service::DemotionRoom Service::plan_room_by_demotion(Tier tier, uint64_t wanted_bytes,
                                                     uint64_t least_bytes, policy::Room rule) {
  DemotionRoom room;
  if (tier != Tier::kRam || !store_->configured(Tier::kNvme)) return room;
  // Writes paused after a failure would refuse the demotions: the caller evicts.
  if (mover_->writes_paused()) return room;
  // Blocks already moving out of RAM free their slots when they land: wait for that
  // room instead of making more (every retry would otherwise demote again).
  const uint64_t coming = store_->moving_out_bytes(Tier::kRam);
  if (coming >= least_bytes) {
    room.coming = true;
    return room;
  }
  room.moves = planner_.make_room(tier, wanted_bytes - std::min(wanted_bytes, coming), sessions_,
                                  *view_, rule);
  if (room.moves.empty() && wanted_bytes > least_bytes) {
    room.moves = planner_.make_room(tier, least_bytes - coming, sessions_, *view_, rule);
  }
  // Nothing can go down now, but blocks are arriving in RAM (reads, promotions): they
  // can once they land. Wait for them rather than evict.
  if (room.moves.empty() && store_->moving_in_bytes(Tier::kRam) > 0) room.coming = true;
  return room;
}

// A Save in progress: its own copy, and the blocks it found being written by another
// Save (it may answer only once those landed: never "saved" for bytes not there yet).
struct Service::SaveInProgress {
  BlockListRequest request;
  std::vector<PendingWrite> writes;  // the blocks this Save writes
  uint32_t deduplicated = 0;
  size_t waiting = 0;  // its copy (if any) + blocks another Save is writing
  Status copy_status;
  std::optional<size_t> lost_duplicate;  // index of a block whose other writer failed
};

Status Service::handle_save(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                            BlockListRequest request) {
  // Behind the Saves already waiting for room, so that none is overtaken for ever.
  if (parked_saves_.empty()) {
    auto started = start_save(c, engine, id, request);
    if (!started.is_ok() || *started) return started.status();
  }
  if (config_.save_room_wait_ms == 0) {
    return resource_exhausted(
        "no room for the Save's {} blocks: every tier is full of blocks that are being copied "
        "or read; retry",
        request.hashes.size());
  }
  parked_saves_.push_back(
      {c, id, std::move(request),
       std::chrono::steady_clock::now() + std::chrono::milliseconds(config_.save_room_wait_ms)});
  return Status::ok();
}

void Service::resume_parked_saves() {
  // Loads waiting for a slot to read an NVMe block into go first: they were there first
  // (a Save parks only once the Loads' reads hold what room there was).
  mover_->retry_room_waiters();
  if (resuming_saves_ || parked_saves_.empty()) return;
  resuming_saves_ = true;
  const auto now = std::chrono::steady_clock::now();
  while (!parked_saves_.empty()) {
    ParkedSave& parked = parked_saves_.front();
    auto engine = std::static_pointer_cast<EngineContext>(parked.connection->user_state);
    Status status;
    if (engine == nullptr) {
      // The engine left: nobody to answer.
    } else if (stopping_) {
      status = unavailable("kvtierd is stopping; the Save was not started").with_retryable(true);
    } else if (now >= parked.deadline) {
      status = resource_exhausted(
          "no room for the Save's {} blocks within save-room-wait-ms ({} ms): every tier stayed "
          "full of blocks being copied or read; retry",
          parked.request.hashes.size(), config_.save_room_wait_ms);
    } else if (status = check_regions_registered(*engine); status.is_ok()) {
      auto started = start_save(parked.connection, *engine, parked.request_id, parked.request);
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

Result<bool> Service::start_save(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                                 BlockListRequest& request) {
  if (const policy::Session* session = sessions_.find(engine.namespace_id, request.session_id);
      session != nullptr && !(session->layout == engine.layout_key)) {
    return invalid_argument("session '{}' belongs to another layout", request.session_id);
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
    auto slot = reserve_block(key, engine.layout.block_bytes, engine.gpu_part, rest);
    if (!slot.is_ok()) {
      // No room even after evicting: the slots reserved so far go back with `save`.
      if (slot.status().code() == StatusCode::kResourceExhausted) return false;
      return slot.status();
    }
    if (!slot->has_value()) {
      ++save->deduplicated;
      if (!store_->lookup(key)) being_written.push_back(i);  // held, not yet visible
      continue;
    }
    add_plane_segments(batch, engine, request.engine_block_ids[i], (*slot)->location(),
                       /*to_engine=*/false);
    save->writes.push_back(std::move(**slot));
  }
  save->request = std::move(request);
  save->waiting = being_written.size() + (save->writes.empty() ? 0 : 1);
  auto engine_ref = std::static_pointer_cast<EngineContext>(c->user_state);
  if (!save->writes.empty()) {
    KVTIER_RETURN_IF_ERROR(
        submit_copy(std::move(batch), [this, c, id, engine_ref, save](Status status) {
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
          if (!landed && (!save->lost_duplicate || i < *save->lost_duplicate)) {
            save->lost_duplicate = i;
          }
          if (--save->waiting == 0) finish_save(c, id, *engine_ref, *save);
        });
  }
  if (save->waiting == 0) finish_save(c, id, *engine_ref, *save);
  return true;
}

void Service::wake_write_waiters(const BlockKey& key, bool landed) {
  auto waiting = write_waiters_.extract(key);
  if (waiting.empty()) return;
  for (const auto& waiter : waiting.mapped()) waiter(landed);
}

void Service::finish_save(const ConnectionPtr& c, uint64_t id, const EngineContext& engine,
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
  counters_.bytes_saved += stored * engine.layout.block_bytes;
  auto session =
      sessions_.get_or_create(engine.namespace_id, request.session_id, engine.layout_key);
  if (session.is_ok()) {
    sessions_.record_uses(engine.layout_key, request.hashes);
    for (const BlockHash& hash :
         sessions_.record_save(**session, request.hashes, request.end_of_turn)) {
      store_->add_session_ref({engine.layout_key, hash});
    }
    apply_retention(**session, request);
    note_session_changed(**session);
    if (request.end_of_turn) write_behind(**session);  // remote_write_behind.cpp
  }
  reply(c, id, [&](wire::Response::Builder response) {
    auto out = response.initSave();
    out.setStored(static_cast<uint32_t>(stored));
    out.setDeduplicated(save.deduplicated);
  });
  if (!session.is_ok()) KVTIER_LOG_WARN("save: {}", session.status().to_string());
  plan_soon();
}

namespace {

// When a priority given for `duration_ms` ends (0: never), on the policy's clock.
uint64_t retention_until(uint64_t now_ms, uint64_t duration_ms) {
  if (duration_ms == 0) return 0;
  return duration_ms > UINT64_MAX - now_ms ? UINT64_MAX : now_ms + duration_ms;
}

}  // namespace

void Service::apply_retention(policy::Session& session, const BlockListRequest& request) {
  const uint64_t now = sessions_.now_ms();
  if (request.retention.priority != 0) {
    sessions_.set_priority(session, request.retention.priority,
                           retention_until(now, request.retention.duration_ms));
  }
  for (const BlockRangeRetention& range : request.block_retention) {
    const uint64_t until = retention_until(now, range.retention.duration_ms);
    for (uint32_t i = range.first; i < range.first + range.count; ++i) {
      // Every block of the Save is the session's now (record_save): this holds.
      (void)sessions_.set_block_priority({session.layout, request.hashes[i]},
                                         range.retention.priority, until);
    }
  }
}

void Service::plan_soon() {
  // Saves finishing together share one plan, run after their replies are sent.
  if (plan_posted_ || stopping_) return;
  plan_posted_ = true;
  asio::post(io_, [this] {
    plan_posted_ = false;
    run_planner(policy::Planner::PlanKind::kAfterSave);
  });
}

Status Service::handle_lookup(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                              const std::vector<BlockHash>& hashes) {
  store_->prefetch(engine.layout_key, hashes);
  std::vector<Tier> tiers;
  for (const BlockHash& hash : hashes) {
    auto info = store_->lookup({engine.layout_key, hash});
    if (!info) break;
    tiers.push_back(info->location.tier);
  }
  if (remote_ && tiers.size() < hashes.size()) {
    lookup_remote(c, engine, id, hashes, std::move(tiers));  // answers when the cluster did
    return Status::ok();
  }
  reply_lookup(c, id, hashes.size(), tiers);
  return Status::ok();
}

void Service::reply_lookup(const ConnectionPtr& c, uint64_t id, size_t asked,
                           const std::vector<Tier>& tiers) {
  counters_.lookup_hits += tiers.size();
  counters_.lookup_misses += asked - tiers.size();
  reply(c, id, [&](wire::Response::Builder response) {
    auto out = response.initLookup();
    out.setHitCount(static_cast<uint32_t>(tiers.size()));
    auto list = out.initTiers(static_cast<unsigned>(tiers.size()));
    for (unsigned i = 0; i < tiers.size(); ++i) list.set(i, static_cast<wire::Tier>(tiers[i]));
  });
}

void Service::run_planner(policy::Planner::PlanKind kind) {
  if (stopping_ || store_ == nullptr) return;
  sessions_.expire_priorities(sessions_.now_ms());
  mover_->apply(planner_.plan_demotions(sessions_, *view_, kind));
  flush_sessions(/*sync=*/false);
  mover_->release_slots();
  sweep_write_behind();   // remote_write_behind.cpp
  resume_parked_saves();  // also answers those whose wait is over
  // The period is kept whatever Saves do: a stream of them does not postpone it.
  if (kind != policy::Planner::PlanKind::kPeriodic) return;
  plan_timer_.expires_after(std::chrono::milliseconds(config_.plan_interval_ms));
  plan_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) run_planner(policy::Planner::PlanKind::kPeriodic);
  });
}

void Service::on_blocks_removed(const std::vector<BlockKey>& keys, bool lost) {
  KeySet removed(keys.begin(), keys.end());
  if (lost) KVTIER_LOG_WARN("{} blocks dropped: their bytes were lost", keys.size());
  cut_sessions_at(removed, sessions_, *store_,
                  [this](const policy::Session& session) { note_session_cut(session); });
}

void Service::make_mover() {
  for (Tier tier : {Tier::kHbm, Tier::kRam}) {
    if (store_->memory(tier) != nullptr) {
      storage_tiers_.push_back(std::make_unique<MemoryTier>(tier, store_->memory(tier)));
    }
  }
  if (nvme_) {
    storage_tiers_.push_back(std::make_unique<NvmeStorageTier>(
        *nvme_->tier, [this](const BlockKey& key) { return nvme_key(key); }));
  }
  std::vector<StorageTier*> tiers;
  for (const auto& tier : storage_tiers_) tiers.push_back(tier.get());
  MoveExecutor::Hooks hooks;
  hooks.copy = [this](CopyBatch batch, std::function<void(Status)> done) {
    return submit_copy(std::move(batch), std::move(done));
  };
  hooks.control_thread = [this]() -> std::function<void(std::function<void()>)> {
    auto guard = asio::make_work_guard(io_);
    return [this, guard](std::function<void()> fn) { asio::post(io_, [guard, fn] { fn(); }); };
  };
  hooks.make_room = [this](Tier tier, uint64_t bytes) {
    sessions_.expire_priorities(sessions_.now_ms());
    // A read out of NVMe into RAM: RAM's coldest blocks go down, as for a Save; the read
    // waits for the room (the executor retries its room waiters as moves settle). A
    // full NVMe evicts nothing for it: that could be a block being read.
    DemotionRoom room = plan_room_by_demotion(tier, bytes, bytes, policy::Room::kDemote);
    if (room.coming) return std::vector<policy::Move>{};
    if (!room.moves.empty()) return std::move(room.moves);
    return planner_.make_room(tier, bytes, sessions_, *view_);
  };
  hooks.not_moved = [this](const BlockKey& key) { planner_.revisit(sessions_, key); };
  hooks.take_evictions = [this](std::vector<BlockKey> keys) {
    return spill_evictions(std::move(keys));  // remote_spill.cpp
  };
  hooks.removed = [this](const std::vector<BlockKey>& keys, bool lost) {
    on_blocks_removed(keys, lost);
  };
  hooks.before_persistent_write = [this] { flush_sessions(/*sync=*/false); };
  hooks.settled = [this] {
    check_drain();
    resume_parked_saves();
  };
  hooks.now_ms = [this] { return now_ms(); };
  hooks.wall_ms_of = [this](uint64_t steady_ms) {
    return steady_to_wall_ms(steady_ms, now_ms(), wall_now_ms());
  };
  mover_ = std::make_unique<MoveExecutor>(*store_, std::move(tiers), std::move(hooks));
}

}  // namespace kvtier::daemon
