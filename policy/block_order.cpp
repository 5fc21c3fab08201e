#include "policy/block_order.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

namespace kvtier::policy::detail {
namespace {

constexpr std::array<Tier, 3> kTiers = {Tier::kHbm, Tier::kRam, Tier::kNvme};

uint8_t bit(Tier tier) {
  return static_cast<uint8_t>(1u << static_cast<unsigned>(tier));
}

// Least recently used first; blocks used at the same time (one request's) tail first.
bool lru_less(const Candidate& a, const Candidate& b) {
  if (a.placement.last_access_ms != b.placement.last_access_ms) {
    return a.placement.last_access_ms < b.placement.last_access_ms;
  }
  if (a.depth != b.depth) return a.depth > b.depth;
  return key_less(a.key, b.key);
}

std::vector<Candidate> unreferenced_lru(const PlanContext& ctx, Tier tier) {
  std::vector<Candidate> out;
  ctx.view.for_each_unreferenced(tier, [&](const BlockKey& key, const Placement& placement) {
    if (placement.movable && placement.tier == tier) out.push_back({key, placement});
  });
  std::sort(out.begin(), out.end(), lru_less);
  return out;
}

// Every movable block in `tier`: those sessions hold, then the rest.
std::vector<Candidate> blocks_in_tier(PlanContext& ctx, Tier tier) {
  std::vector<Candidate> out = unreferenced_lru(ctx, tier);
  for (const IndexedBlock& b : ctx.index().blocks()) {
    if (b.placement.tier == tier && b.placement.movable) {
      out.push_back({b.key, b.placement, b.depth});
    }
  }
  return out;
}

// Session order, each session's tail first (the prefix is read first on the next turn
// and is the part most often shared), a shared block once with its hottest holder —
// a system prompt shared with an active conversation must not leave because a cold
// one also holds it. Blocks no session holds go between idle and active sessions'.
std::vector<Candidate> session_order_in_tier(PlanContext& ctx, Tier tier) {
  const std::vector<const Session*>& order = ctx.session_order();
  const PlanIndex& index = ctx.index();
  std::vector<Candidate> out;
  bool unreferenced_done = false;
  auto add_unreferenced = [&] {
    unreferenced_done = true;
    std::vector<Candidate> rest = unreferenced_lru(ctx, tier);
    out.insert(out.end(), rest.begin(), rest.end());
  };
  for (size_t i = 0; i < order.size(); ++i) {
    if (!unreferenced_done &&
        (order[i]->state == SessionState::kActive || order[i]->priority > 0)) {
      add_unreferenced();
    }
    const auto refs = index.refs(i);
    for (auto it = refs.rbegin(); it != refs.rend(); ++it) {
      const IndexedBlock& b = index.blocks()[*it];
      if (b.hottest != i || b.placement.tier != tier || !b.placement.movable) continue;
      out.push_back({b.key, b.placement, b.depth});
    }
  }
  if (!unreferenced_done) add_unreferenced();
  return out;
}

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

PlanIndex::PlanIndex(PlanContext& ctx, PlanScratch& scratch) : s_(scratch) {
  const std::vector<const Session*>& order = ctx.session_order();
  size_t total_refs = 0;
  for (const Session* s : order) total_refs += s->blocks.size();
  size_t slots = 16;
  while (slots < total_refs * 2) slots *= 2;
  s_.slots.assign(slots, PlanScratch::Slot{});
  mask_ = slots - 1;
  s_.blocks.clear();
  s_.refs.clear();
  s_.ref_begin.clear();
  s_.outlooks.assign(order.size(), SessionOutlook{});
  auto& slots_ = s_.slots;
  auto& blocks_ = s_.blocks;
  auto& refs_ = s_.refs;
  auto& ref_begin_ = s_.ref_begin;

  for (size_t i = 0; i < order.size(); ++i) {
    const Session& s = *order[i];
    SessionOutlook& outlook = s_.outlooks[i];
    if (ctx.predictive()) {
      const ReturnPredictor& predictor = ctx.predictor();
      outlook.p[0] = predictor.probability_within(s, ctx.config.hbm_idle_ms);
      outlook.p[1] = predictor.probability_within(s, ctx.config.ram_idle_ms);
      outlook.p[2] = predictor.probability_ever(s);
    }
    for (Tier tier : {Tier::kHbm, Tier::kRam}) {
      // Past the threshold, and (kPredictive, once it has data) not expected back
      // within it.
      const bool spared = ctx.predictive() && ctx.predictor().informed() &&
                          outlook.p[static_cast<size_t>(tier)] >= ctx.config.imminent_probability;
      const bool past = ctx.idle_for_threshold(s, tier) && !spared;
      if (past) outlook.past_threshold |= bit(tier);
    }
    ref_begin_.push_back(static_cast<uint32_t>(refs_.size()));
    for (size_t depth = 0; depth < s.blocks.size(); ++depth) {
      BlockKey key{s.layout, s.blocks[depth]};
      const uint64_t fingerprint = fingerprint_of(key);
      uint64_t slot = fingerprint & mask_;
      while (slots_[slot].block != PlanScratch::kEmpty &&
             (slots_[slot].fingerprint != static_cast<uint32_t>(fingerprint >> 32) ||
              !(blocks_[slots_[slot].block].key == key))) {
        slot = (slot + 1) & mask_;
      }
      if (slots_[slot].block == PlanScratch::kEmpty) {
        slots_[slot] = {static_cast<uint32_t>(fingerprint >> 32),
                        static_cast<uint32_t>(blocks_.size())};
        blocks_.push_back(IndexedBlock{key, ctx.view.placement(key)});
      }
      IndexedBlock& b = blocks_[slots_[slot].block];
      b.hottest = static_cast<uint32_t>(i);  // later in the order = hotter
      b.depth = std::max(b.depth, static_cast<uint32_t>(depth));
      for (Tier tier : kTiers) {
        if ((outlook.past_threshold & bit(tier)) == 0) b.wanted |= bit(tier);
      }
      b.active |= s.state == SessionState::kActive;
      b.priority = std::max(b.priority, s.priority);
      for (size_t t = 0; t < b.value.size(); ++t) b.value[t] += outlook.p[t];
      refs_.push_back(slots_[slot].block);
    }
  }
  ref_begin_.push_back(static_cast<uint32_t>(refs_.size()));
}

uint64_t PlanIndex::fingerprint_of(const BlockKey& key) {
  uint64_t head = 0;
  auto bytes = key.hash.bytes();
  std::memcpy(&head, bytes.data(), std::min<size_t>(bytes.size(), sizeof(head)));
  uint64_t tail = 0;
  if (bytes.size() > sizeof(head)) {
    std::memcpy(&tail, bytes.data() + bytes.size() - sizeof(tail), sizeof(tail));
  }
  return mix(head ^ (tail * 0x9E3779B97F4A7C15ull) ^ key.layout.layout_digest ^
             (uint64_t{key.layout.namespace_id} << 40 | bytes.size()));
}

int64_t PlanIndex::find(const BlockKey& key) const {
  const uint64_t fingerprint = fingerprint_of(key);
  for (uint64_t slot = fingerprint & mask_; s_.slots[slot].block != PlanScratch::kEmpty;
       slot = (slot + 1) & mask_) {
    if (s_.slots[slot].fingerprint == static_cast<uint32_t>(fingerprint >> 32) &&
        s_.blocks[s_.slots[slot].block].key == key) {
      return s_.slots[slot].block;
    }
  }
  return -1;
}

const ReturnPredictor& PlanContext::predictor() {
  if (!predictor_) predictor_.emplace(sessions, now_ms);
  return *predictor_;
}

PlanIndex& PlanContext::index() {
  if (!index_) index_.emplace(*this, scratch_);
  return *index_;
}

const std::vector<const Session*>& PlanContext::session_order() {
  std::vector<const Session*>& order = scratch_.order;
  if (session_order_ready_) return order;
  session_order_ready_ = true;
  order.clear();
  sessions.for_each([&](const Session& s) {
    if (!s.blocks.empty()) order.push_back(&s);
  });
  auto group = [](const Session* s) {
    return s->priority > 0 ? 2 : s->state == SessionState::kActive ? 1 : 0;
  };
  std::sort(order.begin(), order.end(), [&](const Session* a, const Session* b) {
    if (group(a) != group(b)) return group(a) < group(b);
    if (a->last_active_ms != b->last_active_ms) return a->last_active_ms < b->last_active_ms;
    if (a->id != b->id) return a->id < b->id;
    return a->namespace_id < b->namespace_id;
  });
  return order;
}

bool PlanContext::idle_for_threshold(const Session& session, Tier tier) const {
  if (session.state != SessionState::kIdle || session.priority > 0) return false;
  const uint64_t threshold = idle_threshold_of(config, tier);
  return now_ms >= session.last_active_ms && now_ms - session.last_active_ms >= threshold;
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

std::vector<Candidate> sacrifice_order(PlanContext& ctx, const PlanState& plan, Tier tier,
                                       Sacrifice kind) {
  switch (ctx.config.mode) {
    case PolicyMode::kSessionAware: {
      std::vector<Candidate> out = session_order_in_tier(ctx, tier);
      if (kind == Sacrifice::kEvict) {
        // Leaving the daemon altogether: the blocks no session holds go first (the
        // prefix cache, and the tails of sessions cut by earlier evictions).
        std::stable_partition(out.begin(), out.end(),
                              [](const Candidate& c) { return c.placement.session_refs == 0; });
      }
      return out;
    }
    case PolicyMode::kLru: {
      std::vector<Candidate> out = blocks_in_tier(ctx, tier);
      std::sort(out.begin(), out.end(), lru_less);
      return out;
    }
    case PolicyMode::kPredictive:
      break;
  }
  std::vector<Candidate> blocks = blocks_in_tier(ctx, tier);
  const PlanIndex& index = ctx.index();
  struct Ranked {
    uint8_t priority;
    bool active;
    double loss;
    uint32_t hottest;  // the hottest holder's place in the session order
    size_t at;
  };
  std::vector<Ranked> ranked;
  ranked.reserve(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Candidate& c = blocks[i];
    const int64_t found = c.placement.session_refs == 0 ? -1 : index.find(c.key);
    static const IndexedBlock kNobody{};
    const IndexedBlock& b = found < 0 ? kNobody : index.blocks()[static_cast<size_t>(found)];
    const Tier to = kind == Sacrifice::kEvict
                        ? Tier::kNone
                        : ctx.destination_below(plan, tier, c.key, c.placement.bytes);
    // Leaving the daemon loses the block for every later turn: weigh it by P(ever back).
    const Tier horizon = to == Tier::kNone ? Tier::kNvme : tier;
    const double worse_by = ctx.next_turn_ms(to, c.key, c.placement.bytes) -
                            ctx.next_turn_ms(tier, c.key, c.placement.bytes);
    const double loss = b.value[static_cast<size_t>(horizon)] * std::max(0.0, worse_by) /
                        static_cast<double>(std::max<uint64_t>(c.placement.bytes, 1));
    ranked.push_back({b.priority, b.active, loss, found < 0 ? 0u : b.hottest, i});
  }
  std::sort(ranked.begin(), ranked.end(), [&](const Ranked& a, const Ranked& b) {
    if (std::tie(a.priority, a.active) != std::tie(b.priority, b.active)) {
      return std::tie(a.priority, a.active) < std::tie(b.priority, b.active);
    }
    if (a.loss != b.loss) return a.loss < b.loss;
    // Equal worth (sessions alike, or one session's blocks): the least recently
    // active session first, each session's tail first (its prefix is read first on
    // every turn, whenever each block was last touched), then block LRU.
    if (a.hottest != b.hottest) return a.hottest < b.hottest;
    if (blocks[a.at].depth != blocks[b.at].depth) return blocks[a.at].depth > blocks[b.at].depth;
    return lru_less(blocks[a.at], blocks[b.at]);
  });
  std::vector<Candidate> out;
  out.reserve(ranked.size());
  for (const Ranked& r : ranked) out.push_back(blocks[r.at]);
  return out;
}

}  // namespace kvtier::policy::detail
