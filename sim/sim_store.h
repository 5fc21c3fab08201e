// SimStore: the simulator's model of kvtierd's tiers — which block is where, tier
// usage, session references, and moves that take time. It is the PlacementView the
// real policy::Planner plans against, and it carries out the planner's moves the way
// the daemon's data path does:
//  * a promotion or demotion reserves room in the destination at once, keeps the
//    block readable (and unmovable) at its source while the copy runs, and lands
//    when the link between the two tiers has carried its bytes. The link of a pair
//    is the slower tier's (PCIe for HBM↔RAM, the drive for NVMe), one FIFO queue per
//    direction: PCIe is full duplex, and a drive reads while it writes;
//  * an eviction frees the block at once (and its NVMe copy).
// NVMe is inclusive below RAM, as in kvtierd (tiers/block_store.h), unless the store is
// made exclusive: a promotion out of NVMe keeps the block's NVMe slot as a copy, which
// counts toward NVMe use; a demotion onto that copy takes no link time and writes
// nothing; copies are reclaimed (oldest made first) whenever NVMe needs room for a
// block, and space(NVMe) leaves them out, as the daemon's planner view does. Reclaiming
// is immediate here (the daemon waits for the index delete: a write that found no room
// goes at the next plan).
// Loads into the engine are charged by the caller from read_tier() and do not occupy
// links (a simplification docs/policy.md states).
//
// Keys are the simulator's own: an 8-byte block hash holding a dense trace hash id
// (key_of()), so the store is an array indexed by that id, not a hash map — the
// planner looks placements up tens of thousands of times per plan.
//
// Thread-safety: none; one simulation owns one store.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <list>
#include <queue>
#include <vector>

#include "common/block_key.h"
#include "policy/block_events.h"
#include "policy/planner.h"

namespace kvtier::bench {

class SimStore final : public policy::PlacementView {
 public:
  // `capacity[t]`: bytes of tier t (0: not configured); `read_bytes_per_s[t]`: its
  // bandwidth; every block is `block_bytes`; hash ids run 0 .. distinct_ids - 1.
  // `inclusive_nvme` false: a promotion out of NVMe gives its slot up (the old design).
  SimStore(std::array<uint64_t, kLocalTierCount> capacity,
           std::array<double, kLocalTierCount> read_bytes_per_s, uint64_t block_bytes,
           uint64_t distinct_ids, bool inclusive_nvme = true);

  static BlockKey key_of(uint64_t hash_id);

  // ---- PlacementView ----
  BlockPlacement placement(const BlockKey& key) const override;
  // The same by the block's id (key_of's argument), without making its key.
  BlockPlacement placement_of(uint64_t id) const;
  // Starts fetching block `id`'s entry into the cache (a walk over many ids).
  void prefetch(uint64_t id) const {
    if (id < blocks_.size()) __builtin_prefetch(&blocks_[id]);
  }
  TierSpace space(Tier tier) const override;
  void for_each_in_tier(
      Tier tier,
      const std::function<void(const BlockKey&, const BlockPlacement&)>& fn) const override;

  // ---- the data path ----
  bool holds(const BlockKey& key) const { return find(key) != nullptr; }
  // The tier a load starting at `at_ms` reads from: the destination of a move that
  // has landed by then, else where the block is; kNone when absent.
  Tier read_tier(const BlockKey& key, uint64_t at_ms) const;
  // Stores a new block in the fastest configured tier with room, down to `lowest`;
  // returns that tier, or kNone when every such tier is full. (kvtierd's Saves land in
  // HBM or RAM: lowest = kRam.)
  Tier insert(const BlockKey& key, uint64_t now_ms, Tier lowest = Tier::kNvme);
  void touch(const BlockKey& key, uint64_t now_ms);
  // A pinned block is neither movable nor evictable: a Save's new blocks while the Save
  // is in progress, as kvtierd's reserved slots are invisible to its planner until the
  // Save's copy commits them.
  void set_pinned(const BlockKey& key, bool pinned);
  void add_ref(const BlockKey& key);
  void drop_ref(const BlockKey& key);
  // `given_back`: a block a parked Save wrote and gives back (kvtierd aborts the write):
  // it leaves without being a policy's sacrifice.
  bool evict(const BlockKey& key, bool given_back = false);
  // Starts a promotion/demotion at `now_ms`; false (nothing changes) when the block
  // is absent, busy, already there, or the destination has no room.
  bool begin_move(const BlockKey& key, Tier to, uint64_t now_ms);
  // A move that something waits for (room for a Save, a Load reading a block up): the
  // block is in `to` at once, and the link is busy for the copy's time as for
  // begin_move, so later moves queue behind it. False as for begin_move. (In kvtierd
  // the Save or Load waits for the copy; the simulator does not charge that wait.)
  bool move_now(const BlockKey& key, Tier to, uint64_t now_ms);
  // Blocks moving out of / into `tier` now (started, not landed).
  uint64_t moving_out_of(Tier tier) const { return moving_out_[index(tier)]; }
  uint64_t moving_into(Tier tier) const { return moving_in_[index(tier)]; }
  // Lands every move whose copy has finished by `now_ms`.
  void finish_moves(uint64_t now_ms);
  // When the link a move from `from` to `to` would use is free again (ms; at most
  // now when idle).
  double link_free_at_ms(Tier from, Tier to) const;
  // When the next move in flight lands (UINT64_MAX when none is).
  uint64_t next_landing_ms() const {
    return landings_.empty() ? UINT64_MAX : landings_.top().at_ms;
  }

