// MoveExecutor's spills: evictions out of NVMe written to the key-addressed tier below
// first (move_executor.h says when and why).
#include <algorithm>

#include "tiers/move_executor.h"

namespace kvtier {
namespace {

Status no_answer() {
  return internal_error("the tier gave no answer for this block");
}

}  // namespace

// NVMe evictions being written to the spill tier first: each block pinned (its slot
// stays, and the planner leaves it alone) until it is written there or given up.
struct MoveExecutor::Spill {
  struct Block {
    BlockKey key;
    PinnedBlock pin;  // empty once finished
    uint64_t bytes = 0;
    // As the eviction was planned: a block used since (read, or taken by a session) is
    // not evicted after all.
    uint64_t last_access_ms = 0;
    uint32_t session_refs = 0;
  };
  std::vector<Block> blocks;
  size_t open = 0;  // blocks not finished yet
};

void MoveExecutor::attach_spill_tier(StorageTier& tier, uint64_t max_in_flight_bytes,
                                     std::shared_ptr<Memory> staging, uint64_t staging_slot_bytes) {
  spill_tier_ = &tier;
  max_in_flight_bytes_ = max_in_flight_bytes;
  if (staging != nullptr && staging_slot_bytes > 0) {
    staging_slots_ = std::make_shared<SlabAllocator>(staging->size_bytes(), staging_slot_bytes);
    staging_ = std::move(staging);
  }
}

uint64_t MoveExecutor::leaving_bytes(Tier tier) const {
  return tier == Tier::kNvme ? spilling_bytes_ : 0;
}

std::vector<BlockKey> MoveExecutor::spill(std::vector<BlockKey> keys) {
  if (spills_stopped_ || !spill_tier_->reachable()) {
    // Counted as evicted unwritten: those evict() will take (ready, unpinned).
    for (const BlockKey& key : keys) {
      const auto info = store_.lookup(key);
      if (info && info->state == BlockState::kReady && info->pins == 0) {
        ++counters_.spill_unwritten_blocks;
      }
    }
    return keys;
  }
  auto spill = std::make_shared<Spill>();
  std::vector<BlockKey> rest;
  std::vector<StorageTier::Slot> asked;
  for (BlockKey& key : keys) {
    const auto info = store_.lookup(key);
    // What evict() refuses (pinned, moving) it refuses either way.
    if (!info || info->state != BlockState::kReady || info->pins > 0 ||
        info->location.tier != Tier::kNvme) {
      rest.push_back(std::move(key));
      continue;
    }
    const uint64_t bytes = store_.block_bytes(key.layout);
    if (spilling_bytes_ + bytes > max_in_flight_bytes_) {
      ++counters_.spill_unwritten_blocks;  // the tier is not keeping up: local room first
      rest.push_back(std::move(key));
      continue;
    }
    PinnedBlock pin = store_.pin_in_background(key);
    if (!pin) {
      rest.push_back(std::move(key));
      continue;
    }
    spilling_bytes_ += bytes;
    asked.push_back({key, 0, bytes});
    spill->blocks.push_back(
        {std::move(key), std::move(pin), bytes, info->last_access_ms, info->session_refs});
  }
  if (spill->blocks.empty()) return rest;
  spill->open = spill->blocks.size();
  spills_.insert(spill);
  // Most blocks were written behind at the end of their turn: only the others are read.
  auto post = hooks_.control_thread();
  spill_tier_->probe(std::move(asked), [this, post, spill](std::vector<Result<bool>> found) {
    post([this, spill, found = std::move(found)]() mutable {
      fit_answer(found, spill->blocks.size(), Result<bool>(no_answer()));
      std::vector<size_t> missing;
      std::vector<size_t> done;
      for (size_t i = 0; i < found.size(); ++i) {
        if (!spill->blocks[i].pin) continue;  // given up (a stop), counted and evicted then
        if (found[i].is_ok() && !*found[i]) {
          missing.push_back(i);
          continue;
        }
        // There already, or the tier did not say: evicted without a write.
        ++(found[i].is_ok() ? counters_.spill_present_blocks : counters_.spill_unwritten_blocks);
        done.push_back(i);
      }
      finish_spill(spill, done);
      for (size_t begin = 0; begin < missing.size(); begin += kBlocksPerBufferedRead) {
        const size_t end = std::min(missing.size(), begin + kBlocksPerBufferedRead);
        spill_missing(spill, {missing.begin() + begin, missing.begin() + end});
      }
    });
  });
  return rest;
}

void MoveExecutor::spill_missing(const std::shared_ptr<Spill>& spill, std::vector<size_t> missing) {
  std::erase_if(missing, [&](size_t i) { return !spill->blocks[i].pin; });  // given up
  if (missing.empty()) return;
  StorageTier* nvme = tier(Tier::kNvme);
  uint64_t total = 0;
  for (size_t i : missing) total += spill->blocks[i].bytes;
  std::shared_ptr<std::byte> buffer = allocate_io_buffer(io_buffer_bytes(total));
  if (nvme == nullptr || buffer == nullptr) {
    counters_.spill_unwritten_blocks += missing.size();
    finish_spill(spill, missing);
    return;
  }
  std::vector<StorageTier::ReadItem> items;
  uint64_t offset = 0;
  for (size_t i : missing) {
    const Spill::Block& block = spill->blocks[i];
    items.push_back({{block.key, block.pin.location().offset, block.bytes}, buffer.get() + offset});
    offset += block.bytes;
  }
  auto post = hooks_.control_thread();
  nvme->read(std::move(items), [this, post, spill, missing = std::move(missing),
                                buffer](std::vector<StorageTier::ReadOutcome> outcomes) mutable {
    post([this, spill, missing = std::move(missing), buffer = std::move(buffer),
          outcomes = std::move(outcomes)]() mutable {
      fit_answer(outcomes, missing.size(), StorageTier::ReadOutcome{no_answer(), false});
      std::vector<StorageTier::WriteItem> writes;
      std::vector<size_t> writing;
      std::vector<size_t> unread;
      uint64_t offset = 0;
      for (size_t j = 0; j < missing.size(); ++j) {
        const Spill::Block& block = spill->blocks[missing[j]];
        if (!block.pin) {
          // Given up while it was read (a stop): its slot may hold another block by now,
          // and it was counted then.
          offset += block.bytes;
          continue;
        }
        if (outcomes[j].status.is_ok()) {
          writes.push_back({{block.key, 0, block.bytes},
                            buffer.get() + offset,
                            hooks_.wall_ms_of(block.last_access_ms)});
          writing.push_back(missing[j]);
        } else {
          // Bad bytes are not written anywhere; the eviction goes ahead.
          KVTIER_LOG_WARN("reading block {} out of NVMe to spill it failed: {}",
                          block.key.hash.to_hex(), outcomes[j].status.to_string());
          unread.push_back(missing[j]);
        }
        offset += block.bytes;
      }
      counters_.spill_unwritten_blocks += unread.size();
      finish_spill(spill, unread);
      if (writing.empty()) return;
      auto post = hooks_.control_thread();
      auto on_written = [this, post, spill, writing, buffer](std::vector<Status> statuses) {
        post([this, spill, writing, statuses = std::move(statuses)]() mutable {
          fit_answer(statuses, writing.size(), no_answer());
          for (size_t j = 0; j < statuses.size(); ++j) {
            // A spill given up (a stop) counted its blocks already.
            if (!spill->blocks[writing[j]].pin) continue;
            ++(statuses[j].is_ok() ? counters_.spilled_blocks : counters_.spill_unwritten_blocks);
          }
          finish_spill(spill, writing);
        });
      };
      if (!spill_tier_->try_write(std::move(writes), std::move(on_written))) {
        counters_.spill_unwritten_blocks += writing.size();  // still pinned: nothing ran
        finish_spill(spill, writing);
      }
    });
  });
}

void MoveExecutor::finish_spill(const std::shared_ptr<Spill>& spill,
                                const std::vector<size_t>& indices) {
  std::vector<BlockKey> evictions;
  for (size_t i : indices) {
    Spill::Block& block = spill->blocks[i];
    if (!block.pin) continue;
    const BlockLocation where = block.pin.location();
    block.pin.reset();
    spilling_bytes_ -= block.bytes;
    --spill->open;
    // A block read up meanwhile (a Load, a BeginTurn) stays where it went; one used or
    // taken by a session meanwhile stays too (the planner decides about it again).
    const auto info = store_.lookup(block.key);
    if (info && info->location.tier == where.tier && info->location.offset == where.offset &&
        info->last_access_ms == block.last_access_ms && info->session_refs <= block.session_refs) {
      evictions.push_back(block.key);
    }
  }
  if (spill->open == 0) spills_.erase(spill);
  if (!evictions.empty()) evict(evictions);
  settled();  // the pins are gone and the slots free: what waits for room goes on
}

void MoveExecutor::stop_spills() {
  spills_stopped_ = true;
  // A stop does not wait for the spill tier: the blocks are evicted now (what was written
  // there stays; the rest is lost to the fleet, as when the bound is full).
  auto spills = std::move(spills_);
  spills_.clear();
  for (const std::shared_ptr<Spill>& spill : spills) {
    std::vector<size_t> open;
    for (size_t i = 0; i < spill->blocks.size(); ++i) {
      if (spill->blocks[i].pin) open.push_back(i);
    }
    counters_.spill_unwritten_blocks += open.size();
    finish_spill(spill, open);
  }
}

}  // namespace kvtier
