#include "policy/peer_policy.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <limits>
#include <unordered_map>

#include "policy/peer_queues.h"
#include "policy/peer_tiers.h"
#include "policy/plan_state.h"
#include "policy/planner.h"

namespace kvtier::policy {
namespace {

using peer::ArcTier;
using peer::Entries;
using peer::FrequencySketch;
using peer::kNil;
using peer::S3FifoTier;
using peer::SlruTier;
using peer::tier_bit;
using peer::tier_index;
using peer::TinyLfuTier;
using peer::WTinyLfuTier;

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
            std::vector<PeerRank>& ranks) override {
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
    // Each request's blocks at the earliest place any of them has (major), tail first
    // (depth), then by the block's own place (minor).
    const auto unseen = static_cast<double>(order_.size());
    ranks.resize(keys.size());
    first_of_.clear();  // request → earliest place
    ids_.resize(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      const uint32_t id = entries_.find(keys[i]);
      const bool known = id != kNil && epoch_of_[id] == epoch_;
      const double r = known ? rank_of_[id] : unseen + static_cast<double>(i);
      ranks[i] = {r, id == kNil ? 0 : entries_[id].position, r};
      // Request 0: never named by a Save or Load (recovered, or read from the remote
      // tier): such blocks are no request's and keep their own places.
      ids_[i] = known && entries_[id].request != 0 ? id : kNil;
      if (ids_[i] != kNil) {
        auto [at, inserted] = first_of_.try_emplace(entries_[id].request, r);
        if (!inserted) at->second = std::min(at->second, r);
      }
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      if (ids_[i] != kNil) ranks[i].major = first_of_.find(entries_[ids_[i]].request)->second;
    }
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
  void block_left(const BlockKey& key, Tier tier, Departure why) override {
    if (static_cast<size_t>(tier) >= kLocalTierCount) return;
    const uint32_t id = entries_.find(key);
    if (id == kNil) return;
    tiers_[tier_index(tier)].left(id, sacrificed(why));
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
  // rank()'s scratch, kept between calls.
  std::vector<uint32_t> order_;
  std::vector<uint32_t> ids_;  // a key's id, kNil unless it is a request's
  std::unordered_map<uint64_t, double> first_of_;
  std::vector<double> rank_of_;
  std::vector<uint64_t> epoch_of_;
  uint64_t epoch_ = 0;
};

// A PerTierPolicy whose tiers read one TinyLFU frequency sketch (TinyLFU + LRU,
// W-TinyLFU), sized for all the tiers' blocks.
template <typename PerTier>
class SketchCounted final : public PerTierPolicy<PerTier> {
  using Base = PerTierPolicy<PerTier>;

 public:
  SketchCounted() : Base(sketch_) {}
  void resize() override {
    Base::resize();
    if (const uint64_t blocks = Base::capacity_blocks(); blocks > 0) sketch_.size_for(blocks);
  }
  // Every request for a block counts once: a Load that read it, or a Save of it that
  // no Load read first (a miss: the engine computed it). A turn's Save of the prefix it
  // loaded is the same request as its Load.
  void block_saved(const BlockKey& key, uint32_t position, uint64_t now_ms) override {
    Entries& entries = Base::entries_;
    const uint32_t id = entries.find(key);
    if (id == kNil) {
      sketch_.add(BlockKeyHasher{}(key));
    } else if (!entries[id].loaded) {
      sketch_.add(entries[id].hash);
    }
    if (id != kNil) entries[id].loaded = false;
    Base::name(id, position, now_ms);
  }
  void block_loaded(const BlockKey& key, uint32_t position, uint64_t now_ms) override {
    Base::block_loaded(key, position, now_ms);
    Entries& entries = Base::entries_;
    const uint32_t id = entries.find(key);
    if (id == kNil) return;
    sketch_.add(entries[id].hash);
    entries[id].loaded = true;
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
  void block_left(const BlockKey& key, Tier tier, Departure) override {
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
            std::vector<PeerRank>& ranks) override {
    const double horizon = leaves_daemon
                               ? std::numeric_limits<double>::infinity()
                               : static_cast<double>(detail::idle_threshold_of(config_, tier));
    // Least value first, the deeper block among equals, then by index.
    ranks.resize(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = blocks_.find(keys[i]);
      ranks[i] = {it == blocks_.end() ? 0.0 : value(it->second, now_ms, horizon),
                  it == blocks_.end() ? 0 : it->second.position, static_cast<double>(i)};
    }
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
    // Never saved (recovered at a restart, read from the remote tier, or entered before
    // this policy was): as a first-turn block of its depth, of unknown age.
    if (b.turn == 0) return probability(category(1, b.position), 0, horizon_ms);
    const double age = static_cast<double>(now_ms - std::min(now_ms, b.since_ms));
    // Used since its Save, and lately: in a turn now. A Load's blocks whose session
    // never saved again fall back to their category's odds once the turn is over.
    if (!b.pending && age < static_cast<double>(detail::idle_threshold_of(config_, Tier::kHbm))) {
      return 2.0;
    }
    return probability(b.category, age, horizon_ms);
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
    case PolicyMode::kWTinyLfu:
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
      return std::make_unique<SketchCounted<TinyLfuTier>>();
    case PolicyMode::kWTinyLfu:
      return std::make_unique<SketchCounted<WTinyLfuTier>>();
    case PolicyMode::kWorkloadAware:
      return std::make_unique<WorkloadAware>(config);
    default:
      return nullptr;
  }
}

}  // namespace kvtier::policy
