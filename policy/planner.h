// Planner: turns the state of sessions and tiers into moves (demote, promote, evict —
// an eviction that replaces a demotion is a *drop*). It decides *what* to move; the
// daemon carries moves out through the tiers. Pure logic on an injected clock: no I/O,
// no threads, so the trace simulator (kvtier-bench sim) runs the same code as the
// daemon.
//
// Three policies (PlannerConfig::mode), each a superset of the rules before it:
//  * kLru — LRU tiering, request-scoped, what engine-side offload does today:
//    when a tier is over its high watermark, its least recently used blocks move one
//    tier down until it is at its low watermark; the slowest tier evicts instead. No
//    idle clock, nothing on BeginTurn.
//  * kSessionAware — a conversation is the unit:
//    - Idle demotion: a session idle for hbm_idle_ms leaves HBM, for ram_idle_ms
//      leaves RAM (for NVMe, when configured), while the tier below has room.
//    - Watermarks per tier, order of sacrifice: idle sessions' blocks (least recently
//      active session first, each session's tail first), then blocks no session holds
//      (LRU), then active sessions'. A block shared by several sessions goes with its
//      most recently active holder.
//    - BeginTurn (plan_turn_start): the session's blocks come up to HBM at once, in
//      prefix order, displacing idle sessions' blocks if HBM is full — for as many
//      blocks as can land within the turn lead engines show (observe_turn_lead), and
//      only when all of the session can be there.
//  * kPredictive — session-aware plus:
//    - Return prediction (return_predictor.h): P(return within a horizon) per session,
//      learned online. A block's value for a tier is Σ over the sessions holding it of
//      P(that session returns within the tier's idle threshold) — the slowest tier
//      uses P(it returns at all) — so blocks shared by many sessions (system prompts,
//      common documents) are worth more. Durable sessions (retention priority above
//      the default) count as certain to return.
//  Every mode gives blocks up lowest retention priority first (session_table.h).
//    - Block reuse (block_reuse.h): leaving the daemon, a block some session holds is
//      worth at least its own chance of being used again, learned online from how
//      often blocks are used: a new conversation may open with it, which no session's
//      return predicts.
//    - Prefixes: leaving the daemon, each holder's term of a block's value counts the
//      blocks after it in that holder's prefix too (they cannot be loaded without it).
//    - Cost model (cost_model.h): under pressure the block that loses least leaves
//      first — value × (reload time from the lower tier − reload time from this one).
//      A block whose reload from the lower tier would be slower than recomputing it
//      is dropped instead of demoted.
//    - Idle thresholds spare a session predicted to return within the threshold with
//      probability ≥ imminent_probability (once the predictor has seen returns).
//    - Predictive prefetch: blocks of such sessions move up one tier (NVMe → RAM →
//      HBM) while the upper tier is under its low watermark, within a share of the
//      link's bandwidth per plan (once the predictor has seen returns: never on the
//      prior alone).
//  make_room() picks blocks to evict for a save that does not fit, in each mode's
//  order of sacrifice.
//
// Thread-safety: none; owned by the control thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "common/block_key.h"
#include "policy/cost_model.h"
#include "policy/peer_policy.h"
#include "policy/return_predictor.h"
#include "policy/session_table.h"

