#include "policy/peer_policy.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <limits>
#include <unordered_map>

#include "policy/plan_state.h"
#include "policy/planner.h"

namespace kvtier::policy {
namespace {

constexpr uint32_t kNil = std::numeric_limits<uint32_t>::max();

size_t tier_index(Tier tier) {
  return std::min<size_t>(static_cast<size_t>(tier), kLocalTierCount - 1);
}
uint8_t tier_bit(Tier tier) {
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
    uint64_t hash = 0;  // of the key, for TinyLFU's sketch
    std::array<Link, kLocalTierCount> tier;
    uint64_t request = 0;   // the request that last named it (Save or Load), by number
    uint32_t position = 0;  // its place in that request
    bool loaded = false;    // a Load read it since its last Save
    bool live = false;      // the id is in use (not on the free list)
  };

  uint32_t find(const BlockKey& key) const {
    auto it = ids_.find(key);
    return it == ids_.end() ? kNil : it->second;
  }
  uint32_t get(const BlockKey& key) {
    auto [it, inserted] = ids_.try_emplace(key, kNil);
    if (!inserted) return it->second;
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
    entries_[id].hash = BlockKeyHasher{}(key);
    entries_[id].live = true;
    it->second = id;
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
    ids_.erase(entry.key);
    entry.live = false;
    free_.push_back(id);
  }
  Entry& operator[](uint32_t id) { return entries_[id]; }
  const Entry& operator[](uint32_t id) const { return entries_[id]; }
  size_t capacity() const { return entries_.size(); }

 private:
  std::unordered_map<BlockKey, uint32_t, BlockKeyHasher> ids_;
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

// What every tier's algorithm offers PerTierPolicy. `order` gets the ids it holds
// resident in the order its evictions would take them.
//   void entered(uint32_t id); void left(uint32_t id, bool sacrificed);
//   void used(uint32_t id); void rank(std::vector<uint32_t>& order) const;

// ---- S3-FIFO, one tier ----
class S3FifoTier {
 public:
  static constexpr double kSmallShare = 0.10;
  static constexpr double kGhostShare = 0.90;
  static constexpr uint8_t kMaxFreq = 3;

  S3FifoTier(Entries& e, size_t tier) : small_(e, tier, 1), main_(e, tier, 2), ghost_(e, tier, 3) {}
  void set_capacity(uint64_t blocks) { capacity_ = std::max<uint64_t>(blocks, 1); }
  void entered(uint32_t id) {
    if (small_.holds(id) || main_.holds(id)) return;
    if (ghost_.holds(id)) {
      ghost_.erase(id);
      main_.push_front(id);
    } else {
      small_.push_front(id);
    }
    small_.freq(id) = 0;  // (one freq per tier, whichever queue)
  }
  void used(uint32_t id) {
    if (!small_.holds(id) && !main_.holds(id)) return;
    uint8_t& f = small_.freq(id);
    f = static_cast<uint8_t>(std::min<int>(f + 1, kMaxFreq));
  }
  void left(uint32_t id, bool sacrificed) {
    if (!small_.holds(id) && !main_.holds(id)) return;
    if (!sacrificed) {  // moved up: it simply is not here any more
      (small_.holds(id) ? small_ : main_).erase(id);
      return;
    }
    if (small_.holds(id)) {
      // What S3-FIFO did before this block's turn came: the older blocks of the small
      // FIFO that were used moved to main.
      for (uint32_t k : older_than(small_, id)) {
        if (small_.freq(k) >= 1) {
          small_.erase(k);
          main_.push_front(k);
        }
      }
      const bool used = small_.freq(id) >= 1;
      small_.erase(id);
      if (!used) {
        ghost_.push_front(id);
        const auto cap = static_cast<size_t>(kGhostShare * static_cast<double>(capacity_));
        while (ghost_.size() > std::max<size_t>(cap, 1)) drop_ghost();
      }
    } else {
      // And in main: the older blocks used since they last passed the tail went round
      // again, one use less.
      for (uint32_t k : older_than(main_, id)) {
        uint8_t& f = main_.freq(k);
        if (f > 0) {
          --f;
          main_.to_front(k);
        }
      }
      main_.erase(id);
    }
  }
  // The order S3-FIFO's evictions would take the tier's blocks in, run on a copy.
  void rank(std::vector<uint32_t>& order) const {
    struct Item {
      uint32_t id;
      uint8_t freq;
    };
    std::deque<Item> small, main;  // front: oldest
    small_.for_each_oldest_first([&](uint32_t k) { small.push_back({k, small_.freq(k)}); });
    main_.for_each_oldest_first([&](uint32_t k) { main.push_back({k, main_.freq(k)}); });
    const double small_limit = kSmallShare * static_cast<double>(capacity_);
    while (!small.empty() || !main.empty()) {
      if (!small.empty() && (static_cast<double>(small.size()) >= small_limit || main.empty())) {
        const Item item = small.front();
        small.pop_front();
        if (item.freq >= 1) {
          main.push_back(item);  // to main's newest end
        } else {
          order.push_back(item.id);
        }
      } else {
        Item item = main.front();
        main.pop_front();
        if (item.freq > 0) {
          --item.freq;
          main.push_back(item);
        } else {
          order.push_back(item.id);
        }
      }
    }
  }
  // A ghost dropped: the id may be free now.
  std::vector<uint32_t>& dropped() { return dropped_; }

