// AdminService: Stats, ListSessions and the SessionInfo they and GetSession share —
// read-only views for kvtierctl and engines (admin_service.h).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <string_view>
#include <tuple>

#include "daemon/admin_service.h"
#include "daemon/placement.h"
#include "daemon/remote_path.h"
#include "daemon/session_journal.h"
#include "daemon/startup_gate.h"
#include "schema/wire_tier.h"

namespace kvtier::daemon {
namespace {

constexpr uint32_t kDefaultListingPage = 1000;
constexpr uint32_t kMaxListingPage = 10000;

// A session's place in a listing: ascending by `key` (idle order: when it was last
// active; bytes order: UINT64_MAX minus its referenced bytes, so the most come first),
// then by namespace and id, which make the order total.
struct ListingKey {
  uint64_t key = 0;
  uint32_t namespace_id = 0;
  std::string_view id;
  friend bool operator<(const ListingKey& a, const ListingKey& b) {
    return std::tie(a.key, a.namespace_id, a.id) < std::tie(b.key, b.namespace_id, b.id);
  }
};

// The cursor a page's `next` carries: the order, then its last session's key
// (8 + 4 bytes, little-endian) and id.
std::string encode_cursor(wire::SessionOrder order, const ListingKey& last) {
  std::string out(1 + 8 + 4, '\0');
  out[0] = static_cast<char>(order);
  for (int i = 0; i < 8; ++i) out[1 + i] = static_cast<char>(last.key >> (8 * i));
  for (int i = 0; i < 4; ++i) out[9 + i] = static_cast<char>(last.namespace_id >> (8 * i));
  out.append(last.id);
  return out;
}

// The key a cursor names (its id points into `cursor`); InvalidArgument when it is not a
// cursor of a listing in `order`.
Result<ListingKey> decode_cursor(wire::SessionOrder order, const std::string& cursor) {
  if (cursor.size() < 13 || cursor[0] != static_cast<char>(order)) {
    return invalid_argument(
        "ListSessions.after: not the `next` of an earlier page in this order (start again "
        "with an empty `after`)");
  }
  ListingKey key;
  for (int i = 0; i < 8; ++i) key.key |= uint64_t{static_cast<uint8_t>(cursor[1 + i])} << (8 * i);
  for (int i = 0; i < 4; ++i) {
    key.namespace_id |= uint32_t{static_cast<uint8_t>(cursor[9 + i])} << (8 * i);
  }
  key.id = std::string_view(cursor).substr(13);
  return key;
}

}  // namespace

Status AdminService::handle_stats(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                                  bool all_namespaces) {
  if (all_namespaces && !engine.is_admin) {
    return permission_denied("stats of all namespaces need uid 0 or the admin group");
  }
  auto tiers = ctx_.store->usage();
  // Admins see every namespace's sessions counted; engines see their own.
  const bool every_namespace = all_namespaces || engine.is_admin;
  const uint64_t active =
      every_namespace ? ctx_.sessions.count(policy::SessionState::kActive)
                      : ctx_.sessions.count(engine.namespace_id, policy::SessionState::kActive);
  const uint64_t idle = every_namespace
                            ? ctx_.sessions.count(policy::SessionState::kIdle)
                            : ctx_.sessions.count(engine.namespace_id, policy::SessionState::kIdle);
  reply(c, id, [&](wire::Response::Builder response) {
    auto out = response.initStats();
    auto list = out.initTiers(static_cast<unsigned>(tiers.size()));
    for (size_t i = 0; i < tiers.size(); ++i) {
      list[i].setTier(to_wire(tiers[i].tier));
      list[i].setCapacityBytes(tiers[i].capacity_bytes);
      list[i].setUsedBytes(tiers[i].used_bytes);
      list[i].setBlocks(tiers[i].blocks);
      list[i].setCopyBytes(tiers[i].copy_bytes);
      list[i].setWrittenBytes(
          ctx_.mover->counters().bytes_written[static_cast<size_t>(tiers[i].tier)]);
    }
    out.setSessionsActive(active);
    out.setSessionsIdle(idle);
    out.setLookupHits(ctx_.counters.lookup_hits);
    out.setLookupMisses(ctx_.counters.lookup_misses);
    out.setBytesSaved(ctx_.counters.bytes_saved);
    out.setBytesLoaded(ctx_.counters.bytes_loaded);
    out.setBytesDemoted(ctx_.mover->counters().bytes_demoted);
    out.setBytesPromoted(ctx_.mover->counters().bytes_promoted);
    out.setPinnedBlocks(copy_pinned_blocks());
    out.setAdminPinnedBlocks(admin_pinned_blocks());
    out.setPinnedSessions(static_cast<uint32_t>(admin_pins_.size()));
    out.setCopiesInFlight(ctx_.counters.copies_in_flight + ctx_.mover->tier_jobs());
    out.setConnections(ctx_.server ? static_cast<uint32_t>(ctx_.server->connection_count()) : 0);
    out.setBlocksEvicted(ctx_.mover->counters().blocks_evicted);
    out.setDataLossBlocks(ctx_.mover->counters().blocks_lost);
    out.setDeviceName(std::string(ctx_.device->name()));
    out.setUptimeMs(now_ms() - ctx_.started_ms);
    out.setStarting(!ctx_.ready);
    if (!ctx_.ready) out.setFillBytes(ctx_.parts.startup->fill_bytes());
    out.setPolicy(std::string(policy::policy_mode_name(ctx_.planner.config().mode)));
    // The arena's parts follow Device::gpus() order.
    const std::vector<uint64_t> hbm_parts = ctx_.store->part_used_bytes(Tier::kHbm);
    auto gpus = out.initGpus(static_cast<unsigned>(ctx_.gpus.size()));
    for (unsigned i = 0; i < ctx_.gpus.size(); ++i) {
      gpus[i].setUuid(ctx_.gpus[i].uuid);
      gpus[i].setName(ctx_.gpus[i].name);
      const bool has_part = hbm_parts.size() == ctx_.gpus.size();
      gpus[i].setHbmCapacityBytes(has_part ? ctx_.store->part_capacity_bytes(Tier::kHbm) : 0);
      gpus[i].setHbmUsedBytes(has_part ? hbm_parts[i] : 0);
    }
    ctx_.parts.remote->fill_remote_stats(out.initRemote());
    std::vector<TenantUsage> tenants = tenant_usage(ctx_);
    if (!every_namespace) {
      std::erase_if(tenants,
                    [&](const TenantUsage& t) { return t.namespace_id != engine.namespace_id; });
    }
    auto tenant_list = out.initTenants(static_cast<unsigned>(tenants.size()));
    for (unsigned i = 0; i < tenants.size(); ++i) {
      tenant_list[i].setTenant(tenants[i].tenant);
      auto used = tenant_list[i].initUsedBytes(kLocalTierCount);
      auto quota = tenant_list[i].initQuotaBytes(kLocalTierCount);
      for (unsigned t = 0; t < static_cast<unsigned>(kLocalTierCount); ++t) {
        used.set(t, tenants[i].used_bytes[t]);
        quota.set(t, tenants[i].quota_bytes[t].value_or(UINT64_MAX));
      }
    }
    if (const NvmeTier* nvme = ctx_.parts.journal->tier()) {
      const NvmeHealth health = nvme->health();
      auto stats = out.initNvme();
      stats.setConfigured(true);
      stats.setDegraded(health.degraded);
      if (health.degraded) stats.setReason(health.reason.message());
      stats.setDegradedMs(health.degraded_ms);
      stats.setDegradations(health.degradations);
      stats.setHeals(health.heals);
      stats.setHealAttempts(health.heal_attempts);
    }
    const auto& recent = ctx_.planner.recent_moves();
    auto moves = out.initRecentMoves(static_cast<unsigned>(recent.size()));
    const uint64_t now = now_ms();
    for (size_t i = 0; i < recent.size(); ++i) {
      const policy::PlanRecord& r = recent[i];
      auto move = moves[static_cast<unsigned>(i)];
      move.setAgoMs(now > r.at_ms ? now - r.at_ms : 0);
      move.setKind(static_cast<wire::MoveKind>(static_cast<uint16_t>(r.kind)));
      move.setFromTier(to_wire(r.from));
      move.setToTier(to_wire(r.to));
      move.setReason(std::string(policy::move_reason_name(r.reason)));
      move.setBlocks(r.blocks);
      move.setBytes(r.bytes);
    }
  });
  return Status::ok();
}

Status AdminService::handle_list_sessions(const ConnectionPtr& c, EngineContext& engine,
                                          uint64_t id, const ListSessionsRequest& request) {
  if (request.all_namespaces && !engine.is_admin) {
    return permission_denied("listing all namespaces' sessions needs uid 0 or the admin group");
  }
  if (request.order != wire::SessionOrder::IDLE && request.order != wire::SessionOrder::BYTES) {
    return invalid_argument("ListSessions.sortBy: unknown order {}",
                            static_cast<unsigned>(request.order));
  }
  std::optional<ListingKey> after;
  if (!request.after.empty()) {
    auto decoded = decode_cursor(request.order, request.after);
    if (!decoded.is_ok()) return decoded.status();
    after = *decoded;
  }
  const uint32_t limit =
      request.limit == 0 ? kDefaultListingPage : std::min(request.limit, kMaxListingPage);
  // One pass over the table for the sessions after the cursor; only the page is sorted
  // and described (the costly part: a lookup per block, the return predictor).
  struct Listed {
    ListingKey key;
    const policy::Session* session;
  };
  // The page is the `limit` smallest keys after the cursor, kept in a max-heap while
  // walking (most sessions lose against its top at once); `more` says one was left out.
  const auto by_key = [](const Listed& a, const Listed& b) { return a.key < b.key; };
  std::vector<Listed> rest;
  rest.reserve(std::min<size_t>(limit, ctx_.sessions.size()) + 1);
  bool more = false;
  uint32_t total = 0;
  ctx_.sessions.for_each([&](const policy::Session& session) {
    if (!request.all_namespaces && session.namespace_id != engine.namespace_id) return;
    ++total;
    ListingKey key{session.last_active_ms, session.namespace_id, session.id};
    if (request.order == wire::SessionOrder::BYTES) {
      key.key = UINT64_MAX - session.blocks.size() * ctx_.store->block_bytes(session.layout);
    }
    if (after && !(*after < key)) return;
    if (rest.size() == limit) {
      more = true;
      if (!(key < rest.front().key)) return;
      std::pop_heap(rest.begin(), rest.end(), by_key);
      rest.back() = {key, &session};
    } else {
      rest.push_back({key, &session});
    }
    std::push_heap(rest.begin(), rest.end(), by_key);
  });
  std::sort_heap(rest.begin(), rest.end(), by_key);
  const policy::ReturnPredictor predictor = ctx_.planner.return_predictor(ctx_.sessions);
  reply(c, id, [&](wire::Response::Builder response) {
    auto out = response.initListSessions();
    auto list = out.initSessions(static_cast<unsigned>(rest.size()));
    for (size_t i = 0; i < rest.size(); ++i)
      fill_session_info(*rest[i].session, list[i], predictor);
    if (more) {
      const std::string next = encode_cursor(request.order, rest.back().key);
      out.setNext(
          capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(next.data()), next.size()));
    }
    out.setTotal(total);
  });
  return Status::ok();
}

