// Handles for what a copy out of the store holds while it runs (tiers/move_executor.h,
// copy_out): a slot of staging memory and a share of a bound on buffer bytes. Each gives
// back what it holds when it goes.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include "tiers/slab_allocator.h"

namespace kvtier {

// A slot of staging memory (a SlabAllocator's), given back to its allocator when the handle
// goes (nothing is given back once the allocator is gone: a completion dropped unrun at
// stop). Move-only; control thread only.
class StagingSlot {
 public:
  StagingSlot() = default;
  StagingSlot(const std::shared_ptr<SlabAllocator>& slots, uint64_t offset, uint64_t bytes)
      : slots_(slots), offset_(offset), bytes_(bytes), held_(true) {}
  StagingSlot(StagingSlot&& other) noexcept
      : slots_(std::move(other.slots_)),
        offset_(other.offset_),
        bytes_(other.bytes_),
        held_(std::exchange(other.held_, false)) {}
  StagingSlot& operator=(StagingSlot&& other) noexcept {
    if (this != &other) {
      reset();
      slots_ = std::move(other.slots_);
      offset_ = other.offset_;
      bytes_ = other.bytes_;
      held_ = std::exchange(other.held_, false);
    }
    return *this;
  }
  StagingSlot(const StagingSlot&) = delete;
  StagingSlot& operator=(const StagingSlot&) = delete;
  ~StagingSlot() { reset(); }

  explicit operator bool() const { return held_; }
  uint64_t offset() const { return offset_; }
  void reset() {
    if (!std::exchange(held_, false)) return;
    if (auto slots = slots_.lock()) slots->free(offset_, bytes_);
  }

 private:
  std::weak_ptr<SlabAllocator> slots_;
  uint64_t offset_ = 0;
  uint64_t bytes_ = 0;
  bool held_ = false;
};

// Bytes counted in a shared total (the read buffers of copies out, bounded by the
// executor's in-flight bound) while the handle holds them; taken off when it goes. Move-only.
class CountedBytes {
 public:
  CountedBytes() = default;
  CountedBytes(const std::shared_ptr<uint64_t>& total, uint64_t bytes)
      : total_(total), bytes_(bytes) {
    *total += bytes;
  }
  CountedBytes(CountedBytes&& other) noexcept
      : total_(std::move(other.total_)), bytes_(std::exchange(other.bytes_, 0)) {}
  CountedBytes& operator=(CountedBytes&& other) noexcept {
    if (this != &other) {
      reset();
      total_ = std::move(other.total_);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  CountedBytes(const CountedBytes&) = delete;
  CountedBytes& operator=(const CountedBytes&) = delete;
  ~CountedBytes() { reset(); }

  void reset() {
    const uint64_t bytes = std::exchange(bytes_, 0);
    if (auto total = total_.lock(); total && bytes > 0) *total -= bytes;
  }

 private:
  std::weak_ptr<uint64_t> total_;
  uint64_t bytes_ = 0;
};

}  // namespace kvtier
