// Internal to the planner (not part of policy's interface): the moves planned so far
// in one planning call, and the tier usage they imply, so that later rules in the
// same call see the room earlier ones made or used.
//
// Thread-safety: none; a value local to one planning call.
#pragma once

#include <array>
#include <cstdint>
#include <unordered_set>
#include <vector>

#include "common/block_key.h"
#include "common/tier_topology.h"
#include "policy/planner.h"

namespace kvtier::policy::detail {

using Placement = PlacementView::BlockPlacement;
using KeySet = std::unordered_set<BlockKey, BlockKeyHasher>;

// Rounded down so that "at or below the watermark" never overshoots it.
uint64_t fraction_of(double fraction, uint64_t capacity);
// Written as a subtraction so that huge sizes cannot wrap around.
inline bool fits(uint64_t used, uint64_t bytes, uint64_t limit) {
  return used <= limit && bytes <= limit - used;
}
// A total order on keys, only to make plans independent of hash-map iteration order.
bool key_less(const BlockKey& a, const BlockKey& b);

struct Watermarks {
  double high = 1;
  double low = 1;
};
Watermarks watermarks_of(const PlannerConfig& config, Tier tier);
// The idle threshold after which a session leaves `tier` (HBM, RAM); 0 for others.
uint64_t idle_threshold_of(const PlannerConfig& config, Tier tier);

class PlanState {
 public:
  explicit PlanState(const PlacementView& view);

  // The node-local tiers the view gives room in (a tier with no capacity is not there).
  const TierTopology& topology() const { return topology_; }
  bool configured(Tier tier) const { return topology_.configured(tier); }
  uint64_t capacity(Tier tier) const { return capacity_[index(tier)]; }
  uint64_t used(Tier tier) const { return used_[index(tier)]; }
  // Of used(tier) when the plan began: blocks still being written (TierSpace).
  uint64_t arriving(Tier tier) const { return arriving_[index(tier)]; }
  // Of used(tier) when the plan began: blocks moving out (TierSpace).
  uint64_t departing(Tier tier) const { return departing_[index(tier)]; }
  // The next configured tier below / above `tier`; kNone when there is none.
  Tier below(Tier tier) const { return topology_.below(tier); }
  Tier above(Tier tier) const { return topology_.above(tier); }
  bool planned(const BlockKey& key) const { return planned_.count(key) != 0; }

  // Plans moving `key` (now at placement.tier) to `to`, when it is movable, not yet
  // planned, and `to` stays at or under `limit_bytes` (its capacity by default).
  // Returns whether it did.
  bool move(const BlockKey& key, const Placement& placement, Tier to, MoveReason reason);
  bool move(const BlockKey& key, const Placement& placement, Tier to, MoveReason reason,
            uint64_t limit_bytes);
  // Plans evicting `key` from its tier (movable, not yet planned); returns whether it did.
  bool evict(const BlockKey& key, const Placement& placement, MoveReason reason);

  size_t size() const { return moves_.size(); }
  std::vector<Move> take_moves() { return std::move(moves_); }

 private:
  static size_t index(Tier tier) { return static_cast<size_t>(tier); }

  TierTopology topology_;
  std::array<uint64_t, kTierCount> capacity_{};
  std::array<uint64_t, kTierCount> used_{};
  std::array<uint64_t, kTierCount> arriving_{};
  std::array<uint64_t, kTierCount> departing_{};
  KeySet planned_;
  std::vector<Move> moves_;
};

}  // namespace kvtier::policy::detail