 private:
  static std::vector<uint32_t> older_than(const IdQueue& queue, uint32_t id) {
    std::vector<uint32_t> out;
    bool reached = false;
    queue.for_each_oldest_first([&](uint32_t k) {
      if (k == id) reached = true;
      if (!reached) out.push_back(k);
    });
    return out;
  }
  void drop_ghost() {
    const uint32_t id = ghost_.back();
    ghost_.erase(id);
    dropped_.push_back(id);
  }

  IdQueue small_, main_, ghost_;
  uint64_t capacity_ = 1;
  std::vector<uint32_t> dropped_;
};

// ---- SLRU, one tier ----
class SlruTier {
 public:
  static constexpr double kProtectedShare = 0.80;

  SlruTier(Entries& e, size_t tier) : probation_(e, tier, 1), protected_(e, tier, 2) {}
  void set_capacity(uint64_t blocks) { capacity_ = std::max<uint64_t>(blocks, 1); }
  void entered(uint32_t id) {
    if (!protected_.holds(id) && !probation_.holds(id)) probation_.push_front(id);
  }
  void used(uint32_t id) {
    if (protected_.holds(id)) {
      protected_.to_front(id);
      return;
    }
    if (!probation_.holds(id)) return;
    probation_.erase(id);
    protected_.push_front(id);
    const auto limit = static_cast<size_t>(kProtectedShare * static_cast<double>(capacity_));
    while (protected_.size() > std::max<size_t>(limit, 1)) {
      const uint32_t oldest = protected_.back();
      protected_.erase(oldest);
      probation_.push_front(oldest);
    }
  }
  void left(uint32_t id, bool) {
    if (probation_.holds(id)) probation_.erase(id);
    if (protected_.holds(id)) protected_.erase(id);
  }
  void rank(std::vector<uint32_t>& order) const {
    probation_.for_each_oldest_first([&](uint32_t k) { order.push_back(k); });
    protected_.for_each_oldest_first([&](uint32_t k) { order.push_back(k); });
  }
  std::vector<uint32_t>& dropped() { return dropped_; }  // (no ghosts)

