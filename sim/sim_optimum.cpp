#include "sim/sim_optimum.h"

#include <array>

namespace kvtier::bench {
namespace {

constexpr std::array<Tier, kLocalTierCount> kTiers = {Tier::kHbm, Tier::kRam, Tier::kNvme};

}  // namespace

Clairvoyant::Clairvoyant(const Trace& trace, SimStore& store)
    : trace_(trace),
      store_(store),
      uses_(trace.distinct_blocks),
      cursor_(trace.distinct_blocks, 0),
      held_(trace.distinct_blocks, 0) {
  for (size_t r = 0; r < trace.requests.size(); ++r) {
    const TraceRequest& request = trace.requests[r];
    for (uint32_t k = 0; k < request.full_blocks; ++k) {
      std::vector<uint32_t>& uses = uses_[request.hash_ids[k]];
      if (uses.empty() || uses.back() != r) uses.push_back(static_cast<uint32_t>(r));
    }
  }
}

uint64_t Clairvoyant::next_use(uint64_t id) const {
  const std::vector<uint32_t>& uses = uses_[id];
  return cursor_[id] < uses.size() ? trace_.requests[uses[cursor_[id]]].arrival_ms : kNever;
}

void Clairvoyant::on_served(size_t request) {
  const TraceRequest& r = trace_.requests[request];
  for (uint32_t k = 0; k < r.full_blocks; ++k) {
    const uint64_t id = r.hash_ids[k];
    if (held_[id]) untrack(id);
    while (cursor_[id] < uses_[id].size() && uses_[id][cursor_[id]] <= request) ++cursor_[id];
    if (!held_[id]) continue;
    track(id);
    // Never read again: worth nothing (a block still moving goes at the next rebalance).
    if (next_use(id) == kNever) evict(id);
  }
}

bool Clairvoyant::evict(uint64_t id) {
  if (!store_.evict(SimStore::key_of(id))) return false;
  untrack(id);
  held_[id] = 0;
  ++stats_.blocks_evicted;
  return true;
}

bool Clairvoyant::store(uint64_t id, uint64_t now_ms) {
  const uint64_t next = next_use(id);
  if (next == kNever) return false;
  const BlockKey key = SimStore::key_of(id);
  if (store_.insert(key, now_ms) == Tier::kNone) {
    // Every tier is full: the held block needed last gives up its place, if it is
    // needed later than this one.
    bool made_room = false;
    for (auto it = ranked_.rbegin(); it != ranked_.rend() && it->first > next; ++it) {
      if (store_.placement_of(it->second).movable) {
        made_room = evict(it->second);
        break;
      }
    }
    if (!made_room || store_.insert(key, now_ms) == Tier::kNone) return false;
  }
  held_[id] = 1;
  track(id);
  return true;
}

void Clairvoyant::rebalance(uint64_t now_ms, uint64_t horizon_ms) {
  // The tier each held block earns: HBM for the soonest needed, then RAM, then NVMe.
  std::array<uint64_t, kLocalTierCount> room{};
  for (Tier tier : kTiers) {
    room[static_cast<size_t>(tier)] = store_.space(tier).capacity_bytes / store_.block_bytes();
  }
  struct Out {
    uint32_t id;
    Tier from;
    Tier to;  // kNone: drop
  };
  std::vector<Out> out;  // in next-use order
  size_t tier_at = 0;
  if (walk_stale_) {
    walk_.assign(ranked_.begin(), ranked_.end());
    walk_stale_ = false;
  }
  constexpr size_t kAhead = 16;  // blocks whose placement is fetched ahead of the walk
  for (size_t i = 0; i < walk_.size(); ++i) {
    if (i + kAhead < walk_.size()) store_.prefetch(walk_[i + kAhead].second);
    const auto [next, id] = walk_[i];
    while (tier_at < kTiers.size() && room[tier_at] == 0) ++tier_at;
    const Tier earned = next == kNever || tier_at == kTiers.size() ? Tier::kNone : kTiers[tier_at];
    if (earned != Tier::kNone) --room[tier_at];
    const SimStore::BlockPlacement placement = store_.placement_of(id);
    if (!placement.movable || placement.tier == earned) continue;
    out.push_back({id, placement.tier, earned});
  }
  // Drops free room at once; demotions next, needed-last first, then promotions,
  // needed-first first. A move the link cannot start within the horizon waits.
  const double limit = static_cast<double>(now_ms + horizon_ms);
  waiting_ = false;
  // A demotion onto the block's NVMe copy writes nothing and takes no link time, so it
  // waits until a move needs its room: done at once, it would free room that
  // promotions refill over the NVMe read link, and blocks at a tier's edge would go
  // down and come back up each rebalance (what a slow write used to hold back).
  std::array<std::vector<const Out*>, kLocalTierCount>
      free_demotions{};  // by from, needed-last first
  std::array<size_t, kLocalTierCount> next_free{};
  auto demote_free = [&](const Out& o) {
    if (!store_.begin_move(SimStore::key_of(o.id), o.to, now_ms)) return;
    stats_.bytes_demoted += store_.block_bytes();
  };
  auto make_room = [&](Tier tier) {
    const size_t t = static_cast<size_t>(tier);
    while (next_free[t] < free_demotions[t].size()) {
      const SimStore::TierSpace space = store_.space(tier);
      if (space.capacity_bytes - space.used_bytes >= store_.block_bytes()) return;
      demote_free(*free_demotions[t][next_free[t]++]);
    }
  };
  auto try_move = [&](const Out& o) {
    const BlockKey key = SimStore::key_of(o.id);
    if (store_.link_free_at_ms(o.from, o.to) > limit) {
      waiting_ = true;
      return;
    }
    if (o.to != Tier::kNvme) make_room(o.to);
    if (!store_.begin_move(key, o.to, now_ms)) {
      waiting_ = true;
      return;
    }
    (o.to > o.from ? stats_.bytes_demoted : stats_.bytes_promoted) += store_.block_bytes();
  };
  for (const Out& o : out) {
    if (o.to == Tier::kNone) evict(o.id);
  }
  for (auto it = out.rbegin(); it != out.rend(); ++it) {
    if (it->to == Tier::kNone || it->to < it->from) continue;
    if (it->to == Tier::kNvme && store_.has_nvme_copy(SimStore::key_of(it->id))) {
      free_demotions[static_cast<size_t>(it->from)].push_back(&*it);
    } else {
      try_move(*it);
    }
  }
  for (const Out& o : out) {
    if (o.to != Tier::kNone && o.to < o.from) try_move(o);
  }
}

}  // namespace kvtier::bench
