// BlockTable: the block index of one layout, an open-addressing hash table keyed by
// block hash, with the values stored in the table itself.
//
// Why not std::unordered_map: at a million blocks a lookup there reads a bucket, then
// one or more nodes scattered over the heap, each a cache (and TLB) miss, and nothing
// can be fetched ahead. Here a lookup reads one control byte and, when its 7-bit tag
// matches, one slot; prefetch() lets a request that names many blocks (Lookup, Load)
// start every miss before it waits for the first.
//
// Layout: linear probing over an array of slots of any size, with a parallel array of
// control bytes (0 empty, else 0x80 | the hash's top 7 bits). A hash's home slot is its
// low 57 bits scaled to the capacity (multiply-shift, no power of two needed), so the
// tag and the home are independent bits. The load stays at most 7/8: probes scan
// control bytes, which are dense, and touch a slot only on a tag match. Erase shifts
// later entries of the run back (no tombstones), so lookups never slow down with churn.
//
// Memory and speed: a 64-byte value costs 65 bytes a slot. Capacity doubles as the table
// grows (load between 7/16 and 7/8); reserve() sizes it to the count asked at a load of
// 7/10 (93 bytes a 64-byte value; recovery of the NVMe index reserves its count), which
// a power of two would round up to as little as 7/20. Growing by half instead would keep
// the load above 4/7 always, but near 7/8 most values sit off their home slot — a cache
// miss the lookup's prefetch does not cover — and a Lookup at 232k blocks took 44 µs at
// the median instead of 14 µs (kvtier-bench scale).

// Values move: on growth (all of them) and on erase (the entries after the hole). Every
// mutating call takes `moved`, called with each value at its new address, so an owner
// that keeps pointers to values (BlockStore's per-tier residents) can follow them. No
// pointer to a value survives a mutating call unless `moved` says where it went.
//
// V: default-constructible and movable, with a member `BlockHash hash` (empty in a
// default-constructed V; an empty hash is never a key).
//
// Thread-safety: none; the owner serializes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <utility>

#include "common/block_key.h"

namespace kvtier {

template <class V>
class BlockTable {
 public:
  BlockTable() = default;
  BlockTable(BlockTable&&) noexcept = default;
  BlockTable& operator=(BlockTable&&) noexcept = default;

  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  // Bytes held by the two arrays.
  size_t memory_bytes() const { return capacity_ * (sizeof(Slot) + 1); }

  V* find(const BlockHash& hash) { return const_cast<V*>(std::as_const(*this).find(hash)); }
  const V* find(const BlockHash& hash) const {
    if (capacity_ == 0) return nullptr;
    const uint64_t code = BlockHashHasher()(hash);
    const uint8_t tag = tag_of(code);
    for (size_t i = home_of(code); /* the load < 1: an empty byte comes */; i = next(i)) {
      const uint8_t c = control_[i];
      if (c == 0) return nullptr;
      if (c == tag && slots_[i].value.hash == hash) return &slots_[i].value;
    }
  }
  bool contains(const BlockHash& hash) const { return find(hash) != nullptr; }

  // Starts loading the cache lines a find(hash) reads first.
  void prefetch(const BlockHash& hash) const {
    if (capacity_ == 0) return;
    const size_t i = home_of(BlockHashHasher()(hash));
    __builtin_prefetch(&control_[i]);
    __builtin_prefetch(&slots_[i]);
  }

  // The value under `hash`, default-constructed (with its hash set) if there was none;
  // .second is whether it was inserted. REQUIRES: hash is not empty.
  template <class Moved>
  std::pair<V*, bool> try_emplace(const BlockHash& hash, Moved&& moved) {
    if (V* found = find(hash)) return {found, false};
    if ((size_ + 1) * 8 > capacity_ * 7) {
      grow(capacity_ == 0 ? kMinCapacity : capacity_ * 2, moved);
    }
    const uint64_t code = BlockHashHasher()(hash);
    size_t i = home_of(code);
    while (control_[i] != 0) i = next(i);
    control_[i] = tag_of(code);
    slots_[i].value = V{};
    slots_[i].value.hash = hash;
    ++size_;
    return {&slots_[i].value, true};
  }

  // Removes the value at `value` (a pointer from find/try_emplace).
  template <class Moved>
  void erase(V* value, Moved&& moved) {
    size_t hole = static_cast<size_t>(reinterpret_cast<Slot*>(value) - slots_.get());
    // Backward shift: an entry of the run after the hole moves into it when the hole
    // lies between the entry's home and its place, i.e. when lookups for it would
    // stop at the hole.
    for (size_t j = next(hole); control_[j] != 0; j = next(j)) {
      const size_t home = home_of(BlockHashHasher()(slots_[j].value.hash));
      if (distance(home, j) < distance(hole, j)) continue;
      slots_[hole].value = std::move(slots_[j].value);
      control_[hole] = control_[j];
      moved(slots_[hole].value);
      hole = j;
    }
    control_[hole] = 0;
    slots_[hole].value = V{};
    --size_;
  }

  // Room for `count` values without growing.
  template <class Moved>
  void reserve(size_t count, Moved&& moved) {
    if (count * 8 <= capacity_ * 7) return;
    grow(std::max(kMinCapacity, (count * 10 + 6) / 7), moved);
  }

 private:
  static constexpr size_t kMinCapacity = 16;
  // A slot the size of a cache line starts on one.
  static constexpr size_t kSlotAlign = sizeof(V) % 64 == 0 ? 64 : alignof(V);
  struct alignas(kSlotAlign) Slot {
    V value;
  };

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

  template <class Moved>
  void grow(size_t capacity, Moved& moved) {
    std::unique_ptr<Slot[]> old_slots = std::exchange(slots_, std::make_unique<Slot[]>(capacity));
    std::unique_ptr<uint8_t[]> old_control =
        std::exchange(control_, std::make_unique<uint8_t[]>(capacity));  // zeroed: empty
    const size_t old_capacity = std::exchange(capacity_, capacity);
    for (size_t j = 0; j < old_capacity; ++j) {
      if (old_control[j] == 0) continue;
      size_t i = home_of(BlockHashHasher()(old_slots[j].value.hash));
      while (control_[i] != 0) i = next(i);
      control_[i] = old_control[j];
      slots_[i].value = std::move(old_slots[j].value);
      moved(slots_[i].value);
    }
  }

  std::unique_ptr<Slot[]> slots_;
  std::unique_ptr<uint8_t[]> control_;
  size_t capacity_ = 0;
  size_t size_ = 0;
};

}  // namespace kvtier