 private:
  IdQueue probation_, protected_;
  uint64_t capacity_ = 1;
  std::vector<uint32_t> dropped_;
};

// ---- ARC, one tier ----
class ArcTier {
 public:
  ArcTier(Entries& e, size_t tier)
      : t1_(e, tier, 1), t2_(e, tier, 2), b1_(e, tier, 3), b2_(e, tier, 4) {}
  void set_capacity(uint64_t blocks) { capacity_ = std::max<uint64_t>(blocks, 1); }
  void entered(uint32_t id) {
    if (t1_.holds(id) || t2_.holds(id)) return;
    const auto b1 = static_cast<double>(b1_.size()), b2 = static_cast<double>(b2_.size());
    const auto c = static_cast<double>(capacity_);
    if (b1_.holds(id)) {
      p_ = std::min(c, p_ + std::max(b2 / std::max(b1, 1.0), 1.0));
      b1_.erase(id);
      t2_.push_front(id);
    } else if (b2_.holds(id)) {
      p_ = std::max(0.0, p_ - std::max(b1 / std::max(b2, 1.0), 1.0));
      b2_.erase(id);
      t2_.push_front(id);
    } else {
      t1_.push_front(id);
    }
    trim_ghosts();
  }
  void used(uint32_t id) {
    if (t1_.holds(id)) {
      t1_.erase(id);
      t2_.push_front(id);
    } else if (t2_.holds(id)) {
      t2_.to_front(id);
    }
  }
  void left(uint32_t id, bool sacrificed) {
    if (t1_.holds(id)) {
      t1_.erase(id);
      if (sacrificed) b1_.push_front(id);
    } else if (t2_.holds(id)) {
      t2_.erase(id);
      if (sacrificed) b2_.push_front(id);
    }
    trim_ghosts();
  }
  // REPLACE, repeated: T1's LRU end while T1 holds more than p, else T2's.
  void rank(std::vector<uint32_t>& order) const {
    std::vector<uint32_t> t1, t2;  // oldest first
    t1_.for_each_oldest_first([&](uint32_t k) { t1.push_back(k); });
    t2_.for_each_oldest_first([&](uint32_t k) { t2.push_back(k); });
    size_t i1 = 0, i2 = 0;
    while (i1 < t1.size() || i2 < t2.size()) {
      const auto t1_left = static_cast<double>(t1.size() - i1);
      if (i1 < t1.size() && (t1_left > p_ || i2 == t2.size())) {
        order.push_back(t1[i1++]);
      } else {
        order.push_back(t2[i2++]);
      }
    }
  }
  std::vector<uint32_t>& dropped() { return dropped_; }

 private:
  void trim_ghosts() {
    while (!b1_.empty() && t1_.size() + b1_.size() > capacity_) drop(b1_);
    while (!b2_.empty() && t1_.size() + t2_.size() + b1_.size() + b2_.size() > 2 * capacity_) {
      drop(b2_);
    }
  }
  void drop(IdQueue& ghost) {
    const uint32_t id = ghost.back();
    ghost.erase(id);
    dropped_.push_back(id);
  }

  IdQueue t1_, t2_, b1_, b2_;
  uint64_t capacity_ = 1;
  double p_ = 0;
  std::vector<uint32_t> dropped_;
};

// ---- TinyLFU's frequency sketch ----
class FrequencySketch {
 public:
  static constexpr uint8_t kMaxCount = 15;  // 4-bit counters
  static constexpr size_t kRows = 4;

  // Sized for `blocks` cached blocks; forgets what it counted when its width changes.
  void size_for(uint64_t blocks) {
    uint64_t width = 64;
    while (width < blocks * 2) width <<= 1;
    sample_ = std::max<uint64_t>(10 * blocks, 10);
    if (width == width_) return;
    width_ = width;
    counts_.assign(kRows * width_, 0);
    added_ = 0;
  }
  void add(uint64_t hash) {
    if (width_ == 0) size_for(1);
    for (size_t row = 0; row < kRows; ++row) {
      uint8_t& c = counts_[row * width_ + slot(hash, row)];
      if (c < kMaxCount) ++c;
    }
    if (++added_ >= sample_) {  // aging: halve every counter
      for (uint8_t& c : counts_) c = static_cast<uint8_t>(c >> 1);
      added_ /= 2;
    }
  }
  uint8_t estimate(uint64_t hash) const {
    if (width_ == 0) return 0;
    uint8_t least = kMaxCount;
    for (size_t row = 0; row < kRows; ++row) {
      least = std::min(least, counts_[row * width_ + slot(hash, row)]);
    }
    return least;
  }

 private:
  size_t slot(uint64_t h, size_t row) const {
    static constexpr std::array<uint64_t, kRows> kSeeds = {
        0x9e3779b97f4a7c15ULL, 0xc2b2ae3d27d4eb4fULL, 0x165667b19e3779f9ULL, 0xd6e8feb86659fd93ULL};
    uint64_t x = (h ^ kSeeds[row]) * 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return static_cast<size_t>(x & (width_ - 1));
  }

