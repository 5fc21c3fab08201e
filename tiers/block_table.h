// BlockTable: the block index of one layout, an open-addressing hash table keyed by
// block hash, over values kept densely in chunks of their own.
//
// Why not std::unordered_map: at a million blocks a lookup there reads a bucket, then
// one or more nodes scattered over the heap, each a cache (and TLB) miss, and nothing
// can be fetched ahead. Here a lookup reads one control byte and, when its 7-bit tag
// matches, the slot's value number and that value; prefetch() and prefetch_values() let
// a request that names many blocks (Lookup, Load) start every miss before it waits for
// the first.
//
// Layout: linear probing over two parallel arrays, a control byte (0 empty, else 0x80 |
// the hash's top 7 bits) and a 4-byte value number per slot. A hash's home slot is its
// low 57 bits scaled to the capacity (multiply-shift, no power of two needed), so the tag
// and the home are independent bits. The load stays at most 7/8: probes scan control
// bytes, which are dense, and read a slot's value only on a tag match. Erase shifts
// later slots of the run back (no tombstones), so lookups never slow down with churn.
// The values are numbered densely (0 .. size-1) in chunks of 4096 whose pages are
// touched only as values are placed there.
//
// Memory and speed: a 64-byte value costs 64 bytes, plus 5 bytes a slot. Capacity
// doubles as the table grows (load between 7/16 and 7/8: 5.7..11.4 bytes a value);
// reserve() sizes it to the count asked at a load of 7/10 (recovery of the NVMe index
// reserves its count). Before, the values sat in the slots: a 64-byte value cost 65
// bytes a slot, 148 bytes a value at 7/16 after a doubling. The cost of the indirection
// is one more dependent read per lookup, which a batch overlaps (prefetch_values); the
// low load keeps it: near 7/8 most slots sit off their home, and a Lookup at 232k
// blocks took 44 us at the median instead of 14 us (kvtier-bench scale) when the table
// grew by half.
//
// Values move only on erase: the last value fills the hole (and takes its number).
// Every erase takes `moved`, called with the value at its new place, so an owner that
// keeps pointers to values or their numbers (BlockStore's per-tier residents) can
// follow it. No pointer or number survives an erase unless `moved` says where it went;
// inserting moves nothing.
//
// V: default-constructible, movable and trivially destructible, with a member
// `BlockHash hash` (an empty hash is never a key).
//
// Thread-safety: none; the owner serializes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/block_key.h"

namespace kvtier {

template <class V>
class BlockTable {
  static_assert(std::is_trivially_destructible_v<V>, "chunks are freed without destructors");

 public:
  BlockTable() = default;
  BlockTable(BlockTable&&) noexcept = default;
  BlockTable& operator=(BlockTable&&) noexcept = default;

  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  // Bytes held: the slots' two arrays and the values' chunks as far as values were
  // placed in them (untouched pages of a chunk cost nothing).
  size_t memory_bytes() const {
    return capacity_ * (sizeof(uint32_t) + 1) + placed_ * sizeof(V) +
           chunks_.capacity() * sizeof(Chunk);
  }

  V* find(const BlockHash& hash) { return const_cast<V*>(std::as_const(*this).find(hash)); }
  const V* find(const BlockHash& hash) const {
    if (capacity_ == 0) return nullptr;
    const uint64_t code = BlockHashHasher()(hash);
    const uint8_t tag = tag_of(code);
    for (size_t i = home_of(code); /* the load < 1: an empty byte comes */; i = next(i)) {
      const uint8_t c = control_[i];
      if (c == 0) return nullptr;
      if (c == tag) {
        const V& value = at(numbers_[i]);
        if (value.hash == hash) return &value;
      }
    }
  }
  bool contains(const BlockHash& hash) const { return find(hash) != nullptr; }

  // Values are numbered 0 .. size()-1: an owner may keep a value's number instead of a
  // pointer (4 bytes, not 8). Erase renumbers the last value (moved() is told).
  V& at(uint32_t number) { return chunks_[number >> kChunkBits].get()[number & kChunkMask]; }
  const V& at(uint32_t number) const {
    return chunks_[number >> kChunkBits].get()[number & kChunkMask];
  }
  // The number of `value` (a reference from find/try_emplace/at): a probe for its hash.
  uint32_t number_of(const V& value) const { return numbers_[find_slot(value.hash, &value)]; }

  // Starts loading the cache lines a find(hash) reads first: the home slot's control
  // byte and value number.
  void prefetch(const BlockHash& hash) const {
    if (capacity_ == 0) return;
    const size_t i = home_of(BlockHashHasher()(hash));
    __builtin_prefetch(&control_[i]);
    __builtin_prefetch(&numbers_[i]);
  }
  // Then, once those arrived (prefetch() on every hash of a batch first), starts loading
  // the value of the first slot whose tag matches: what find(hash) reads last.
  void prefetch_value(const BlockHash& hash) const {
    if (capacity_ == 0) return;
    const uint64_t code = BlockHashHasher()(hash);
    const uint8_t tag = tag_of(code);
    for (size_t i = home_of(code);; i = next(i)) {
      const uint8_t c = control_[i];
      if (c == 0) return;
      if (c == tag) {
        __builtin_prefetch(&at(numbers_[i]));
        return;
      }
    }
  }

