// Placement: room for new blocks and the planner's runs (placement.h).
#include "daemon/placement.h"

#include <boost/asio/post.hpp>

#include <algorithm>
#include <unordered_set>

#include "common/log.h"

namespace kvtier::daemon {

namespace {

class StorePlacementView final : public policy::PlacementView {
 public:
  StorePlacementView(const BlockStore& store, std::function<uint64_t(Tier)> leaving_bytes,
                     std::function<std::vector<QuotaStanding>(Tier)> quota_standing)
      : store_(store),
        leaving_bytes_(std::move(leaving_bytes)),
        quota_standing_(std::move(quota_standing)) {}

  BlockPlacement placement(const BlockKey& key) const override {
    auto info = store_.lookup(key);
    if (!info) return {Tier::kNone, false, 0, 0, 0};
    return to_placement(key, *info);
  }
  TierSpace space(Tier tier) const override {
    if (!store_.configured(tier)) return {};
    auto usage = store_.usage(tier);
    // NVMe slots waiting for their index delete are free in a moment; counting them as
    // used would make the planner evict again for room already being made. Copies are
    // free too: a write that needs their room drops them first (move_executor.h), so a
    // block never goes for room a copy holds. Blocks being written to the remote tier
    // on their way out are gone in a moment too.
    const uint64_t going =
        store_.unconfirmed_release_bytes(tier) + usage.copy_bytes + leaving_bytes_(tier);
    const uint64_t used = usage.used_bytes - std::min(usage.used_bytes, going);
    return {usage.capacity_bytes, used, std::min(usage.writing_bytes, used),
            store_.moving_out_bytes(tier)};
  }
  void for_each_in_tier(
      Tier tier,
      const std::function<void(const BlockKey&, const BlockPlacement&)>& fn) const override {
    store_.for_each_in_tier(tier, [&](const BlockKey& key, const BlockInfo& info) {
      fn(key, to_placement(key, info));
    });
  }
  std::vector<QuotaStanding> quota_standing(Tier tier) const override {
    return quota_standing_ ? quota_standing_(tier) : std::vector<QuotaStanding>{};
  }

 private:
  BlockPlacement to_placement(const BlockKey& key, const BlockInfo& info) const {
    return {info.location.tier, info.state == BlockState::kReady && info.pins == 0,
            store_.block_bytes(key.layout), info.session_refs, info.last_access_ms};
  }
  const BlockStore& store_;
  std::function<uint64_t(Tier)> leaving_bytes_;
  std::function<std::vector<QuotaStanding>(Tier)> quota_standing_;
};

using KeySet = std::unordered_set<BlockKey, BlockKeyHasher>;

// A session is a prefix: once one of its blocks is gone, the blocks after it can never
// be loaded as part of that prefix, so the session is cut there and drops its
// references to the rest. Only the sessions holding a removed block are visited (the
// table's reverse index). The table tells its observers of every session it cut.
void cut_sessions_at(const KeySet& removed, policy::SessionTable& sessions) {
  std::vector<policy::Session*> holders;
  for (const BlockKey& key : removed) {
    const policy::BlockHolders* h = sessions.holders(key);
    if (h == nullptr) continue;
    h->for_each(
        [&](const policy::Session& s) { holders.push_back(sessions.find(s.namespace_id, s.id)); });
  }
  std::sort(holders.begin(), holders.end());
  holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
  for (policy::Session* session : holders) {
    const auto& blocks = session->blocks;
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (removed.count({session->layout, blocks[i]}) == 0) continue;
      sessions.truncate(*session, i);  // drops its references to the blocks after
      break;
    }
  }
}

}  // namespace

std::unique_ptr<policy::PlacementView> make_placement_view(
    const BlockStore& store, std::function<uint64_t(Tier)> leaving_bytes,
    std::function<std::vector<policy::PlacementView::QuotaStanding>(Tier)> quota_standing) {
  return std::make_unique<StorePlacementView>(store, std::move(leaving_bytes),
                                              std::move(quota_standing));
}

