// The cache policies other KV-cache stores ship, as orders of sacrifice kvtierd's
// planner can run (PlannerConfig::mode; `policy = s3fifo | slru | arc | tinylfu-lru |
// w-tinylfu | workload` in kvtierd.toml), so that `kvtier-bench sim` compares kvtier's
// own policies with them on the same tiers, links and TTFT model:
//  * kS3Fifo — S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction",
//    SOSP 2023), the parameters of its reference implementation (libCacheSim): a small
//    FIFO of 10 % of the tier, a main FIFO with a 2-bit clock (a use adds one, up to 3;
//    passing the tail with a count above 0 reinserts the block with one less), and a
//    ghost FIFO of 90 % of the tier's blocks. A new block enters the small FIFO, one
//    found in the ghost enters main; a block at the small FIFO's tail moves to main when
//    it was used there, else it goes (its key to the ghost).
//  * kSlru — segmented LRU (Karedla, Love and Wherry, IEEE Computer 1994) with the
//    protected segment at 80 % of the tier (as Caffeine's main space): a new block is on
//    probation; a use there protects it; a protected segment over its share moves its
//    least recent block back to probation. Probation's LRU end goes first.
//  * kArc — ARC (Megiddo and Modha, FAST 2003): T1 (seen once) and T2 (seen again),
//    ghosts B1 and B2, and the target p for T1 that a ghost hit moves (B1: up by
//    max(|B2|/|B1|, 1); B2: down by max(|B1|/|B2|, 1)). REPLACE takes T1's LRU end while
//    |T1| > p, else T2's.
//  * kTinyLfuLru — TinyLFU admission (Einziger, Friedman and Manes, ACM TOS 2017) in
//    front of LRU: a count-min sketch of 4-bit counters (4 rows) counts every request
//    for a block, halved after 10 × the tiers' blocks (the paper's sample size W). A
//    block new to a tier is judged at its first eviction there: it stays only if the
//    sketch counts it more often than the LRU block it would displace, which goes
//    instead; else it goes itself.
//  * kWTinyLfu — W-TinyLFU, Caffeine's design (the same paper, section 5): a window LRU
//    of 1 % of the tier in front of a segmented LRU main space (protected 80 % of it),
//    and TinyLFU admission (the sketch above) between them: a block pushed out of the
//    window is a candidate that enters main's probation only if the sketch counts it
//    more often than the block main would give up (probation's LRU end, then
//    protected's); the loser goes.
//  * kWorkloadAware — in the spirit of "KVCache Cache in the Wild" (Wang et al., USENIX
//    ATC 2025): reuse probability by request category and turn, learned from the
//    requests as they come. A block's category is its turn (how many Saves named it:
//    1, 2, 3, 4+) and its depth in the request (positions 0–3, 4–15, 16–63, 64+: system
//    prompts and documents lead, conversation tails follow). Per category it learns the
//    share of blocks used again and the mean time to that reuse (an exponential, as the
//    paper fits), counting a reuse after eviction too (a ghost of the keys that left);
//    a block's value is P(used within the tier's horizon | not used for its age): the
//    tier's idle threshold in HBM and RAM, at all for the slowest tier. Least value
//    goes first; among equal values the deeper block.
// Each runs once per tier: a block leaving a tier (demoted or evicted) leaves that
// tier's queues; a block landing in a tier enters them (a demotion into the tier below
// is a new block there). Every other rule is LRU tiering's (kLru): watermarks, room for
// Saves, lowest retention priority first, no idle demotion, nothing on BeginTurn.
//
// They learn from what happens to blocks: each subscribes to its store's block events
// (policy/block_events.h: the daemon's BlockStore and the simulator's store tell of
// blocks entering and leaving tiers), and the Save and Load paths tell it of requests
// (BlockObserver).
//
// Thread-safety: none; owned by the planner, on the control thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/block_key.h"
#include "policy/block_events.h"

namespace kvtier::policy {

enum class PolicyMode : uint8_t;
struct PlannerConfig;

// What a policy that learns from blocks' history hears: the store's block events
// (BlockListener, from the store it subscribes to) and the requests (from the Save and
// Load paths).
class BlockObserver : public BlockListener {
 public:
  // A Save named it at `position` in its prefix (stored now or already held).
  virtual void block_saved(const BlockKey& key, uint32_t position, uint64_t now_ms) = 0;
  // A Load read it (a hit) at `position`.
  virtual void block_loaded(const BlockKey& key, uint32_t position, uint64_t now_ms) = 0;
};

// A block's place in a peer policy's order of sacrifice, compared lexicographically:
// the lesser `major` goes first, then the deeper block (a request's tail first), then
// the lesser `minor`. Each policy fills in what its order needs (PerTierPolicy: the
// place of the request's first block, the block's own place; WorkloadAware: the value,
// the block's index) so that the planner sorts blocks by it without the policy sorting
// them too.
struct PeerRank {
  double major = 0;
  uint32_t depth = 0;
  double minor = 0;

  friend bool operator<(const PeerRank& a, const PeerRank& b) {
    if (a.major != b.major) return a.major < b.major;
    if (a.depth != b.depth) return a.depth > b.depth;
    return a.minor < b.minor;
  }
};

class PeerPolicy : public BlockObserver {
 public:
  // nullptr for the modes that are not peer policies.
  static std::unique_ptr<PeerPolicy> make(PolicyMode mode, const PlannerConfig& config);
  static bool is_peer(PolicyMode mode);

  // The tier's size for the policy: the bytes it holds at its low watermark, where a
  // demotion leaves it (a block entering past it is one that will make another go).
  // The planner tells it at every plan; in blocks, it is that over the block size the
  // policy has seen. Until then a tier's size is unknown (TinyLFU admits every block).
  virtual void set_capacity(Tier tier, uint64_t bytes) = 0;
  // Ranks `keys`, blocks now in `tier`: ranks[i] is keys[i]'s place in the order of
  // sacrifice (PeerRank: the lesser goes first; distinct keys never rank equal). A key
  // the policy has not seen ranks after the rest. `leaves_daemon`: `tier` is the
  // slowest, what goes leaves the daemon. The keys are not sorted here: the planner
  // sorts as far as a pass reads (block_order.h).
  virtual void rank(Tier tier, bool leaves_daemon, const std::vector<BlockKey>& keys,
                    uint64_t now_ms, std::vector<PeerRank>& ranks) = 0;
};

}  // namespace kvtier::policy
