#include "policy/planner.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace kvtier::policy {
namespace {

using Placement = PlacementView::BlockPlacement;
using KeySet = std::unordered_set<BlockKey, BlockKeyHasher>;

// Rounded down so that "at or below the watermark" never overshoots it.
uint64_t fraction_of(double fraction, uint64_t capacity) {
  if (fraction <= 0) return 0;
  return static_cast<uint64_t>(fraction * static_cast<double>(capacity));
}

// Written as a subtraction so that huge sizes cannot wrap around.
bool fits(uint64_t used, uint64_t bytes, uint64_t limit) {
  return used <= limit && bytes <= limit - used;
}

// A total order on keys, only to make plans independent of hash-map iteration order.
bool key_less(const BlockKey& a, const BlockKey& b) {
  if (a.layout.namespace_id != b.layout.namespace_id) {
    return a.layout.namespace_id < b.layout.namespace_id;
  }
  if (a.layout.layout_digest != b.layout.layout_digest) {
    return a.layout.layout_digest < b.layout.layout_digest;
  }
  auto x = a.hash.bytes();
  auto y = b.hash.bytes();
  return std::lexicographical_compare(x.begin(), x.end(), y.begin(), y.end());
}

// Sessions in the order they give up their blocks: idle before active, each group
// least recently active first.
std::vector<const Session*> demotion_order(const SessionTable& sessions) {
  std::vector<const Session*> order = sessions.by_last_active();
  std::stable_partition(order.begin(), order.end(),
                        [](const Session* s) { return s->state == SessionState::kIdle; });
  return order;
}

// Visits session blocks in the order they should leave a tier, until `fn` returns
// false. A block shared by several sessions is visited once, with the hottest of them
// (the last in `order`): a system prompt shared with an active conversation must not
// leave because a cold conversation also holds it. Within a session the tail goes
// first: the prefix is read first on the next turn and is the part most often shared.
template <typename Fn>
void for_each_session_block(const std::vector<const Session*>& order, Fn&& fn) {
  std::unordered_map<BlockKey, size_t, BlockKeyHasher> hottest_holder;
  for (size_t i = 0; i < order.size(); ++i) {
    for (const BlockHash& hash : order[i]->blocks) {
      hottest_holder[BlockKey{order[i]->layout, hash}] = i;
    }
  }
  for (size_t i = 0; i < order.size(); ++i) {
    const auto& blocks = order[i]->blocks;
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
      BlockKey key{order[i]->layout, *it};
      if (hottest_holder.at(key) != i) continue;
      if (!fn(key, *order[i])) return;
    }
  }
}

// Movable blocks of `tier` that no session references, least recently used first.
std::vector<std::pair<BlockKey, Placement>> unreferenced_lru(const PlacementView& view, Tier tier) {
  std::vector<std::pair<BlockKey, Placement>> out;
  view.for_each_unreferenced(tier, [&](const BlockKey& key, const Placement& placement) {
    if (placement.movable && placement.tier == tier) out.emplace_back(key, placement);
  });
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    if (a.second.last_access_ms != b.second.last_access_ms) {
      return a.second.last_access_ms < b.second.last_access_ms;
    }
    return key_less(a.first, b.first);
  });
  return out;
}

// Moves planned so far in one plan_demotions call and the tier usage they imply.
class DemotionPlan {
 public:
  DemotionPlan(PlacementView::TierSpace hbm, PlacementView::TierSpace ram)
      : hbm_used_(hbm.used_bytes), ram_capacity_(ram.capacity_bytes), ram_used_(ram.used_bytes) {}

  uint64_t hbm_used() const { return hbm_used_; }
  bool ram_configured() const { return ram_capacity_ > 0; }

  // Plans HBM → RAM for `key` when it is in HBM, movable, not yet planned and RAM has
  // room; returns whether it did.
  bool try_demote(const BlockKey& key, const Placement& placement) {
    if (placement.tier != Tier::kHbm || !placement.movable) return false;
    if (!fits(ram_used_, placement.bytes, ram_capacity_)) return false;
    if (!planned_.insert(key).second) return false;
    moves_.push_back(Move{MoveKind::kDemote, key, Tier::kHbm, Tier::kRam});
    hbm_used_ -= std::min(placement.bytes, hbm_used_);
    ram_used_ += placement.bytes;
    return true;
  }

  std::vector<Move> take_moves() { return std::move(moves_); }

 private:
  uint64_t hbm_used_;
  uint64_t ram_capacity_;
  uint64_t ram_used_;
  KeySet planned_;
  std::vector<Move> moves_;
};

