#include "tiers/slab_allocator.h"

#include <algorithm>
#include <cassert>
#include <limits>

namespace kvtier {

namespace {

uint64_t clamp_slab_bytes(uint64_t capacity_bytes, uint64_t slab_bytes) {
  if (slab_bytes == 0 || slab_bytes > capacity_bytes) return capacity_bytes;
  return slab_bytes;
}

// Slot and slab indices are uint32_t to keep the per-slab free lists small; a slab of
// more than 4G slots (1-byte slots in a multi-GiB slab) simply leaves its tail unused.
uint32_t clamp_to_u32(uint64_t count) {
  return static_cast<uint32_t>(std::min<uint64_t>(count, std::numeric_limits<uint32_t>::max()));
}

}  // namespace

SlabAllocator::SlabAllocator(uint64_t capacity_bytes, uint64_t slab_bytes)
    : capacity_bytes_(capacity_bytes), slab_bytes_(clamp_slab_bytes(capacity_bytes, slab_bytes)) {
  const uint32_t slab_count = slab_bytes_ == 0 ? 0 : clamp_to_u32(capacity_bytes_ / slab_bytes_);
  slabs_.resize(slab_count);
  free_slabs_.reserve(slab_count);
  // Pushed in reverse so that the lowest slab is handed out first: offsets grow from
  // the start of the memory, which makes dumps and tests easier to read.
  for (uint32_t i = slab_count; i > 0; --i) free_slabs_.push_back(i - 1);
}

bool SlabAllocator::can_allocate(uint64_t slot_bytes) const {
  if (slot_bytes == 0 || slot_bytes > slab_bytes_) return false;
  if (!free_slabs_.empty()) return true;
  auto it = partial_slabs_.find(slot_bytes);
  return it != partial_slabs_.end() && !it->second.empty();
}

Result<uint64_t> SlabAllocator::allocate(uint64_t slot_bytes) {
  if (slot_bytes == 0 || slot_bytes > slab_bytes_) {
    return invalid_argument("slot_bytes {} must be in 1..{} (the slab size)", slot_bytes,
                            slab_bytes_);
  }
  const uint32_t slots_per_slab = clamp_to_u32(slab_bytes_ / slot_bytes);

  // Partial slabs first: filling them keeps free slabs whole for other slot sizes.
  uint32_t slab_index;
  bool from_partial = false;
  auto partial = partial_slabs_.find(slot_bytes);
  if (partial != partial_slabs_.end() && !partial->second.empty()) {
    slab_index = partial->second.back();
    from_partial = true;
  } else if (!free_slabs_.empty()) {
    slab_index = free_slabs_.back();
    free_slabs_.pop_back();
    slabs_[slab_index].slot_bytes = slot_bytes;
  } else {
    return resource_exhausted(
        "no free slot of {} bytes: {} of {} bytes used in {} slots, no free slab of {} bytes",
        slot_bytes, used_bytes_, capacity_bytes_, used_slots_, slab_bytes_);
  }

  Slab& slab = slabs_[slab_index];
  // Slots of a slab are handed out lazily: slots [0, used + free_slots.size()) have been
  // handed out at least once since the slab was taken; the rest were never touched.
  // So a fresh slab costs O(1) instead of filling a free list of every slot.
  uint32_t slot;
  if (!slab.free_slots.empty()) {
    slot = slab.free_slots.back();
    slab.free_slots.pop_back();
  } else {
    slot = slab.used;
  }
  ++slab.used;
  const bool full = slab.used == slots_per_slab;
  if (from_partial && full) remove_partial(slab_index);
  if (!from_partial && !full) add_partial(slab_index);

  used_bytes_ += slot_bytes;
  ++used_slots_;
  return static_cast<uint64_t>(slab_index) * slab_bytes_ + static_cast<uint64_t>(slot) * slot_bytes;
}

void SlabAllocator::free(uint64_t offset, uint64_t slot_bytes) {
  assert(slab_bytes_ != 0 && offset / slab_bytes_ < slabs_.size());
  const uint32_t slab_index = static_cast<uint32_t>(offset / slab_bytes_);
  Slab& slab = slabs_[slab_index];
  assert(slab.slot_bytes == slot_bytes && slab.used > 0);
  assert((offset % slab_bytes_) % slot_bytes == 0);
  const uint32_t slot = static_cast<uint32_t>((offset % slab_bytes_) / slot_bytes);
  const uint32_t slots_per_slab = clamp_to_u32(slab_bytes_ / slot_bytes);

  const bool was_full = slab.used == slots_per_slab;
  --slab.used;
  used_bytes_ -= slot_bytes;
  --used_slots_;

  if (slab.used == 0) {
    // Whole again: give it back so any slot size can use it.
    if (!was_full) remove_partial(slab_index);
    slab.slot_bytes = 0;
    slab.free_slots.clear();
    free_slabs_.push_back(slab_index);
    return;
  }
  slab.free_slots.push_back(slot);
  if (was_full) add_partial(slab_index);
}

Status SlabAllocator::allocate_at(uint64_t offset, uint64_t slot_bytes) {
  if (slot_bytes == 0 || slot_bytes > slab_bytes_) {
    return invalid_argument("slot_bytes {} must be in 1..{} (the slab size)", slot_bytes,
                            slab_bytes_);
  }
  const uint64_t slab_index = offset / slab_bytes_;
  const uint64_t in_slab = offset % slab_bytes_;
  const uint32_t slots_per_slab = clamp_to_u32(slab_bytes_ / slot_bytes);
  if (slab_index >= slabs_.size() || in_slab % slot_bytes != 0 ||
      in_slab / slot_bytes >= slots_per_slab) {
    return invalid_argument("offset {} is not a slot of {} bytes within {} bytes of {}-byte slabs",
                            offset, slot_bytes, capacity_bytes_, slab_bytes_);
  }
  const uint32_t index = static_cast<uint32_t>(slab_index);
  const uint32_t slot = static_cast<uint32_t>(in_slab / slot_bytes);
  Slab& slab = slabs_[index];
  bool was_free = false;
  if (slab.slot_bytes == 0) {
    // The free list is pushed lowest-last, so ascending rebuilds find it at the back.
    auto it = std::find(free_slabs_.rbegin(), free_slabs_.rend(), index);
    assert(it != free_slabs_.rend());
    free_slabs_.erase(std::next(it).base());
    slab.slot_bytes = slot_bytes;
    was_free = true;
  } else if (slab.slot_bytes != slot_bytes) {
    return invalid_argument("offset {}: its slab holds slots of {} bytes, not {}", offset,
                            slab.slot_bytes, slot_bytes);
  }
  const uint32_t handed_out = slab.used + static_cast<uint32_t>(slab.free_slots.size());
  if (slot >= handed_out) {
    // Slots skipped over become free ones that have been handed out (see allocate).
    for (uint32_t skipped = handed_out; skipped < slot; ++skipped)
      slab.free_slots.push_back(skipped);
  } else {
    auto it = std::find(slab.free_slots.begin(), slab.free_slots.end(), slot);
    if (it == slab.free_slots.end()) {
      return invalid_argument("offset {}: the slot is already allocated", offset);
    }
    slab.free_slots.erase(it);
  }
  ++slab.used;
  const bool full = slab.used == slots_per_slab;
  if (was_free && !full) add_partial(index);
  if (!was_free && full) remove_partial(index);
  used_bytes_ += slot_bytes;
  ++used_slots_;
  return Status::ok();
}

void SlabAllocator::add_partial(uint32_t slab_index) {
  Slab& slab = slabs_[slab_index];
  assert(slab.partial_position == kNotPartial);
  std::vector<uint32_t>& list = partial_slabs_[slab.slot_bytes];
  slab.partial_position = static_cast<uint32_t>(list.size());
  list.push_back(slab_index);
}

void SlabAllocator::remove_partial(uint32_t slab_index) {
  Slab& slab = slabs_[slab_index];
  assert(slab.partial_position != kNotPartial);
  auto it = partial_slabs_.find(slab.slot_bytes);
  assert(it != partial_slabs_.end());
  std::vector<uint32_t>& list = it->second;
  // Swap-remove: O(1), order within the list does not matter.
  const uint32_t last = list.back();
  list[slab.partial_position] = last;
  slabs_[last].partial_position = slab.partial_position;
  list.pop_back();
  slab.partial_position = kNotPartial;
  // An emptied list stays in the map: there are few slot sizes, and erasing it would
  // cost a map node and a vector allocation every time the list refills.
}

}  // namespace kvtier
