// Internal to policy/peer_policy.cpp: the peers' eviction algorithms for one tier —
// S3-FIFO, SLRU, ARC, TinyLFU admission in front of LRU with its frequency sketch, and
// W-TinyLFU — over the queues of peer_queues.h. Each offers PerTierPolicy (peer_policy.cpp):
//   void entered(uint32_t id); void left(uint32_t id, bool sacrificed);
//   void used(uint32_t id); void rank(std::vector<uint32_t>& order) const;
//   std::vector<uint32_t>& dropped();  // ghosts dropped since asked: ids maybe free now
// and, where the tier's size matters, void set_capacity(uint64_t blocks). rank() gives
// the ids resident in the tier in the order the algorithm's evictions would take them.
// The parameters and their sources: peer_policy.h.
//
// Thread-safety: none; owned by one PeerPolicy.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <limits>
#include <vector>

#include "policy/peer_queues.h"

namespace kvtier::policy::peer {

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
  // Stops at `id`: a block leaving near the tail (the usual sacrifice) costs little.
  static std::vector<uint32_t> older_than(const IdQueue& queue, uint32_t id) {
    std::vector<uint32_t> out;
    queue.for_each_older_than(id, [&](uint32_t k) { out.push_back(k); });
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

// ---- TinyLFU's admission duel (TinyLFU + LRU, W-TinyLFU) ----
// Newcomers wait to be admitted; each is judged against the block the admitted would
// give up next, and the one the sketch counts less often goes.
class AdmissionDuel {
 public:
  AdmissionDuel(const Entries& e, const FrequencySketch& sketch) : e_(&e), sketch_(&sketch) {}
  uint8_t count(uint32_t id) const { return sketch_->estimate((*e_)[id].hash); }
  // The admitted block `victim` went: the oldest newcomer counted more often won its
  // place (as order() said), or kNil.
  uint32_t winner(const IdQueue& newcomers, uint32_t victim) const {
    const uint8_t against = count(victim);
    uint32_t won = kNil;
    newcomers.for_each_oldest_first([&](uint32_t k) {
      if (won == kNil && count(k) > against) won = k;
    });
    return won;
  }
  // Appends to `order`: the newcomers, oldest first, each against the next of
  // `admitted` (first to go first), the less frequent of the two first; then the rest
  // of `admitted`; then the newcomers that won or had nothing to displace.
  void order(const IdQueue& newcomers, const std::vector<uint32_t>& admitted,
             std::vector<uint32_t>& order) const {
    std::vector<uint32_t> kept;
    size_t victim = 0;
    newcomers.for_each_oldest_first([&](uint32_t k) {
      if (victim < admitted.size() && count(k) > count(admitted[victim])) {
        order.push_back(admitted[victim++]);
        kept.push_back(k);
      } else if (victim < admitted.size()) {
        order.push_back(k);
      } else {
        kept.push_back(k);
      }
    });
    for (; victim < admitted.size(); ++victim) order.push_back(admitted[victim]);
    order.insert(order.end(), kept.begin(), kept.end());
  }

 private:
  const Entries* e_;
  const FrequencySketch* sketch_;
};

// ---- TinyLFU admission in front of LRU, one tier ----
class TinyLfuTier {
 public:
  TinyLfuTier(Entries& e, size_t tier, const FrequencySketch& sketch)
      : lru_(e, tier, 1), newcomers_(e, tier, 2), duel_(e, sketch) {}
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
    // An admitted block went: a newcomer that won its place is admitted now.
    if (const uint32_t winner = duel_.winner(newcomers_, id); winner != kNil) {
      newcomers_.erase(winner);
      lru_.push_front(winner);
    }
  }
  // Newcomers, oldest first, each against the LRU end of the admitted: the less
  // frequent of the two goes first; then the admitted in LRU order, then the
  // newcomers that won.
  void rank(std::vector<uint32_t>& order) const {
    std::vector<uint32_t> admitted;
    lru_.for_each_oldest_first([&](uint32_t k) { admitted.push_back(k); });
    duel_.order(newcomers_, admitted, order);
  }
  std::vector<uint32_t>& dropped() { return dropped_; }  // (no ghosts)

 private:
  IdQueue lru_, newcomers_;
  AdmissionDuel duel_;
  uint64_t capacity_ = std::numeric_limits<uint64_t>::max();  // unknown: every block admitted
  std::vector<uint32_t> dropped_;
};

// ---- W-TinyLFU, one tier ----
// Caffeine's design (Einziger, Friedman and Manes, ACM TOS 2017, section 5): a window
// LRU of 1 % of the tier in front of a segmented LRU main space (protected 80 % of it),
// and TinyLFU admission between them: a block pushed out of the window becomes a
// candidate, which enters main's probation only by beating the block main would give
// up (probation's LRU end, then protected's) on the frequency sketch; the loser goes.
class WTinyLfuTier {
 public:
  static constexpr double kWindowShare = 0.01;
  static constexpr double kProtectedShare = 0.80;

