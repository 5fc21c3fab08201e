// Internal to the planner (not part of policy's interface): the rules planner.h lists,
// each adding its moves to one PlanState so that later rules see the room earlier
// ones made or used.
//
// Thread-safety: none; called within one planning call.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "policy/block_order.h"
#include "policy/plan_state.h"

namespace kvtier::policy::detail {

// What idle demotion remembers from one plan to the next (the Planner keeps it), so
// that a plan looks only at sessions that crossed a threshold since the last one:
// per tier, how far along the table's idle order it has looked, and the sessions to
// look at again later (predicted back, or with blocks busy at the time).
struct IdleScan {
  struct Position {
    uint64_t last_active_ms;
    uint64_t touch_seq;
  };
  struct Retry {
    uint64_t due_ms;
    uint64_t last_active_ms;
  };
  struct PerTier {
    std::optional<Position> cursor;   // the last session looked at; none: from the start
    std::map<uint64_t, Retry> retry;  // by the session's touch_seq
  };
  std::array<PerTier, 2> tiers;  // HBM, RAM
  // Predicted-back sessions are looked at again after this long.
  static constexpr uint64_t kRecheckMs = 1'000;
};

// Sessions past a tier's idle threshold leave it (HBM → next tier; RAM → NVMe when
// NVMe is configured). Blocks that a session within its threshold also holds stay.
// Sessions are taken in the order they crossed; one whose blocks cannot move because
// the tier below is full holds the scan there until the next plan.
void demote_idle_sessions(PlanContext& ctx, PlanState& plan, IdleScan& scan);

// The idle sessions holding `key` are looked at again by the next plan (a move planned
// for it did not happen).
void revisit_holders(const SessionTable& sessions, const BlockKey& key, uint64_t now_ms,
                     IdleScan& scan);

// Every tier over its high watermark sheds down to its low watermark, counting what
// the tier above will shed into it; the slowest tier evicts. Planned bottom-up so
// each demotion finds the room the tier below made.
void relieve_pressure(PlanContext& ctx, PlanState& plan);

// kPredictive: blocks of sessions predicted to return within the upper tier's idle
// threshold move up one tier while it is under its low watermark, within the
// bandwidth share of one plan interval. Prospects are the kProspectWindow most
// recently active idle sessions (a plan must not cost the whole idle population).
inline constexpr size_t kProspectWindow = 1024;
void prefetch_predicted_returns(PlanContext& ctx, PlanState& plan);

// Moves out of `tier` so that `bytes` more fit, as `room` says (planner.h); empty when
// impossible. Demoting, a block the cost model would drop is dropped, and `bytes`
// counts the room the demotions will make once they land.
std::vector<Move> room_for(PlanContext& ctx, Tier tier, uint64_t bytes, Room room = Room::kEvict);

// BeginTurn: `session`'s blocks come up to the top tier, displacing other idle
// blocks when it is full — when all of them can be there (blocks that land within
// `lead_ms` may displace, the others need free room); NVMe blocks that do not come up
// to the top tier come up to RAM (when the top tier is HBM); NVMe blocks that cannot
// land within `lead_ms` (when known) stay.
std::vector<Move> turn_start(PlanContext& ctx, const Session& session,
                             std::optional<double> lead_ms);

}  // namespace kvtier::policy::detail
