// Internal to the planner (not part of policy's interface): what one planning call
// reads (PlanContext), one pass over the session table that every rule shares
// (PlanIndex), and the order in which each policy gives blocks up (sacrifice_order).
//
// Planning runs after every save and on a timer, so it must not walk the session
// table once per rule: PlanIndex walks it once, looks each referenced block's
// placement up once, and keeps per-block and per-session facts in flat arrays.
//
// Thread-safety: none; values local to one planning call.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "policy/plan_state.h"
#include "policy/planner.h"
#include "policy/return_predictor.h"

namespace kvtier::policy::detail {

// A block some session references, as this planning call sees it.
struct IndexedBlock {
  BlockKey key;
  Placement placement;
  uint32_t hottest = 0;  // position (in session order) of its hottest holder
  uint32_t depth = 0;    // its index in its holders' prefixes (the largest, if they differ)
  uint8_t wanted = 0;    // bit t: a holder is not past tier t's idle threshold
  bool active = false;   // a holder is in a turn
  uint8_t priority = 0;  // the highest priority among its holders
  // kPredictive: Σ over holders of P(return within tier t's horizon) — HBM and RAM
  // use their idle thresholds, NVMe "ever" — so shared prefixes are worth more.
  std::array<double, kTierCount> value{};
};

// Per session (in session order): past which tiers' idle thresholds it is, and
// (kPredictive) its return probabilities for each tier's horizon.
struct SessionOutlook {
  uint8_t past_threshold = 0;  // bit t
  std::array<double, kTierCount> p{};
};

class PlanContext;

// The buffers a planning call fills, kept by the Planner between calls so that a
// plan in the steady state allocates (and page-faults) nothing.
struct PlanScratch {
  static constexpr uint32_t kEmpty = UINT32_MAX;
  struct Slot {  // 8 bytes: the table is probed at random, so it must stay small
    uint32_t fingerprint = 0;
    uint32_t block = kEmpty;  // index into blocks
  };
  std::vector<const Session*> order;
  std::vector<IndexedBlock> blocks;
  std::vector<uint32_t> refs;
  std::vector<uint32_t> ref_begin;
  std::vector<SessionOutlook> outlooks;
  std::vector<Slot> slots;  // open addressing over blocks
};

class PlanIndex {
 public:
  // Fills `scratch` (which must outlive this index) from one pass over the sessions.
  PlanIndex(PlanContext& ctx, PlanScratch& scratch);

  std::vector<IndexedBlock>& blocks() { return s_.blocks; }
  const std::vector<IndexedBlock>& blocks() const { return s_.blocks; }
  // Indices into blocks() of session `position`'s references, in prefix order.
  std::span<const uint32_t> refs(size_t position) const {
    return {s_.refs.data() + s_.ref_begin[position], s_.refs.data() + s_.ref_begin[position + 1]};
  }
  const SessionOutlook& outlook(size_t position) const { return s_.outlooks[position]; }
  // The index of `key` in blocks(), or -1 when no session references it.
  int64_t find(const BlockKey& key) const;

 private:
  static uint64_t fingerprint_of(const BlockKey& key);

  PlanScratch& s_;
  uint64_t mask_ = 0;
};

class PlanContext {
 public:
  PlanContext(const PlannerConfig& config, const CostModel& cost, const SessionTable& sessions,
              const PlacementView& view, uint64_t now_ms, PlanScratch& scratch)
      : config(config),
        cost(cost),
        sessions(sessions),
        view(view),
        now_ms(now_ms),
        scratch_(scratch) {}

  const PlannerConfig& config;
  const CostModel& cost;
  const SessionTable& sessions;
  const PlacementView& view;
  const uint64_t now_ms;

  bool predictive() const { return config.mode == PolicyMode::kPredictive; }
  // Each built on first use, then kept for the rest of the call.
  const ReturnPredictor& predictor();
  PlanIndex& index();
  // Sessions holding blocks, in the order they give blocks up: normal idle sessions,
  // then normal active ones, then durable ones; each group least recently active
  // first (ties by id, then namespace: plans must not depend on hash-map order).
  const std::vector<const Session*>& session_order();

  // Whether `session` is idle, not durable, and idle for at least `tier`'s idle
  // threshold. (kPredictive also spares it when it is predicted back within the
  // threshold with probability ≥ imminent_probability: SessionOutlook has the verdict.)
  bool idle_for_threshold(const Session& session, Tier tier) const;

  // Cost at the next turn of a block in `tier`: its reload time, or its recompute
  // time when `tier` is kNone (or reloading would be slower).
  double next_turn_ms(Tier tier, const BlockKey& key, uint64_t bytes) const;
  // Where a block leaving `tier` goes: the next tier down, or kNone (evict) when
  // there is none or, under kPredictive, reloading from there would be slower than
  // recomputing ("drop instead of demote").
  Tier destination_below(const PlanState& plan, Tier tier, const BlockKey& key,
                         uint64_t bytes) const;

 private:
  PlanScratch& scratch_;
  std::optional<ReturnPredictor> predictor_;
  std::optional<PlanIndex> index_;
  bool session_order_ready_ = false;
};

struct Candidate {
  BlockKey key;
  Placement placement;
  uint32_t depth = 0;  // index in the prefix of the sessions holding it; 0 when none
};

enum class Sacrifice { kDemote, kEvict };

// Movable blocks now in `tier`, in the order the configured policy gives them up:
//  kLru: least recently used first (blocks used together: deepest in the prefix first);
//  kSessionAware: idle sessions' blocks (least recently active session first, tail
//    first), blocks no session holds (LRU), active sessions', durable sessions'; a
//    shared block goes with its hottest holder;
//  kPredictive: durable and active last; otherwise least loss first, where loss =
//    value × (next-turn cost after the move − cost now) per byte; among equal losses
//    the least recently active session's first, each session's tail first (a block
//    is worth nothing without those before it).
std::vector<Candidate> sacrifice_order(PlanContext& ctx, const PlanState& plan, Tier tier,
                                       Sacrifice kind);

}  // namespace kvtier::policy::detail
