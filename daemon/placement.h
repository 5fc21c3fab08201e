// Placement: where blocks go when the daemon decides — room for a new block (a Save's,
// or a block read up from NVMe or the remote tier), and the planner's runs (periodic,
// and after Saves). The plans are policy/planner.h's; this part applies them through the
// executor (tiers/move_executor.h), which also frees the slots blocks leave. It uses no
// other part: what follows a plan (NVMe copies, session records, the remote write-behind,
// parked Saves) subscribes with after_each_plan.
//
// Thread-safety: control thread only (daemon_context.h).
#pragma once

#include <boost/asio/steady_timer.hpp>

#include <array>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "daemon/daemon_context.h"

namespace kvtier::daemon {

// The planner's window on `store`: blocks' tiers and movability, each tier's room
// counting `leaving_bytes(tier)` (bytes on their way out) as free, and where each
// namespace stands against its quota (`quota_standing`; below).
std::unique_ptr<policy::PlacementView> make_placement_view(
    const BlockStore& store, std::function<uint64_t(Tier)> leaving_bytes,
    std::function<std::vector<policy::PlacementView::QuotaStanding>(Tier)> quota_standing);

// Each tenant (namespace) holding blocks: its bytes per local tier and its quota there
// (tenant-quota; nullopt: none), sorted by name.
struct TenantUsage {
  std::string tenant;
  uint32_t namespace_id = 0;
  BlockStore::NamespaceBytes used_bytes{};
  std::array<std::optional<uint64_t>, kLocalTierCount> quota_bytes{};
};
std::vector<TenantUsage> tenant_usage(const DaemonContext& ctx) KVTIER_REQUIRES(control_thread);
// Each namespace holding blocks in `tier` with a quota there: its bytes above the quota
// (below: negative). Empty without quotas.
std::vector<policy::PlacementView::QuotaStanding> quota_standing(const DaemonContext& ctx,
                                                                 Tier tier)
    KVTIER_REQUIRES(control_thread);

class Placement final : public Part {
 public:
  Placement(DaemonContext& ctx, Replies& replies) : Part(ctx, replies), plan_timer_(ctx.io) {}

  // `then` runs after every plan's moves were handed to the executor, in the order
  // subscribed.
  void after_each_plan(std::function<void()> then) KVTIER_REQUIRES(control_thread) {
    after_each_plan_.push_back(std::move(then));
  }

  // Reserves a slot for a new block, evicting cold blocks if every tier is full: room
  // for `room_bytes` (the rest of the request) at once when it can be had.
  Result<std::optional<PendingWrite>> reserve_block(const BlockKey& key, uint64_t block_bytes,
                                                    int gpu_part, uint64_t room_bytes)
      KVTIER_REQUIRES(control_thread);
  // Room in RAM for `wanted_bytes` (at least `least_bytes`) by moving its coldest blocks
  // down to NVMe instead of evicting them (`rule`: whether a full NVMe evicts its own
  // coldest to take them): `moves` to apply, or `coming` when blocks already on their
  // way out make enough, or none can go now but blocks are arriving in RAM. Neither when
  // there is no NVMe tier, `tier` is not RAM, NVMe writes are paused after a failure or NVMe is
  // degraded, or NVMe cannot take them (the caller then evicts).
  struct DemotionRoom {
    bool coming = false;
    std::vector<policy::Move> moves;
  };
  DemotionRoom plan_room_by_demotion(Tier tier, uint64_t wanted_bytes, uint64_t least_bytes,
                                     policy::Room rule) KVTIER_REQUIRES(control_thread);
  // Room in the tiers above RAM by sending their blocks past it to NVMe (RAM holds only
  // blocks that cannot move now); none without a durable tier below RAM taking writes.
  DemotionRoom plan_room_past_landing(uint64_t wanted_bytes, uint64_t least_bytes)
      KVTIER_REQUIRES(control_thread);
  // Room in `tier` for `bytes` coming into it (a block read up into RAM, blocks written
  // into a full NVMe): RAM's coldest go down to NVMe as for a Save, and the room comes
  // when they land (empty: it is coming already); where nothing can go down, the
  // planner's evictions. The executor's room_by_demotion hook.
  std::vector<policy::Move> room_by_demotion(Tier tier, uint64_t bytes)
      KVTIER_REQUIRES(control_thread);
  // Plans and applies the moves; a periodic plan also arms the next one.
  void run_planner(policy::Planner::PlanKind kind) KVTIER_REQUIRES(control_thread);
  // Runs the planner once the current handlers are done (coalesces post-Save plans).
  void plan_soon() KVTIER_REQUIRES(control_thread);
  // No more plans (stop, a lost device).
  void stop() KVTIER_REQUIRES(control_thread) { plan_timer_.cancel(); }
  // The executor reports blocks that left the store (evicted, or lost: their bytes
  // were bad): the sessions holding them are cut there.
  void on_blocks_removed(const std::vector<BlockKey>& keys, bool lost)
      KVTIER_REQUIRES(control_thread);

 private:
  // Blocks are on their way out of a tier a Save lands in (or NVMe slots on their way
  // back): room comes without more moves.
  bool room_on_its_way() const KVTIER_REQUIRES(control_thread);
  // Some block in a tier a Save lands in cannot move now (being copied, read, written
  // or pinned by a request in flight): room may come when it is done.
  bool busy_blocks_in_save_tiers() const KVTIER_REQUIRES(control_thread);
  // "HBM is full (8 blocks: 6 held by sessions, 2 being copied...); RAM is full (...)".
  std::string describe_save_tiers() const KVTIER_REQUIRES(control_thread);

  asio::steady_timer plan_timer_ KVTIER_GUARDED_BY(control_thread);
  bool plan_posted_ KVTIER_GUARDED_BY(control_thread) = false;  // plan_soon() has a run queued
  std::vector<std::function<void()>> after_each_plan_ KVTIER_GUARDED_BY(control_thread);
};

}  // namespace kvtier::daemon
