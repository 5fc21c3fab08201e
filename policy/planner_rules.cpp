#include "policy/planner_rules.h"

#include <algorithm>
#include <array>

namespace kvtier::policy::detail {
namespace {

constexpr std::array<Tier, 3> kTiers = {Tier::kHbm, Tier::kRam, Tier::kNvme};

// Plans `key` out of `tier`: demoted to the next tier, or evicted when there is none
// or (kPredictive) recomputing it would be faster than reloading it from there.
bool leave_tier(PlanContext& ctx, PlanState& plan, Tier tier, const Candidate& c,
                MoveReason reason) {
  const Tier to = ctx.destination_below(plan, tier, c.key, c.placement.bytes);
  if (to != Tier::kNone) return plan.move(c.key, c.placement, to, reason);
  const bool drop = plan.below(tier) != Tier::kNone;
  return plan.evict(c.key, c.placement, drop ? MoveReason::kRecomputeCheaper : reason);
}

}  // namespace

void demote_idle_sessions(PlanContext& ctx, PlanState& plan) {
  for (Tier tier : {Tier::kHbm, Tier::kRam}) {
    // An idle session leaves a tier only for a tier below it: the slowest tier keeps
    // what it holds until pressure evicts it.
    if (!plan.configured(tier) || plan.below(tier) == Tier::kNone) continue;
    const uint8_t tier_bit = static_cast<uint8_t>(1u << static_cast<unsigned>(tier));
    PlanIndex& index = ctx.index();
    const size_t sessions = ctx.session_order().size();
    for (size_t i = 0; i < sessions; ++i) {
      if ((index.outlook(i).past_threshold & tier_bit) == 0) continue;
      const auto refs = index.refs(i);
      for (auto it = refs.rbegin(); it != refs.rend(); ++it) {  // tail first
        const IndexedBlock& b = index.blocks()[*it];
        // A block that a session within its threshold also holds stays.
        if ((b.wanted & tier_bit) != 0 || b.placement.tier != tier) continue;
        (void)leave_tier(ctx, plan, tier, {b.key, b.placement}, MoveReason::kIdle);
      }
    }
  }
}

void relieve_pressure(PlanContext& ctx, PlanState& plan) {
  std::array<uint64_t, kTierCount> shed{};
  bool any = false;
  uint64_t inflow = 0;  // what the tier above will shed into this one
  for (Tier tier : kTiers) {
    if (!plan.configured(tier)) continue;
    const Watermarks marks = watermarks_of(ctx.config, tier);
    const uint64_t projected = plan.used(tier) + inflow;
    const uint64_t high = fraction_of(marks.high, plan.capacity(tier));
    const uint64_t low = fraction_of(marks.low, plan.capacity(tier));
    const uint64_t amount = projected > high ? projected - std::min(low, projected) : 0;
    shed[static_cast<size_t>(tier)] = amount;
    any |= amount > 0;
    inflow = amount;
  }
  if (!any) return;
  for (auto it = kTiers.rbegin(); it != kTiers.rend(); ++it) {
    const Tier tier = *it;
    const uint64_t amount = shed[static_cast<size_t>(tier)];
    if (amount == 0) continue;
    const Sacrifice kind = plan.below(tier) == Tier::kNone ? Sacrifice::kEvict : Sacrifice::kDemote;
    uint64_t done = 0;
    for (const Candidate& c : sacrifice_order(ctx, plan, tier, kind)) {
      if (done >= amount) break;
      if (leave_tier(ctx, plan, tier, c, MoveReason::kWatermark)) done += c.placement.bytes;
    }
  }
}

void prefetch_predicted_returns(PlanContext& ctx, PlanState& plan) {
  // Moving blocks on the prior alone would be a guess: wait for observed returns.
  if (!ctx.predictor().informed()) return;
  PlanIndex& index = ctx.index();
  const std::vector<const Session*>& order = ctx.session_order();
  // NVMe → RAM first, then RAM → HBM: a block moves at most one tier per plan.
  for (Tier upper : {Tier::kRam, Tier::kHbm}) {
    const Tier lower = plan.below(upper);
    if (!plan.configured(upper) || lower == Tier::kNone) continue;
    const uint64_t limit = fraction_of(watermarks_of(ctx.config, upper).low, plan.capacity(upper));
    if (plan.used(upper) >= limit) continue;
    struct Prospect {
      double probability;
      size_t position;
    };
    std::vector<Prospect> prospects;
    for (size_t i = 0; i < order.size(); ++i) {
      const Session& s = *order[i];
      if (s.state != SessionState::kIdle || s.blocks.empty()) continue;
      const double p = s.priority > 0 ? 1.0 : index.outlook(i).p[static_cast<size_t>(upper)];
      if (p >= ctx.config.imminent_probability) prospects.push_back({p, i});
    }
    // Most likely first; among equals the most recently active (later in the order).
    std::sort(prospects.begin(), prospects.end(), [](const Prospect& a, const Prospect& b) {
      if (a.probability != b.probability) return a.probability > b.probability;
      return a.position > b.position;
    });
    const double budget = ctx.cost.config().read_bytes_per_s[static_cast<size_t>(lower)] *
                          static_cast<double>(ctx.config.plan_interval_ms) / 1000.0 *
                          ctx.config.prefetch_bandwidth_share;
    double moved = 0;
    bool full = false;
    for (const Prospect& prospect : prospects) {
      for (uint32_t at : index.refs(prospect.position)) {  // prefix first: it is read first
        const IndexedBlock& b = index.blocks()[at];
        if (b.placement.tier != lower || !b.placement.movable || plan.planned(b.key)) continue;
        if (!fits(plan.used(upper), b.placement.bytes, limit) ||
            moved + static_cast<double>(b.placement.bytes) > budget) {
          full = true;
          break;
        }
        if (plan.move(b.key, b.placement, upper, MoveReason::kPredictedReturn, limit)) {
          moved += static_cast<double>(b.placement.bytes);
        }
      }
      if (full) break;
    }
  }
}

std::vector<Move> room_for(PlanContext& ctx, Tier tier, uint64_t bytes) {
  PlanState plan(ctx.view);
  const uint64_t capacity = plan.capacity(tier);
  uint64_t free_bytes = capacity > plan.used(tier) ? capacity - plan.used(tier) : 0;
  if (free_bytes >= bytes) return {};
  if (bytes > capacity) return {};  // could never fit, even in an empty tier

  for (const Candidate& c : sacrifice_order(ctx, plan, tier, Sacrifice::kEvict)) {
    if (free_bytes >= bytes) break;
    if (plan.evict(c.key, c.placement, MoveReason::kMakeRoom)) free_bytes += c.placement.bytes;
  }
  // Partial evictions would drop cached blocks without letting the caller store
  // anything, so an impossible request evicts nothing.
  if (free_bytes < bytes) return {};
  return plan.take_moves();
}

std::vector<Move> turn_start(PlanContext& ctx, const Session& session) {
  PlanState plan(ctx.view);
  const Tier top = plan.configured(Tier::kHbm)   ? Tier::kHbm
                   : plan.configured(Tier::kRam) ? Tier::kRam
                                                 : Tier::kNone;
  if (top == Tier::kNone) return {};
  const uint64_t top_limit = fraction_of(watermarks_of(ctx.config, top).high, plan.capacity(top));
  const uint64_t ram_limit =
      fraction_of(watermarks_of(ctx.config, Tier::kRam).high, plan.capacity(Tier::kRam));
  std::vector<Candidate> victims;
  bool victims_ready = false;
  size_t next_victim = 0;
  bool top_full = false;
  for (const BlockHash& hash : session.blocks) {
    BlockKey key{session.layout, hash};
    const Placement placement = ctx.view.placement(key);
    if (placement.tier == Tier::kNone || placement.tier == top || !placement.movable) continue;
    if (!top_full) {
      if (!fits(plan.used(top), placement.bytes, top_limit) && !victims_ready) {
        victims_ready = true;
        // Blocks of sessions in a turn (this one included) or durable ones stay.
        const PlanIndex& index = ctx.index();
        for (const Candidate& c : sacrifice_order(ctx, plan, top, Sacrifice::kDemote)) {
          const int64_t at = c.placement.session_refs == 0 ? -1 : index.find(c.key);
          if (at >= 0) {
            const IndexedBlock& b = index.blocks()[static_cast<size_t>(at)];
            if (b.active || b.priority > 0) continue;
          }
          victims.push_back(c);
        }
      }
      while (!fits(plan.used(top), placement.bytes, top_limit) && next_victim < victims.size()) {
        (void)leave_tier(ctx, plan, top, victims[next_victim++], MoveReason::kMakeRoom);
      }
      if (plan.move(key, placement, top, MoveReason::kTurnStart, top_limit)) continue;
      // Stop at the first block that does not fit: a later block without the ones
      // before it does not lengthen the prefix the engine can load from the top tier.
      top_full = true;
    }
    if (top == Tier::kHbm && placement.tier == Tier::kNvme) {
      (void)plan.move(key, placement, Tier::kRam, MoveReason::kTurnStart, ram_limit);
    }
  }
  return plan.take_moves();
}

}  // namespace kvtier::policy::detail
