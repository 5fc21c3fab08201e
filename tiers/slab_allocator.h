// SlabAllocator: fixed-size slots carved from one tier's memory (the HBM arena or the
// RAM pool). The memory is split into slabs of `slab_bytes`; a free slab is given to
// whichever slot size needs room, and returns to the free list when its last slot is
// freed, so layouts with different block sizes share one tier without fragmenting it
// for long.
//
// It hands out offsets only; it never touches the memory.
// Thread-safety: none; owned by the control thread.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace kvtier {

class SlabAllocator {
 public:
  // capacity_bytes: the tier's memory size. slab_bytes: the carving unit; a slot size
  // larger than slab_bytes can never be allocated. The tail of capacity that does not
  // fill a whole slab is unused.
  SlabAllocator(uint64_t capacity_bytes, uint64_t slab_bytes);

  // Returns the byte offset of a free slot of `slot_bytes`, or ResourceExhausted when
  // no slab has a free slot of that size and no slab is free.
  Result<uint64_t> allocate(uint64_t slot_bytes);
  // REQUIRES: `offset` came from allocate(slot_bytes) and was not freed since.
  void free(uint64_t offset, uint64_t slot_bytes);

  // Whether an allocate(slot_bytes) would succeed now.
  bool can_allocate(uint64_t slot_bytes) const;

  uint64_t capacity_bytes() const { return capacity_bytes_; }
  uint64_t slab_bytes() const { return slab_bytes_; }
  uint64_t used_bytes() const { return used_bytes_; }   // sum of allocated slot sizes
  uint64_t used_slots() const { return used_slots_; }
  uint64_t free_slabs() const { return free_slabs_.size(); }

 private:
  struct Slab {
    uint64_t slot_bytes = 0;             // 0 while the slab is free
    uint32_t used = 0;                   // allocated slots
    std::vector<uint32_t> free_slots;    // slot indices, LIFO
  };

  const uint64_t capacity_bytes_;
  const uint64_t slab_bytes_;
  std::vector<Slab> slabs_;
  std::vector<uint32_t> free_slabs_;  // slab indices
  // slot size → slabs of that size with at least one free slot
  std::unordered_map<uint64_t, std::vector<uint32_t>> partial_slabs_;
  uint64_t used_bytes_ = 0;
  uint64_t used_slots_ = 0;
};

}  // namespace kvtier
