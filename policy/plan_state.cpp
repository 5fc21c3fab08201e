#include "policy/plan_state.h"

#include <algorithm>

namespace kvtier::policy::detail {

uint64_t fraction_of(double fraction, uint64_t capacity) {
  if (fraction <= 0) return 0;
  if (fraction >= 1) return capacity;
  return static_cast<uint64_t>(fraction * static_cast<double>(capacity));
}

bool key_less(const BlockKey& a, const BlockKey& b) {
  if (a.layout.namespace_id != b.layout.namespace_id) {
    return a.layout.namespace_id < b.layout.namespace_id;
  }
  if (a.layout.layout_digest != b.layout.layout_digest) {
    return a.layout.layout_digest < b.layout.layout_digest;
  }
  auto x = a.hash.bytes();
  auto y = b.hash.bytes();
  return std::lexicographical_compare(x.begin(), x.end(), y.begin(), y.end());
}

Watermarks watermarks_of(const PlannerConfig& config, Tier tier) {
  switch (tier) {
    case Tier::kHbm:
      return {config.hbm_high_watermark, config.hbm_low_watermark};
    case Tier::kRam:
      return {config.ram_high_watermark, config.ram_low_watermark};
    case Tier::kNvme:
      return {config.nvme_high_watermark, config.nvme_low_watermark};
    case Tier::kRemote:
    case Tier::kNone:
      break;
  }
  return {};
}

uint64_t idle_threshold_of(const PlannerConfig& config, Tier tier) {
  if (tier == Tier::kHbm) return config.hbm_idle_ms;
  if (tier == Tier::kRam) return config.ram_idle_ms;
  return 0;
}

PlanState::PlanState(const PlacementView& view) {
  for (Tier tier : TierTopology::kOrder) {
    if (TierTopology::traits(tier).key_addressed) continue;  // not placed by the planner
    const PlacementView::TierSpace space = view.space(tier);
    capacity_[index(tier)] = space.capacity_bytes;
    used_[index(tier)] = space.used_bytes;
    arriving_[index(tier)] = std::min(space.arriving_bytes, space.used_bytes);
    departing_[index(tier)] =
        std::min(space.departing_bytes, space.used_bytes - arriving_[index(tier)]);
  }
  topology_ = TierTopology::of([&](Tier tier) { return capacity_[index(tier)] > 0; });
}

bool PlanState::move(const BlockKey& key, const Placement& placement, Tier to, MoveReason reason) {
  return to != Tier::kNone && move(key, placement, to, reason, capacity(to));
}

bool PlanState::move(const BlockKey& key, const Placement& placement, Tier to, MoveReason reason,
                     uint64_t limit_bytes) {
  if (to == Tier::kNone || placement.tier == Tier::kNone || placement.tier == to) return false;
  if (!placement.movable || !configured(to)) return false;
  if (!fits(used(to), placement.bytes, std::min(limit_bytes, capacity(to)))) return false;
  if (!planned_.insert(key).second) return false;
  const MoveKind kind = to > placement.tier  // below: Tier is numbered top to bottom
                            ? MoveKind::kDemote
                            : MoveKind::kPromote;
  moves_.push_back(Move{kind, key, placement.tier, to, reason, placement.bytes});
  uint64_t& from_used = used_[index(placement.tier)];
  from_used -= std::min(placement.bytes, from_used);
  used_[index(to)] += placement.bytes;
  return true;
}

bool PlanState::evict(const BlockKey& key, const Placement& placement, MoveReason reason) {
  if (placement.tier == Tier::kNone || !placement.movable) return false;
  if (!planned_.insert(key).second) return false;
  moves_.push_back(
      Move{MoveKind::kEvict, key, placement.tier, Tier::kNone, reason, placement.bytes});
  uint64_t& from_used = used_[index(placement.tier)];
  from_used -= std::min(placement.bytes, from_used);
  return true;
}

}  // namespace kvtier::policy::detail
