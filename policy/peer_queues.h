// Internal to policy/peer_policy.cpp: the blocks a peer policy knows, by dense id, and
// the intrusive queues over those ids its per-tier algorithms (peer_tiers.h) keep, so
// that an event costs one hash lookup and a rank call works on arrays.
//
// Thread-safety: none; owned by one PeerPolicy.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/block_key.h"
#include "common/slot_index.h"

namespace kvtier::policy::peer {

inline constexpr uint32_t kNil = std::numeric_limits<uint32_t>::max();
static_assert(kNil == SlotIndex::kNone, "Entries::find returns the index's kNone as kNil");

inline size_t tier_index(Tier tier) {
  return std::min<size_t>(static_cast<size_t>(tier), kLocalTierCount - 1);
}
inline uint8_t tier_bit(Tier tier) {
  return static_cast<uint8_t>(1u << tier_index(tier));
}

// The blocks a policy knows, by dense id (one hash lookup per event; the algorithms
// then work on arrays), and for each tier the queue of that tier's algorithm the
// block is in, with its links: the queues are intrusive lists over ids. An id is freed
// when no tier's queue (resident or ghost) holds it.
class Entries {
 public:
  struct Link {
    uint32_t prev = kNil;
    uint32_t next = kNil;
    uint8_t queue = 0;  // 0: in none of this tier's queues
    uint8_t freq = 0;   // the algorithm's use count, where it keeps one
  };
  struct Entry {
    BlockKey key;
    uint64_t hash = 0;  // of the key: its code in the index, and TinyLFU's sketch's
    std::array<Link, kLocalTierCount> tier;
    uint64_t request = 0;   // the request that last named it (Save or Load), by number
    uint32_t position = 0;  // its place in that request
    bool loaded = false;    // a Load read it since its last Save
    bool live = false;      // the id is in use (not on the free list)
  };

  uint32_t find(const BlockKey& key) const { return find(key, BlockKeyHasher{}(key)); }
  uint32_t get(const BlockKey& key) {
    const uint64_t code = BlockKeyHasher{}(key);
    if (const uint32_t found = find(key, code); found != kNil) return found;
    uint32_t id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
      entries_[id] = Entry{};
    } else {
      id = static_cast<uint32_t>(entries_.size());
      entries_.emplace_back();
    }
    entries_[id].key = key;
    entries_[id].hash = code;
    entries_[id].live = true;
    if (!slots_.has_room(live_)) {
      slots_.grow(slots_.capacity() == 0 ? kMinSlots : slots_.capacity() * 2, code_of());
    }
    slots_.insert(code, id);
    ++live_;
    return id;
  }
  // Idempotent: an id a ghost queue dropped may be released again by the event that
  // made the drop.
  void release_if_unused(uint32_t id) {
    Entry& entry = entries_[id];
    if (!entry.live) return;
    for (const Link& link : entry.tier) {
      if (link.queue != 0) return;
    }
    slots_.erase(entry.hash, id, code_of());
    --live_;
    entry.live = false;
    free_.push_back(id);
  }
  Entry& operator[](uint32_t id) { return entries_[id]; }
  const Entry& operator[](uint32_t id) const { return entries_[id]; }
  size_t capacity() const { return entries_.size(); }

 private:
  static constexpr size_t kMinSlots = 64;
  uint32_t find(const BlockKey& key, uint64_t code) const {
    return slots_.find(code, [&](uint32_t id) { return entries_[id].key == key; });
  }
  struct CodeOf {
    const std::vector<Entry>* entries;
    uint64_t operator()(uint32_t id) const { return (*entries)[id].hash; }
  };
  CodeOf code_of() const { return CodeOf{&entries_}; }

  // Key → id: a flat index over the entries' hash codes (common/slot_index.h), not a
  // node per block.
  SlotIndex slots_;
  size_t live_ = 0;  // ids in use
  std::vector<Entry> entries_;
  std::vector<uint32_t> free_;
};

// One queue of one tier's algorithm: an intrusive list over ids, front newest.
class IdQueue {
 public:
  IdQueue(Entries& entries, size_t tier, uint8_t tag) : e_(&entries), tier_(tier), tag_(tag) {}
  bool holds(uint32_t id) const { return link(id).queue == tag_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  uint32_t back() const { return tail_; }
  void push_front(uint32_t id) {
    Entries::Link& l = link(id);
    l.queue = tag_;
    l.prev = kNil;
    l.next = head_;
    if (head_ != kNil) link(head_).prev = id;
    head_ = id;
    if (tail_ == kNil) tail_ = id;
    ++size_;
  }
  void erase(uint32_t id) {
    Entries::Link& l = link(id);
    if (l.prev != kNil)
      link(l.prev).next = l.next;
    else
      head_ = l.next;
    if (l.next != kNil)
      link(l.next).prev = l.prev;
    else
      tail_ = l.prev;
    l.prev = l.next = kNil;
    l.queue = 0;
    --size_;
  }
  void to_front(uint32_t id) {
    if (head_ == id) return;
    erase(id);
    push_front(id);
  }
  // Oldest first; `fn` may not change this queue.
  template <typename Fn>
  void for_each_oldest_first(Fn&& fn) const {
    for (uint32_t id = tail_; id != kNil; id = link(id).prev) fn(id);
  }
  // The ids older than `id` (all of them when it is not here), oldest first: a walk
  // from the tail that stops at `id`.
  template <typename Fn>
  void for_each_older_than(uint32_t id, Fn&& fn) const {
    for (uint32_t k = tail_; k != kNil && k != id; k = link(k).prev) fn(k);
  }
  uint8_t& freq(uint32_t id) { return link(id).freq; }
  uint8_t freq(uint32_t id) const { return link(id).freq; }

 private:
  Entries::Link& link(uint32_t id) { return (*e_)[id].tier[tier_]; }
  const Entries::Link& link(uint32_t id) const { return (*e_)[id].tier[tier_]; }

  Entries* e_;
  size_t tier_;
  uint8_t tag_;
  uint32_t head_ = kNil, tail_ = kNil;
  size_t size_ = 0;
};

}  // namespace kvtier::policy::peer