void demote_idle_sessions(const std::vector<const Session*>& order, uint64_t now_ms,
                          uint64_t idle_ms, const PlacementView& view, DemotionPlan& plan) {
  auto expired = [&](const Session* s) {
    return s->state == SessionState::kIdle && now_ms >= s->last_active_ms &&
           now_ms - s->last_active_ms >= idle_ms;
  };
  if (std::none_of(order.begin(), order.end(), expired)) return;
  // Blocks that a session still within its idle window (or active) holds stay in HBM.
  KeySet still_wanted;
  for (const Session* s : order) {
    if (expired(s)) continue;
    for (const BlockHash& hash : s->blocks) still_wanted.insert(BlockKey{s->layout, hash});
  }
  for (const Session* s : order) {
    if (!expired(s)) continue;
    for (auto it = s->blocks.rbegin(); it != s->blocks.rend(); ++it) {
      BlockKey key{s->layout, *it};
      if (still_wanted.count(key) != 0) continue;
      (void)plan.try_demote(key, view.placement(key));
    }
  }
}

void demote_to_low_watermark(const std::vector<const Session*>& order, uint64_t low_bytes,
                             const PlacementView& view, DemotionPlan& plan) {
  // Order of sacrifice: idle sessions' blocks, then blocks no session holds (a prefix
  // cache that may never be asked for again), and only then active sessions' blocks.
  bool unreferenced_done = false;
  auto demote_unreferenced = [&] {
    unreferenced_done = true;
    for (const auto& [key, placement] : unreferenced_lru(view, Tier::kHbm)) {
      if (plan.hbm_used() <= low_bytes) return;
      (void)plan.try_demote(key, placement);
    }
  };
  for_each_session_block(order, [&](const BlockKey& key, const Session& holder) {
    if (!unreferenced_done && holder.state == SessionState::kActive) demote_unreferenced();
    if (plan.hbm_used() <= low_bytes) return false;
    (void)plan.try_demote(key, view.placement(key));
    return true;
  });
  if (!unreferenced_done && plan.hbm_used() > low_bytes) demote_unreferenced();
}

}  // namespace

std::vector<Move> Planner::plan_demotions(const SessionTable& sessions,
                                          const PlacementView& view) const {
  const PlacementView::TierSpace hbm = view.space(Tier::kHbm);
  DemotionPlan plan(hbm, view.space(Tier::kRam));
  // Every rule here demotes into RAM; without a RAM tier, HBM pressure is relieved by
  // make_room() evictions instead.
  if (!plan.ram_configured()) return {};
  const std::vector<const Session*> order = demotion_order(sessions);

  demote_idle_sessions(order, clock_.now_ms(), config_.hbm_idle_ms, view, plan);
  if (hbm.capacity_bytes > 0 &&
      plan.hbm_used() > fraction_of(config_.hbm_high_watermark, hbm.capacity_bytes)) {
    demote_to_low_watermark(order, fraction_of(config_.hbm_low_watermark, hbm.capacity_bytes), view,
                            plan);
  }
  return plan.take_moves();
}

std::vector<Move> Planner::make_room(Tier tier, uint64_t bytes, const SessionTable& sessions,
                                     const PlacementView& view) const {
  const PlacementView::TierSpace space = view.space(tier);
  uint64_t free_bytes =
      space.capacity_bytes > space.used_bytes ? space.capacity_bytes - space.used_bytes : 0;
  if (free_bytes >= bytes) return {};
  if (bytes > space.capacity_bytes) return {};  // could never fit, even in an empty tier

  std::vector<Move> moves;
  KeySet planned;
  auto evict = [&](const BlockKey& key, const Placement& placement) {
    if (placement.tier != tier || !placement.movable) return;
    if (!planned.insert(key).second) return;
    moves.push_back(Move{MoveKind::kEvict, key, tier, Tier::kNone});
    free_bytes += placement.bytes;
  };
  for (const auto& [key, placement] : unreferenced_lru(view, tier)) {
    if (free_bytes >= bytes) return moves;
    evict(key, placement);
  }
  for_each_session_block(demotion_order(sessions), [&](const BlockKey& key, const Session&) {
    if (free_bytes >= bytes) return false;
    evict(key, view.placement(key));
    return true;
  });
  // Partial evictions would drop cached blocks without letting the caller store
  // anything, so an impossible request evicts nothing.
  if (free_bytes < bytes) return {};
  return moves;
}

std::vector<Move> Planner::plan_promotions(const Session& session,
                                           const PlacementView& view) const {
  const PlacementView::TierSpace hbm = view.space(Tier::kHbm);
  if (hbm.capacity_bytes == 0) return {};
  const uint64_t limit = fraction_of(config_.hbm_high_watermark, hbm.capacity_bytes);
  uint64_t used = hbm.used_bytes;
  std::vector<Move> moves;
  for (const BlockHash& hash : session.blocks) {
    BlockKey key{session.layout, hash};
    const Placement placement = view.placement(key);
    if (placement.tier != Tier::kRam && placement.tier != Tier::kNvme) continue;
    if (!placement.movable) continue;  // busy (e.g. already moving): not ours to plan
    // Stop at the first block that does not fit: a later block without the ones before
    // it does not lengthen the prefix the engine can load from HBM.
    if (!fits(used, placement.bytes, limit)) break;
    moves.push_back(Move{MoveKind::kPromote, key, placement.tier, Tier::kHbm});
    used += placement.bytes;
  }
  return moves;
}

}  // namespace kvtier::policy