void AdminService::fill_session_info(const policy::Session& session,
                                     wire::SessionInfo::Builder out) const {
  fill_session_info(session, out, ctx_.planner.return_predictor(ctx_.sessions));
}

void AdminService::fill_session_info(const policy::Session& session, wire::SessionInfo::Builder out,
                                     const policy::ReturnPredictor& predictor) const {
  out.setSessionId(session.id);
  out.setNamespaceName(ctx_.engines.namespaces().name(session.namespace_id));
  bool active = session.state == policy::SessionState::kActive;
  out.setState(active ? wire::SessionState::ACTIVE : wire::SessionState::IDLE);
  out.setIdleMs(active ? 0 : now_ms() - session.last_active_ms);
  out.setTurns(session.turns);
  out.setBlocks(static_cast<uint32_t>(session.blocks.size()));
  out.setLayoutDigest(session.layout.layout_digest);
  // Indexed by the wire's numbering: hbm, ram, nvme, none.
  const auto none = static_cast<size_t>(wire::Tier::NONE);
  std::array<uint32_t, none + 1> per_tier{};
  for (const BlockHash& hash : session.blocks) {
    auto info = ctx_.store->lookup({session.layout, hash});
    per_tier[info ? static_cast<size_t>(to_wire(info->location.tier)) : none] += 1;
  }
  auto tiers = out.initBlocksPerTier(static_cast<unsigned>(per_tier.size()));
  for (unsigned t = 0; t < per_tier.size(); ++t) tiers.set(t, per_tier[t]);
  const uint64_t held = session.blocks.size() - per_tier[none];
  out.setBytes(held * ctx_.store->block_bytes(session.layout));
  out.setPinned(admin_pins_.count({session.namespace_id, session.id}) != 0);
  out.setReturnProbability(predictor.probability_ever(session));
  const double return_in = predictor.median_return_in_ms(session);
  out.setReturnInMs(std::isfinite(return_in) ? static_cast<uint64_t>(return_in) : UINT64_MAX);
  out.setPriority(session.priority);
  const uint64_t now = now_ms();
  out.setPriorityRemainingMs(session.priority_until_ms == 0    ? 0
                             : session.priority_until_ms > now ? session.priority_until_ms - now
                                                               : 1);
}

}  // namespace kvtier::daemon