  uint64_t width_ = 0;
  uint64_t sample_ = 10;
  uint64_t added_ = 0;
  std::vector<uint8_t> counts_;
};

// ---- TinyLFU admission in front of LRU, one tier ----
class TinyLfuTier {
 public:
  TinyLfuTier(Entries& e, size_t tier, const FrequencySketch& sketch)
      : lru_(e, tier, 1), newcomers_(e, tier, 2), e_(&e), sketch_(&sketch) {}
  void set_capacity(uint64_t blocks) { capacity_ = std::max<uint64_t>(blocks, 1); }
  // While the tier has room a block is admitted at once; once it is full, a newcomer
  // waits to be judged.
  void entered(uint32_t id) {
    if (lru_.holds(id) || newcomers_.holds(id)) return;
    if (lru_.size() + newcomers_.size() < capacity_) {
      lru_.push_front(id);
    } else {
      newcomers_.push_front(id);
    }
  }
  void used(uint32_t id) {
    if (newcomers_.holds(id)) newcomers_.to_front(id);
    if (lru_.holds(id)) lru_.to_front(id);
  }
  void left(uint32_t id, bool sacrificed) {
    if (newcomers_.holds(id)) {  // rejected (or simply moved on)
      newcomers_.erase(id);
      return;
    }
    if (!lru_.holds(id)) return;
    lru_.erase(id);
    if (!sacrificed) return;
    // An admitted block went: the oldest newcomer the sketch counts more often won its
    // place (as rank() said), and is admitted now.
    const uint8_t victim = count(id);
    uint32_t winner = kNil;
    newcomers_.for_each_oldest_first([&](uint32_t k) {
      if (winner == kNil && count(k) > victim) winner = k;
    });
    if (winner != kNil) {
      newcomers_.erase(winner);
      lru_.push_front(winner);
    }
  }
  // Newcomers, oldest first, each against the LRU end of the admitted: the less
  // frequent of the two goes first; then the admitted in LRU order, then the
  // newcomers that won.
  void rank(std::vector<uint32_t>& order) const {
    std::vector<uint32_t> admitted, kept;
    lru_.for_each_oldest_first([&](uint32_t k) { admitted.push_back(k); });
    size_t victim = 0;
    newcomers_.for_each_oldest_first([&](uint32_t k) {
      if (victim < admitted.size() && count(k) > count(admitted[victim])) {
        order.push_back(admitted[victim++]);
        kept.push_back(k);
      } else if (victim < admitted.size()) {
        order.push_back(k);
      } else {
        kept.push_back(k);  // nothing to displace: the newcomer stays
      }
    });
    for (; victim < admitted.size(); ++victim) order.push_back(admitted[victim]);
    order.insert(order.end(), kept.begin(), kept.end());
  }
  std::vector<uint32_t>& dropped() { return dropped_; }  // (no ghosts)

 private:
  uint8_t count(uint32_t id) const { return sketch_->estimate((*e_)[id].hash); }

