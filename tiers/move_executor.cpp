#include "tiers/move_executor.h"

#include <algorithm>

#include "common/log.h"

namespace kvtier {
namespace {

// Blocks per tier job: big enough to amortize a persistent tier's sync and index
// commit, small enough that moved blocks become visible (and memory frees up) in steps.
constexpr size_t kMaxBlocksPerJob = 32;
constexpr uint64_t kMaxBytesPerJob = 128ull << 20;
// Writes into a tier pause after a failure: from this long, doubling, up to the max.
constexpr uint64_t kFirstBackoffMs = 500;
constexpr uint64_t kMaxBackoffMs = 30'000;

// Splits parallel vectors into jobs of at most kMaxBlocksPerJob / kMaxBytesPerJob.
template <typename Item, typename Parallel, typename Fn>
void for_each_job(std::vector<Item>& items, std::vector<Parallel>& parallel, Fn&& submit) {
  size_t begin = 0;
  while (begin < items.size()) {
    size_t end = begin;
    uint64_t bytes = 0;
    while (end < items.size() && end - begin < kMaxBlocksPerJob &&
           (end == begin || bytes + items[end].slot.bytes <= kMaxBytesPerJob)) {
      bytes += items[end].slot.bytes;
      ++end;
    }
    submit(std::vector<Item>(std::make_move_iterator(items.begin() + begin),
                             std::make_move_iterator(items.begin() + end)),
           std::vector<Parallel>(std::make_move_iterator(parallel.begin() + begin),
                                 std::make_move_iterator(parallel.begin() + end)));
    begin = end;
  }
}

}  // namespace

MoveExecutor::MoveExecutor(BlockStore& store, std::vector<StorageTier*> tiers, Hooks hooks)
    : store_(store), tiers_(kTierCount, nullptr), hooks_(std::move(hooks)) {
  for (StorageTier* tier : tiers) tiers_[static_cast<size_t>(tier->id())] = tier;
}

StorageTier* MoveExecutor::tier(Tier id) const {
  const auto at = static_cast<size_t>(id);
  return at < tiers_.size() ? tiers_[at] : nullptr;
}

bool MoveExecutor::accepts_writes(Tier id) const {
  const StorageTier* to = tier(id);
  return to != nullptr && to->writable() && !writes_paused();
}

bool MoveExecutor::copies_by_device(Tier id) const {
  const StorageTier* t = tier(id);
  return t != nullptr && t->memory() != nullptr;
}

bool MoveExecutor::in_host_memory(Tier id) const {
  const StorageTier* t = tier(id);
  return t != nullptr && t->memory() != nullptr && t->memory()->host_data() != nullptr;
}

void MoveExecutor::set_draining(bool draining) {
  draining_ = draining;
  if (!draining) drain_failed_.clear();
}

// A move whose bytes the Device copies, its destination reserved (step 1).
struct MoveExecutor::DeviceMove {
  PendingMove move;
  policy::MoveKind kind;
  uint64_t bytes;
  Tier to;
  Tier onward;  // kNone, or where the block goes next (second hop)
};

// apply()'s moves, sorted by the way their bytes go (step 2).
struct MoveExecutor::MoveRoutes {
  CopyBatch batch;
  std::vector<DeviceMove> copying;
  std::vector<BlockKey> evictions;
  bool demoted_onto_copy = false;  // freed slots above: reads waiting for room may go
  std::array<std::vector<BlockKey>, kTierCount> writes{};                         // by destination
  std::array<std::array<std::vector<BlockKey>, kTierCount>, kTierCount> reads{};  // [from][to]
};

void MoveExecutor::apply(const std::vector<policy::Move>& moves, int hbm_part) {
  MoveRoutes routes;
  // The policy's moves never hold up an engine's Save or Load.
  routes.batch.priority = CopyPriority::kBackground;
  for (const policy::Move& move : moves) route_move(move, hbm_part, routes);
  if (!routes.evictions.empty() && spill_tier_ != nullptr) spill_leaving(routes.evictions);
  if (!routes.evictions.empty()) evict(routes.evictions);
  for (size_t to = 0; to < kTierCount; ++to) {
    if (!routes.writes[to].empty()) write_into(*tiers_[to], routes.writes[to]);
  }
  for (size_t from = 0; from < kTierCount; ++from) {
    for (size_t to = 0; to < kTierCount; ++to) {
      if (!routes.reads[from][to].empty())
        read_from(*tiers_[from], routes.reads[from][to], static_cast<Tier>(to));
    }
  }
  release_slots();
  if (routes.demoted_onto_copy) retry_room_waiters();
  if (routes.copying.empty()) return;
  submit_device_moves(std::move(routes.batch), std::move(routes.copying));
}

void MoveExecutor::route_move(const policy::Move& move, int hbm_part, MoveRoutes& routes) {
  if (move.kind == policy::MoveKind::kEvict) {
    // Room a Save or a read needs: a block with a copy below frees its slot just as
    // well by moving onto the copy, and stays cached (nothing is written).
    if (move.reason == policy::MoveReason::kMakeRoom && store_.copy_of(move.block) &&
        store_.demote_onto_copy(move.block).is_ok()) {
      counters_.bytes_demoted_onto_copy += store_.block_bytes(move.block.layout);
      return;
    }
    routes.evictions.push_back(move.block);
    return;
  }
  auto info = store_.lookup(move.block);
  if (!info || tier(move.to) == nullptr) return;
  const Tier from = info->location.tier;
  if (from == move.to) return;  // already there
  if (info->has_copy && move_onto_copy(move.block, move.to)) {
    routes.demoted_onto_copy = true;
    return;
  }
  Tier to = move.to;
  Tier onward = Tier::kNone;
  if (!copies_by_device(to)) {
    if (in_host_memory(from)) {
      routes.writes[static_cast<size_t>(to)].push_back(move.block);
      return;
    }
    // GPU memory → a tier written from host memory: through RAM.
    if (!in_host_memory(Tier::kRam) || !copies_by_device(from)) {
      hooks_.not_moved(move.block);
      return;
    }
    onward = to;
    to = Tier::kRam;
  } else if (!copies_by_device(from)) {
    routes.reads[static_cast<size_t>(from)][static_cast<size_t>(to)].push_back(move.block);
    return;
  }
  auto pending =
      store_.begin_move(move.block, to, to == Tier::kHbm ? hbm_part : SlabAllocator::kAnyPart);
  if (!pending.is_ok()) {
    KVTIER_LOG_DEBUG("move of {} skipped: {}", move.block.hash.to_hex(),
                     pending.status().to_string());
    hooks_.not_moved(move.block);
    return;
  }
  const uint64_t bytes = store_.block_bytes(move.block.layout);
  CopyBatch& batch = routes.batch;
  batch.segments.push_back({batch.memory_index(tier(from)->memory()),
                            batch.memory_index(tier(to)->memory()), pending->from().offset,
                            pending->location().offset, bytes});
  routes.copying.push_back({std::move(*pending), move.kind, bytes, to, onward});
}

void MoveExecutor::spill_leaving(std::vector<BlockKey>& evictions) {
  // Blocks leaving the node's last local tier: written to the spill tier first.
  std::vector<BlockKey> leaving;
  std::erase_if(evictions, [&](const BlockKey& key) {
    const auto info = store_.lookup(key);
    if (!info || copies_by_device(info->location.tier)) return false;
    leaving.push_back(key);
    return true;
  });
  if (!leaving.empty()) {
    std::vector<BlockKey> rest = spill(std::move(leaving));
    evictions.insert(evictions.end(), rest.begin(), rest.end());
  }
}

void MoveExecutor::submit_device_moves(CopyBatch batch, std::vector<DeviceMove> copying) {
  // Shared: the copy's completion is a std::function, which must be copyable.
  auto started = std::make_shared<std::vector<DeviceMove>>(std::move(copying));
  ++copies_;
  Status submitted = hooks_.copy(std::move(batch), [this, started](Status status) {
    --copies_;
    std::vector<BlockKey> onward[kTierCount];
    for (DeviceMove& move : *started) {
      const BlockKey key = move.move.key();
      if (!status.is_ok()) {
        move.move.abort();
        hooks_.not_moved(key);
        continue;
      }
      move.move.commit();
      counters_.bytes_written[static_cast<size_t>(move.to)] += move.bytes;
      (move.kind == policy::MoveKind::kDemote ? counters_.bytes_demoted
                                              : counters_.bytes_promoted) += move.bytes;
      if (move.onward != Tier::kNone) onward[static_cast<size_t>(move.onward)].push_back(key);
    }
    if (!status.is_ok())
      KVTIER_LOG_WARN("{} block moves failed: {}", started->size(), status.to_string());
    for (size_t to = 0; to < kTierCount; ++to) {
      if (!onward[to].empty()) write_into(*tiers_[to], onward[to]);
    }
    settled();
  });
  if (!submitted.is_ok()) {
    --copies_;
    for (DeviceMove& move : *started) {
      const BlockKey key = move.move.key();
      move.move.abort();
      hooks_.not_moved(key);
    }
    KVTIER_LOG_ERROR("block moves rejected: {}", submitted.to_string());
  }
}

void MoveExecutor::count_read_up(const BlockKey& key) {
  const uint64_t bytes = store_.block_bytes(key.layout);
  counters_.bytes_promoted += bytes;
  if (const auto info = store_.lookup(key)) {
    counters_.bytes_written[static_cast<size_t>(info->location.tier)] += bytes;
  }
}

bool MoveExecutor::move_onto_copy(const BlockKey& key, Tier to) {
  const std::optional<BlockLocation> copy = store_.copy_of(key);
  if (!copy || copy->tier != to) return false;
  auto moved = store_.demote_onto_copy(key);
  if (!moved.is_ok()) {
    KVTIER_LOG_DEBUG("move of {} onto its copy skipped: {}", key.hash.to_hex(),
                     moved.status().to_string());
    hooks_.not_moved(key);
    return true;
  }
  // Nothing is written, so the copy's index record keeps the access time it was
  // written with: after a restart the block looks as old as its last write to NVMe and
  // is an earlier eviction candidate than it should be. Rewriting the record would cost
  // an index write per demotion, which is what copies are there to save.
  counters_.bytes_demoted_onto_copy += store_.block_bytes(key.layout);
  return true;
}

void MoveExecutor::evict(const std::vector<BlockKey>& keys, bool lost) {
  std::vector<BlockKey> removed;
  for (const BlockKey& key : keys) {
    if (!store_.evict(key)) continue;
    removed.push_back(key);
    ++(lost ? counters_.blocks_lost : counters_.blocks_evicted);
  }
  if (!removed.empty()) hooks_.removed(removed, lost);
  release_slots();
  if (!removed.empty()) retry_room_waiters();
}

void MoveExecutor::write_into(StorageTier& to, const std::vector<BlockKey>& keys) {
  if (keys.empty()) return;
  if (writes_paused() || !to.writable()) {
    for (const BlockKey& key : keys) hooks_.not_moved(key);  // after the pause, or the heal
    return;
  }
  if (to.release_is_durable()) hooks_.before_persistent_write();
  std::vector<StorageTier::WriteItem> items;
  std::vector<BlockKey> started;     // written or moved onto a copy
  std::vector<PendingMove> writing;  // parallel to items
  uint64_t needed_bytes = 0;
  for (const BlockKey& key : keys) {
    auto info = store_.lookup(key);
    if (!info || info->state != BlockState::kReady || info->location.tier == to.id()) continue;
    if (info->has_copy && move_onto_copy(key, to.id())) {
      started.push_back(key);  // not a write, but done: not reported as not moved
      continue;
    }
    const std::byte* source = tier(info->location.tier)->host_address(info->location.offset);
    if (source == nullptr) continue;  // GPU memory: through RAM (apply)
    const uint64_t bytes = store_.block_bytes(key.layout);
    if (needed_bytes > 0 || !store_.has_room(to.id(), bytes)) {
      needed_bytes += bytes;
      continue;
    }
    auto pending = store_.begin_move(key, to.id());
    if (!pending.is_ok()) continue;
    items.push_back({{key, pending->location().offset, bytes},
                     source,
                     hooks_.wall_ms_of(info->last_access_ms)});
    started.push_back(key);
    writing.push_back(std::move(*pending));
  }
  if (started.size() < keys.size()) {
    // Blocks that could not start now (no room yet, busy): planned again later.
    std::unordered_set<BlockKey, BlockKeyHasher> going(started.begin(), started.end());
    for (const BlockKey& key : keys) {
      if (!going.contains(key)) hooks_.not_moved(key);
    }
  }
  if (needed_bytes > 0) {
    // The tier is full: copies go first (they are redundant), then its coldest blocks.
    // Their slots are reusable once released (durably, on NVMe), so the blocks that did
    // not fit wait for a later plan; the planner's view counts slots being released and
    // copies as free, so nothing goes twice and no block goes for room copies give.
    const uint64_t capacity = to.capacity_bytes();
    const uint64_t wanted = std::min(needed_bytes, capacity / 2);
    // Slots already on their way back (copies dropped by an earlier write) count.
    const uint64_t being_freed = store_.unconfirmed_release_bytes(to.id());
    const uint64_t dropped =
        wanted > being_freed ? store_.drop_copies(to.id(), wanted - being_freed) : 0;
    if (dropped > 0) {
      counters_.copy_bytes_dropped += dropped;
      release_slots();
    }
    if (being_freed + dropped < wanted) {
      auto victims = hooks_.room_by_demotion(to.id(), wanted);
      if (!victims.empty()) apply(victims);
    }
  }
  if (writing.size() < started.size()) retry_room_waiters();  // moves onto copies freed slots
  submit_writes(to, std::move(items), std::move(writing), /*copies=*/false);
}

size_t MoveExecutor::copy_down(std::span<const BlockKey> keys, Tier to_id) {
  StorageTier* to = tier(to_id);
  if (to == nullptr || !accepts_writes(to_id)) return 0;
  std::vector<StorageTier::WriteItem> items;
  std::vector<PendingMove> writing;  // parallel to items
  for (const BlockKey& key : keys) {
    auto info = store_.lookup(key);
    if (!info || info->state != BlockState::kReady || info->has_copy ||
        info->location.tier >= to_id) {
      continue;
    }
    const std::byte* source = tier(info->location.tier)->host_address(info->location.offset);
    if (source == nullptr) continue;  // GPU memory: its copy is written once it is in RAM
    const uint64_t bytes = store_.block_bytes(key.layout);
    // A copy never takes room a block needs: none is made for it.
    if (!store_.has_room(to_id, bytes)) break;
    auto pending = store_.begin_copy_down(key, to_id);
    if (!pending.is_ok()) continue;
    items.push_back({{key, pending->location().offset, bytes},
                     source,
                     hooks_.wall_ms_of(info->last_access_ms)});
    writing.push_back(std::move(*pending));
  }
  const size_t started = items.size();
  if (started == 0) return 0;
  if (to->release_is_durable()) hooks_.before_persistent_write();
  submit_writes(*to, std::move(items), std::move(writing), /*copies=*/true);
  return started;
}

void MoveExecutor::submit_writes(StorageTier& to, std::vector<StorageTier::WriteItem> items,
                                 std::vector<PendingMove> writing, bool copies) {
  const Tier to_id = to.id();
  for_each_job(
      items, writing, [&](std::vector<StorageTier::WriteItem> job, std::vector<PendingMove> moves) {
        ++jobs_;
        auto post = hooks_.control_thread();
        // Shared: the completions are std::function, which must be copyable.
        auto job_moves = std::make_shared<std::vector<PendingMove>>(std::move(moves));
        to.write(std::move(job), [this, post, job_moves, to_id,
                                  copies](std::vector<Status> results) {
          post([this, job_moves, to_id, copies, results = std::move(results)] {
            --jobs_;
            size_t failed = 0;
            const Status* first_error = nullptr;
            std::vector<BlockKey> job_keys;
            for (size_t i = 0; i < job_moves->size(); ++i) {
              PendingMove& move = (*job_moves)[i];
              job_keys.push_back(move.key());
              const bool ok = results[i].is_ok();
              ok ? move.commit() : move.abort();
              if (ok) {
                const uint64_t bytes = store_.block_bytes(job_keys[i].layout);
                (copies ? counters_.bytes_copied_down : counters_.bytes_demoted) += bytes;
                counters_.bytes_written[static_cast<size_t>(to_id)] += bytes;
                continue;
              }
              ++failed;
              if (!copies) hooks_.not_moved(job_keys[i]);
              if (first_error == nullptr) first_error = &results[i];
              if (draining_ && !copies) drain_failed_.insert(job_keys[i]);
            }
            if (failed == 0) {
              write_backoff_ms_ = 0;
            } else {
              counters_.write_errors += failed;
              write_backoff_ms_ = std::clamp(write_backoff_ms_ * 2, kFirstBackoffMs, kMaxBackoffMs);
              write_paused_until_ms_ = hooks_.now_ms() + write_backoff_ms_;
              KVTIER_LOG_WARN(
                  "{} tier: {} of {} block {} failed; those blocks stay where they "
                  "were and writes to it pause for {} ms: {}",
                  tier_name(to_id), failed, job_keys.size(), copies ? "copies" : "writes",
                  write_backoff_ms_, first_error->to_string());
            }
            release_slots();  // a failed write gave its slot back
            settled();
          });
        });
      });
}

std::vector<BlockKey> MoveExecutor::read_into_memory(const std::vector<BlockKey>& keys) {
  std::vector<BlockKey> running;
  std::array<std::vector<BlockKey>, kTierCount> by_tier{};
  for (const BlockKey& key : keys) {
    if (reads_.contains(key)) {
      running.push_back(key);
      continue;
    }
    auto info = store_.lookup(key);
    if (!info || copies_by_device(info->location.tier)) continue;
    by_tier[static_cast<size_t>(info->location.tier)].push_back(key);
  }
  for (size_t from = 0; from < kTierCount; ++from) {
    if (by_tier[from].empty() || tiers_[from] == nullptr) continue;
    read_from(*tiers_[from], by_tier[from], Tier::kRam);
    for (const BlockKey& key : by_tier[from]) {
      if (reads_.contains(key)) running.push_back(key);
    }
  }
  return running;
}

void MoveExecutor::read_from(StorageTier& from, const std::vector<BlockKey>& keys, Tier target) {
  std::vector<StorageTier::ReadItem> items;
  std::vector<PendingMove> started;  // parallel to items
  for (const BlockKey& key : keys) {
    if (reads_.contains(key)) continue;
    auto info = store_.lookup(key);
    if (!info || info->location.tier != from.id() || info->state != BlockState::kReady) continue;
    const uint64_t bytes = store_.block_bytes(key.layout);
    // A tier read lands in host memory only: the target when it is host memory with
    // room, else RAM, and on to the target after the read. With RAM full, HBM when it
    // is host memory (the host backend) and has room: a Load of more blocks than RAM
    // holds would otherwise wait for slots its own pins keep.
    Tier destination =
        in_host_memory(target) && store_.has_room(target, bytes) ? target : Tier::kRam;
    if (!store_.has_room(destination, bytes) && in_host_memory(Tier::kHbm) &&
        store_.has_room(Tier::kHbm, bytes)) {
      destination = Tier::kHbm;
    }
    if (!in_host_memory(destination) || !store_.has_room(destination, bytes)) continue;
    auto pending = store_.begin_move(key, destination);
    if (!pending.is_ok()) continue;
    items.push_back({{key, pending->from().offset, bytes},
                     tier(destination)->host_address(pending->location().offset)});
    started.push_back(std::move(*pending));
    reads_[key];  // readers waiting for it attach here
    if (destination != target && !in_host_memory(target)) continue_to_hbm_.insert(key);
  }
  for_each_job(
      items, started, [&](std::vector<StorageTier::ReadItem> job, std::vector<PendingMove> moves) {
        ++jobs_;
        auto post = hooks_.control_thread();
        // Shared: the completions are std::function, which must be copyable.
        auto job_moves = std::make_shared<std::vector<PendingMove>>(std::move(moves));
        from.read(std::move(job),
                  [this, post, job_moves, target](std::vector<StorageTier::ReadOutcome> outcomes) {
                    post([this, job_moves, target, outcomes = std::move(outcomes)] {
                      --jobs_;
                      std::vector<BlockKey> lost;
                      std::vector<policy::Move> onward;
                      for (size_t i = 0; i < job_moves->size(); ++i) {
                        PendingMove& move = (*job_moves)[i];
                        const BlockKey key = move.key();
                        const StorageTier::ReadOutcome& outcome = outcomes[i];
                        const bool ok = outcome.status.is_ok();
                        ok ? move.commit() : move.abort();
                        const bool continues = continue_to_hbm_.erase(key) > 0;
                        if (ok) {
                          count_read_up(key);
                          if (continues) {
                            onward.push_back({policy::MoveKind::kPromote, key, Tier::kRam, target});
                          }
                        } else if (outcome.corrupt) {
                          KVTIER_LOG_WARN("dropping a block whose bytes are lost: {}",
                                          outcome.status.message());
                          lost.push_back(key);
                        } else {
                          ++counters_.read_errors;
                          KVTIER_LOG_WARN("reading a block failed (kept; may be retried): {}",
                                          outcome.status.message());
                        }
                        auto waiting = reads_.extract(key);
                        if (!waiting.empty()) {
                          for (const auto& waiter : waiting.mapped()) waiter(outcome.status);
                        }
                      }
                      if (!lost.empty()) evict(lost, /*lost=*/true);
                      if (!onward.empty()) apply(onward);
                      release_slots();  // the slots of blocks that left a durable tier
                      settled();
                    });
                  });
      });
}

void MoveExecutor::await_readable(const BlockKey& key, std::function<void(const Status&)> waiter) {
  if (!reads_.contains(key)) {
    (void)read_into_memory({key});
    if (!reads_.contains(key) && store_.lookup(key)) {
      // An engine is waiting: make room in RAM as a save would (coldest blocks first;
      // the blocks this Load already pinned are not candidates).
      auto victims = hooks_.room_by_demotion(Tier::kRam, store_.block_bytes(key.layout));
      if (!victims.empty()) {
        apply(victims);
        (void)read_into_memory({key});
      }
    }
  }
  if (!reads_.contains(key)) {
    const auto info = store_.lookup(key);
    if (!info) {
      waiter(not_found("block {} was evicted before it could be read", key.hash.to_hex()));
    } else if (in_host_memory(info->location.tier) && info->state == BlockState::kReady) {
      waiter(Status::ok());  // it came up meanwhile (another Load, BeginTurn, the planner)
    } else if (room_waiters_.size() >= kMaxRoomWaiters) {
      waiter(resource_exhausted(
          "block {} is in the {} tier and neither RAM nor HBM has a free slot to read it into, "
          "and {} reads already wait for one; retry",
          key.hash.to_hex(), tier_name(info->location.tier), room_waiters_.size()));
    } else {
      room_waiters_.emplace_back(key, std::move(waiter));
    }
    return;
  }
  reads_[key].push_back(std::move(waiter));
}

void MoveExecutor::settled() {
  retry_room_waiters();
  hooks_.settled();
}

void MoveExecutor::retry_room_waiters() {
  // await_readable may make room, whose moves finish later and call back here.
  if (retrying_room_waiters_ || room_waiters_.empty()) return;
  retrying_room_waiters_ = true;
  auto waiting = std::exchange(room_waiters_, {});
  while (!waiting.empty()) {
    auto [key, waiter] = std::move(waiting.front());
    waiting.pop_front();
    const size_t before = room_waiters_.size();
    await_readable(key, std::move(waiter));
    if (room_waiters_.size() > before) {
      // Still no room: neither has anyone behind it (they keep their order).
      while (!waiting.empty()) {
        room_waiters_.push_back(std::move(waiting.front()));
        waiting.pop_front();
      }
    }
  }
  retrying_room_waiters_ = false;
}

void MoveExecutor::release_slots() {
  std::vector<BlockStore::PendingRelease> pending = store_.take_pending_releases();
  pending.insert(pending.end(), failed_releases_.begin(), failed_releases_.end());
  failed_releases_.clear();
  if (pending.empty()) return;
  std::array<std::vector<BlockStore::PendingRelease>, kTierCount> by_tier{};
  for (BlockStore::PendingRelease& release : pending) {
    by_tier[static_cast<size_t>(release.location.tier)].push_back(std::move(release));
  }
  for (size_t t = 0; t < kTierCount; ++t) {
    if (by_tier[t].empty()) continue;
    std::vector<StorageTier::Slot> slots;
    slots.reserve(by_tier[t].size());
    for (const BlockStore::PendingRelease& release : by_tier[t]) {
      slots.push_back({release.key, release.location.offset, release.bytes});
    }
    ++jobs_;
    auto post = hooks_.control_thread();
    tiers_[t]->release(
        std::move(slots), [this, post, released = std::move(by_tier[t])](Status status) {
          post([this, released, status] {
            --jobs_;
            if (status.is_ok()) {
              for (const BlockStore::PendingRelease& release : released) {
                store_.confirm_release(release.location, release.bytes);
              }
            } else {
              // The slots stay reserved: reusing one while an index entry may still name it
              // could pair that entry with another block's bytes. Retried with the next.
              uint64_t held_back = 0;
              if (release_warnings_.allow(&held_back)) {
                KVTIER_LOG_WARN(
                    "releasing {} slots failed, retrying later: {} ({} more since the last such "
                    "line)",
                    released.size(), status.to_string(), held_back);
              }
              failed_releases_.insert(failed_releases_.end(), released.begin(), released.end());
            }
            settled();
          });
        });
  }
}

}  // namespace kvtier
