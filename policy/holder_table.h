// HolderTable: the SessionTable's reverse index for one layout, from a block hash to
// the facts about who holds the block (BlockHolders), in a flat table of small entries.
//
// Why not std::unordered_map<BlockKey, BlockHolders>: its node is 112 bytes in a
// 128-byte allocator chunk, plus a bucket pointer (~140 B per block held), and a
// session's block list kept an 8-byte pointer to the node per block. Here an entry is
// 72 bytes: the holders' facts (38 bytes, the holders themselves in one word:
// HolderSet) and the 33-byte hash in their padding; the layout is the table's (one
// table per layout), not 16 bytes per entry. Entries live in chunks that never move, so
// a session's block list keeps 4-byte entry numbers (Id). The index from hash to entry
// is an open-addressing table of a control byte and a 4-byte Id per slot (5 bytes, at a
// load of 7/16..7/8 after growing by doubling), laid out as BlockTable's
// (tiers/block_table.h): linear probing, a 7-bit tag per slot so a probe touches an
// entry only on a tag match, erase by backward shift (no tombstones).
//
// A freed Id is handed out again; an entry keeps its address while its Id is taken.
//
// Thread-safety: none; the SessionTable's owner serializes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "common/block_key.h"

namespace kvtier::policy {

template <class Holders>
class HolderTable {
 public:
  using Id = uint32_t;
  static constexpr Id kNone = UINT32_MAX;

  struct Entry {
    [[no_unique_address]] Holders holders;  // the hash may sit in its tail padding
    BlockHash hash;
  };

  HolderTable() = default;
  HolderTable(const HolderTable&) = delete;
  HolderTable& operator=(const HolderTable&) = delete;

  size_t size() const { return size_; }
  Entry& at(Id id) { return chunks_[id >> kChunkBits][id & kChunkMask]; }
  const Entry& at(Id id) const { return chunks_[id >> kChunkBits][id & kChunkMask]; }

  // The entry of `hash`; kNone when absent.
  Id find(const BlockHash& hash) const {
    if (capacity_ == 0) return kNone;
    const uint64_t code = BlockHashHasher()(hash);
    const uint8_t tag = tag_of(code);
    for (size_t i = home_of(code); /* the load < 1: an empty byte comes */; i = next(i)) {
      const uint8_t c = control_[i];
      if (c == 0) return kNone;
      if (c == tag && at(ids_[i]).hash == hash) return ids_[i];
    }
  }

  // The entry of `hash`, made (default holders) when absent; .second: it was made.
  std::pair<Id, bool> try_emplace(const BlockHash& hash) {
    if (Id found = find(hash); found != kNone) return {found, false};
    if ((size_ + 1) * 8 > capacity_ * 7) grow(capacity_ == 0 ? kMinCapacity : capacity_ * 2);
    const Id id = take_id();
    at(id).hash = hash;
    const uint64_t code = BlockHashHasher()(hash);
    size_t i = home_of(code);
    while (control_[i] != 0) i = next(i);
    control_[i] = tag_of(code);
    ids_[i] = id;
    ++size_;
    return {id, true};
  }

  // Removes the entry (its holders reset to their default).
  void erase(Id id) {
    Entry& entry = at(id);
    size_t hole = home_of(BlockHashHasher()(entry.hash));
    while (control_[hole] == 0 || ids_[hole] != id) hole = next(hole);
    // Backward shift: an entry of the run after the hole moves into it when the hole
    // lies between that entry's home and its place (lookups for it would stop there).
    for (size_t j = next(hole); control_[j] != 0; j = next(j)) {
      const size_t home = home_of(BlockHashHasher()(at(ids_[j]).hash));
      if (distance(home, j) < distance(hole, j)) continue;
      ids_[hole] = ids_[j];
      control_[hole] = control_[j];
      hole = j;
    }
    control_[hole] = 0;
    --size_;
    entry = Entry{};
    free_ids_.push_back(id);
  }

 private:
  static constexpr uint32_t kChunkBits = 12;  // 4096 entries (288 KiB) a chunk
  static constexpr uint32_t kChunkMask = (1u << kChunkBits) - 1;
  static constexpr size_t kMinCapacity = 16;

  Id take_id() {
    if (!free_ids_.empty()) {
      const Id id = free_ids_.back();
      free_ids_.pop_back();
      return id;
    }
    const Id id = next_id_++;
    if ((id >> kChunkBits) == chunks_.size()) {
      chunks_.push_back(std::make_unique<Entry[]>(size_t{1} << kChunkBits));
    }
    return id;
  }

  static uint8_t tag_of(uint64_t code) { return static_cast<uint8_t>(0x80 | (code >> 57)); }
  // The low 57 bits (those the tag leaves), scaled to [0, capacity_).
  size_t home_of(uint64_t code) const {
    return static_cast<size_t>((static_cast<unsigned __int128>(code << 7) * capacity_) >> 64);
  }
  size_t next(size_t i) const { return i + 1 == capacity_ ? 0 : i + 1; }
  size_t distance(size_t from, size_t to) const {
    return to >= from ? to - from : to + capacity_ - from;
  }

  void grow(size_t capacity) {
    std::unique_ptr<Id[]> old_ids = std::exchange(ids_, std::make_unique_for_overwrite<Id[]>(capacity));
    std::unique_ptr<uint8_t[]> old_control =
        std::exchange(control_, std::make_unique<uint8_t[]>(capacity));  // zeroed: empty
    const size_t old_capacity = std::exchange(capacity_, capacity);
    for (size_t j = 0; j < old_capacity; ++j) {
      if (old_control[j] == 0) continue;
      size_t i = home_of(BlockHashHasher()(at(old_ids[j]).hash));
      while (control_[i] != 0) i = next(i);
      control_[i] = old_control[j];
      ids_[i] = old_ids[j];
    }
  }

  std::vector<std::unique_ptr<Entry[]>> chunks_;
  Id next_id_ = 0;            // Ids below it were handed out at least once
  std::vector<Id> free_ids_;  // handed out and given back
  std::unique_ptr<uint8_t[]> control_;
  std::unique_ptr<Id[]> ids_;
  size_t capacity_ = 0;
  size_t size_ = 0;
};

}  // namespace kvtier::policy
