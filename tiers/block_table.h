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
// Layout: the slots are a SlotIndex (common/slot_index.h: linear probing over a control
// byte and a 4-byte value number per slot, a 7-bit tag, erase by backward shift). The
// values are numbered densely (0 .. size-1) in chunks of 4096 whose pages are touched
// only as values are placed there.
//
// Memory and speed: a 64-byte value costs 64 bytes, plus 5 bytes a slot. Capacity
// doubles as the table grows (load between 7/16 and 7/8: 5.7..11.4 bytes a value);
// reserve() sizes it to the count asked at a load of 7/10 (recovery of the NVMe index
// reserves its count). Before, the values sat in the slots: a 64-byte value cost 65
// bytes a slot, 148 bytes a value at 7/16 after a doubling. The cost of the indirection
// is one more dependent read per lookup, which a batch overlaps (prefetch_value); the
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
#include "common/slot_index.h"

namespace kvtier {

template <class V>
class BlockTable {
  static_assert(std::is_trivially_destructible_v<V>, "chunks are freed without destructors");

 public:
  BlockTable() = default;
  BlockTable(BlockTable&&) noexcept = default;
  BlockTable& operator=(BlockTable&&) noexcept = default;

  size_t size() const { return size_; }
  size_t capacity() const { return slots_.capacity(); }
  // Bytes held: the slots and the values' chunks as far as values were placed in them
  // (untouched pages of a chunk cost nothing).
  size_t memory_bytes() const {
    return slots_.memory_bytes() + placed_ * sizeof(V) + chunks_.capacity() * sizeof(Chunk);
  }

  V* find(const BlockHash& hash) { return const_cast<V*>(std::as_const(*this).find(hash)); }
  const V* find(const BlockHash& hash) const {
    const uint32_t number =
        slots_.find(code_of(hash), [&](uint32_t n) { return at(n).hash == hash; });
    return number == SlotIndex::kNone ? nullptr : &at(number);
  }
  bool contains(const BlockHash& hash) const { return find(hash) != nullptr; }

  // Values are numbered 0 .. size()-1: an owner may keep a value's number instead of a
  // pointer (4 bytes, not 8). Erase renumbers the last value (moved() is told).
  V& at(uint32_t number) { return chunks_[number >> kChunkBits].get()[number & kChunkMask]; }
  const V& at(uint32_t number) const {
    return chunks_[number >> kChunkBits].get()[number & kChunkMask];
  }
  // The number of `value` (a reference from find/try_emplace/at): a probe for its hash.
  uint32_t number_of(const V& value) const {
    return slots_.find(code_of(value.hash), [&](uint32_t n) { return &at(n) == &value; });
  }

  // Starts loading the cache lines a find(hash) reads first: the home slot's control
  // byte and value number.
  void prefetch(const BlockHash& hash) const { slots_.prefetch(code_of(hash)); }
  // Then, once those arrived (prefetch() on every hash of a batch first), starts loading
  // the value of the first slot whose tag matches: what find(hash) reads last.
  void prefetch_value(const BlockHash& hash) const {
    const uint32_t number = slots_.first_tagged(code_of(hash));
    if (number != SlotIndex::kNone) __builtin_prefetch(&at(number));
  }

  // The value under `hash`, default-constructed (with its hash set) if there was none;
  // .second is whether it was inserted. Moves no value. REQUIRES: hash is not empty.
  template <class Moved>
  std::pair<V*, bool> try_emplace(const BlockHash& hash, Moved&& moved) {
    (void)moved;  // nothing moves on insert
    if (V* found = find(hash)) return {found, false};
    if (!slots_.has_room(size_)) grow(capacity() == 0 ? kMinCapacity : capacity() * 2);
    const auto number = static_cast<uint32_t>(size_);
    V& value = place(number);
    value = V{};
    value.hash = hash;
    slots_.insert(code_of(hash), number);
    ++size_;
    return {&value, true};
  }

  // Removes the value at `value` (a pointer from find/try_emplace). The last value
  // moves into its place (reported to `moved`).
  template <class Moved>
  void erase(V* value, Moved&& moved) {
    const uint32_t number = number_of(*value);
    slots_.erase(code_of(value->hash), number, codes());
    --size_;
    const auto last = static_cast<uint32_t>(size_);
    if (number != last) {
      V& from = at(last);
      slots_.renumber(code_of(from.hash), last, number);
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
    if (count * 8 <= capacity() * 7) return;
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

  static uint64_t code_of(const BlockHash& hash) { return BlockHashHasher()(hash); }
  auto codes() const {
    return [this](uint32_t number) { return code_of(at(number).hash); };
  }
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
  void grow(size_t capacity) { slots_.grow(capacity, codes()); }

  SlotIndex slots_;
  size_t size_ = 0;
  std::vector<Chunk> chunks_;
  uint32_t placed_ = 0;  // values constructed (numbers below it)
};

}  // namespace kvtier
