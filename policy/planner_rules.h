// Internal to the planner (not part of policy's interface): the rules planner.h lists,
// each adding its moves to one PlanState so that later rules see the room earlier
// ones made or used.
//
// Thread-safety: none; called within one planning call.
#pragma once

#include <cstdint>
#include <vector>

#include "policy/block_order.h"
#include "policy/plan_state.h"

namespace kvtier::policy::detail {

// Sessions past a tier's idle threshold leave it (HBM → next tier; RAM → NVMe when
// NVMe is configured). Blocks that a session within its threshold also holds stay.
void demote_idle_sessions(PlanContext& ctx, PlanState& plan);

// Every tier over its high watermark sheds down to its low watermark, counting what
// the tier above will shed into it; the slowest tier evicts. Planned bottom-up so
// each demotion finds the room the tier below made.
void relieve_pressure(PlanContext& ctx, PlanState& plan);

// kPredictive: blocks of sessions predicted to return within the upper tier's idle
// threshold move up one tier while it is under its low watermark, within the
// bandwidth share of one plan interval.
void prefetch_predicted_returns(PlanContext& ctx, PlanState& plan);

// Evictions from `tier` so that `bytes` more fit; empty when impossible.
std::vector<Move> room_for(PlanContext& ctx, Tier tier, uint64_t bytes);

// BeginTurn: `session`'s blocks come up to the top tier, displacing other idle
// blocks when it is full; NVMe blocks that still do not fit come up to RAM.
std::vector<Move> turn_start(PlanContext& ctx, const Session& session);

}  // namespace kvtier::policy::detail