std::vector<TenantUsage> tenant_usage(const DaemonContext& ctx) {
  std::vector<TenantUsage> out;
  if (ctx.store == nullptr) return out;
  const Namespaces& namespaces = ctx.engines.namespaces();
  const std::vector<BlockStore::NamespaceBytes>& held = ctx.store->namespace_bytes();
  for (uint32_t id = 0; id < held.size() && id < namespaces.size(); ++id) {
    const BlockStore::NamespaceBytes& bytes = held[id];
    if (std::all_of(bytes.begin(), bytes.end(), [](uint64_t b) { return b == 0; })) continue;
    TenantUsage usage{namespaces.name(id), id, bytes, {}};
    for (Tier tier : ctx.topology.local()) {
      const size_t t = static_cast<size_t>(tier);
      usage.quota_bytes[t] = quota_bytes(ctx.config.tenant_quotas, usage.tenant, tier,
                                         ctx.store->usage(tier).capacity_bytes);
    }
    out.push_back(std::move(usage));
  }
  std::sort(out.begin(), out.end(),
            [](const TenantUsage& a, const TenantUsage& b) { return a.tenant < b.tenant; });
  return out;
}

std::vector<policy::PlacementView::QuotaStanding> quota_standing(const DaemonContext& ctx,
                                                                 Tier tier) {
  std::vector<policy::PlacementView::QuotaStanding> out;
  if (ctx.config.tenant_quotas.empty() || ctx.store == nullptr) return out;
  const size_t t = static_cast<size_t>(tier);
  if (t >= static_cast<size_t>(kLocalTierCount) || !ctx.store->configured(tier)) return out;
  const uint64_t capacity = ctx.store->usage(tier).capacity_bytes;
  const Namespaces& namespaces = ctx.engines.namespaces();
  const std::vector<BlockStore::NamespaceBytes>& held = ctx.store->namespace_bytes();
  for (uint32_t id = 0; id < held.size() && id < namespaces.size(); ++id) {
    const BlockStore::NamespaceBytes& bytes = held[id];
    if (bytes[t] == 0) continue;
    const auto quota = quota_bytes(ctx.config.tenant_quotas, namespaces.name(id), tier, capacity);
    if (quota) {
      out.push_back({id, static_cast<int64_t>(bytes[t]) - static_cast<int64_t>(*quota)});
    }
  }
  return out;
}

Result<std::optional<PendingWrite>> Placement::reserve_block(const BlockKey& key,
                                                             uint64_t block_bytes, int gpu_part,
                                                             uint64_t room_bytes) {
  const std::span<const Tier> save_tiers = ctx_.topology.engine_facing();
  auto reserved = ctx_.store->reserve(key, save_tiers, now_ms(), gpu_part);
  if (reserved.is_ok() || reserved.status().code() != StatusCode::kResourceExhausted)
    return reserved;
  ctx_.sessions.expire_priorities(
      ctx_.sessions.now_ms());  // a priority whose time is up keeps nothing
  // HBM and RAM are full. Room for the rest of the request at once (`room_bytes`), so
  // that a request plans once, not once per block; for one block when that much cannot
  // be had. With NVMe below RAM (the landing tier), RAM's coldest blocks go down to it:
  // nothing leaves the daemon for room NVMe has. The Save waits for those writes (it
  // parks: ResourceExhausted here), as it does while room already on its way (blocks
  // moving out) comes.
  const Tier landing = ctx_.topology.landing();
  const uint64_t wanted = std::max(room_bytes, block_bytes);
  DemotionRoom room =
      plan_room_by_demotion(landing, wanted, block_bytes, policy::Room::kDemoteEvictingBelow);
  // RAM has nothing that can go down now (its blocks are being copied, read or pinned
  // by requests in flight) and nothing is on its way out: the tiers above it send
  // theirs past it, straight to NVMe. A priority orders who goes; it never keeps a
  // full tier full while a tier below has room.
  if (room.moves.empty() && !room.coming) room = plan_room_past_landing(wanted, block_bytes);
  if (!room.moves.empty()) {
    ctx_.mover->apply(room.moves);
    // Demotions onto NVMe copies (and drops) free their slots at once.
    reserved = ctx_.store->reserve(key, save_tiers, now_ms(), gpu_part);
    if (reserved.is_ok() || reserved.status().code() != StatusCode::kResourceExhausted)
      return reserved;
    // Writes started, or NVMe slots on their way back for them: the room comes. (A
    // move refused at once, its tier failing, leaves neither: then evict, below.)
    room.coming = room_on_its_way();
  }
  if (room.coming) {
    return resource_exhausted(
        "no room for a {}-byte block yet: blocks are on their way down to NVMe to make it; "
        "retry",
        block_bytes);
  }
  // No tier below can take them: drop the coldest blocks, from the slowest tier that
  // has any to give (RAM may hold only blocks in flight while HBM holds cold ones). A
  // Save never takes the top tier from blocks sessions hold when a tier below it takes
  // Saves (a Save that evicted them would cost those sessions their next turn for
  // blocks that may never be read): it stores the prefix that fits.
  bool held_refused = false;
  for (auto it = save_tiers.rbegin(); it != save_tiers.rend(); ++it) {
    const Tier victim_tier = *it;
    const policy::Room rule = victim_tier == save_tiers.front() && save_tiers.size() > 1
                                  ? policy::Room::kEvictUnheld
                                  : policy::Room::kEvict;
    auto moves = ctx_.planner.make_room(victim_tier, std::max(room_bytes, block_bytes),
                                        ctx_.sessions, *ctx_.view, rule);
    if (moves.empty() && room_bytes > block_bytes) {
      moves = ctx_.planner.make_room(victim_tier, block_bytes, ctx_.sessions, *ctx_.view, rule);
    }
    if (moves.empty() && rule == policy::Room::kEvictUnheld) {
      // Were there blocks the old rule would have evicted (movable, held)? Then the
      // room is not coming: the Save keeps a prefix. (Asked of the view, not the
      // planner: a plan would be recorded among its recent moves.)
      ctx_.view->for_each_in_tier(
          victim_tier, [&](const BlockKey&, const policy::PlacementView::BlockPlacement& p) {
            if (p.movable && p.session_refs > 0) held_refused = true;
          });
    }
    if (moves.empty()) continue;
    ctx_.mover->apply(moves);
    return ctx_.store->reserve(key, save_tiers, now_ms(), gpu_part);
  }
  const std::string full = describe_save_tiers();
  if (held_refused && !busy_blocks_in_save_tiers()) {
    // Not retryable: waiting would not free it (SavePath stores the prefix before it).
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("no room for a {}-byte block: {}", block_bytes, full),
                  /*retryable=*/false);
  }
  // Blocks being copied, read or pinned by requests in flight: room comes when they
  // are done (SavePath waits, within save-room-wait-ms).
  return resource_exhausted("no room for a {}-byte block yet: {}; retry", block_bytes, full);
}

