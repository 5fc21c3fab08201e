// NVMe evictions on their way to the cluster: the blocks it lacks are read out of NVMe
// and written there before they are evicted (remote_path.h).
#include "daemon/remote_path.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>

#include "common/log.h"
#include "daemon/copies.h"
#include "daemon/load_path.h"
#include "daemon/save_path.h"
#include "daemon/turn_path.h"

namespace kvtier::daemon {

// NVMe evictions being written to the cluster first: each block pinned (its slot stays,
// and the planner leaves it alone) until it is written there or given up.
struct RemotePath::Spill {
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

uint64_t RemotePath::leaving_bytes(Tier tier) const {
  return remote_ && tier == Tier::kNvme ? remote_->spilling_bytes : 0;
}

std::vector<BlockKey> RemotePath::spill_evictions(std::vector<BlockKey> keys) {
  if (!remote_ || ctx_.stopping || !remote_->worker->connected()) {
    if (remote_) remote_->spill_unwritten += keys.size();
    return keys;
  }
  auto spill = std::make_shared<Spill>();
  std::vector<BlockKey> rest;
  std::vector<StorageTier::Slot> asked;
  for (BlockKey& key : keys) {
    const auto info = ctx_.store->lookup(key);
    // What evict() refuses (pinned, moving) it refuses either way.
    if (!info || info->state != BlockState::kReady || info->pins > 0 ||
        info->location.tier != Tier::kNvme) {
      rest.push_back(std::move(key));
      continue;
    }
    const uint64_t bytes = ctx_.store->block_bytes(key.layout);
    if (remote_->spilling_bytes + bytes > ctx_.config.remote_max_in_flight_bytes) {
      ++remote_->spill_unwritten;  // the cluster is not keeping up: local room first
      rest.push_back(std::move(key));
      continue;
    }
    PinnedBlock pin = ctx_.store->pin_in_background(key);
    if (!pin) {
      rest.push_back(std::move(key));
      continue;
    }
    remote_->spilling_bytes += bytes;
    asked.push_back({key, 0, bytes});
    spill->blocks.push_back(
        {std::move(key), std::move(pin), bytes, info->last_access_ms, info->session_refs});
  }
  if (spill->blocks.empty()) return rest;
  spill->open = spill->blocks.size();
  remote_->spills.insert(spill);
  // Most blocks were written behind at the end of their turn: only the others are read.
  // Not bounded (no payload): never declined.
  remote_->tier->probe(std::move(asked), [this, spill](std::vector<Result<bool>> found) {
    std::vector<size_t> missing;
    std::vector<size_t> done;
    for (size_t i = 0; i < found.size(); ++i) {
      if (!spill->blocks[i].pin) continue;  // given up (a stop), counted and evicted then
      if (found[i].is_ok() && !*found[i]) {
        missing.push_back(i);
        continue;
      }
      // There already, or the cluster did not say: evicted without a write.
      ++(found[i].is_ok() ? remote_->spill_present : remote_->spill_unwritten);
      done.push_back(i);
    }
    finish_spill(spill, done);
    for (size_t begin = 0; begin < missing.size(); begin += kNvmeBlocksPerRead) {
      const size_t end = std::min(missing.size(), begin + kNvmeBlocksPerRead);
      spill_missing(spill, {missing.begin() + begin, missing.begin() + end});
    }
  });
  return rest;
}

void RemotePath::spill_missing(const std::shared_ptr<Spill>& spill, std::vector<size_t> missing) {
  std::erase_if(missing, [&](size_t i) { return !spill->blocks[i].pin; });  // given up
  if (missing.empty()) return;
  StorageTier* nvme = ctx_.mover->tier(Tier::kNvme);
  uint64_t total = 0;
  for (size_t i : missing) total += spill->blocks[i].bytes;
  std::shared_ptr<std::byte> buffer = allocate_nvme_buffer(nvme_buffer_bytes(total));
  if (nvme == nullptr || buffer == nullptr) {
    remote_->spill_unwritten += missing.size();
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
  auto guard = asio::make_work_guard(ctx_.io);
  nvme->read(std::move(items), [this, spill, missing = std::move(missing), buffer,
                                guard](std::vector<StorageTier::ReadOutcome> outcomes) mutable {
    asio::post(ctx_.io, [this, spill, missing = std::move(missing), buffer = std::move(buffer),
                         outcomes = std::move(outcomes), guard = std::move(guard)] {
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
          writes.push_back({{block.key, 0, block.bytes}, buffer.get() + offset, 0});
          writing.push_back(missing[j]);
        } else {
          // Bad bytes are not written anywhere; the eviction goes ahead.
          KVTIER_LOG_WARN("reading block {} out of NVMe for the remote tier failed: {}",
                          block.key.hash.to_hex(), outcomes[j].status.to_string());
          unread.push_back(missing[j]);
        }
        offset += block.bytes;
      }
      remote_->spill_unwritten += unread.size();
      finish_spill(spill, unread);
      if (writing.empty()) return;
      auto on_written = [this, spill, writing, buffer](std::vector<Status> statuses) {
        for (size_t j = 0; j < statuses.size(); ++j) {
          // A spill given up (a stop) counted its blocks already.
          if (!spill->blocks[writing[j]].pin) continue;
          ++(statuses[j].is_ok() ? remote_->spilled_blocks : remote_->spill_unwritten);
        }
        finish_spill(spill, writing);
      };
      if (!remote_->tier->try_write(std::move(writes), std::move(on_written))) {
        remote_->spill_unwritten += writing.size();  // all still pinned: nothing ran between
        finish_spill(spill, writing);
      }
    });
  });
}

void RemotePath::finish_spill(const std::shared_ptr<Spill>& spill,
                              const std::vector<size_t>& indices) {
  std::vector<BlockKey> evictions;
  for (size_t i : indices) {
    Spill::Block& block = spill->blocks[i];
    if (!block.pin) continue;
    const BlockLocation where = block.pin.location();
    block.pin.reset();
    remote_->spilling_bytes -= block.bytes;
    --spill->open;
    // A block read up meanwhile (a Load, a BeginTurn) stays where it went; one used or
    // taken by a session meanwhile stays too (the planner decides about it again).
    const auto info = ctx_.store->lookup(block.key);
    if (info && info->location.tier == where.tier && info->location.offset == where.offset &&
        info->last_access_ms == block.last_access_ms && info->session_refs <= block.session_refs) {
      evictions.push_back(block.key);
    }
  }
  if (spill->open == 0) remote_->spills.erase(spill);
  if (!evictions.empty()) ctx_.mover->evict(evictions);
  ctx_.parts.saves
      ->resume_parked_saves();  // the pins are gone and the slots free: what waits for room goes on
}

void RemotePath::abandon_spills() {
  if (!remote_) return;
  // A stop does not wait for the cluster: the blocks are evicted now (what was written
  // there stays; the rest is lost to the fleet, as when the bound is full).
  auto spills = std::move(remote_->spills);
  remote_->spills.clear();
  for (const std::shared_ptr<Spill>& spill : spills) {
    std::vector<size_t> open;
    for (size_t i = 0; i < spill->blocks.size(); ++i) {
      if (spill->blocks[i].pin) open.push_back(i);
    }
    remote_->spill_unwritten += open.size();
    finish_spill(spill, open);
  }
}

}  // namespace kvtier::daemon