  IdQueue lru_, newcomers_;
  const Entries* e_;
  const FrequencySketch* sketch_;
  uint64_t capacity_ = 1;
  std::vector<uint32_t> dropped_;
};

// One algorithm per tier. The algorithms see blocks one at a time, but a request's
// blocks are a prefix: the tail is worth nothing without the blocks before it. So the
// blocks one request last named go together, tail first, at the place the algorithm
// gives the first of them (as LRU tiering orders blocks used together, and as vLLM's
// free-block queue takes a request's blocks tail first).
template <typename PerTier>
class PerTierPolicy : public PeerPolicy {
 public:
  template <typename... Args>
  explicit PerTierPolicy(const Args&... args)
      : tiers_{PerTier(entries_, 0, args...), PerTier(entries_, 1, args...),
               PerTier(entries_, 2, args...)} {}
  void set_capacity(Tier tier, uint64_t bytes) override {
    tier_bytes_[tier_index(tier)] = bytes;
    resize();
  }
  void rank(Tier tier, bool, const std::vector<BlockKey>& keys, uint64_t,
            std::vector<double>& ranks) override {
    order_.clear();
    tiers_[tier_index(tier)].rank(order_);
    if (rank_of_.size() < entries_.capacity()) {
      rank_of_.resize(entries_.capacity());
      epoch_of_.resize(entries_.capacity(), 0);
    }
    ++epoch_;
    for (size_t r = 0; r < order_.size(); ++r) {
      rank_of_[order_[r]] = static_cast<double>(r);
      epoch_of_[order_[r]] = epoch_;
    }
    // Each request's blocks at the earliest place any of them has, tail first.
    const auto unseen = static_cast<double>(order_.size());
    struct Item {
      double group;
      uint32_t position;
      double rank;
      size_t index;
    };
    std::vector<Item> items(keys.size());
    std::unordered_map<uint64_t, double> first_of;  // request → earliest rank
    std::vector<uint32_t> ids(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      const uint32_t id = entries_.find(keys[i]);
      ids[i] = id;
      const bool known = id != kNil && epoch_of_[id] == epoch_;
      const double r = known ? rank_of_[id] : unseen + static_cast<double>(i);
      items[i] = {r, id == kNil ? 0 : entries_[id].position, r, i};
      if (known) {
        auto [at, inserted] = first_of.try_emplace(entries_[id].request, r);
        if (!inserted) at->second = std::min(at->second, r);
      }
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      if (ids[i] != kNil && epoch_of_[ids[i]] == epoch_) {
        items[i].group = first_of[entries_[ids[i]].request];
      }
    }
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
      if (a.group != b.group) return a.group < b.group;
      if (a.position != b.position) return a.position > b.position;
      return a.rank < b.rank;
    });
    ranks.resize(keys.size());
    for (size_t r = 0; r < items.size(); ++r) ranks[items[r].index] = static_cast<double>(r);
  }
  void block_entered(const BlockKey& key, Tier tier, uint64_t bytes) override {
    if (static_cast<size_t>(tier) >= kLocalTierCount) return;
    if (bytes > block_bytes_) {  // (the largest block seen: a count of blocks never too high)
      block_bytes_ = bytes;
      resize();
    }
    tiers_[tier_index(tier)].entered(entries_.get(key));
    release_dropped(tier);
  }
  void block_left(const BlockKey& key, Tier tier, bool sacrificed) override {
    if (static_cast<size_t>(tier) >= kLocalTierCount) return;
    const uint32_t id = entries_.find(key);
    if (id == kNil) return;
    tiers_[tier_index(tier)].left(id, sacrificed);
    release_dropped(tier);
    entries_.release_if_unused(id);
  }
  void block_saved(const BlockKey& key, uint32_t position, uint64_t now_ms) override {
    name(entries_.find(key), position, now_ms);
  }
  void block_loaded(const BlockKey& key, uint32_t position, uint64_t now_ms) override {
    const uint32_t id = entries_.find(key);
    if (id == kNil) return;
    for (PerTier& t : tiers_) t.used(id);  // only the tiers holding it know it
    name(id, position, now_ms);
  }

 protected:
  // Each tier's size in blocks, once both its bytes and a block's are known.
  virtual void resize() {
    if (block_bytes_ == 0) return;
    for (size_t t = 0; t < kLocalTierCount; ++t) {
      if (tier_bytes_[t] == 0) continue;
      if constexpr (requires(PerTier x) { x.set_capacity(uint64_t{1}); }) {
        tiers_[t].set_capacity(tier_bytes_[t] / block_bytes_);
      }
    }
  }
  uint64_t capacity_blocks() const {
    uint64_t total = 0;
    for (uint64_t bytes : tier_bytes_) total += block_bytes_ ? bytes / block_bytes_ : 0;
    return total;
  }

  // A request's blocks come in prefix order: a position not past the last one seen
  // starts another request.
  void name(uint32_t id, uint32_t position, uint64_t) {
    if (position <= last_position_) ++request_;
    last_position_ = position;
    if (id == kNil) return;  // not held
    entries_[id].request = request_;
    entries_[id].position = position;
  }
  void release_dropped(Tier tier) {
    std::vector<uint32_t>& dropped = tiers_[tier_index(tier)].dropped();
    for (uint32_t id : dropped) entries_.release_if_unused(id);
    dropped.clear();
  }

  Entries entries_;  // before tiers_, which keep its address
  std::array<PerTier, kLocalTierCount> tiers_;
  uint64_t request_ = 0;
  uint32_t last_position_ = 0;
  std::array<uint64_t, kLocalTierCount> tier_bytes_{};
  uint64_t block_bytes_ = 0;
  std::vector<uint32_t> order_;
  std::vector<double> rank_of_;
  std::vector<uint64_t> epoch_of_;
  uint64_t epoch_ = 0;
};