namespace kvtier::policy {
namespace detail {
struct IdleScan;
}

// kLru, kSessionAware, kPredictive: kvtier's (above). The rest are the policies peers
// ship, run by the rules of kLru with their own order of sacrifice (peer_policy.h).
enum class PolicyMode : uint8_t {
  kLru = 0,
  kSessionAware = 1,
  kPredictive = 2,
  kS3Fifo = 3,
  kSlru = 4,
  kArc = 5,
  kTinyLfuLru = 6,
  kWorkloadAware = 7,
  kWTinyLfu = 8,
};
// "lru", "session", "predictive", "s3fifo", "slru", "arc", "tinylfu-lru", "workload",
// "w-tinylfu"
std::string_view policy_mode_name(PolicyMode mode);
std::optional<PolicyMode> parse_policy_mode(std::string_view name);

struct PlannerConfig {
  double hbm_high_watermark = 0.90;  // fraction of HBM capacity that triggers demotion
  double hbm_low_watermark = 0.75;   // demote down to this fraction
  uint64_t hbm_idle_ms = 30'000;     // idle sessions leave HBM after this long
  uint64_t ram_idle_ms = 600'000;    // ... and RAM (when an NVMe tier is configured)
  double ram_high_watermark = 0.90;
  double ram_low_watermark = 0.75;
  double nvme_high_watermark = 0.98;  // the slowest tier evicts past this
  double nvme_low_watermark = 0.95;
  PolicyMode mode = PolicyMode::kSessionAware;
  CostConfig cost{};  // tier bandwidths and default prefill speed (cost_model.h)
  // kPredictive: P(return within a tier's idle threshold) at which an idle session is
  // treated as coming back soon: kept in, or prefetched into, that tier.
  double imminent_probability = 0.5;
  uint64_t plan_interval_ms = 100;        // how often plan_demotions runs
  double prefetch_bandwidth_share = 0.5;  // of each link, per plan interval, for prefetch
};

// How make_room makes room. kEvict: blocks leave the daemon, in the order of sacrifice
// for that. kDemote: they go down to the tier below instead (where it has room, in the
// order of sacrifice for leaving the tier), so that nothing leaves the daemon for room a
// lower tier has: the room comes when those copies land; nothing when the tier below
// cannot take them. kDemoteEvictingBelow: and when that tier is the slowest and full,
// its coldest blocks are evicted to take them (not for a read: that could evict the
// block being read). kEvictUnheld: as kEvict, but only blocks no session holds (a Save
// never takes HBM from blocks sessions still need: it stores the prefix that fits).
// kDemoteToDurable: as kDemoteEvictingBelow, but the blocks go past the tiers between to
// the first durable tier below (HBM → NVMe while RAM is full of blocks that cannot
// move: being copied, read or pinned by requests in flight); nothing when there is none.
enum class Room : uint8_t { kEvict, kDemote, kDemoteEvictingBelow, kEvictUnheld, kDemoteToDurable };

// Numbering matches the wire enum `MoveKind` in schema/kvtier.capnp.
enum class MoveKind : uint8_t { kDemote = 0, kPromote = 1, kEvict = 2 };

// Why a move was planned (for logs, kvtierctl and the simulator's accounting).
enum class MoveReason : uint8_t {
  kUnspecified = 0,
  kIdle = 1,              // the session passed the tier's idle threshold
  kWatermark = 2,         // the tier was over its high watermark
  kMakeRoom = 3,          // a save needed the space
  kRecomputeCheaper = 4,  // dropped: reload from the lower tier would be slower than prefill
  kTurnStart = 5,         // BeginTurn: the session's turn is starting
  kPredictedReturn = 6,   // predictive prefetch
};
std::string_view move_reason_name(MoveReason reason);

struct Move {
  MoveKind kind;
  BlockKey block;
  Tier from;
  Tier to;  // kNone for kEvict
  MoveReason reason = MoveReason::kUnspecified;
  uint64_t bytes = 0;  // the block's size, when the planner knew it
};

// A summary of the moves of one kind a plan produced, for "recent planner moves".
struct PlanRecord {
  uint64_t at_ms = 0;
  MoveKind kind = MoveKind::kDemote;
  Tier from = Tier::kNone;
  Tier to = Tier::kNone;
  MoveReason reason = MoveReason::kUnspecified;
  uint32_t blocks = 0;
  uint64_t bytes = 0;
};

// What the planner may ask about blocks and tiers; the daemon implements it over the
// BlockStore, tests and the simulator over their own models.
class PlacementView {
 public:
  virtual ~PlacementView() = default;
  struct BlockPlacement {
    Tier tier;       // kNone when absent
    bool movable;    // ready, unpinned, not moving
    uint64_t bytes;  // block size
    uint32_t session_refs;
    uint64_t last_access_ms;
  };
  virtual BlockPlacement placement(const BlockKey& key) const = 0;
  struct TierSpace {
    uint64_t capacity_bytes = 0;  // 0: tier not configured
    uint64_t used_bytes = 0;
    // Of used_bytes: blocks a Save is still writing. They hold room (a Save's room
    // counts them) but are nobody's to judge yet: a watermark pass waits for them to
    // land, so that it never sends an older block down in place of one still arriving
    // that the policy would have given up first.
    uint64_t arriving_bytes = 0;
    // Of used_bytes: blocks moving out to another tier; their slots are free once the
    // moves land. A watermark pass counts them gone (it planned them, or BeginTurn
    // did): a pass while an earlier one's moves are still copying sheds nothing twice.
    uint64_t departing_bytes = 0;
  };
  virtual TierSpace space(Tier tier) const = 0;
  // Visible blocks in `tier`, with their placements. Must cost what the tier holds,
  // not what every tier holds: plans under pressure enumerate the pressed tier.
  virtual void for_each_in_tier(
      Tier tier, const std::function<void(const BlockKey&, const BlockPlacement&)>& fn) const = 0;
  // How far each namespace with a quota in `tier` (the daemon's tenant-quota) stands
  // above it (below: negative). When the tier must give blocks up, the namespace
  // furthest above its quota gives first (sacrifice order); a namespace not listed
  // counts as at its quota. Default: none listed (no quotas).
  struct QuotaStanding {
    uint32_t namespace_id;
    int64_t over_bytes;
  };
  virtual std::vector<QuotaStanding> quota_standing(Tier tier) const {
    (void)tier;
    return {};
  }
};

class Planner {
 public:
  static constexpr size_t kRecentRecords = 32;

  Planner(PlannerConfig config, const Clock& clock);
  ~Planner();

