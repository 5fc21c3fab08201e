// SlotIndex: the open-addressing index under kvtier's flat tables (tiers/block_table.h,
// policy/holder_table.h), which keep their entries elsewhere and number them. Each slot
// is a control byte (0 empty, else 0x80 | the top 7 bits of the entry's 64-bit hash
// code) and the entry's 4-byte number: 5 bytes a slot.
//
// Linear probing. A code's home slot is its low 57 bits scaled to the capacity
// (multiply-shift, no power of two needed), so the tag and the home are independent
// bits. The owner keeps the load at most 7/8 (has_room, grow): probes scan control
// bytes, which are dense, and look at an entry only on a tag match. Erase shifts later
// slots of the run back (no tombstones), so lookups never slow down with churn.
//
// Every call that walks slots takes the codes from the owner: `code_of(number)` is the
// hash code of the entry so numbered.
//
// Thread-safety: none; the owner serializes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

namespace kvtier {

class SlotIndex {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  size_t capacity() const { return capacity_; }
  size_t memory_bytes() const { return capacity_ * (sizeof(uint32_t) + 1); }
  // Whether one more of `size` entries keeps the load at most 7/8.
  bool has_room(size_t size) const { return (size + 1) * 8 <= capacity_ * 7; }

  // The number of the entry tagged like `code` for which matches(number) holds; kNone
  // when none is.
  template <class Match>
  uint32_t find(uint64_t code, Match&& matches) const {
    if (capacity_ == 0) return kNone;
    const uint8_t tag = tag_of(code);
    for (size_t i = home_of(code); /* the load < 1: an empty byte comes */; i = next(i)) {
      const uint8_t c = control_[i];
      if (c == 0) return kNone;
      if (c == tag && matches(numbers_[i])) return numbers_[i];
    }
  }
  // The first entry tagged like `code`, without looking at any entry (a prefetch's
  // guess); kNone when none is.
  uint32_t first_tagged(uint64_t code) const {
    return find(code, [](uint32_t) { return true; });
  }
  // Starts loading the cache lines find(code) reads first.
  void prefetch(uint64_t code) const {
    if (capacity_ == 0) return;
    const size_t i = home_of(code);
    __builtin_prefetch(&control_[i]);
    __builtin_prefetch(&numbers_[i]);
  }

  // REQUIRES: has_room (the owner grows first).
  void insert(uint64_t code, uint32_t number) {
    size_t i = home_of(code);
    while (control_[i] != 0) i = next(i);
    control_[i] = tag_of(code);
    numbers_[i] = number;
  }
  // The entry numbered `from` (under `code`) is numbered `to` from now on.
  void renumber(uint64_t code, uint32_t from, uint32_t to) { numbers_[slot_of(code, from)] = to; }
  // Removes the slot of the entry numbered `number` (under `code`).
  template <class CodeOf>
  void erase(uint64_t code, uint32_t number, CodeOf&& code_of) {
    size_t hole = slot_of(code, number);
    // Backward shift: a slot of the run after the hole moves into it when the hole lies
    // between the slot's home and its place, i.e. when lookups for it would stop there.
    for (size_t j = next(hole); control_[j] != 0; j = next(j)) {
      const size_t home = home_of(code_of(numbers_[j]));
      if (distance(home, j) < distance(hole, j)) continue;
      numbers_[hole] = numbers_[j];
      control_[hole] = control_[j];
      hole = j;
    }
    control_[hole] = 0;
  }
  // Rebuilds the slots at `capacity` (> the entries held ÷ 7/8).
  template <class CodeOf>
  void grow(size_t capacity, CodeOf&& code_of) {
    std::unique_ptr<uint32_t[]> old_numbers =
        std::exchange(numbers_, std::make_unique_for_overwrite<uint32_t[]>(capacity));
    std::unique_ptr<uint8_t[]> old_control =
        std::exchange(control_, std::make_unique<uint8_t[]>(capacity));  // zeroed: empty
    const size_t old_capacity = std::exchange(capacity_, capacity);
    for (size_t j = 0; j < old_capacity; ++j) {
      if (old_control[j] == 0) continue;
      size_t i = home_of(code_of(old_numbers[j]));
      while (control_[i] != 0) i = next(i);
      control_[i] = old_control[j];
      numbers_[i] = old_numbers[j];
    }
  }

 private:
  static uint8_t tag_of(uint64_t code) { return static_cast<uint8_t>(0x80 | (code >> 57)); }
  // The low 57 bits (those the tag leaves), scaled to [0, capacity_).
  size_t home_of(uint64_t code) const {
    return static_cast<size_t>((static_cast<unsigned __int128>(code << 7) * capacity_) >> 64);
  }
  size_t next(size_t i) const { return i + 1 == capacity_ ? 0 : i + 1; }
  // How far `to` lies after `from` along the probe order (wrapping).
  size_t distance(size_t from, size_t to) const {
    return to >= from ? to - from : to + capacity_ - from;
  }
  // REQUIRES: the entry numbered `number` is indexed under `code`.
  size_t slot_of(uint64_t code, uint32_t number) const {
    for (size_t i = home_of(code);; i = next(i)) {
      if (control_[i] != 0 && numbers_[i] == number) return i;
    }
  }

  std::unique_ptr<uint8_t[]> control_;
  std::unique_ptr<uint32_t[]> numbers_;  // of the slots whose control byte is set
  size_t capacity_ = 0;
};

}  // namespace kvtier
