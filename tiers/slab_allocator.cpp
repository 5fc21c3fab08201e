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

SlabAllocator::SlabAllocator(uint64_t capacity_bytes, uint64_t slab_bytes, uint32_t parts)
    : capacity_bytes_(capacity_bytes), slab_bytes_(clamp_slab_bytes(capacity_bytes, slab_bytes)) {
  const uint32_t slab_count = slab_bytes_ == 0 ? 0 : clamp_to_u32(capacity_bytes_ / slab_bytes_);
  // More parts than slabs (or a part that is not whole slabs) would leave parts
  // without a slab of their own: fall back to one part.
  if (parts == 0 || slab_count == 0 || slab_count % parts != 0) parts = 1;
  slabs_per_part_ = slab_count == 0 ? 1 : slab_count / parts;
  slabs_.resize(slab_count);
  free_slabs_.resize(parts);
  used_bytes_by_part_.resize(parts);
  // Pushed in reverse so that the lowest slab is handed out first: offsets grow from
  // the start of the memory, which makes dumps and tests easier to read.
  for (uint32_t i = slab_count; i > 0; --i) free_slabs_[slab_part(i - 1)].push_back(i - 1);
  free_slab_count_ = slab_count;
}

uint32_t SlabAllocator::slab_part(uint32_t slab_index) const {
  return slab_index / slabs_per_part_;
}

uint32_t SlabAllocator::part_of(uint64_t offset) const {
  return slab_bytes_ == 0 ? 0 : slab_part(static_cast<uint32_t>(offset / slab_bytes_));
}

bool SlabAllocator::can_allocate(uint64_t slot_bytes) const {
  if (slot_bytes == 0 || slot_bytes > slab_bytes_) return false;
  if (free_slab_count_ > 0) return true;
  auto it = partial_slabs_.find(slot_bytes);
  if (it == partial_slabs_.end()) return false;
  return std::any_of(it->second.begin(), it->second.end(),
                     [](const std::vector<uint32_t>& list) { return !list.empty(); });
}

std::optional<std::pair<uint32_t, bool>> SlabAllocator::take_slab(uint64_t slot_bytes,
                                                                  uint32_t part) {
  // Partial slabs first: filling them keeps free slabs whole for other slot sizes.
  auto partial = partial_slabs_.find(slot_bytes);
  if (partial != partial_slabs_.end() && !partial->second[part].empty()) {
    return std::make_pair(partial->second[part].back(), true);
  }
  std::vector<uint32_t>& free_list = free_slabs_[part];
  if (free_list.empty()) return std::nullopt;
  const uint32_t slab_index = free_list.back();
  free_list.pop_back();
  --free_slab_count_;
  slabs_[slab_index].slot_bytes = slot_bytes;
  return std::make_pair(slab_index, false);
}

Result<uint64_t> SlabAllocator::allocate(uint64_t slot_bytes, int preferred_part) {
  if (slot_bytes == 0 || slot_bytes > slab_bytes_) {
    return invalid_argument("slot_bytes {} must be in 1..{} (the slab size)", slot_bytes,
                            slab_bytes_);
  }
  const uint32_t slots_per_slab = clamp_to_u32(slab_bytes_ / slot_bytes);

  std::optional<std::pair<uint32_t, bool>> taken;
  if (preferred_part >= 0 && static_cast<uint32_t>(preferred_part) < parts()) {
    taken = take_slab(slot_bytes, static_cast<uint32_t>(preferred_part));
  }
  // Elsewhere: any part's partial slab before any part's free slab.
  auto partial = partial_slabs_.find(slot_bytes);
  for (uint32_t part = 0; !taken && partial != partial_slabs_.end() && part < parts(); ++part) {
    if (!partial->second[part].empty()) taken = std::make_pair(partial->second[part].back(), true);
  }
  for (uint32_t part = 0; !taken && part < parts(); ++part) taken = take_slab(slot_bytes, part);
  if (!taken) {
    return resource_exhausted(
        "no free slot of {} bytes: {} of {} bytes used in {} slots, no free slab of {} bytes",
        slot_bytes, used_bytes_, capacity_bytes_, used_slots_, slab_bytes_);
  }
  const uint32_t slab_index = taken->first;
  const bool from_partial = taken->second;

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
  used_bytes_by_part_[slab_part(slab_index)] += slot_bytes;
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
  used_bytes_by_part_[slab_part(slab_index)] -= slot_bytes;
  --used_slots_;

  if (slab.used == 0) {
    // Whole again: give it back so any slot size can use it.
    if (!was_full) remove_partial(slab_index);
    slab.slot_bytes = 0;
    slab.free_slots.clear();
    free_slabs_[slab_part(slab_index)].push_back(slab_index);
    ++free_slab_count_;
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
    std::vector<uint32_t>& free_list = free_slabs_[slab_part(index)];
    auto it = std::find(free_list.rbegin(), free_list.rend(), index);
    assert(it != free_list.rend());
    free_list.erase(std::next(it).base());
    --free_slab_count_;
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
  used_bytes_by_part_[slab_part(index)] += slot_bytes;
  ++used_slots_;
  return Status::ok();
}

void SlabAllocator::add_partial(uint32_t slab_index) {
  Slab& slab = slabs_[slab_index];
  assert(slab.partial_position == kNotPartial);
  auto& per_part = partial_slabs_[slab.slot_bytes];
  if (per_part.empty()) per_part.resize(parts());
  std::vector<uint32_t>& list = per_part[slab_part(slab_index)];
  slab.partial_position = static_cast<uint32_t>(list.size());
  list.push_back(slab_index);
}

void SlabAllocator::remove_partial(uint32_t slab_index) {
  Slab& slab = slabs_[slab_index];
  assert(slab.partial_position != kNotPartial);
  auto it = partial_slabs_.find(slab.slot_bytes);
  assert(it != partial_slabs_.end());
  std::vector<uint32_t>& list = it->second[slab_part(slab_index)];
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