Placement::DemotionRoom Placement::plan_room_past_landing(uint64_t wanted_bytes,
                                                          uint64_t least_bytes) {
  DemotionRoom room;
  const Tier landing = ctx_.topology.landing();
  const Tier durable = ctx_.topology.below(landing);
  if (durable == Tier::kNone || !TierTopology::traits(durable).durable ||
      !ctx_.mover->accepts_writes(durable)) {
    return room;
  }
  for (Tier tier : ctx_.topology.engine_facing()) {
    if (tier == landing) break;
    room.moves = ctx_.planner.make_room(tier, wanted_bytes, ctx_.sessions, *ctx_.view,
                                        policy::Room::kDemoteToDurable);
    if (room.moves.empty() && wanted_bytes > least_bytes) {
      room.moves = ctx_.planner.make_room(tier, least_bytes, ctx_.sessions, *ctx_.view,
                                          policy::Room::kDemoteToDurable);
    }
    if (!room.moves.empty()) return room;
  }
  return room;
}

bool Placement::room_on_its_way() const {
  for (Tier tier : ctx_.topology.engine_facing()) {
    if (ctx_.store->moving_out_bytes(tier) > 0) return true;
  }
  const Tier durable = ctx_.topology.below(ctx_.topology.landing());
  return durable != Tier::kNone && ctx_.store->unconfirmed_release_bytes(durable) > 0;
}

bool Placement::busy_blocks_in_save_tiers() const {
  for (Tier tier : ctx_.topology.engine_facing()) {
    bool busy = false;
    uint64_t listed_bytes = 0;
    ctx_.view->for_each_in_tier(
        tier, [&](const BlockKey&, const policy::PlacementView::BlockPlacement& p) {
          listed_bytes += p.bytes;
          if (!p.movable) busy = true;
        });
    // Slots not listed are blocks being written (a Save's, a read's) or moving in.
    const TierUsage usage = ctx_.store->usage(tier);
    if (busy || listed_bytes + usage.copy_bytes < usage.used_bytes) return true;
  }
  return false;
}