  WTinyLfuTier(Entries& e, size_t tier, const FrequencySketch& sketch)
      : window_(e, tier, 1),
        probation_(e, tier, 2),
        protected_(e, tier, 3),
        candidates_(e, tier, 4),
        duel_(e, sketch) {}
  void set_capacity(uint64_t blocks) {
    capacity_ = std::max<uint64_t>(blocks, 2);
    window_limit_ = std::max<uint64_t>(
        1, static_cast<uint64_t>(kWindowShare * static_cast<double>(capacity_) + 0.5));
    main_limit_ = capacity_ - window_limit_;
    protected_limit_ = static_cast<uint64_t>(kProtectedShare * static_cast<double>(main_limit_));
  }
  void entered(uint32_t id) {
    if (holds(id)) return;
    window_.push_front(id);
    while (window_.size() > window_limit_) {
      const uint32_t oldest = window_.back();
      window_.erase(oldest);
      if (main_size() < main_limit_) {
        probation_.push_front(oldest);  // main has room: no duel
      } else {
        candidates_.push_front(oldest);
      }
    }
  }
  void used(uint32_t id) {
    if (window_.holds(id)) {
      window_.to_front(id);
    } else if (candidates_.holds(id)) {
      candidates_.to_front(id);  // (its count in the sketch is what the duel reads)
    } else if (protected_.holds(id)) {
      protected_.to_front(id);
    } else if (probation_.holds(id)) {
      probation_.erase(id);
      protected_.push_front(id);
      while (protected_.size() > std::max<uint64_t>(protected_limit_, 1)) {
        const uint32_t oldest = protected_.back();
        protected_.erase(oldest);
        probation_.push_front(oldest);
      }
    }
  }
  void left(uint32_t id, bool sacrificed) {
    if (window_.holds(id)) {
      window_.erase(id);
      return;
    }
    if (candidates_.holds(id)) {  // lost its duel (or moved on)
      candidates_.erase(id);
      return;
    }
    if (!probation_.holds(id) && !protected_.holds(id)) return;
    (probation_.holds(id) ? probation_ : protected_).erase(id);
    uint32_t admitted = kNil;
    if (sacrificed) {
      admitted = duel_.winner(candidates_, id);  // main gave it up: who won its place
    } else if (!candidates_.empty() && main_size() < main_limit_) {
      admitted = candidates_.back();  // moved up: main has room for the longest waiting
    }
    if (admitted != kNil) {
      candidates_.erase(admitted);
      probation_.push_front(admitted);
    }
  }
  // Candidates, oldest first, each against main's next victim (probation's LRU end,
  // then protected's): the less frequent goes first; then main's rest in that order,
  // the candidates that won, and the window, oldest first.
  void rank(std::vector<uint32_t>& order) const {
    std::vector<uint32_t> main;
    probation_.for_each_oldest_first([&](uint32_t k) { main.push_back(k); });
    protected_.for_each_oldest_first([&](uint32_t k) { main.push_back(k); });
    duel_.order(candidates_, main, order);
    window_.for_each_oldest_first([&](uint32_t k) { order.push_back(k); });
  }
  std::vector<uint32_t>& dropped() { return dropped_; }  // (no ghosts)

 private:
  bool holds(uint32_t id) const {
    return window_.holds(id) || probation_.holds(id) || protected_.holds(id) ||
           candidates_.holds(id);
  }
  uint64_t main_size() const { return probation_.size() + protected_.size(); }

  IdQueue window_, probation_, protected_, candidates_;
  AdmissionDuel duel_;
  // Unknown until told: every block is admitted (a window of 1, main without bound).
  uint64_t capacity_ = std::numeric_limits<uint64_t>::max();
  uint64_t window_limit_ = 1;
  uint64_t main_limit_ = std::numeric_limits<uint64_t>::max();
  uint64_t protected_limit_ = std::numeric_limits<uint64_t>::max();
  std::vector<uint32_t> dropped_;
};

}  // namespace kvtier::policy::peer
