// HolderTable: the SessionTable's reverse index, from a block (layout + hash) to the
// facts about who holds it (BlockHolders), in a flat table of small entries.
//
// Why not std::unordered_map<BlockKey, BlockHolders>: its node is 112 bytes in a
// 128-byte allocator chunk, plus a bucket pointer (~140 B per block held), and a
// session's block list kept an 8-byte pointer to the node per block. Here an entry is
// 80 bytes: the 33-byte hash, a 4-byte layout number in place of the 16-byte LayoutKey
// (the table numbers the layouts it holds blocks of), and the holders' facts (40 bytes
// with the holders themselves in one word: HolderSet). Entries
// live in chunks that never move, so a session's block list keeps 4-byte entry numbers
// (Id). The index from key to entry is an open-addressing table of a control byte and a
// 4-byte Id per slot (5 bytes, at a load of 7/16..7/8 after growing by doubling), laid
// out as BlockTable's (tiers/block_table.h): linear probing, a 7-bit tag per slot so a
// probe touches an entry only on a tag match, erase by backward shift (no tombstones).
//
// A freed Id is handed out again; an entry keeps its address while its Id is taken.
//
// Thread-safety: none; the SessionTable's owner serializes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
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
    BlockHash hash;
    uint32_t layout = 0;  // the table's number for its LayoutKey (layout_of)
    Holders holders;
  };

  HolderTable() = default;
  HolderTable(const HolderTable&) = delete;
  HolderTable& operator=(const HolderTable&) = delete;

  size_t size() const { return size_; }
  Entry& at(Id id) { return chunks_[id >> kChunkBits][id & kChunkMask]; }
  const Entry& at(Id id) const { return chunks_[id >> kChunkBits][id & kChunkMask]; }
  const LayoutKey& layout_of(const Entry& entry) const { return layouts_[entry.layout].key; }
  BlockKey key_of(Id id) const {
    const Entry& entry = at(id);
    return {layout_of(entry), entry.hash};
  }

  // The entry of `key`; kNone when absent.
  Id find(const BlockKey& key) const {
    auto layout = layout_ids_.find(key.layout);
    if (layout == layout_ids_.end()) return kNone;
    return find(layout->second, key.hash);
  }

  // The entry of `key`, made (default holders) when absent; .second: it was made.
  std::pair<Id, bool> try_emplace(const BlockKey& key) {
    auto [layout, new_layout] = layout_ids_.try_emplace(key.layout, 0);
    if (new_layout) {
      if (free_layouts_.empty()) {
        layout->second = static_cast<uint32_t>(layouts_.size());
        layouts_.push_back({key.layout, 0});
      } else {
        layout->second = free_layouts_.back();
        free_layouts_.pop_back();
        layouts_[layout->second] = {key.layout, 0};
      }
    } else if (Id found = find(layout->second, key.hash); found != kNone) {
      return {found, false};
    }
    if ((size_ + 1) * 8 > capacity_ * 7) grow(capacity_ == 0 ? kMinCapacity : capacity_ * 2);
    const Id id = take_id();
    Entry& entry = at(id);
    entry.hash = key.hash;
    entry.layout = layout->second;
    ++layouts_[entry.layout].entries;
    const uint64_t code = code_of(entry.layout, key.hash);
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
    const uint64_t code = code_of(entry.layout, entry.hash);
    size_t hole = home_of(code);
    while (ids_[hole] != id || control_[hole] == 0) hole = next(hole);
    // Backward shift: an entry of the run after the hole moves into it when the hole
    // lies between that entry's home and its place (lookups for it would stop there).
    for (size_t j = next(hole); control_[j] != 0; j = next(j)) {
      const Entry& later = at(ids_[j]);
      const size_t home = home_of(code_of(later.layout, later.hash));
      if (distance(home, j) < distance(hole, j)) continue;
      ids_[hole] = ids_[j];
      control_[hole] = control_[j];
      hole = j;
    }
    control_[hole] = 0;
    --size_;
    if (--layouts_[entry.layout].entries == 0) {
      layout_ids_.erase(layouts_[entry.layout].key);
      free_layouts_.push_back(entry.layout);
    }
    entry = Entry{};
    free_ids_.push_back(id);
  }

 private:
  static constexpr uint32_t kChunkBits = 12;  // 4096 entries (320 KiB) a chunk
  static constexpr uint32_t kChunkMask = (1u << kChunkBits) - 1;
  static constexpr size_t kMinCapacity = 16;

  struct Layout {
    LayoutKey key;
    uint32_t entries = 0;
  };

  Id find(uint32_t layout, const BlockHash& hash) const {
    if (capacity_ == 0) return kNone;
    const uint64_t code = code_of(layout, hash);
    const uint8_t tag = tag_of(code);
    for (size_t i = home_of(code); /* the load < 1: an empty byte comes */; i = next(i)) {
      const uint8_t c = control_[i];
      if (c == 0) return kNone;
      if (c == tag) {
        const Entry& entry = at(ids_[i]);
        if (entry.layout == layout && entry.hash == hash) return ids_[i];
      }
    }
  }

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

  static uint64_t code_of(uint32_t layout, const BlockHash& hash) {
    return BlockHashHasher()(hash) ^ (uint64_t{layout} * 0x9E3779B97F4A7C15ull);
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
    std::unique_ptr<Id[]> old_ids = std::exchange(ids_, std::make_unique<Id[]>(capacity));
    std::unique_ptr<uint8_t[]> old_control =
        std::exchange(control_, std::make_unique<uint8_t[]>(capacity));  // zeroed: empty
    const size_t old_capacity = std::exchange(capacity_, capacity);
    for (size_t j = 0; j < old_capacity; ++j) {
      if (old_control[j] == 0) continue;
      const Entry& entry = at(old_ids[j]);
      size_t i = home_of(code_of(entry.layout, entry.hash));
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
  std::vector<Layout> layouts_;
  std::unordered_map<LayoutKey, uint32_t, LayoutKeyHasher> layout_ids_;
  std::vector<uint32_t> free_layouts_;
};

}  // namespace kvtier::policy