class TinyLfuLru final : public PerTierPolicy<TinyLfuTier> {
 public:
  TinyLfuLru() : PerTierPolicy<TinyLfuTier>(sketch_) {}
  void resize() override {
    PerTierPolicy<TinyLfuTier>::resize();
    if (const uint64_t blocks = capacity_blocks(); blocks > 0) sketch_.size_for(blocks);
  }
  // Every request for a block counts once: a Load that read it, or a Save of it that
  // no Load read first (a miss: the engine computed it). A turn's Save of the prefix it
  // loaded is the same request as its Load.
  void block_saved(const BlockKey& key, uint32_t position, uint64_t now_ms) override {
    const uint32_t id = entries_.find(key);
    if (id == kNil) {
      sketch_.add(BlockKeyHasher{}(key));
    } else if (!entries_[id].loaded) {
      sketch_.add(entries_[id].hash);
    }
    if (id != kNil) entries_[id].loaded = false;
    name(id, position, now_ms);
  }
  void block_loaded(const BlockKey& key, uint32_t position, uint64_t now_ms) override {
    PerTierPolicy<TinyLfuTier>::block_loaded(key, position, now_ms);
    const uint32_t id = entries_.find(key);
    if (id == kNil) return;
    sketch_.add(entries_[id].hash);
    entries_[id].loaded = true;
  }

 private:
  // A member of the derived class, built after the base: the base's tiers keep only its
  // address, and nothing reads it before the constructor ends.
  FrequencySketch sketch_;
};

// ---- workload-aware: reuse probability by category and turn ----
class WorkloadAware final : public PeerPolicy {
 public:
  static constexpr uint32_t kTurns = 4;
  static constexpr uint32_t kDepths = 4;
  static constexpr double kPriorMeanMs = 60'000;

  explicit WorkloadAware(const PlannerConfig& config) : config_(config) {}

  void set_capacity(Tier tier, uint64_t bytes) override { capacity_[tier_index(tier)] = bytes; }

  void block_entered(const BlockKey& key, Tier tier, uint64_t bytes) override {
    blocks_[key].tiers |= tier_bit(tier);
    block_bytes_ = std::max(block_bytes_, bytes);
  }
  void block_left(const BlockKey& key, Tier tier, bool) override {
    auto it = blocks_.find(key);
    if (it == blocks_.end() || it->second.tiers == 0) return;
    if ((it->second.tiers &= ~tier_bit(tier)) == 0) {
      ghosts_.push_back(key);  // kept to learn from a reuse after it left
      trim_ghosts();
    }
  }
  void block_saved(const BlockKey& key, uint32_t position, uint64_t now_ms) override {
    Block& b = blocks_[key];
    reused(b, now_ms);
    b.turn = static_cast<uint8_t>(std::min<uint32_t>(b.turn + 1, kTurns));
    b.position = position;
    b.category = category(b.turn, position);
    b.pending = true;
    b.since_ms = now_ms;
    stats_[b.category].entries += 1;
  }
  void block_loaded(const BlockKey& key, uint32_t position, uint64_t now_ms) override {
    auto it = blocks_.find(key);
    if (it == blocks_.end()) return;
    reused(it->second, now_ms);
    it->second.position = position;
    it->second.since_ms = now_ms;
  }

  void rank(Tier tier, bool leaves_daemon, const std::vector<BlockKey>& keys, uint64_t now_ms,
            std::vector<double>& ranks) override {
    const double horizon = leaves_daemon
                               ? std::numeric_limits<double>::infinity()
                               : static_cast<double>(detail::idle_threshold_of(config_, tier));
    struct Scored {
      double value;
      uint32_t position;
      size_t index;
    };
    std::vector<Scored> scored(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = blocks_.find(keys[i]);
      scored[i] = {it == blocks_.end() ? 0.0 : value(it->second, now_ms, horizon),
                   it == blocks_.end() ? 0 : it->second.position, i};
    }
    std::sort(scored.begin(), scored.end(), [](const Scored& a, const Scored& b) {
      if (a.value != b.value) return a.value < b.value;
      if (a.position != b.position) return a.position > b.position;
      return a.index < b.index;
    });
    ranks.resize(keys.size());
    for (size_t r = 0; r < scored.size(); ++r) ranks[scored[r].index] = static_cast<double>(r);
  }