std::string Placement::describe_save_tiers() const {
  std::string out;
  for (Tier tier : ctx_.topology.engine_facing()) {
    uint64_t blocks = 0, held = 0, busy = 0;
    ctx_.view->for_each_in_tier(
        tier, [&](const BlockKey&, const policy::PlacementView::BlockPlacement& p) {
          ++blocks;
          if (!p.movable) {
            ++busy;
          } else if (p.session_refs > 0) {
            ++held;
          }
        });
    out += fmt::format(
        "{}{} is full ({} blocks: {} held by sessions, {} being copied, read or "
        "pinned by requests in flight)",
        out.empty() ? "" : "; ", tier_name(tier), blocks, held, busy);
  }
  const Tier durable = ctx_.topology.below(ctx_.topology.landing());
  if (durable == Tier::kNone) {
    out += "; no NVMe tier to demote to";
  } else if (!ctx_.mover->accepts_writes(durable)) {
    out += fmt::format("; {} takes no writes now (paused after a failure, or degraded)",
                       tier_name(durable));
  }
  return out;
}

Placement::DemotionRoom Placement::plan_room_by_demotion(Tier tier, uint64_t wanted_bytes,
                                                         uint64_t least_bytes, policy::Room rule) {
  DemotionRoom room;
  // Demotion that makes room at once is the landing tier's, onto a durable tier below
  // (RAM → NVMe); elsewhere the caller evicts.
  const Tier below = ctx_.topology.below(tier);
  if (tier != ctx_.topology.landing() || below == Tier::kNone ||
      !TierTopology::traits(below).durable) {
    return room;
  }
  // Writes paused after a failure, or a degraded tier below, would refuse the demotions:
  // the caller evicts.
  if (!ctx_.mover->accepts_writes(below)) return room;
  // Blocks already moving out of the tier free their slots when they land: wait for that
  // room instead of making more (every retry would otherwise demote again).
  const uint64_t coming = ctx_.store->moving_out_bytes(tier);
  if (coming >= least_bytes) {
    room.coming = true;
    return room;
  }
  room.moves = ctx_.planner.make_room(tier, wanted_bytes - std::min(wanted_bytes, coming),
                                      ctx_.sessions, *ctx_.view, rule);
  if (room.moves.empty() && wanted_bytes > least_bytes) {
    room.moves =
        ctx_.planner.make_room(tier, least_bytes - coming, ctx_.sessions, *ctx_.view, rule);
  }
  // Nothing can go down now, but blocks are arriving in RAM (reads, promotions): they
  // can once they land. Wait for them rather than evict.
  if (room.moves.empty() && ctx_.store->moving_in_bytes(tier) > 0) room.coming = true;
  return room;
}

void Placement::plan_soon() {
  // Saves finishing together share one plan, run after their replies are sent.
  if (plan_posted_ || ctx_.stopping) return;
  plan_posted_ = true;
  asio::post(ctx_.io, [this] {
    assert_control_thread();
    plan_posted_ = false;
    run_planner(policy::Planner::PlanKind::kAfterSave);
  });
}

std::vector<policy::Move> Placement::room_by_demotion(Tier tier, uint64_t bytes) {
  ctx_.sessions.expire_priorities(ctx_.sessions.now_ms());
  // A read out of NVMe into RAM: RAM's coldest blocks go down, as for a Save; the read
  // waits for the room (the executor retries its room waiters as moves settle). A
  // full NVMe evicts nothing for it: that could be a block being read.
  DemotionRoom room = plan_room_by_demotion(tier, bytes, bytes, policy::Room::kDemote);
  if (room.coming) return {};
  if (!room.moves.empty()) return std::move(room.moves);
  return ctx_.planner.make_room(tier, bytes, ctx_.sessions, *ctx_.view);
}

void Placement::run_planner(policy::Planner::PlanKind kind) {
  if (ctx_.stopping || ctx_.store == nullptr) return;
  ctx_.sessions.expire_priorities(ctx_.sessions.now_ms());
  ctx_.mover->apply(ctx_.planner.plan_demotions(ctx_.sessions, *ctx_.view, kind));
  for (const std::function<void()>& then : after_each_plan_) then();
  // The period is kept whatever Saves do: a stream of them does not postpone it.
  if (kind != policy::Planner::PlanKind::kPeriodic) return;
  plan_timer_.expires_after(std::chrono::milliseconds(ctx_.config.plan_interval_ms));
  plan_timer_.async_wait([this](const boost::system::error_code& ec) {
    assert_control_thread();
    if (!ec) run_planner(policy::Planner::PlanKind::kPeriodic);
  });
}

void Placement::on_blocks_removed(const std::vector<BlockKey>& keys, bool lost) {
  KeySet removed(keys.begin(), keys.end());
  if (lost) KVTIER_LOG_WARN("{} blocks dropped: their bytes were lost", keys.size());
  cut_sessions_at(removed, ctx_.sessions);  // the table's observers hear of each cut
}

}  // namespace kvtier::daemon
