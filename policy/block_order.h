// Internal to the planner (not part of policy's interface): what one planning call
// reads (PlanContext) and the order in which each policy gives blocks up
// (sacrifice_order).
//
// A plan must cost what it moves and what the tiers it relieves hold, never what the
// daemon holds in total: blocks are enumerated per tier (PlacementView), and what a
// block's holders say about it (in a turn, durable, how recently active, how deep in
// their prefixes) is kept per block by the SessionTable (BlockHolders), not gathered
// by walking every session.
//
// Thread-safety: none; values local to one planning call.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>
#include <vector>

#include "policy/plan_state.h"
#include "policy/planner.h"
#include "policy/return_predictor.h"

namespace kvtier::policy::detail {

class PlanContext {
 public:
  PlanContext(const PlannerConfig& config, const CostModel& cost, const SessionTable& sessions,
              const PlacementView& view, uint64_t now_ms, PeerPolicy* peer = nullptr)
      : config(config), cost(cost), sessions(sessions), view(view), now_ms(now_ms), peer(peer) {}

  const PlannerConfig& config;
  const CostModel& cost;
  const SessionTable& sessions;
  const PlacementView& view;
  const uint64_t now_ms;
  PeerPolicy* const peer;  // a peer mode's order of sacrifice (peer_policy.h)

  bool predictive() const { return config.mode == PolicyMode::kPredictive; }
  // Built on first use, then kept for the rest of the call.
  const ReturnPredictor& predictor();

  // Whether `session` is idle, not durable, and idle for at least `tier`'s idle
  // threshold.
  bool idle_for_threshold(const Session& session, Tier tier) const;
  // The same, and (kPredictive, once the predictor has seen returns) not predicted back
  // within the threshold with probability >= imminent_probability.
  bool past_threshold(const Session& session, Tier tier);
  // Whether some holder of the block is not past `tier`'s threshold (in a turn,
  // durable, recently active, or predicted back): then the block stays in `tier`.
  // Judged once per block per call.
  bool wanted(const BlockKey& key, const BlockHolders& holders, Tier tier);
  // kPredictive: Σ over the block's holders of P(return within `horizon`'s threshold)
  // (an engine-facing tier) or P(return at all) (kNone: leaving the daemon), so shared
  // prefixes are worth more. Blocks held by more than kValueSample sessions are valued
  // from a sample of them, scaled.
  // For leaving the daemon (horizon kNone) a block some session holds is worth at
  // least its own chance of being used again (block_reuse.h): a new conversation may
  // open with it. (One no session holds may be the tail of a prefix that is gone.)
  static constexpr uint32_t kValueSample = 64;
  // `with_dependents`: for leaving the daemon, each holder's term counts the blocks
  // after this one in its prefix too — they cannot be loaded without it.
  double value(const BlockKey& key, const BlockHolders* holders, Tier horizon,
               bool with_dependents = false);

  // Cost at the next turn of a block in `tier`: its reload time, or its recompute
  // time when `tier` is kNone (or reloading would be slower).
  double next_turn_ms(Tier tier, const BlockKey& key, uint64_t bytes) const;
  // Where a block leaving `tier` goes: the next tier down, or kNone (evict) when
  // there is none or, under kPredictive, reloading from there would be slower than
  // recomputing ("drop instead of demote").
  Tier destination_below(const PlanState& plan, Tier tier, const BlockKey& key,
                         uint64_t bytes) const;

 private:
  double probability(const Session& session, Tier horizon);

  std::optional<ReturnPredictor> predictor_;
  // probability() per session, by horizon (index: the tier, kTierCount for kNone); -1:
  // not asked yet.
  std::unordered_map<const Session*, std::array<double, kTierCount + 1>> probabilities_;
  std::unordered_map<BlockKey, uint8_t, BlockKeyHasher> wanted_;  // bit t: judged, bit 4+t: wanted
};

// A movable block in a tier, with its holders (nullptr when no session holds it).
struct Candidate {
  BlockKey key;
  Placement placement;
  const BlockHolders* holders = nullptr;
  uint32_t depth() const { return holders == nullptr ? 0 : holders->depth; }
  // Its retention priority (a block no session holds has the default).
  uint8_t priority() const { return holders == nullptr ? kDefaultPriority : holders->priority(); }
  // Held by a session in a turn or kept above the default: such blocks go after every
  // other in the session modes, whatever their priority (then by it).
  bool kept() const {
    return holders != nullptr && (holders->active > 0 || priority() > kDefaultPriority);
  }
};

enum class Sacrifice { kDemote, kEvict };

// Candidates in an order of sacrifice, sorted only as far as they are read: a pass
// that gives up a few blocks of a large tier sorts a few chunks (nth_element, then a
// sort of the chunk), not the tier. Every order is total (ties end on the key), so
// the blocks come in exactly the order a whole sort gives. Read once, front to back;
// its iterators point at it, so it is not moved while read. It holds the candidates and
// their sort keys until the pass ends: the peak is what the whole sort held.
class SacrificeOrder {
 public:
  // Sorts the next blocks: appends to `order` the indices into `blocks` of those
  // that come next, until `order` holds at least `upto` (or every block).
  using Sorter = std::function<void(const std::vector<Candidate>& blocks,
                                    std::vector<uint32_t>& order, size_t upto)>;

