// MoveExecutor's copies out: copies of blocks written into the key-addressed tier while
// the blocks stay where they are (move_executor.h says how their bytes are had).
#include <algorithm>

#include "tiers/move_executor.h"

namespace kvtier {

// One copy_out batch. Blocks in host memory are read in place, under their pins; blocks
// in GPU memory from the staging slots the Device copies them into, and blocks in a tier
// that is not memory from `buffer` once read into it (their pins go once the copy or
// read is done).
struct MoveExecutor::CopyOut {
  std::vector<StorageTier::WriteItem> writes;
  std::vector<PinnedBlock> pins;   // parallel to writes
  std::vector<StagingSlot> slots;  // parallel to writes: the staging slot, or empty
  size_t blocks = 0;               // writes.size() before any were cut off
  std::vector<size_t> staged;      // indices in writes, copied out of GPU memory
  std::vector<size_t> buffered;    // indices in writes, read out of a tier into `buffer`
  std::shared_ptr<std::byte> buffer;
  std::shared_ptr<Memory> staging;  // kept while the tier may read the staged bytes
  CountedBytes buffer_bytes;        // buffer's size, in buffered_bytes_
  size_t waiting = 0;               // stages still running (the staging copy, the reads)
  size_t readable = SIZE_MAX;       // writes before the first whose bytes could not be had
  std::function<void(CopyOutResult)> done;
};

size_t MoveExecutor::copy_out(std::span<const BlockKey> keys,
                              std::function<void(CopyOutResult)> done) {
  if (spill_tier_ == nullptr) return 0;
  auto batch = std::make_shared<CopyOut>();
  CopyBatch staging_copy;  // blocks in GPU memory → staging slots
  staging_copy.priority = CopyPriority::kBackground;
  StorageTier* read_from = nullptr;          // the tier (not memory) blocks are read out of first
  std::vector<StorageTier::ReadItem> reads;  // destinations filled in once the buffer exists
  // Bytes that must be copied or read first only while the tier can take them: otherwise
  // the copy would be made for nothing.
  const bool reachable = spill_tier_->reachable();
  const uint64_t bound = max_in_flight_bytes_;
  for (const BlockKey& key : keys) {
    const uint64_t block_bytes = store_.block_bytes(key.layout);
    // One batch stays within half the in-flight bound (a larger one would be declined
    // every time, one as large would keep other writes out); a block larger than half
    // goes alone.
    const uint64_t batch_bytes = (batch->writes.size() + 1) * block_bytes;
    if (batch_bytes > bound || (!batch->writes.empty() && batch_bytes > bound / 2)) break;
    const auto info = store_.lookup(key);
    if (!info) break;
    const Tier from = info->location.tier;
    const bool in_place = in_host_memory(from);
    if (!in_place && !reachable) break;
    if (!in_place && !copies_by_device(from)) {
      // Not memory (NVMe): read into a buffer first; all batches' buffers together stay
      // within the in-flight bound.
      StorageTier* source = tier(from);
      if (source == nullptr || (read_from != nullptr && source != read_from)) break;
      const uint64_t buffer = io_buffer_bytes((reads.size() + 1) * block_bytes);
      if (*buffered_bytes_ + buffer > bound) break;
      read_from = source;
    } else if (!in_place && staging_slots_ == nullptr) {
      break;  // GPU memory and nothing to stage it in
    }
    PinnedBlock pinned = store_.pin_in_background(key);
    if (!pinned) break;
    const size_t at = batch->writes.size();
    StagingSlot slot;
    const std::byte* bytes = nullptr;  // read first: set once the buffer exists
    if (in_place) {
      bytes = tier(from)->host_address(pinned.location().offset);
    } else if (copies_by_device(from)) {
      // GPU memory: copied into a staging slot first (none free: the caller tries later).
      auto allocated = staging_slots_->allocate(block_bytes);
      if (!allocated.is_ok()) break;
      slot = StagingSlot(staging_slots_, *allocated, block_bytes);
      const std::shared_ptr<Memory>& memory = tier(from)->memory();
      staging_copy.segments.push_back({staging_copy.memory_index(memory),
                                       staging_copy.memory_index(staging_),
                                       pinned.location().offset, slot.offset(), block_bytes});
      batch->staged.push_back(at);
      batch->staging = staging_;
      bytes = staging_->host_data() + slot.offset();
    } else {
      batch->buffered.push_back(at);
      reads.push_back({{key, pinned.location().offset, block_bytes}, nullptr});
    }
    batch->writes.push_back({{key, 0, block_bytes}, bytes, 0});
    batch->pins.push_back(std::move(pinned));
    batch->slots.push_back(std::move(slot));
  }
  batch->blocks = batch->writes.size();
  if (batch->blocks == 0) return 0;
  batch->done = std::move(done);

  batch->waiting = 1;  // this function's own: released by the call at its end
  if (!staging_copy.segments.empty()) stage_for_copy_out(batch, std::move(staging_copy));
  if (!reads.empty()) read_for_copy_out(batch, *read_from, std::move(reads));
  copy_out_staged(batch);
  return batch->blocks;
}

void MoveExecutor::stage_for_copy_out(const std::shared_ptr<CopyOut>& batch,
                                      CopyBatch staging_copy) {
  ++batch->waiting;
  // Segments are not merged: adjacent GPU offsets may lie in different parts of the
  // pool, and the Device merges what it can.
  Status submitted = hooks_.copy(std::move(staging_copy), [this, batch](Status copied) {
    if (copied.is_ok()) {
      counters_.staged_blocks += batch->staged.size();
    } else {
      KVTIER_LOG_WARN("staging {} blocks out of GPU memory to copy them out failed: {}",
                      batch->staged.size(), copied.to_string());
      batch->readable = std::min(batch->readable, batch->staged.front());
    }
    for (size_t i : batch->staged) batch->pins[i].reset();  // the bytes are staged (or lost)
    copy_out_staged(batch);
  });
  if (!submitted.is_ok()) {
    KVTIER_LOG_WARN("staging {} blocks out of GPU memory to copy them out failed: {}",
                    batch->staged.size(), submitted.to_string());
    batch->readable = std::min(batch->readable, batch->staged.front());
    --batch->waiting;
  }
}

void MoveExecutor::read_for_copy_out(const std::shared_ptr<CopyOut>& batch, StorageTier& from,
                                     std::vector<StorageTier::ReadItem> reads) {
  uint64_t total = 0;
  for (const StorageTier::ReadItem& read : reads) total += read.slot.bytes;
  const uint64_t rounded = io_buffer_bytes(total);
  batch->buffer = allocate_io_buffer(rounded);
  if (batch->buffer == nullptr) {
    batch->readable = std::min(batch->readable, batch->buffered.front());
    return;
  }
  batch->buffer_bytes = CountedBytes(buffered_bytes_, rounded);
  uint64_t offset = 0;
  for (size_t j = 0; j < reads.size(); ++j) {
    std::byte* into = batch->buffer.get() + offset;
    reads[j].destination = into;
    batch->writes[batch->buffered[j]].source = into;
    offset += reads[j].slot.bytes;
  }
  // In jobs of the executor's size, so one batch does not hold the tier's queue for long.
  for (size_t begin = 0; begin < reads.size(); begin += kBlocksPerBufferedRead) {
    const size_t end = std::min(reads.size(), begin + kBlocksPerBufferedRead);
    std::vector<StorageTier::ReadItem> job(reads.begin() + begin, reads.begin() + end);
    ++batch->waiting;
    auto post = hooks_.control_thread();
    from.read(std::move(job), [this, post, batch, begin, asked = end - begin](
                                  std::vector<StorageTier::ReadOutcome> outcomes) {
      post([this, batch, begin, asked, outcomes = std::move(outcomes)]() mutable {
        fit_answer(outcomes, asked,
                   StorageTier::ReadOutcome{internal_error("the tier gave no answer"), false});
        std::vector<BlockKey> lost;  // bytes that did not verify
        for (size_t j = 0; j < outcomes.size(); ++j) {
          const size_t at = batch->buffered[begin + j];
          if (!outcomes[j].status.is_ok()) {
            batch->readable = std::min(batch->readable, at);
            if (outcomes[j].corrupt) lost.push_back(batch->pins[at].key());
            KVTIER_LOG_WARN("reading block {} to copy it out failed: {}",
                            batch->pins[at].key().hash.to_hex(), outcomes[j].status.to_string());
          }
          batch->pins[at].reset();  // the bytes are in the buffer (or lost)
        }
        // Bad bytes: the block goes now (no pin of the batch holds it), as when any read
        // finds it so; nothing from it on is written.
        if (!lost.empty()) evict(lost, /*lost=*/true);
        copy_out_staged(batch);
        settled();  // the pins are gone: their blocks may move or go
      });
    });
  }
}

void MoveExecutor::copy_out_staged(const std::shared_ptr<CopyOut>& batch) {
  if (--batch->waiting > 0) return;
  if (batch->readable < batch->writes.size()) {
    // Only the blocks before the first unreadable one are written (the caller's mark
    // stops there): the others are let go now.
    for (size_t i = batch->readable; i < batch->writes.size(); ++i) {
      batch->pins[i].reset();
      batch->slots[i].reset();
    }
    batch->writes.resize(batch->readable);
  }
  if (batch->writes.empty()) {
    finish_copy_out(batch, {});
    return;
  }
  const size_t asked = batch->writes.size();
  auto post = hooks_.control_thread();
  const bool queued = spill_tier_->try_write(
      std::move(batch->writes), [this, post, batch, asked](std::vector<Status> statuses) {
        post([this, batch, asked, statuses = std::move(statuses)]() mutable {
          fit_answer(statuses, asked, internal_error("the tier gave no answer"));
          size_t written = 0;
          while (written < statuses.size() && statuses[written].is_ok()) ++written;
          finish_copy_out(batch, {asked, written, false});
        });
      });
  if (!queued) finish_copy_out(batch, {0, 0, /*declined=*/true});
}

void MoveExecutor::finish_copy_out(const std::shared_ptr<CopyOut>& batch, CopyOutResult result) {
  // The tier, the Device and the read are done with the slots and the buffer.
  batch->pins.clear();
  batch->slots.clear();
  batch->buffer.reset();
  batch->staging.reset();
  batch->buffer_bytes.reset();
  // Never from inside copy_out(): the caller learns what it took first.
  hooks_.control_thread()([this, batch, result] {
    batch->done(result);
    settled();  // the pins are gone: their blocks may move or go
  });
}

}  // namespace kvtier
