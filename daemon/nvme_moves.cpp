// Moves to and from the NVMe tier. The pattern is the Device copies' (data_path.cpp):
// begin_move on the control thread (the block stays readable where it is, pinned),
// the I/O on the tier's workers, finish_move back on the control thread. A demotion is
// published only after the tier committed the index entry, so an acknowledged block
// is never in a state a crash can corrupt; a failed demotion leaves the block where
// it was.
#include <algorithm>
#include <unordered_set>

#include "common/log.h"
#include "common/units.h"
#include "daemon/persistence.h"
#include "daemon/service.h"

namespace kvtier::daemon {
namespace {

// Blocks per tier job: big enough to amortize the sync and the index commit, small
// enough that demoted blocks become visible (and RAM frees up) in steps.
constexpr size_t kMaxBlocksPerJob = 32;
constexpr uint64_t kMaxBytesPerJob = 128ull << 20;
constexpr uint64_t kFirstBackoffMs = 500;
constexpr uint64_t kMaxBackoffMs = 30'000;

// Splits parallel vectors into jobs of at most kMaxBlocksPerJob / kMaxBytesPerJob.
template <typename Item, typename Fn>
void for_each_job(std::vector<Item>& items, std::vector<BlockKey>& keys, Fn&& submit) {
  size_t begin = 0;
  while (begin < items.size()) {
    size_t end = begin;
    uint64_t bytes = 0;
    while (end < items.size() && end - begin < kMaxBlocksPerJob &&
           (end == begin || bytes + items[end].bytes <= kMaxBytesPerJob)) {
      bytes += items[end].bytes;
      ++end;
    }
    submit(std::vector<Item>(std::make_move_iterator(items.begin() + begin),
                             std::make_move_iterator(items.begin() + end)),
           std::vector<BlockKey>(keys.begin() + begin, keys.begin() + end));
    begin = end;
  }
}

}  // namespace

void Service::demote_to_nvme(const std::vector<BlockKey>& keys) {
  if (!nvme_ || keys.empty()) return;
  if (!nvme_->draining() && now_ms() < nvme_->write_paused_until_ms) {
    for (const BlockKey& key : keys) planner_.revisit(sessions_, key);  // after the pause
    return;
  }
  // Session records first (the writer keeps order): an index that names a block
  // always comes with the session record that refers to it.
  flush_sessions(false);
  const uint64_t steady_now = now_ms();
  const uint64_t wall_now = wall_now_ms();
  std::vector<NvmeTier::WriteItem> items;
  std::vector<BlockKey> started;
  uint64_t needed_bytes = 0;
  for (const BlockKey& key : keys) {
    auto info = store_->lookup(key);
    if (!info || info->state != BlockState::kReady || info->location.tier == Tier::kNvme) continue;
    const std::shared_ptr<Memory>& memory = store_->memory(info->location.tier);
    if (memory == nullptr || memory->host_data() == nullptr) continue;  // GPU: via RAM
    const uint64_t bytes = store_->block_bytes(key.layout);
    if (needed_bytes > 0 || !store_->has_room(Tier::kNvme, bytes)) {
      needed_bytes += bytes;
      continue;
    }
    auto locations = store_->begin_move(key, Tier::kNvme);
    if (!locations.is_ok()) continue;
    const auto& [from, to] = *locations;
    items.push_back({nvme_key(key), memory->host_data() + from.offset, bytes, to.offset,
                     steady_to_wall_ms(info->last_access_ms, steady_now, wall_now)});
    started.push_back(key);
  }
  if (started.size() < keys.size()) {
    // Blocks that could not start now (no room yet, busy): planned again later.
    std::unordered_set<BlockKey, BlockKeyHasher> going(started.begin(), started.end());
    for (const BlockKey& key : keys) {
      if (!going.contains(key)) planner_.revisit(sessions_, key);
    }
  }
  if (needed_bytes > 0) {
    // NVMe is full: its coldest blocks go. Their slots are reusable once their index
    // entries are deleted durably, so the blocks that did not fit wait for a later
    // plan; the view counts slots being released as free, so nothing is evicted twice.
    const uint64_t capacity = store_->usage(Tier::kNvme).capacity_bytes;
    auto victims =
        planner_.make_room(Tier::kNvme, std::min(needed_bytes, capacity / 2), sessions_, *view_);
    if (!victims.empty()) apply_moves(victims);
  }
  for_each_job(
      items, started, [this](std::vector<NvmeTier::WriteItem> job, std::vector<BlockKey> job_keys) {
        ++nvme_->write_jobs;
        nvme_->tier->write_blocks(
            std::move(job),
            on_control_thread<std::vector<Status>>(
                io_, [this, job_keys](std::vector<Status> results) {
                  --nvme_->write_jobs;
                  size_t failed = 0;
                  const Status* first_error = nullptr;
                  for (size_t i = 0; i < job_keys.size(); ++i) {
                    const bool ok = results[i].is_ok();
                    store_->finish_move(job_keys[i], ok);
                    if (ok) {
                      counters_.bytes_demoted += store_->block_bytes(job_keys[i].layout);
                      continue;
                    }
                    ++failed;
                    planner_.revisit(sessions_, job_keys[i]);
                    if (first_error == nullptr) first_error = &results[i];
                    if (nvme_->draining()) nvme_->drain_failed.insert(job_keys[i]);
                  }
                  if (failed == 0) {
                    nvme_->write_backoff_ms = 0;
                  } else {
                    nvme_->write_errors += failed;
                    nvme_->write_backoff_ms =
                        std::clamp(nvme_->write_backoff_ms * 2, kFirstBackoffMs, kMaxBackoffMs);
                    nvme_->write_paused_until_ms = now_ms() + nvme_->write_backoff_ms;
                    KVTIER_LOG_WARN(
                        "NVMe tier: {} of {} block writes failed; those blocks stay where they "
                        "were and "
                        "demotions to NVMe pause for {}: {}",
                        failed, job_keys.size(), format_duration_ms(nvme_->write_backoff_ms),
                        first_error->to_string());
                  }
                  release_nvme_slots();  // a failed write gave its NVMe slot back
                  check_drain();
                }));
      });
}

std::vector<BlockKey> Service::promote_from_nvme(const std::vector<BlockKey>& keys, Tier target) {
  std::vector<BlockKey> running;
  if (!nvme_) return running;
  auto host_memory = [this](Tier tier) {
    const std::shared_ptr<Memory>& memory = store_->memory(tier);
    return memory != nullptr && memory->host_data() != nullptr;
  };
  std::vector<NvmeTier::ReadItem> items;
  std::vector<BlockKey> started;
  for (const BlockKey& key : keys) {
    if (nvme_->reads.contains(key)) {
      running.push_back(key);
      continue;
    }
    auto info = store_->lookup(key);
    if (!info || info->location.tier != Tier::kNvme || info->state != BlockState::kReady) continue;
    const uint64_t bytes = store_->block_bytes(key.layout);
    // The drive writes into host memory only: HBM directly when it is host memory
    // (host backend), else RAM, and on to HBM after the read.
    Tier destination = host_memory(target) && store_->has_room(target, bytes) ? target : Tier::kRam;
    if (!host_memory(destination) || !store_->has_room(destination, bytes)) continue;
    auto locations = store_->begin_move(key, destination);
    if (!locations.is_ok()) continue;
    const auto& [from, to] = *locations;
    items.push_back(
        {nvme_key(key), store_->memory(destination)->host_data() + to.offset, bytes, from.offset});
    started.push_back(key);
    nvme_->reads[key];  // readers waiting for it attach here
    if (target == Tier::kHbm && destination != Tier::kHbm && !host_memory(Tier::kHbm)) {
      nvme_->continue_to_hbm.insert(key);
    }
    running.push_back(key);
  }
  for_each_job(
      items, started, [this](std::vector<NvmeTier::ReadItem> job, std::vector<BlockKey> job_keys) {
        ++nvme_->read_jobs;
        nvme_->tier->read_blocks(
            std::move(job),
            on_control_thread<std::vector<NvmeTier::ReadOutcome>>(
                io_, [this, job_keys](std::vector<NvmeTier::ReadOutcome> outcomes) {
                  --nvme_->read_jobs;
                  std::vector<BlockKey> lost;
                  std::vector<policy::Move> onward;
                  for (size_t i = 0; i < job_keys.size(); ++i) {
                    const BlockKey& key = job_keys[i];
                    const NvmeTier::ReadOutcome& outcome = outcomes[i];
                    const bool ok = outcome.status.is_ok();
                    store_->finish_move(key, ok);
                    const bool continues = nvme_->continue_to_hbm.erase(key) > 0;
                    if (ok) {
                      counters_.bytes_promoted += store_->block_bytes(key.layout);
                      if (continues)
                        onward.push_back({policy::MoveKind::kPromote, key, Tier::kRam, Tier::kHbm});
                    } else if (outcome.corrupt) {
                      KVTIER_LOG_WARN("NVMe tier: dropping a block whose bytes are lost: {}",
                                      outcome.status.message());
                      lost.push_back(key);
                    } else {
                      ++nvme_->read_errors;
                      KVTIER_LOG_WARN(
                          "NVMe tier: reading a block failed (kept; may be retried): {}",
                          outcome.status.message());
                    }
                    auto waiting = nvme_->reads.extract(key);
                    if (!waiting.empty()) {
                      for (const NvmeReadWaiter& waiter : waiting.mapped()) waiter(outcome.status);
                    }
                  }
                  if (!lost.empty()) drop_lost_blocks(lost);
                  if (!onward.empty()) apply_moves(onward);
                  release_nvme_slots();  // the NVMe slots of promoted blocks
                  check_drain();
                }));
      });
  return running;
}

void Service::await_nvme_block(const BlockKey& key, std::function<void(const Status&)> waiter) {
  if (nvme_ && !nvme_->reads.contains(key)) {
    (void)promote_from_nvme({key}, Tier::kRam);
    if (!nvme_->reads.contains(key) && store_->lookup(key)) {
      // An engine is waiting: make room in RAM as a save would (coldest blocks first;
      // the blocks this Load already pinned are not candidates).
      auto victims =
          planner_.make_room(Tier::kRam, store_->block_bytes(key.layout), sessions_, *view_);
      if (!victims.empty()) {
        apply_moves(victims);
        (void)promote_from_nvme({key}, Tier::kRam);
      }
    }
  }
  if (!nvme_ || !nvme_->reads.contains(key)) {
    waiter(resource_exhausted(
        "block {} is on NVMe and neither RAM nor HBM has a free slot to read it into; retry",
        key.hash.to_hex()));
    return;
  }
  nvme_->reads[key].push_back(std::move(waiter));
}

}  // namespace kvtier::daemon
