// Planner: turns the state of sessions and tiers into moves (demote, promote, evict).
// It decides *what* to move; the daemon carries moves out through the tiers. Pure
// logic on an injected clock: no I/O, no threads, so the trace simulator runs the same
// code as the daemon.
//
// Rules implemented here (the core set; the session-aware policy extends them):
//  * Watermark demotion: when HBM use exceeds high_watermark × capacity, demote
//    HBM → RAM until it is at or below low_watermark × capacity: idle sessions' blocks
//    first (least recently active session first, each session's tail first), then
//    blocks no session references (least recently used first), then active sessions'.
//    A block shared by several sessions goes with its most recently active holder.
//  * Idle demotion: a session idle for longer than hbm_idle_ms has its HBM blocks
//    demoted to RAM while RAM has room.
//  * Eviction for room: make_room() picks unpinned blocks to drop from the slowest
//    tier (blocks no session holds first, LRU; then the least recently active
//    sessions' blocks) so that a new block of `bytes` fits.
//  * Promotion: on BeginTurn the session's blocks below HBM move up while HBM stays
//    under its high watermark.
//
// Thread-safety: none; owned by the control thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "common/block_key.h"
#include "policy/session_table.h"

namespace kvtier::policy {

struct PlannerConfig {
  double hbm_high_watermark = 0.90;  // fraction of HBM capacity that triggers demotion
  double hbm_low_watermark = 0.75;   // demote down to this fraction
  uint64_t hbm_idle_ms = 30'000;     // idle sessions leave HBM after this long
};

enum class MoveKind : uint8_t { kDemote, kPromote, kEvict };

struct Move {
  MoveKind kind;
  BlockKey block;
  Tier from;
  Tier to;  // kNone for kEvict
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
  };
  virtual TierSpace space(Tier tier) const = 0;
  // Visible blocks in `tier` that no session references, with their placements.
  virtual void for_each_unreferenced(
      Tier tier, const std::function<void(const BlockKey&, const BlockPlacement&)>& fn) const = 0;
};

class Planner {
 public:
  Planner(PlannerConfig config, const Clock& clock) : config_(config), clock_(clock) {}

  const PlannerConfig& config() const { return config_; }
  void set_config(const PlannerConfig& config) { config_ = config; }

  // Periodic and after-save planning: watermark and idle demotions.
  std::vector<Move> plan_demotions(const SessionTable& sessions, const PlacementView& view) const;

  // Blocks to evict from `tier` so that `bytes` more fit; empty when nothing may go
  // (all pinned) — the caller then reports ResourceExhausted.
  std::vector<Move> make_room(Tier tier, uint64_t bytes, const SessionTable& sessions,
                              const PlacementView& view) const;

  // Promotions for a session whose turn is starting.
  std::vector<Move> plan_promotions(const Session& session, const PlacementView& view) const;

 private:
  PlannerConfig config_;
  const Clock& clock_;
};

}  // namespace kvtier::policy
