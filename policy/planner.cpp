#include "policy/planner.h"

#include <map>
#include <tuple>

#include "policy/block_order.h"
#include "policy/plan_state.h"
#include "policy/planner_rules.h"

namespace kvtier::policy {

std::string_view policy_mode_name(PolicyMode mode) {
  switch (mode) {
    case PolicyMode::kLru:
      return "lru";
    case PolicyMode::kSessionAware:
      return "session";
    case PolicyMode::kPredictive:
      return "predictive";
    case PolicyMode::kS3Fifo:
      return "s3fifo";
    case PolicyMode::kSlru:
      return "slru";
    case PolicyMode::kArc:
      return "arc";
    case PolicyMode::kTinyLfuLru:
      return "tinylfu-lru";
    case PolicyMode::kWorkloadAware:
      return "workload";
    case PolicyMode::kWTinyLfu:
      return "w-tinylfu";
  }
  return "unknown";
}

std::optional<PolicyMode> parse_policy_mode(std::string_view name) {
  for (PolicyMode mode :
       {PolicyMode::kLru, PolicyMode::kSessionAware, PolicyMode::kPredictive, PolicyMode::kS3Fifo,
        PolicyMode::kSlru, PolicyMode::kArc, PolicyMode::kTinyLfuLru, PolicyMode::kWorkloadAware,
        PolicyMode::kWTinyLfu}) {
    if (policy_mode_name(mode) == name) return mode;
  }
  return std::nullopt;
}

std::string_view move_reason_name(MoveReason reason) {
  switch (reason) {
    case MoveReason::kUnspecified:
      return "unspecified";
    case MoveReason::kIdle:
      return "idle";
    case MoveReason::kWatermark:
      return "watermark";
    case MoveReason::kMakeRoom:
      return "make-room";
    case MoveReason::kRecomputeCheaper:
      return "recompute-cheaper";
    case MoveReason::kTurnStart:
      return "turn-start";
    case MoveReason::kPredictedReturn:
      return "predicted-return";
  }
  return "unknown";
}

Planner::Planner(PlannerConfig config, const Clock& clock)
    : config_(config),
      cost_(config.cost),
      clock_(clock),
      idle_scan_(std::make_unique<detail::IdleScan>()),
      peer_(PeerPolicy::make(config.mode, config)),
      peer_mode_(config.mode) {}

Planner::~Planner() = default;

void Planner::set_config(const PlannerConfig& config) {
  config_ = config;
  cost_.set_config(config.cost);
  *idle_scan_ = detail::IdleScan{};  // thresholds may have changed: look at every session again
  // A peer policy's history stays while its mode does (a reload keeps what it learned).
  if (config.mode != peer_mode_) peer_ = PeerPolicy::make(config.mode, config);
  peer_mode_ = config.mode;
}

std::vector<Move> Planner::plan_demotions(const SessionTable& sessions, const PlacementView& view,
                                          PlanKind kind) const {
  tell_capacities(view);
  detail::PlanContext ctx(config_, cost_, sessions, view, clock_.now_ms(), peer_.get());
  detail::PlanState plan(view);
  if (!request_scoped()) detail::demote_idle_sessions(ctx, plan, *idle_scan_);
  detail::relieve_pressure(ctx, plan);
  if (config_.mode == PolicyMode::kPredictive && kind == PlanKind::kPeriodic) {
    detail::prefetch_predicted_returns(ctx, plan);
  }
  return record(plan.take_moves());
}

void Planner::revisit(const SessionTable& sessions, const BlockKey& key) const {
  detail::revisit_holders(sessions, key, clock_.now_ms(), *idle_scan_);
}

std::vector<Move> Planner::make_room(Tier tier, uint64_t bytes, const SessionTable& sessions,
                                     const PlacementView& view, Room room) const {
  tell_capacities(view);
  detail::PlanContext ctx(config_, cost_, sessions, view, clock_.now_ms(), peer_.get());
  return record(detail::room_for(ctx, tier, bytes, room));
}

void Planner::observe_turn_lead(uint64_t lead_ms) {
  const double lead = static_cast<double>(lead_ms);
  turn_lead_ms_ = turn_lead_ms_ ? *turn_lead_ms_ + (lead - *turn_lead_ms_) / 8 : lead;
}

std::vector<Move> Planner::plan_turn_start(const Session& session, const SessionTable& sessions,
                                           const PlacementView& view) const {
  if (request_scoped()) return {};
  detail::PlanContext ctx(config_, cost_, sessions, view, clock_.now_ms(), peer_.get());
  return record(detail::turn_start(ctx, session, turn_lead_ms_));
}

std::vector<Move> Planner::plan_promotions(const Session& session,
                                           const PlacementView& view) const {
  const PlacementView::TierSpace hbm = view.space(Tier::kHbm);
  if (hbm.capacity_bytes == 0) return {};
  const uint64_t limit = detail::fraction_of(config_.hbm_high_watermark, hbm.capacity_bytes);
  uint64_t used = hbm.used_bytes;
  std::vector<Move> moves;
  for (const BlockHash& hash : session.blocks) {
    BlockKey key{session.layout, hash};
    const PlacementView::BlockPlacement placement = view.placement(key);
    if (placement.tier != Tier::kRam && placement.tier != Tier::kNvme) continue;
    if (!placement.movable) continue;  // busy (e.g. already moving): not ours to plan
    // Stop at the first block that does not fit: a later block without the ones before
    // it does not lengthen the prefix the engine can load from HBM.
    if (!detail::fits(used, placement.bytes, limit)) break;
    moves.push_back(Move{MoveKind::kPromote, key, placement.tier, Tier::kHbm,
                         MoveReason::kTurnStart, placement.bytes});
    used += placement.bytes;
  }
  return record(std::move(moves));
}

void Planner::tell_capacities(const PlacementView& view) const {
  if (peer_ == nullptr) return;
  for (Tier t : {Tier::kHbm, Tier::kRam, Tier::kNvme}) {
    peer_->set_capacity(t, detail::fraction_of(detail::watermarks_of(config_, t).low,
                                               view.space(t).capacity_bytes));
  }
}

std::vector<Move> Planner::record(std::vector<Move> moves) const {
  if (moves.empty()) return moves;
  // One record per (kind, from, to, reason), in the order first seen.
  std::map<std::tuple<MoveKind, Tier, Tier, MoveReason>, size_t> index;
  std::vector<PlanRecord> records;
  const uint64_t now = clock_.now_ms();
  for (const Move& move : moves) {
    auto [it, inserted] = index.try_emplace(
        std::make_tuple(move.kind, move.from, move.to, move.reason), records.size());
    if (inserted) records.push_back(PlanRecord{now, move.kind, move.from, move.to, move.reason});
    records[it->second].blocks += 1;
    records[it->second].bytes += move.bytes;
  }
  for (PlanRecord& r : records) {
    recent_.push_back(r);
    if (recent_.size() > kRecentRecords) recent_.pop_front();
  }
  return moves;
}

}  // namespace kvtier::policy