  // P(used within `horizon_ms` | not used in the `age_ms` since its Save) for a block of
  // `category` (for tests and docs).
  double probability(uint32_t cat, double age_ms, double horizon_ms) const {
    const Stats& s = stats_[cat];
    const double p = (static_cast<double>(s.reuses) + 1) / (static_cast<double>(s.entries) + 2);
    const double mean = (s.reuse_ms + kPriorMeanMs) / (static_cast<double>(s.reuses) + 1);
    const double survive = std::exp(-age_ms / mean);
    const double not_yet = 1 - p + p * survive;
    const double later = std::isinf(horizon_ms) ? 0.0 : std::exp(-(age_ms + horizon_ms) / mean);
    return not_yet <= 0 ? 0 : p * (survive - later) / not_yet;
  }

 private:
  struct Block {
    uint64_t since_ms = 0;
    uint32_t position = 0;
    uint8_t turn = 0;
    uint8_t category = 0;
    uint8_t tiers = 0;     // tier_bit of each tier holding it (0: left the daemon)
    bool pending = false;  // saved, not used since
  };
  struct Stats {
    uint64_t entries = 0;
    uint64_t reuses = 0;
    double reuse_ms = 0;
  };

  static uint8_t category(uint32_t turn, uint32_t position) {
    const uint32_t depth = position < 4 ? 0 : position < 16 ? 1 : position < 64 ? 2 : 3;
    return static_cast<uint8_t>((std::max<uint32_t>(turn, 1) - 1) * kDepths + depth);
  }
  void reused(Block& b, uint64_t now_ms) {
    if (!b.pending) return;
    Stats& s = stats_[b.category];
    s.reuses += 1;
    s.reuse_ms += static_cast<double>(now_ms - std::min(now_ms, b.since_ms));
    b.pending = false;
  }
  double value(const Block& b, uint64_t now_ms, double horizon_ms) const {
    if (!b.pending) return 2.0;  // used since its Save: in a turn now
    return probability(b.category, static_cast<double>(now_ms - std::min(now_ms, b.since_ms)),
                       horizon_ms);
  }
  void trim_ghosts() {
    uint64_t held = 0;  // blocks the tiers hold
    for (uint64_t bytes : capacity_) held += block_bytes_ ? bytes / block_bytes_ : 0;
    const uint64_t limit = std::max<uint64_t>(held, 1024);
    while (ghosts_.size() > limit) {
      auto it = blocks_.find(ghosts_.front());
      if (it != blocks_.end() && it->second.tiers == 0) blocks_.erase(it);
      ghosts_.pop_front();
    }
  }

  PlannerConfig config_;
  std::array<uint64_t, kLocalTierCount> capacity_{};  // bytes
  uint64_t block_bytes_ = 0;
  std::unordered_map<BlockKey, Block, BlockKeyHasher> blocks_;
  std::deque<BlockKey> ghosts_;
  std::array<Stats, kTurns * kDepths> stats_{};
};

}  // namespace

bool PeerPolicy::is_peer(PolicyMode mode) {
  switch (mode) {
    case PolicyMode::kS3Fifo:
    case PolicyMode::kSlru:
    case PolicyMode::kArc:
    case PolicyMode::kTinyLfuLru:
    case PolicyMode::kWorkloadAware:
      return true;
    default:
      return false;
  }
}

std::unique_ptr<PeerPolicy> PeerPolicy::make(PolicyMode mode, const PlannerConfig& config) {
  switch (mode) {
    case PolicyMode::kS3Fifo:
      return std::make_unique<PerTierPolicy<S3FifoTier>>();
    case PolicyMode::kSlru:
      return std::make_unique<PerTierPolicy<SlruTier>>();
    case PolicyMode::kArc:
      return std::make_unique<PerTierPolicy<ArcTier>>();
    case PolicyMode::kTinyLfuLru:
      return std::make_unique<TinyLfuLru>();
    case PolicyMode::kWorkloadAware:
      return std::make_unique<WorkloadAware>(config);
    default:
      return nullptr;
  }
}

}  // namespace kvtier::policy
