#include "policy/planner_rules.h"

#include <algorithm>
#include <array>
#include <set>

namespace kvtier::policy::detail {
namespace {

// Plans `key` out of `tier`: demoted to the next tier, or evicted when there is none
// or (kPredictive) recomputing it would be faster than reloading it from there.
bool leave_tier(PlanContext& ctx, PlanState& plan, Tier tier, const Candidate& c,
                MoveReason reason) {
  const Tier to = ctx.destination_below(plan, tier, c.key, c.placement.bytes);
  if (to != Tier::kNone) return plan.move(c.key, c.placement, to, reason);
  const bool drop = plan.below(tier) != Tier::kNone;
  return plan.evict(c.key, c.placement, drop ? MoveReason::kRecomputeCheaper : reason);
}

// Plans `c` down to `to` (a durable tier some tiers below its own), or evicted where
// (kPredictive) recomputing it would be faster than reloading it from there.
bool leave_tier_to(PlanContext& ctx, PlanState& plan, Tier to, const Candidate& c,
                   MoveReason reason) {
  if (!ctx.predictive() || ctx.cost.worth_keeping(to, c.key.layout, c.placement.bytes)) {
    return plan.move(c.key, c.placement, to, reason);
  }
  return plan.evict(c.key, c.placement, MoveReason::kRecomputeCheaper);
}

// Whether BeginTurn may displace a block with these holders (nullptr: none): blocks of
// sessions in a turn (the starting one included) and durable ones stay.
bool displaceable(const BlockHolders* holders) {
  return holders == nullptr || (holders->active == 0 && !holders->durable());
}

// Whether all of `session`'s blocks that turn_start would bring up to `top` can be
// there: those whose copies land within the lead may displace idle blocks, the others
// need free room. A dry run of turn_start's loop; the idle blocks are counted, not
// ordered (one pass over the top tier).
bool session_fits_top(PlanContext& ctx, const PlanState& plan, const Session& session, Tier top,
                      uint64_t top_limit, std::optional<double> lead_ms) {
  std::array<double, kTierCount> queued_ms{};
  uint64_t wanted = 0;
  uint64_t displacing = 0;
  for (const BlockHash& hash : session.blocks) {
    const Placement placement = ctx.view.placement({session.layout, hash});
    if (placement.tier == Tier::kNone || placement.tier == top || !placement.movable) continue;
    double& queued = queued_ms[static_cast<size_t>(placement.tier)];
    const double lands_ms = queued + ctx.cost.reload_ms(placement.tier, placement.bytes);
    // A block that must be read up first (not engine-facing) and cannot land in time stays.
    if (!TierTopology::traits(placement.tier).engine_facing && lead_ms && lands_ms > *lead_ms) {
      continue;
    }
    queued = lands_ms;
    wanted += placement.bytes;
    if (!lead_ms || lands_ms <= *lead_ms) displacing += placement.bytes;
  }
  const uint64_t free_bytes = top_limit > plan.used(top) ? top_limit - plan.used(top) : 0;
  if (wanted <= free_bytes) return true;
  uint64_t idle_bytes = 0;  // what turn_start's victims would be
  ctx.view.for_each_in_tier(top, [&](const BlockKey& key, const Placement& placement) {
    if (!placement.movable || placement.tier != top || plan.planned(key)) return;
    if (displaceable(placement.session_refs == 0 ? nullptr : ctx.sessions.holders(key))) {
      idle_bytes += placement.bytes;
    }
  });
  return wanted <= free_bytes + std::min(idle_bytes, displacing);
}

}  // namespace

namespace {

// kRetry: look again next plan; kSpared: predicted back, look again in kRecheckMs.
enum class Outcome { kDone, kRetry, kSpared, kBlocked };

// Plans `session`'s blocks in `tier` out of it, tail first. kRetry when some of its
// blocks may still need to leave `tier` later: busy now, or on their way down to it.
Outcome demote_session(PlanContext& ctx, PlanState& plan, const Session& session, Tier tier) {
  if (!ctx.idle_for_threshold(session, tier)) return Outcome::kDone;  // durable
  if (!ctx.past_threshold(session, tier)) return Outcome::kSpared;    // predicted back
  Outcome outcome = Outcome::kDone;
  for (auto it = session.blocks.rbegin(); it != session.blocks.rend(); ++it) {
    const BlockKey key{session.layout, *it};
    const Placement placement = ctx.view.placement(key);
    if (placement.tier == Tier::kNone || placement.tier > tier) continue;
    const BlockHolders* holders = ctx.sessions.holders(key);
    if (placement.tier < tier) {
      // Above: moving now, or leaving its tier too (nobody there wants it), it will be
      // in `tier` later. Kept above by a warmer holder, that holder takes it down.
      if (plan.planned(key) || !placement.movable ||
          (holders != nullptr && !ctx.wanted(key, *holders, placement.tier))) {
        outcome = Outcome::kRetry;
      }
      continue;
    }
    if (plan.planned(key)) continue;
    // A block that a session within its threshold also holds stays.
    if (holders != nullptr && ctx.wanted(key, *holders, tier)) continue;
    if (!placement.movable) {
      outcome = Outcome::kRetry;  // being read or moved: look again later
      continue;
    }
    if (!leave_tier(ctx, plan, tier, {key, placement, holders}, MoveReason::kIdle)) {
      return Outcome::kBlocked;  // the tier below is full
    }
  }
  return outcome;
}

}  // namespace

void demote_idle_sessions(PlanContext& ctx, PlanState& plan, IdleScan& scan) {
  const std::set<SessionTable::IdleKey>& idle = ctx.sessions.idle_sessions();
  auto key_of = [](const IdleScan::Position& p) {
    return SessionTable::IdleKey{p.last_active_ms, p.touch_seq, nullptr};
  };
  for (Tier tier : plan.topology().engine_facing()) {
    // Idle thresholds are the engine-facing tiers'. An idle session leaves a tier only
    // for a tier below it: the slowest tier keeps what it holds until pressure evicts it.
    if (!plan.configured(tier) || plan.below(tier) == Tier::kNone) continue;
    IdleScan::PerTier& state = scan.tiers[static_cast<size_t>(tier)];
    const uint64_t threshold = idle_threshold_of(ctx.config, tier);
    auto due = [&](Outcome outcome) {
      return ctx.now_ms + (outcome == Outcome::kSpared ? IdleScan::kRecheckMs : 0);
    };
    // Sessions to look at again: still idle since then (touched or closed ones left
    // the idle order, and will be seen when they cross again).
    bool blocked = false;
    for (auto r = state.retry.begin(); r != state.retry.end();) {
      auto found = idle.find(key_of({r->second.last_active_ms, r->first}));
      if (found == idle.end()) {
        r = state.retry.erase(r);
        continue;
      }
      if (r->second.due_ms > ctx.now_ms || blocked) {
        ++r;
        continue;
      }
      const Outcome outcome = demote_session(ctx, plan, *found->session, tier);
      if (outcome == Outcome::kBlocked) blocked = true;
      if (outcome == Outcome::kDone) {
        r = state.retry.erase(r);
      } else {
        r->second.due_ms = due(outcome);
        ++r;
      }
    }
    if (blocked) continue;
    // Sessions that crossed the threshold since the last plan, in the order they did.
    auto it = state.cursor ? idle.upper_bound(key_of(*state.cursor)) : idle.begin();
    for (; it != idle.end(); ++it) {
      if (ctx.now_ms < it->last_active_ms || ctx.now_ms - it->last_active_ms < threshold) break;
      const Outcome outcome = demote_session(ctx, plan, *it->session, tier);
      if (outcome == Outcome::kBlocked) break;  // again from here next time
      if (outcome != Outcome::kDone) {
        state.retry[it->touch_seq] = IdleScan::Retry{due(outcome), it->last_active_ms};
      }
      state.cursor = IdleScan::Position{it->last_active_ms, it->touch_seq};
    }
  }
}

void revisit_holders(const SessionTable& sessions, const BlockKey& key, uint64_t now_ms,
                     IdleScan& scan) {
  const BlockHolders* holders = sessions.holders(key);
  if (holders == nullptr) return;
  holders->for_each([&](const Session& s) {
    if (s.state != SessionState::kIdle) return;
    for (IdleScan::PerTier& tier : scan.tiers) {
      tier.retry[s.touch_seq] = IdleScan::Retry{now_ms, s.last_active_ms};
    }
  });
}

void relieve_pressure(PlanContext& ctx, PlanState& plan) {
  std::array<uint64_t, kTierCount> shed{};
  bool any = false;
  uint64_t inflow = 0;  // what the tier above will shed into this one
  const std::span<const Tier> tiers = plan.topology().local();
  for (Tier tier : tiers) {
    const Watermarks marks = watermarks_of(ctx.config, tier);
    // Blocks still arriving count once they landed (a plan or two later): until then
    // the order of sacrifice cannot see them; blocks already moving out count as gone
    // (PlacementView::TierSpace). (Rules before this one may have lowered used().)
    const uint64_t unsettled = plan.arriving(tier) + plan.departing(tier);
    const uint64_t projected = plan.used(tier) - std::min(plan.used(tier), unsettled) + inflow;
    const uint64_t high = fraction_of(marks.high, plan.capacity(tier));
    const uint64_t low = fraction_of(marks.low, plan.capacity(tier));
    const uint64_t amount = projected > high ? projected - std::min(low, projected) : 0;
    shed[static_cast<size_t>(tier)] = amount;
    any |= amount > 0;
    inflow = amount;
  }
  if (!any) return;
  for (auto it = tiers.rbegin(); it != tiers.rend(); ++it) {
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
  const std::set<SessionTable::IdleKey>& idle = ctx.sessions.idle_sessions();
  // Into each engine-facing tier from the one below, bottom first (NVMe → RAM, then
  // RAM → HBM): a block moves at most one tier per plan.
  const std::span<const Tier> facing = plan.topology().engine_facing();
  for (auto upper_it = facing.rbegin(); upper_it != facing.rend(); ++upper_it) {
    const Tier upper = *upper_it;
    const Tier lower = plan.below(upper);
    if (lower == Tier::kNone) continue;
    if (plan.used(lower) == 0) continue;  // nothing there to bring up
    const uint64_t limit = fraction_of(watermarks_of(ctx.config, upper).low, plan.capacity(upper));
    if (plan.used(upper) >= limit) continue;
    struct Prospect {
      double probability;
      size_t recency;  // 0: the most recently active
      const Session* session;
    };
    std::vector<Prospect> prospects;
    size_t recency = 0;
    for (auto it = idle.rbegin(); it != idle.rend() && recency < kProspectWindow; ++it, ++recency) {
      const Session& s = *it->session;
      if (s.blocks.empty()) continue;
      const double p = s.priority > kDefaultPriority ? 1.0
                                                     : ctx.predictor().probability_within(
                                                           s, idle_threshold_of(ctx.config, upper));
      if (p >= ctx.config.imminent_probability) prospects.push_back({p, recency, &s});
    }
    // Most likely first; among equals the most recently active.
    std::sort(prospects.begin(), prospects.end(), [](const Prospect& a, const Prospect& b) {
      if (a.probability != b.probability) return a.probability > b.probability;
      return a.recency < b.recency;
    });
    const double budget = ctx.cost.config().read_bytes_per_s[static_cast<size_t>(lower)] *
                          static_cast<double>(ctx.config.plan_interval_ms) / 1000.0 *
                          ctx.config.prefetch_bandwidth_share;
    double moved = 0;
    bool full = false;
    for (const Prospect& prospect : prospects) {
      const Session& s = *prospect.session;
      for (const BlockHash& hash : s.blocks) {  // prefix first: it is read first
        const BlockKey key{s.layout, hash};
        const Placement placement = ctx.view.placement(key);
        if (placement.tier != lower || !placement.movable || plan.planned(key)) continue;
        if (!fits(plan.used(upper), placement.bytes, limit) ||
            moved + static_cast<double>(placement.bytes) > budget) {
          full = true;
          break;
        }
        if (plan.move(key, placement, upper, MoveReason::kPredictedReturn, limit)) {
          moved += static_cast<double>(placement.bytes);
        }
      }
      if (full) break;
    }
  }
}

std::vector<Move> room_for(PlanContext& ctx, Tier tier, uint64_t bytes, Room room) {
  PlanState plan(ctx.view);
  const uint64_t capacity = plan.capacity(tier);
  uint64_t free_bytes = capacity > plan.used(tier) ? capacity - plan.used(tier) : 0;
  if (free_bytes >= bytes) return {};
  if (bytes > capacity) return {};  // could never fit, even in an empty tier

  const bool demote =
      room != Room::kEvict && room != Room::kEvictUnheld && plan.below(tier) != Tier::kNone;
  // kDemoteToDurable: the first durable tier below, past the ones between.
  Tier skip_to = Tier::kNone;
  if (room == Room::kDemoteToDurable) {
    for (Tier t = plan.below(tier); t != Tier::kNone; t = plan.below(t)) {
      if (TierTopology::traits(t).durable) {
        skip_to = t;
        break;
      }
    }
    if (skip_to == Tier::kNone) return {};
  }
  if (demote && (room == Room::kDemoteEvictingBelow || room == Room::kDemoteToDurable)) {
    // The tier below takes what leaves this one; when it is the slowest and full, its
    // own order of sacrifice (for leaving the daemon) makes that room first, as the
    // watermarks would: a block cold enough to leave goes rather than a warmer one
    // above it.
    const Tier below = skip_to != Tier::kNone ? skip_to : plan.below(tier);
    const uint64_t needed = bytes - free_bytes;
    const uint64_t below_capacity = plan.capacity(below);
    uint64_t below_free = below_capacity > plan.used(below) ? below_capacity - plan.used(below) : 0;
    if (below_free < needed && plan.below(below) == Tier::kNone) {
      for (const Candidate& c : sacrifice_order(ctx, plan, below, Sacrifice::kEvict)) {
        if (below_free >= needed) break;
        if (plan.evict(c.key, c.placement, MoveReason::kMakeRoom)) below_free += c.placement.bytes;
      }
    }
  }
  for (const Candidate& c :
       sacrifice_order(ctx, plan, tier, demote ? Sacrifice::kDemote : Sacrifice::kEvict)) {
    if (free_bytes >= bytes) break;
    if (room == Room::kEvictUnheld && c.placement.session_refs > 0) continue;
    const bool leaves = skip_to != Tier::kNone
                            ? leave_tier_to(ctx, plan, skip_to, c, MoveReason::kMakeRoom)
                        : demote ? leave_tier(ctx, plan, tier, c, MoveReason::kMakeRoom)
                                 : plan.evict(c.key, c.placement, MoveReason::kMakeRoom);
    if (leaves) free_bytes += c.placement.bytes;
  }
  // Partial evictions would drop cached blocks without letting the caller store
  // anything, so an impossible request evicts nothing.
  if (free_bytes < bytes) return {};
  return plan.take_moves();
}

std::vector<Move> turn_start(PlanContext& ctx, const Session& session,
                             std::optional<double> lead_ms) {
  PlanState plan(ctx.view);
  const Tier top = plan.topology().top();
  if (top == Tier::kNone) return {};
  const uint64_t top_limit = fraction_of(watermarks_of(ctx.config, top).high, plan.capacity(top));
  // Below top, the tier blocks read up out of NVMe land in (RAM), when it is not top.
  const Tier landing = plan.topology().landing();
  const uint64_t landing_limit =
      fraction_of(watermarks_of(ctx.config, landing).high, plan.capacity(landing));
  std::vector<Candidate> victims;
  bool victims_ready = false;
  size_t next_victim = 0;
  bool top_full = !session_fits_top(ctx, plan, session, top, top_limit, lead_ms);
  // Per source tier, when the copies planned so far would land (ms from now, FIFO).
  std::array<double, kTierCount> queued_ms{};
  for (const BlockHash& hash : session.blocks) {
    BlockKey key{session.layout, hash};
    const Placement placement = ctx.view.placement(key);
    if (placement.tier == Tier::kNone || placement.tier == top || !placement.movable) continue;
    // A block on NVMe (not engine-facing) whose copy cannot land before the Load (the
    // turn lead engines show) stays there: the Load reads it up into RAM itself, and a
    // copy still on its way when the Load comes only takes the link from blocks that
    // can land.
    const bool read_up = !TierTopology::traits(placement.tier).engine_facing;
    double& queued = queued_ms[static_cast<size_t>(placement.tier)];
    if (read_up && lead_ms &&
        queued + ctx.cost.reload_ms(placement.tier, placement.bytes) > *lead_ms) {
      continue;
    }
    if (!top_full) {
      const double lands_ms = queued + ctx.cost.reload_ms(placement.tier, placement.bytes);
      const bool may_displace = !lead_ms || lands_ms <= *lead_ms;
      if (may_displace && !fits(plan.used(top), placement.bytes, top_limit) && !victims_ready) {
        victims_ready = true;
        for (const Candidate& c : sacrifice_order(ctx, plan, top, Sacrifice::kDemote)) {
          if (displaceable(c.holders)) victims.push_back(c);
        }
      }
      while (may_displace && !fits(plan.used(top), placement.bytes, top_limit) &&
             next_victim < victims.size()) {
        (void)leave_tier(ctx, plan, top, victims[next_victim++], MoveReason::kMakeRoom);
      }
      if (plan.move(key, placement, top, MoveReason::kTurnStart, top_limit)) {
        queued = lands_ms;
        continue;
      }
      // Stop at the first block that does not fit: a later block without the ones
      // before it does not lengthen the prefix the engine can load from the top tier.
      top_full = true;
    }
    if (landing != top && read_up &&
        plan.move(key, placement, landing, MoveReason::kTurnStart, landing_limit)) {
      queued += ctx.cost.reload_ms(placement.tier, placement.bytes);
    }
  }
  return plan.take_moves();
}

}  // namespace kvtier::policy::detail