  const PlannerConfig& config() const { return config_; }
  // Replaces the configuration; per-layout costs already registered are kept.
  void set_config(const PlannerConfig& config);
  // What an engine reported for its layout (Hello): tokens per block, prefill speed.
  void set_layout_cost(const LayoutKey& layout, LayoutCost cost) { cost_.set_layout(layout, cost); }
  const CostModel& cost_model() const { return cost_; }

  // Periodic and after-save planning: idle demotions, watermark demotions and
  // evictions, drops and (kPredictive, periodic plans only) prefetch — every rule of the
  // mode but BeginTurn. Its cost follows what changed, not what is held: idle demotion
  // looks only at sessions that crossed a threshold since the last call (it remembers
  // how far it got), pressure at the blocks of the tiers over their watermarks,
  // prefetch at the most recently active idle sessions (up to 1024, each one's return
  // probability computed). Prefetch spends a share of one plan interval's read
  // bandwidth, so it runs once per interval: a plan after a Save leaves it out.
  enum class PlanKind { kPeriodic, kAfterSave };
  std::vector<Move> plan_demotions(const SessionTable& sessions, const PlacementView& view,
                                   PlanKind kind = PlanKind::kPeriodic) const;

  // A planned move of `key` did not happen (its copy failed, or the tier could not
  // take it then): idle demotion looks at the idle sessions holding it again next plan.
  void revisit(const SessionTable& sessions, const BlockKey& key) const;

  // Blocks to leave `tier` so that `bytes` more fit (Room says how); empty when nothing
  // may go (all pinned) — the caller then reports ResourceExhausted.
  std::vector<Move> make_room(Tier tier, uint64_t bytes, const SessionTable& sessions,
                              const PlacementView& view, Room room = Room::kEvict) const;

  // BeginTurn: the session's blocks below HBM move up in prefix order; in the session
  // modes idle sessions' blocks are demoted to make room when HBM is over its high
  // watermark, but only for blocks whose copies can land within the turn lead (what
  // arrives later is read from where it is anyway, and displacing others for it only
  // churns the tiers); blocks that still do not fit come up from NVMe to RAM when RAM
  // has room. A session larger than the room HBM can give it (under the high
  // watermark, with the idle blocks it may displace for blocks that land within the
  // lead) gets none of it there; its NVMe blocks may still come up to RAM. A block on
  // NVMe whose copy cannot land within the turn lead stays there: the Load reads it up
  // into RAM itself. Empty in kLru (request-scoped: nothing happens between requests).
  std::vector<Move> plan_turn_start(const Session& session, const SessionTable& sessions,
                                    const PlacementView& view) const;
  // The time from a session's BeginTurn to its Load, as engines show it: the average of
  // recent turns (exponentially weighted, 1/8 to the newest). Until one is observed
  // BeginTurn displaces without a bound.
  void observe_turn_lead(uint64_t lead_ms);
  std::optional<double> turn_lead_ms() const { return turn_lead_ms_; }
  // The session's blocks below HBM move up in prefix order while HBM stays under its
  // high watermark; nothing is displaced.
  std::vector<Move> plan_promotions(const Session& session, const PlacementView& view) const;

  // A snapshot of the return predictor at the clock's now.
  ReturnPredictor return_predictor(const SessionTable& sessions) const {
    return ReturnPredictor(sessions, clock_.now_ms());
  }
  // What a peer policy learns from (the stores and request paths report to it);
  // nullptr in kvtier's own modes, which read all they need from the PlacementView.
  BlockObserver* observer() const { return peer_.get(); }
  // Tells a peer policy its tier sizes (PeerPolicy::set_capacity) from the view. Every
  // plan does; the daemon also does once its tiers exist (and after a reload), so that
  // blocks saved before the first plan are judged against the real sizes, not admitted
  // as into a tier of unknown size.
  void tell_capacities(const PlacementView& view) const;
  // The last kRecentRecords summaries of planned moves, oldest first.
  const std::deque<PlanRecord>& recent_moves() const { return recent_; }

 private:
  std::vector<Move> record(std::vector<Move> moves) const;
  // LRU tiering and the peer policies: nothing happens between requests (no idle
  // demotion, nothing on BeginTurn).
  bool request_scoped() const {
    return config_.mode == PolicyMode::kLru || PeerPolicy::is_peer(config_.mode);
  }

  PlannerConfig config_;
  CostModel cost_;
  std::optional<double> turn_lead_ms_;
  const Clock& clock_;
  // Observability only: what recent plans decided. Kept here (mutable) so planning
  // stays a const operation on the state it reads.
  mutable std::deque<PlanRecord> recent_;
  // How far idle demotion has looked (planner_rules.h); reset by set_config.
  mutable std::unique_ptr<detail::IdleScan> idle_scan_;
  // The peer policy of a peer mode (its history of blocks); nullptr otherwise.
  std::unique_ptr<PeerPolicy> peer_;
  PolicyMode peer_mode_;
};

}  // namespace kvtier::policy
