// The simulator's offline optimum: a clairvoyant placement that knows every future
// request of the trace. It is a bound to measure policies against, not a product.
//
// It runs on the same SimStore (tiers, budgets, links, move times) and the same TTFT
// model as the real policies; only the decisions differ. Belady's rule, extended to a
// hierarchy of tiers:
//  * a block's worth is its next use (the arrival of the next request that loads it);
//  * the blocks needed soonest belong in the fastest tiers: at every rebalance the held
//    blocks are ranked by next use and given HBM, then RAM, then NVMe by capacity; a
//    block out of place is demoted (farthest next use first) or promoted (soonest
//    first), each move queued on its link only while the link's backlog is under the
//    horizon, so prefetches are limited by bandwidth as the planner's are; a demotion
//    onto the block's NVMe copy (free: no write, no link time) waits until a move needs
//    its room;
//  * a block never used again is dropped at once; a new block that finds every tier
//    full takes the place of the block with the farthest next use, or is not stored
//    when its own next use is farther still.
//
// It is not provably optimal once moves take time and prefixes must be contiguous
// (a block is useful only after the blocks before it), but it knows the future, which
// no online policy does; the gap to it is what knowing more could buy.
//
// Thread-safety: none; one simulation owns one.
#pragma once

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "sim/sim_store.h"
#include "sim/sim_trace.h"

namespace kvtier::bench {

class Clairvoyant {
 public:
  struct Stats {
    uint64_t bytes_promoted = 0;
    uint64_t bytes_demoted = 0;
    uint64_t blocks_evicted = 0;
  };

  Clairvoyant(const Trace& trace, SimStore& store);

  // Request `request` has loaded its prefix: its blocks' next uses move past it, and
  // those never used again are dropped.
  void on_served(size_t request);
  // Stores block `id` (not held) at the end of a turn; false when it is not worth a
  // place (never used again, or every tier is full of blocks needed sooner).
  bool store(uint64_t id, uint64_t now_ms);
  // Moves held blocks toward the tiers their next uses earn, within `horizon_ms` of
  // backlog per link.
  void rebalance(uint64_t now_ms, uint64_t horizon_ms);
  // Whether the last rebalance left moves it wanted undone (no room until moves land,
  // or links busy): then a landing is worth another rebalance.
  bool waiting() const { return waiting_; }

  const Stats& stats() const { return stats_; }

 private:
  static constexpr uint64_t kNever = UINT64_MAX;

  uint64_t next_use(uint64_t id) const;
  void track(uint64_t id) {
    ranked_.insert({next_use(id), static_cast<uint32_t>(id)});
    walk_stale_ = true;
  }
  void untrack(uint64_t id) {
    ranked_.erase({next_use(id), static_cast<uint32_t>(id)});
    walk_stale_ = true;
  }
  bool evict(uint64_t id);

  const Trace& trace_;
  SimStore& store_;
  std::vector<std::vector<uint32_t>> uses_;  // per block id: the requests that load it
  std::vector<uint32_t> cursor_;             // per block id: its first use not yet past
  std::vector<uint8_t> held_;
  std::set<std::pair<uint64_t, uint32_t>> ranked_;  // held blocks by (next use, id)
  // ranked_ as an array for rebalance's walk over every held block, made again only when
  // ranked_ changed since: the rebalances that landings bring between requests walk the
  // same order, and an array walks several times faster than the tree.
  std::vector<std::pair<uint64_t, uint32_t>> walk_;
  bool walk_stale_ = true;
  Stats stats_;
  bool waiting_ = false;
};

}  // namespace kvtier::bench