  // Already in order.
  explicit SacrificeOrder(std::vector<Candidate> blocks);
  SacrificeOrder(std::vector<Candidate> blocks, Sorter sorter);

  class Iterator {
   public:
    Iterator(SacrificeOrder* order, size_t at) : order_(order), at_(at) {}
    const Candidate& operator*() const { return order_->at(at_); }
    Iterator& operator++() {
      ++at_;
      return *this;
    }
    bool operator!=(const Iterator& other) const { return at_ != other.at_; }

   private:
    SacrificeOrder* order_;
    size_t at_;
  };
  Iterator begin() { return {this, 0}; }
  Iterator end() { return {this, blocks_.size()}; }
  size_t size() const { return blocks_.size(); }

  // Every block, in order (sorting the rest).
  std::vector<Candidate> take_all() &&;

 private:
  const Candidate& at(size_t i);

  std::vector<Candidate> blocks_;  // as gathered (or in order, without a sorter)
  std::vector<uint32_t> order_;    // the sorted front: indices into blocks_
  Sorter sorter_;                  // empty: blocks_ is in order
};

// Sorts `keys` on demand (a SacrificeOrder::Sorter) by less(blocks, a, b), which must
// be a total order for the chunks to come as one sort would give them; Key::at is the
// block's index in `blocks`.
template <class Key, class Less>
SacrificeOrder::Sorter sort_on_demand(std::vector<Key> keys, Less less) {
  return [keys = std::move(keys), less](const std::vector<Candidate>& blocks,
                                        std::vector<uint32_t>& order, size_t upto) mutable {
    auto before = [&](const Key& a, const Key& b) { return less(blocks, a, b); };
    // keys[0, order.size()) is the sorted front, read already.
    const auto from = keys.begin() + static_cast<ptrdiff_t>(order.size());
    const auto to = keys.begin() + static_cast<ptrdiff_t>(upto);
    if (to != keys.end()) std::nth_element(from, to, keys.end(), before);
    std::sort(from, to, before);
    for (auto it = from; it != to; ++it) order.push_back(it->at);
  };
}

// Movable blocks now in `tier`, in the order the configured policy gives them up:
// lowest retention priority first in every mode (session_table.h) — in the session
// modes the blocks of sessions in a turn and those kept above the default go after
// every other, whatever their priority (then by it) — and among blocks of one
// priority:
//  kLru: least recently used first (blocks used together: deepest in the prefix first);
//  kSessionAware: idle sessions' blocks (least recently active holder first, tail
//    first), blocks no session holds (LRU), active sessions'; a shared block goes with
//    its most recently active holder. For kEvict the blocks no session holds go first;
//  kPredictive: active last; otherwise least loss first, where loss =
//    value × (next-turn cost after the move − cost now) per byte; among equal losses
//    the least recently active holder's first, each session's tail first (a block is
//    worth nothing without those before it).
// With quotas in `tier` (PlacementView::quota_standing), that order is interleaved
// across namespaces: the namespace furthest above its quota gives its next block first,
// so a namespace within its quota keeps its blocks while another stands further above.
// Gathering is O(b) for the b blocks in `tier`; sorting, O(b + k log k) per chunk
// read of k blocks (LRU tiering, the peers' and predictive's orders; the session-aware
// order and quotas sort the tier, O(b log b)).
SacrificeOrder sacrifice_order(PlanContext& ctx, const PlanState& plan, Tier tier, Sacrifice kind);

}  // namespace kvtier::policy::detail
