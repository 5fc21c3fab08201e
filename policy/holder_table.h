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
// is a SlotIndex (common/slot_index.h): a control byte and a 4-byte Id per slot (5
// bytes, at a load of 7/16..7/8 after growing by doubling), a 7-bit tag per slot so a
// probe touches an entry only on a tag match.
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
#include "common/slot_index.h"

namespace kvtier::policy {

template <class Holders>
class HolderTable {
 public:
  using Id = uint32_t;
  static constexpr Id kNone = SlotIndex::kNone;

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
    return slots_.find(code_of(hash), [&](Id id) { return at(id).hash == hash; });
  }

  // The entry of `hash`, made (default holders) when absent; .second: it was made.
  std::pair<Id, bool> try_emplace(const BlockHash& hash) {
    if (Id found = find(hash); found != kNone) return {found, false};
    if (!slots_.has_room(size_)) {
      const size_t capacity = slots_.capacity();
      slots_.grow(capacity == 0 ? kMinCapacity : capacity * 2, codes());
    }
    const Id id = take_id();
    at(id).hash = hash;
    slots_.insert(code_of(hash), id);
    ++size_;
    return {id, true};
  }

  // Removes the entry (its holders reset to their default).
  void erase(Id id) {
    Entry& entry = at(id);
    slots_.erase(code_of(entry.hash), id, codes());
    --size_;
    entry = Entry{};
    free_ids_.push_back(id);
  }

 private:
  static constexpr uint32_t kChunkBits = 12;  // 4096 entries (288 KiB) a chunk
  static constexpr uint32_t kChunkMask = (1u << kChunkBits) - 1;
  static constexpr size_t kMinCapacity = 16;

  static uint64_t code_of(const BlockHash& hash) { return BlockHashHasher()(hash); }
  auto codes() const {
    return [this](Id id) { return code_of(at(id).hash); };
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

  std::vector<std::unique_ptr<Entry[]>> chunks_;
  Id next_id_ = 0;            // Ids below it were handed out at least once
  std::vector<Id> free_ids_;  // handed out and given back
  SlotIndex slots_;
  size_t size_ = 0;
};

}  // namespace kvtier::policy