  // `listener` (borrowed: it outlives the store) hears of every block entering and
  // leaving a tier, with why it left (policy/block_events.h), as the daemon's BlockStore
  // tells it: a peer policy learns its order from them.
  void subscribe(policy::BlockListener& listener) { listeners_.subscribe(listener); }

  uint64_t now_ms() const { return now_ms_; }
  void set_now(uint64_t now_ms) { now_ms_ = now_ms; }
  Tier slowest_tier() const;
  uint64_t block_bytes() const { return block_bytes_; }
  // Bytes written into NVMe (demotions and new blocks stored there; a demotion onto a
  // copy writes nothing), and bytes demoted onto copies.
  uint64_t nvme_written_bytes() const { return nvme_written_bytes_; }
  uint64_t demoted_onto_copy_bytes() const { return demoted_onto_copy_bytes_; }
  uint64_t nvme_copy_bytes() const { return copy_order_.size() * block_bytes_; }
  // Whether the block lives above NVMe with a copy there (a demotion to NVMe is free).
  bool has_nvme_copy(const BlockKey& key) const {
    const Block* block = find(key);
    return block != nullptr && block->nvme_copy;
  }

 private:
  struct Block {
    Tier tier = Tier::kNone;       // kNone: not held
    Tier moving_to = Tier::kNone;  // kNone unless a move is in flight
    uint32_t position = 0;         // in residents_[tier]
    uint64_t lands_at_ms = 0;
    uint64_t last_access_ms = 0;
    uint32_t session_refs = 0;
    bool nvme_copy = false;                 // holds a copy in NVMe (lives above it)
    bool pinned = false;                    // a Save in progress is writing it
    std::list<uint32_t>::iterator copy_at;  // in copy_order_, when nvme_copy
  };
  struct Landing {
    uint64_t at_ms;
    uint64_t sequence;  // FIFO among equal times: deterministic
    uint64_t id;
    bool operator>(const Landing& other) const {
      return at_ms != other.at_ms ? at_ms > other.at_ms : sequence > other.sequence;
    }
  };
  static size_t index(Tier tier) { return static_cast<size_t>(tier); }
  static uint64_t id_of(const BlockKey& key);
  Block* find(const BlockKey& key);
  const Block* find(const BlockKey& key) const;
  BlockPlacement to_placement(const Block& block) const;
  size_t link_of(Tier a, Tier b) const;
  void place(uint64_t id, Tier tier);
  // `to`: where it goes (kNone: evicted, or given back when `given_back`).
  void unplace(uint64_t id, Tier to, bool given_back = false);
  void land(uint64_t id, Tier to);  // a move ends: the block is in `to`
  // Whether `tier` has room for one more block, reclaiming NVMe copies if need be.
  bool make_room(Tier tier);
  void add_copy(uint64_t id);
  void drop_copy(uint64_t id);  // frees its NVMe room

  std::array<uint64_t, kLocalTierCount> capacity_;
  std::array<uint64_t, kLocalTierCount> used_{};
  std::array<double, kLocalTierCount> read_bytes_per_s_;
  // [tier][0: toward faster tiers, 1: toward slower]: when that queue drains.
  std::array<std::array<double, 2>, kLocalTierCount> link_free_at_ms_{};
  uint64_t block_bytes_;
  uint64_t now_ms_ = 0;
  uint64_t sequence_ = 0;
  std::vector<Block> blocks_;                                     // indexed by trace hash id
  std::array<std::vector<uint32_t>, kLocalTierCount> residents_;  // ids held in each tier
  std::priority_queue<Landing, std::vector<Landing>, std::greater<>> landings_;
  std::array<uint64_t, kLocalTierCount> moving_out_{};
  std::array<uint64_t, kLocalTierCount> moving_in_{};
  bool inclusive_nvme_;
  policy::BlockListeners listeners_;
  std::list<uint32_t> copy_order_;  // ids with an NVMe copy, oldest made first
  uint64_t nvme_written_bytes_ = 0;
  uint64_t demoted_onto_copy_bytes_ = 0;
};

}  // namespace kvtier::bench
