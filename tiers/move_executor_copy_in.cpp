// MoveExecutor's copies in: blocks this node lacks read out of the key-addressed tier into
// memory (move_executor.h says where they land and when they are published).
#include <algorithm>
#include <deque>

#include "tiers/move_executor.h"

namespace kvtier {

// One copy_in call's reads: the keys it started, read in chunks of at most
// kCopyInChunkBytes with at most `window` chunks at the tier at once, so a prefix of any
// length is read (in turn) and slots are reserved only as their chunk starts.
struct MoveExecutor::CopyIn {
  std::deque<BlockKey> to_read;
  size_t chunks_in_flight = 0;
};

void MoveExecutor::copy_in(const std::vector<BlockKey>& keys,
                           std::function<void(size_t, const Status&)> done) {
  auto answer = std::make_shared<std::function<void(size_t, const Status&)>>(std::move(done));
  if (spill_tier_ == nullptr || !spill_tier_->reachable()) {
    for (size_t i = 0; i < keys.size(); ++i) {
      (*answer)(i, store_.lookup(keys[i]) ? Status::ok()
                                          : unavailable("the remote tier is not connected"));
    }
    return;
  }
  std::vector<std::pair<size_t, Status>> at_once;
  auto copy = std::make_shared<CopyIn>();
  for (size_t i = 0; i < keys.size(); ++i) {
    const BlockKey& key = keys[i];
    auto waiter = [answer, i](const Status& status) { (*answer)(i, status); };
    if (auto it = copying_in_.find(key); it != copying_in_.end()) {
      it->second.push_back(std::move(waiter));  // joins the read already under way
      continue;
    }
    if (store_.lookup(key)) {
      at_once.emplace_back(i, Status::ok());
      continue;
    }
    copying_in_[key].push_back(std::move(waiter));
    copy->to_read.push_back(key);
  }
  pump_copy_in(copy);
  for (const auto& [i, status] : at_once) (*answer)(i, status);
}

Result<std::optional<PendingWrite>> MoveExecutor::reserve_for_copy_in(const BlockKey& key,
                                                                      uint64_t bytes) {
  // The memory tiers the tier can write into, lowest first (RAM before host HBM).
  std::vector<Tier> into;
  for (size_t t = tiers_.size(); t-- > 0;) {
    if (in_host_memory(static_cast<Tier>(t))) into.push_back(static_cast<Tier>(t));
  }
  if (into.empty()) return not_supported("no host memory tier to read remote blocks into");
  auto reserved = store_.reserve(key, into, hooks_.now_ms());
  if (reserved.is_ok() || reserved.status().code() != StatusCode::kResourceExhausted) {
    return reserved;
  }
  for (Tier tier : into) {
    auto moves = hooks_.room_by_eviction(tier, bytes);
    if (moves.empty()) continue;
    apply(moves);
    return store_.reserve(key, into, hooks_.now_ms());
  }
  return reserved;
}

void MoveExecutor::settle_copy_in(const BlockKey& key, PendingWrite* slot, const Status& status) {
  if (slot != nullptr) {
    if (status.is_ok()) {
      slot->commit();
    } else {
      slot->abort();
    }
    hooks_.inserted(key, status.is_ok());
  }
  ++(status.is_ok() ? counters_.copied_in_blocks : counters_.copy_in_misses);
  auto it = copying_in_.find(key);
  if (it == copying_in_.end()) return;
  auto waiters = std::move(it->second);
  copying_in_.erase(it);
  for (auto& waiter : waiters) waiter(status);
}

void MoveExecutor::pump_copy_in(const std::shared_ptr<CopyIn>& copy) {
  const uint64_t chunk_limit = std::min(kCopyInChunkBytes, max_in_flight_bytes_);
  const size_t window =
      std::max<uint64_t>(1, max_in_flight_bytes_ / std::max<uint64_t>(chunk_limit, 1));
  while (copy->chunks_in_flight < window && !copy->to_read.empty()) {
    std::vector<StorageTier::ReadItem> reads;
    auto slots = std::make_shared<std::vector<PendingWrite>>();
    auto started = std::make_shared<std::vector<BlockKey>>();
    uint64_t bytes = 0;
    while (!copy->to_read.empty()) {
      const BlockKey key = copy->to_read.front();
      const uint64_t block_bytes = store_.block_bytes(key.layout);
      if (!started->empty() && bytes + block_bytes > chunk_limit) break;
      copy->to_read.pop_front();
      auto reserved = reserve_for_copy_in(key, block_bytes);
      if (!reserved.is_ok() || !*reserved) {
        // No room, or present meanwhile but not visible (a Save is writing it).
        settle_copy_in(
            key, nullptr,
            reserved.is_ok() ? unavailable("it is being saved; retry") : reserved.status());
        continue;
      }
      PendingWrite& slot = **reserved;
      std::byte* into = tier(slot.location().tier)->host_address(slot.location().offset);
      reads.push_back({{key, 0, block_bytes}, into});
      slots->push_back(std::move(slot));
      started->push_back(key);
      bytes += block_bytes;
    }
    if (reads.empty()) continue;
    ++copy->chunks_in_flight;
    // Every started read ends once: its slot committed or given back, its waiters told.
    auto post = hooks_.control_thread();
    auto settle = [this, slots, started, copy](std::vector<StorageTier::ReadOutcome> outcomes) {
      fit_answer(outcomes, started->size(),
                 StorageTier::ReadOutcome{internal_error("the tier gave no answer"), false});
      for (size_t j = 0; j < started->size(); ++j) {
        settle_copy_in((*started)[j], &(*slots)[j], outcomes[j].status);
      }
      --copy->chunks_in_flight;
      pump_copy_in(copy);
      settled();
    };
    if (!spill_tier_->try_read(std::move(reads),
                               [post, settle](std::vector<StorageTier::ReadOutcome> outcomes) {
                                 post([settle, outcomes = std::move(outcomes)]() mutable {
                                   settle(std::move(outcomes));
                                 });
                               })) {
      // Other reads hold the tier's bound: this chunk and the rest are not read now.
      --copy->chunks_in_flight;
      const Status busy =
          resource_exhausted("the remote tier has as many bytes in flight as it may; retry");
      for (size_t j = 0; j < started->size(); ++j) {
        settle_copy_in((*started)[j], &(*slots)[j], busy);
      }
      while (!copy->to_read.empty()) {
        const BlockKey key = copy->to_read.front();
        copy->to_read.pop_front();
        settle_copy_in(key, nullptr, busy);
      }
      return;
    }
  }
}

}  // namespace kvtier
