// SlabAllocator: fixed-size slots carved from one tier's memory (the HBM arena or the
// RAM pool). The memory is split into slabs of `slab_bytes`; a free slab is given to
// whichever slot size needs room, and returns to the free list when its last slot is
// freed, so layouts with different block sizes share one tier without fragmenting it
// for long.
//
// Parts: memory made of equal parts (the HBM arena holds one part per GPU) can be
// split into `parts`; allocate() then takes a preferred part and looks there first, so
// a block lands on the GPU of the engine that wrote it when that GPU has room. Each
// part must be a whole number of slabs (the arena is allocated so).
//
// It hands out offsets only; it never touches the memory.
// Thread-safety: none; owned by the control thread.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kvtier {

class SlabAllocator {
 public:
  // capacity_bytes: the tier's memory size. slab_bytes: the carving unit, clamped to
  // capacity_bytes (so a tier smaller than one slab still has one; 0 also means
  // capacity_bytes); a slot size larger than slab_bytes can never be allocated. The
  // tail of capacity that does not fill a whole slab is unused.
  SlabAllocator(uint64_t capacity_bytes, uint64_t slab_bytes, uint32_t parts = 1);

  static constexpr int kAnyPart = -1;

  // Returns the byte offset of a free slot of `slot_bytes`, or ResourceExhausted when
  // no slab has a free slot of that size and no slab is free. InvalidArgument when
  // slot_bytes is 0 or larger than slab_bytes(). With a `preferred_part`, a slot in
  // that part (a partial slab, else a free one) comes before any other part's.
  Result<uint64_t> allocate(uint64_t slot_bytes, int preferred_part = kAnyPart);
  // REQUIRES: `offset` came from allocate(slot_bytes) and was not freed since.
  void free(uint64_t offset, uint64_t slot_bytes);
  // Marks the slot of `slot_bytes` at `offset` allocated, as allocate() would have
  // returned it: rebuilds the allocation of persistent memory (the NVMe slab file)
  // from its index at start-up. InvalidArgument when the slot lies outside the
  // capacity, is not on a slot boundary, sits in a slab of another slot size, or is
  // already allocated. Fast when called in ascending offset order.
  Status allocate_at(uint64_t offset, uint64_t slot_bytes);

  // Whether an allocate(slot_bytes) would succeed now.
  bool can_allocate(uint64_t slot_bytes) const;

  uint64_t capacity_bytes() const { return capacity_bytes_; }
  uint64_t slab_bytes() const { return slab_bytes_; }
  uint64_t used_bytes() const { return used_bytes_; }  // sum of allocated slot sizes
  uint64_t used_bytes(uint32_t part) const { return used_bytes_by_part_[part]; }
  uint64_t part_capacity_bytes() const { return uint64_t{slabs_per_part_} * slab_bytes_; }
  uint64_t used_slots() const { return used_slots_; }
  uint64_t free_slabs() const { return free_slab_count_; }
  uint32_t parts() const { return static_cast<uint32_t>(free_slabs_.size()); }
  // The part holding byte `offset`.
  uint32_t part_of(uint64_t offset) const;

 private:
  static constexpr uint32_t kNotPartial = UINT32_MAX;
  struct Slab {
    uint64_t slot_bytes = 0;  // 0 while the slab is free
    uint32_t used = 0;        // allocated slots
    // Freed slot indices, LIFO. Slots are handed out lazily: indices at or above
    // used + free_slots.size() have not been handed out since the slab was taken.
    std::vector<uint32_t> free_slots;
    uint32_t partial_position = kNotPartial;  // index in partial_slabs_[slot_bytes]
  };
  void add_partial(uint32_t slab_index);
  void remove_partial(uint32_t slab_index);
  uint32_t slab_part(uint32_t slab_index) const;
  // A slab with a free slot of `slot_bytes` in `part`: a partial one (from_partial
  // true), else a free one taken off its list; nullopt when the part has neither.
  std::optional<std::pair<uint32_t, bool>> take_slab(uint64_t slot_bytes, uint32_t part);

  const uint64_t capacity_bytes_;
  const uint64_t slab_bytes_;
  uint32_t slabs_per_part_ = 0;
  std::vector<Slab> slabs_;
  std::vector<std::vector<uint32_t>> free_slabs_;  // per part: slab indices
  uint64_t free_slab_count_ = 0;
  // slot size → per part: slabs of that size with at least one free slot
  std::unordered_map<uint64_t, std::vector<std::vector<uint32_t>>> partial_slabs_;
  uint64_t used_bytes_ = 0;
  std::vector<uint64_t> used_bytes_by_part_;
  uint64_t used_slots_ = 0;
};

}  // namespace kvtier
