#include "policy/block_order.h"

#include <algorithm>
#include <queue>
#include <tuple>

namespace kvtier::policy::detail {
namespace {

// Least recently used first; blocks used at the same time (one request's) tail first;
// then by key, so that the order is total. On the fields, for orders that gather them.
bool lru_less(uint64_t a_access_ms, uint32_t a_depth, const BlockKey& a_key, uint64_t b_access_ms,
              uint32_t b_depth, const BlockKey& b_key) {
  if (a_access_ms != b_access_ms) return a_access_ms < b_access_ms;
  if (a_depth != b_depth) return a_depth > b_depth;
  return key_less(a_key, b_key);
}

bool lru_less(const Candidate& a, const Candidate& b) {
  return lru_less(a.placement.last_access_ms, a.depth(), a.key, b.placement.last_access_ms,
                  b.depth(), b.key);
}

std::vector<Candidate> movable_in_tier(const PlanContext& ctx, Tier tier) {
  std::vector<Candidate> out;
  ctx.view.for_each_in_tier(tier, [&](const BlockKey& key, const Placement& placement) {
    if (!placement.movable || placement.tier != tier) return;
    out.push_back(
        {key, placement, placement.session_refs == 0 ? nullptr : ctx.sessions.holders(key)});
  });
  return out;
}

// Session order among blocks of one priority: idle holders' blocks (0), blocks no
// session holds (1), blocks of sessions in a turn (2).
int session_group(const Candidate& c) {
  if (c.holders == nullptr) return 1;
  return c.holders->active > 0 ? 2 : 0;
}

}  // namespace

const ReturnPredictor& PlanContext::predictor() {
  if (!predictor_) predictor_.emplace(sessions, now_ms);
  return *predictor_;
}

bool PlanContext::idle_for_threshold(const Session& session, Tier tier) const {
  if (session.state != SessionState::kIdle || session.priority > kDefaultPriority) return false;
  const uint64_t threshold = idle_threshold_of(config, tier);
  return now_ms >= session.last_active_ms && now_ms - session.last_active_ms >= threshold;
}

double PlanContext::probability(const Session& session, Tier horizon) {
  if (session.priority > kDefaultPriority) return 1.0;
  // Once per session and horizon per call: a session is asked about once per block.
  const size_t h = std::min<size_t>(static_cast<size_t>(horizon), kTierCount);
  auto [it, inserted] = probabilities_.try_emplace(&session);
  if (!inserted && it->second[h] >= 0) return it->second[h];
  if (inserted) it->second.fill(-1);
  // Sessions leave an engine-facing tier after its idle threshold; leaving the daemon
  // (kNone) loses the block for every later turn.
  const double p =
      !TierTopology::traits(horizon).engine_facing
          ? predictor().probability_ever(session)
          : predictor().probability_within(session, idle_threshold_of(config, horizon));
  it->second[h] = p;
  return p;
}

bool PlanContext::past_threshold(const Session& session, Tier tier) {
  if (!idle_for_threshold(session, tier)) return false;
  const bool spared = predictive() && predictor().informed() &&
                      probability(session, tier) >= config.imminent_probability;
  return !spared;
}

bool PlanContext::wanted(const BlockKey& key, const BlockHolders& holders, Tier tier) {
  if (holders.active > 0 || holders.durable()) return true;
  // hot_ms is the latest activity of any holder: none past the threshold by time
  // unless that one is.
  const uint64_t threshold = idle_threshold_of(config, tier);
  if (now_ms < holders.hot_ms || now_ms - holders.hot_ms < threshold) return true;
  if (!predictive()) return false;
  const auto t = static_cast<unsigned>(tier);
  uint8_t& judged = wanted_[key];
  if ((judged & (1u << t)) == 0) {
    const bool any = holders.any_of([&](const Session& s) { return !past_threshold(s, tier); });
    judged = static_cast<uint8_t>(judged | (1u << t) | (any ? 1u << (4 + t) : 0u));
  }
  return (judged & (1u << (4 + t))) != 0;
}

double PlanContext::value(const BlockKey& key, const BlockHolders* holders, Tier horizon,
                          bool with_dependents) {
  double sum = 0;
  if (holders != nullptr) {
    holders->for_first(kValueSample, [&](const Session& s) {
      // Its blocks after this one cannot be loaded without it. depth is the block's
      // deepest index among its holders: exact for one holder and for a prefix shared
      // at one position; a holder that has it shallower is undercounted.
      const size_t after =
          s.blocks.size() > holders->depth + 1 ? s.blocks.size() - holders->depth - 1 : 0;
      sum += probability(s, horizon) * (with_dependents ? 1.0 + static_cast<double>(after) : 1.0);
    });
    const uint32_t count = holders->count();
    if (count > kValueSample) sum = sum * count / kValueSample;
  }
  if (horizon == Tier::kNone && holders != nullptr) {
    if (auto again = sessions.reuse().probability_used_again(key)) sum = std::max(sum, *again);
  }
  return sum;
}

double PlanContext::next_turn_ms(Tier tier, const BlockKey& key, uint64_t bytes) const {
  if (tier == Tier::kNone) return cost.recompute_ms(key.layout);
  return std::min(cost.reload_ms(tier, bytes), cost.recompute_ms(key.layout));
}

Tier PlanContext::destination_below(const PlanState& plan, Tier tier, const BlockKey& key,
                                    uint64_t bytes) const {
  const Tier below = plan.below(tier);
  if (below == Tier::kNone || !predictive()) return below;
  return cost.worth_keeping(below, key.layout, bytes) ? below : Tier::kNone;
}

namespace {

SacrificeOrder policy_order(PlanContext& ctx, const PlanState& plan, Tier tier, Sacrifice kind);
void permute(std::vector<Candidate>& blocks, std::vector<uint32_t> from);

// With quotas: the blocks in the order that levels the namespaces' standing against
// their quotas — each next block is the next (in policy order) of the namespace then
// furthest above its quota, ties going to the block the policy names first. Without
// quotas: the policy's order unchanged.
std::vector<Candidate> quota_order(const std::vector<PlacementView::QuotaStanding>& standings,
                                   std::vector<Candidate> blocks) {
  std::unordered_map<uint32_t, int64_t> over;
  for (const PlacementView::QuotaStanding& s : standings) over[s.namespace_id] = s.over_bytes;
  // Each namespace's blocks, in policy order (indices into `blocks`).
  std::unordered_map<uint32_t, std::vector<size_t>> by_namespace;
  for (size_t i = 0; i < blocks.size(); ++i) {
    by_namespace[blocks[i].key.layout.namespace_id].push_back(i);
  }
  struct Next {
    int64_t over;
    size_t block;  // its next block: an index into `blocks`, in policy order
    size_t at;     // that block's place in its namespace's list
    uint32_t namespace_id;
  };
  auto comes_later = [](const Next& a, const Next& b) {
    if (a.over != b.over) return a.over < b.over;
    return a.block > b.block;
  };
  std::priority_queue<Next, std::vector<Next>, decltype(comes_later)> heads(comes_later);
  for (const auto& [id, list] : by_namespace) {
    auto it = over.find(id);
    heads.push({it == over.end() ? 0 : it->second, list.front(), 0, id});
  }
  std::vector<Candidate> out;
  out.reserve(blocks.size());
  while (!heads.empty()) {
    Next next = heads.top();
    heads.pop();
    Candidate& c = blocks[next.block];
    next.over -= static_cast<int64_t>(c.placement.bytes);
    out.push_back(std::move(c));
    const std::vector<size_t>& list = by_namespace[next.namespace_id];
    if (++next.at < list.size()) {
      next.block = list[next.at];
      heads.push(next);
    }
  }
  return out;
}

}  // namespace

SacrificeOrder::SacrificeOrder(std::vector<Candidate> blocks) : blocks_(std::move(blocks)) {}

SacrificeOrder::SacrificeOrder(std::vector<Candidate> blocks, Sorter sorter)
    : blocks_(std::move(blocks)), sorter_(std::move(sorter)) {}

const Candidate& SacrificeOrder::at(size_t i) {
  if (!sorter_) return blocks_[i];
  if (i >= order_.size()) {
    // Chunks double, so a pass that reads the whole tier pays O(b log b), as one sort.
    constexpr size_t kFirstChunk = 64;
    const size_t upto = std::max({i + 1, kFirstChunk, 2 * order_.size()});
    sorter_(blocks_, order_, std::min(upto, blocks_.size()));
  }
  return blocks_[order_[i]];
}

std::vector<Candidate> SacrificeOrder::take_all() && {
  if (sorter_) {
    if (order_.size() < blocks_.size()) sorter_(blocks_, order_, blocks_.size());
    permute(blocks_, std::move(order_));
  }
  return std::move(blocks_);
}

SacrificeOrder sacrifice_order(PlanContext& ctx, const PlanState& plan, Tier tier, Sacrifice kind) {
  SacrificeOrder order = policy_order(ctx, plan, tier, kind);
  const std::vector<PlacementView::QuotaStanding> standings = ctx.view.quota_standing(tier);
  if (standings.empty() || order.size() == 0) return order;
  return SacrificeOrder(quota_order(standings, std::move(order).take_all()));
}

namespace {

// Reorders `blocks` in place so that the i-th is the one at from[i] now, one cycle of
// the permutation at a time (no second list of the candidates).
void permute(std::vector<Candidate>& blocks, std::vector<uint32_t> from) {
  for (size_t start = 0; start < from.size(); ++start) {
    if (from[start] == start) continue;
    Candidate held = std::move(blocks[start]);
    size_t i = start;
    while (from[i] != start) {
      const size_t next = from[i];
      blocks[i] = std::move(blocks[next]);
      from[i] = static_cast<uint32_t>(i);
      i = next;
    }
    blocks[i] = std::move(held);
    from[i] = static_cast<uint32_t>(i);
  }
}

// The sort key of a block in the baselines' orders, gathered once per block so that
// sorting compares values in one array instead of chasing each block's holders.
struct BaselineKey {
  uint8_t priority;
  PeerRank rank;  // the peer policy's (all equal in LRU tiering)
  uint64_t last_access_ms;
  uint32_t depth;
  uint32_t at;  // the block's index in the candidates
};

// Lowest priority first, then `rank`, then lru_less (by the same fields).
SacrificeOrder baseline_order(std::vector<Candidate> blocks, const std::vector<PeerRank>* ranks) {
  std::vector<BaselineKey> keys;
  keys.reserve(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Candidate& c = blocks[i];
    keys.push_back({c.priority(), ranks == nullptr ? PeerRank{} : (*ranks)[i],
                    c.placement.last_access_ms, c.depth(), static_cast<uint32_t>(i)});
  }
  auto less = [](const std::vector<Candidate>& blocks, const BaselineKey& a, const BaselineKey& b) {
    if (a.priority != b.priority) return a.priority < b.priority;
    if (a.rank < b.rank) return true;
    if (b.rank < a.rank) return false;
    return lru_less(a.last_access_ms, a.depth, blocks[a.at].key, b.last_access_ms, b.depth,
                    blocks[b.at].key);
  };
  return SacrificeOrder(std::move(blocks), sort_on_demand(std::move(keys), less));
}

// A peer policy's order (peer_policy.h), lowest retention priority first as in every
// mode; blocks it has not seen go after the rest, least recently used first.
SacrificeOrder peer_order(PlanContext& ctx, const PlanState& plan, Tier tier,
                          std::vector<Candidate> blocks) {
  if (ctx.peer == nullptr || blocks.empty()) return SacrificeOrder(std::move(blocks));
  std::vector<BlockKey> keys;
  keys.reserve(blocks.size());
  for (const Candidate& c : blocks) keys.push_back(c.key);
  std::vector<PeerRank> ranks;
  ctx.peer->rank(tier, plan.below(tier) == Tier::kNone, keys, ctx.now_ms, ranks);
  keys = {};
  return baseline_order(std::move(blocks), &ranks);
}

// Lowest retention priority first, then least recently used.
SacrificeOrder lru_order(std::vector<Candidate> blocks) {
  return baseline_order(std::move(blocks), nullptr);
}

// Kept blocks last; lowest retention priority first; then by session group (session_group);
// then the least recently active holder first, each session's tail first; then block LRU.
std::vector<Candidate> session_aware_order(std::vector<Candidate> blocks, Sacrifice kind) {
  // Leaving the daemon altogether: the blocks no session holds go first (the
  // prefix cache, and the tails of sessions cut by earlier evictions).
  auto rank = [&](const Candidate& c) {
    const int group = session_group(c);
    return kind == Sacrifice::kEvict && group == 1 ? -1 : group;
  };
  std::sort(blocks.begin(), blocks.end(), [&](const Candidate& a, const Candidate& b) {
    if (a.kept() != b.kept()) return b.kept();
    if (a.priority() != b.priority()) return a.priority() < b.priority();
    const int ra = rank(a), rb = rank(b);
    if (ra != rb) return ra < rb;
    if (a.holders == nullptr || b.holders == nullptr) return lru_less(a, b);
    if (a.holders->hot_seq != b.holders->hot_seq) {
      return a.holders->hot_seq < b.holders->hot_seq;
    }
    // One session's blocks: tail first.
    if (a.depth() != b.depth()) return a.depth() > b.depth();
    return lru_less(a, b);
  });
  return blocks;
}

// Kept blocks last; lowest retention priority first; then the smallest loss per byte: the
// block's value to its holders (PlanContext::value) times how much slower their next turn
// gets where it goes.
SacrificeOrder predictive_order(PlanContext& ctx, const PlanState& plan, Tier tier, Sacrifice kind,
                                std::vector<Candidate> blocks) {
  struct Ranked {
    uint8_t priority;
    bool kept;
    double loss;
    uint64_t hot_seq;
    uint32_t at;
  };
  std::vector<Ranked> ranked;
  ranked.reserve(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Candidate& c = blocks[i];
    const Tier to = kind == Sacrifice::kEvict
                        ? Tier::kNone
                        : ctx.destination_below(plan, tier, c.key, c.placement.bytes);
    // Leaving the daemon loses the block for every later turn: weigh it by P(ever back).
    const Tier horizon = to == Tier::kNone ? Tier::kNone : tier;
    const double worse_by = ctx.next_turn_ms(to, c.key, c.placement.bytes) -
                            ctx.next_turn_ms(tier, c.key, c.placement.bytes);
    const double value = ctx.value(c.key, c.holders, horizon, to == Tier::kNone);
    const double loss = value * std::max(0.0, worse_by) /
                        static_cast<double>(std::max<uint64_t>(c.placement.bytes, 1));
    ranked.push_back({c.priority(), c.kept(), loss, c.holders == nullptr ? 0 : c.holders->hot_seq,
                      static_cast<uint32_t>(i)});
  }
  auto less = [](const std::vector<Candidate>& blocks, const Ranked& a, const Ranked& b) {
    if (std::tie(a.kept, a.priority) != std::tie(b.kept, b.priority)) {
      return std::tie(a.kept, a.priority) < std::tie(b.kept, b.priority);
    }
    if (a.loss != b.loss) return a.loss < b.loss;
    // Equal worth (sessions alike, or one session's blocks): the least recently
    // active holder first, each session's tail first (its prefix is read first on
    // every turn, whenever each block was last touched), then block LRU.
    if (a.hot_seq != b.hot_seq) return a.hot_seq < b.hot_seq;
    const Candidate& ca = blocks[a.at];
    const Candidate& cb = blocks[b.at];
    if (ca.depth() != cb.depth()) return ca.depth() > cb.depth();
    return lru_less(ca, cb);
  };
  return SacrificeOrder(std::move(blocks), sort_on_demand(std::move(ranked), less));
}

SacrificeOrder policy_order(PlanContext& ctx, const PlanState& plan, Tier tier, Sacrifice kind) {
  std::vector<Candidate> blocks = movable_in_tier(ctx, tier);
  switch (ctx.config.mode) {
    case PolicyMode::kLru:
      return lru_order(std::move(blocks));
    case PolicyMode::kSessionAware:
      return SacrificeOrder(session_aware_order(std::move(blocks), kind));
    case PolicyMode::kPredictive:
      break;
    case PolicyMode::kS3Fifo:
    case PolicyMode::kSlru:
    case PolicyMode::kArc:
    case PolicyMode::kTinyLfuLru:
    case PolicyMode::kWTinyLfu:
    case PolicyMode::kWorkloadAware:
      return peer_order(ctx, plan, tier, std::move(blocks));
  }
  return predictive_order(ctx, plan, tier, kind, std::move(blocks));
}

}  // namespace

}  // namespace kvtier::policy::detail