  // The value under `hash`, default-constructed (with its hash set) if there was none;
  // .second is whether it was inserted. Moves no value. REQUIRES: hash is not empty.
  template <class Moved>
  std::pair<V*, bool> try_emplace(const BlockHash& hash, Moved&& moved) {
    (void)moved;  // nothing moves on insert
    if (V* found = find(hash)) return {found, false};
    if ((size_ + 1) * 8 > capacity_ * 7) grow(capacity_ == 0 ? kMinCapacity : capacity_ * 2);
    const auto number = static_cast<uint32_t>(size_);
    V& value = place(number);
    value = V{};
    value.hash = hash;
    const uint64_t code = BlockHashHasher()(hash);
    size_t i = home_of(code);
    while (control_[i] != 0) i = next(i);
    control_[i] = tag_of(code);
    numbers_[i] = number;
    ++size_;
    return {&value, true};
  }

  // Removes the value at `value` (a pointer from find/try_emplace). The last value
  // moves into its place (reported to `moved`).
  template <class Moved>
  void erase(V* value, Moved&& moved) {
    size_t hole = find_slot(value->hash, value);
    const uint32_t number = numbers_[hole];
    // Backward shift: a slot of the run after the hole moves into it when the hole lies
    // between the slot's home and its place, i.e. when lookups for it would stop there.
    for (size_t j = next(hole); control_[j] != 0; j = next(j)) {
      const size_t home = home_of(BlockHashHasher()(at(numbers_[j]).hash));
      if (distance(home, j) < distance(hole, j)) continue;
      numbers_[hole] = numbers_[j];
      control_[hole] = control_[j];
      hole = j;
    }
    control_[hole] = 0;
    --size_;
    const auto last = static_cast<uint32_t>(size_);
    if (number != last) {
      V& from = at(last);
      numbers_[find_slot(from.hash, last)] = number;
      V& into = at(number);
      into = std::move(from);
      from = V{};
      moved(into);
    } else {
      at(number) = V{};
    }
  }

  // Room for `count` values without growing.
  template <class Moved>
  void reserve(size_t count, Moved&& moved) {
    (void)moved;  // nothing moves
    if (count * 8 <= capacity_ * 7) return;
    grow(std::max(kMinCapacity, (count * 10 + 6) / 7));
  }

 private:
  static constexpr size_t kMinCapacity = 16;
  static constexpr uint32_t kChunkBits = 12;  // 4096 values a chunk
  static constexpr uint32_t kChunkValues = 1u << kChunkBits;
  static constexpr uint32_t kChunkMask = kChunkValues - 1;
  // A value the size of a cache line starts on one.
  static constexpr size_t kValueAlign = sizeof(V) % 64 == 0 ? 64 : alignof(V);

  // Raw storage for kChunkValues values: placed ones are constructed, the rest untouched.
  struct ChunkFree {
    void operator()(V* values) const { ::operator delete (values, std::align_val_t{kValueAlign}); }
  };
  using Chunk = std::unique_ptr<V, ChunkFree>;

  // The value numbered `number`, made when no value was ever placed there.
  V& place(uint32_t number) {
    while (placed_ <= number) {
      if ((placed_ & kChunkMask) == 0) {
        chunks_.emplace_back(static_cast<V*>(
            ::operator new (sizeof(V) * kChunkValues, std::align_val_t{kValueAlign})));
      }
      new (&at(placed_)) V{};
      ++placed_;
    }
    return at(number);
  }
  // The slot of `value` (under `hash`), or of the value numbered `number`. REQUIRES:
  // the table holds it.
  size_t find_slot(const BlockHash& hash, const V* value) const {
    for (size_t i = home_of(BlockHashHasher()(hash));; i = next(i)) {
      if (control_[i] != 0 && &at(numbers_[i]) == value) return i;
    }
  }
  size_t find_slot(const BlockHash& hash, uint32_t number) const {
    for (size_t i = home_of(BlockHashHasher()(hash));; i = next(i)) {
      if (control_[i] != 0 && numbers_[i] == number) return i;
    }
  }

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

  void grow(size_t capacity) {
    std::unique_ptr<uint32_t[]> old_numbers =
        std::exchange(numbers_, std::make_unique_for_overwrite<uint32_t[]>(capacity));
    std::unique_ptr<uint8_t[]> old_control =
        std::exchange(control_, std::make_unique<uint8_t[]>(capacity));  // zeroed: empty
    const size_t old_capacity = std::exchange(capacity_, capacity);
    for (size_t j = 0; j < old_capacity; ++j) {
      if (old_control[j] == 0) continue;
      size_t i = home_of(BlockHashHasher()(at(old_numbers[j]).hash));
      while (control_[i] != 0) i = next(i);
      control_[i] = old_control[j];
      numbers_[i] = old_numbers[j];
    }
  }

  std::unique_ptr<uint8_t[]> control_;
  std::unique_ptr<uint32_t[]> numbers_;  // of the slots whose control byte is set
  size_t capacity_ = 0;
  size_t size_ = 0;
  std::vector<Chunk> chunks_;
  uint32_t placed_ = 0;  // values constructed (numbers below it)
};

}  // namespace kvtier
