// AdminService: Stats, ListSessions and the SessionInfo they and GetSession share —
// read-only views for kvtierctl and engines (admin_service.h).
#include <capnp/message.h>
#include <capnp/orphan.h>
#include <boost/asio/post.hpp>

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
#include "daemon/replies.h"
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

// One entry per configured tier, with what the policy's moves wrote into it.
void fill_tier_stats(wire::StatsReply::Builder out, const std::vector<TierUsage>& tiers,
                     const DaemonContext& ctx) KVTIER_REQUIRES(control_thread) {
  auto list = out.initTiers(static_cast<unsigned>(tiers.size()));
  for (size_t i = 0; i < tiers.size(); ++i) {
    list[i].setTier(to_wire(tiers[i].tier));
    list[i].setCapacityBytes(tiers[i].capacity_bytes);
    list[i].setUsedBytes(tiers[i].used_bytes);
    list[i].setBlocks(tiers[i].blocks);
    list[i].setCopyBytes(tiers[i].copy_bytes);
    list[i].setWrittenBytes(
        ctx.mover->counters().bytes_written[static_cast<size_t>(tiers[i].tier)]);
  }
}

// Each served GPU's part of the HBM arena.
void fill_gpu_stats(wire::StatsReply::Builder out, const DaemonContext& ctx)
    KVTIER_REQUIRES(control_thread) {
  // The arena's parts follow Device::gpus() order.
  const std::vector<uint64_t> hbm_parts = ctx.store->part_used_bytes(Tier::kHbm);
  auto gpus = out.initGpus(static_cast<unsigned>(ctx.gpus.size()));
  for (unsigned i = 0; i < ctx.gpus.size(); ++i) {
    gpus[i].setUuid(ctx.gpus[i].uuid);
    gpus[i].setName(ctx.gpus[i].name);
    const bool has_part = hbm_parts.size() == ctx.gpus.size();
    gpus[i].setHbmCapacityBytes(has_part ? ctx.store->part_capacity_bytes(Tier::kHbm) : 0);
    gpus[i].setHbmUsedBytes(has_part ? hbm_parts[i] : 0);
  }
}

// What each tenant holds of each tier, and its quota there; only `namespace_id`'s unless
// `every_namespace`.
void fill_tenant_stats(wire::StatsReply::Builder out, std::vector<TenantUsage> tenants,
                       bool every_namespace, uint32_t namespace_id) {
  if (!every_namespace) {
    std::erase_if(tenants, [&](const TenantUsage& t) { return t.namespace_id != namespace_id; });
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
}

// The engines that said Hello; only those of `namespace_id` unless `every_namespace`.
void fill_engine_stats(wire::StatsReply::Builder out,
                       std::vector<std::shared_ptr<const EngineContext>> engines,
                       bool every_namespace, uint32_t namespace_id) {
  if (!every_namespace) {
    std::erase_if(engines, [&](const std::shared_ptr<const EngineContext>& e) {
      return e->namespace_id != namespace_id;
    });
  }
  auto engine_list = out.initEngines(static_cast<unsigned>(engines.size()));
  for (unsigned i = 0; i < engines.size(); ++i) {
    const EngineContext& e = *engines[i];
    engine_list[i].setEngineName(e.engine_name);
    engine_list[i].setPid(static_cast<uint32_t>(e.pid));
    engine_list[i].setNamespaceName(e.namespace_name);
    engine_list[i].setModelId(e.layout.model_id);
    engine_list[i].setLayoutDigest(e.layout.digest);
    engine_list[i].setTpRank(e.layout.tp_rank);
    engine_list[i].setTpSize(e.layout.tp_size);
    engine_list[i].setDataPath(e.data_path);
  }
}

// The NVMe tier's health.
void fill_nvme_stats(wire::StatsReply::Builder out, const NvmeTier& nvme) {
  const NvmeHealth health = nvme.health();
  auto stats = out.initNvme();
  stats.setConfigured(true);
  stats.setDegraded(health.degraded);
  if (health.degraded) stats.setReason(health.reason.message());
  stats.setDegradedMs(health.degraded_ms);
  stats.setDegradations(health.degradations);
  stats.setHeals(health.heals);
  stats.setHealAttempts(health.heal_attempts);
}

// The planner's latest decisions, oldest first, each with how long ago it was made.
void fill_recent_moves(wire::StatsReply::Builder out, const DaemonContext& ctx)
    KVTIER_REQUIRES(control_thread) {
  const auto& recent = ctx.planner.recent_moves();
  auto moves = out.initRecentMoves(static_cast<unsigned>(recent.size()));
  const uint64_t now = ctx.now_ms();
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
    assert_control_thread();
    auto out = response.initStats();
    fill_tier_stats(out, tiers, ctx_);
    out.setSessionsActive(active);
    out.setSessionsIdle(idle);
    out.setLookupHits(ctx_.counters.lookup_hits);
    out.setLookupMisses(ctx_.counters.lookup_misses);
    out.setBytesSaved(ctx_.counters.bytes_saved);
    out.setPartialSaves(ctx_.counters.partial_saves);
    out.setBlocksNotSaved(ctx_.counters.blocks_not_saved);
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
    if (!ctx_.ready) out.setFillBytes(startup_.fill_bytes());
    out.setPolicy(std::string(policy::policy_mode_name(ctx_.planner.config().mode)));
    fill_gpu_stats(out, ctx_);
    remote_.fill_remote_stats(out.initRemote());
    fill_tenant_stats(out, tenant_usage(ctx_), every_namespace, engine.namespace_id);
    fill_engine_stats(out, ctx_.engines.introduced(), every_namespace, engine.namespace_id);
    if (const NvmeTier* nvme = journal_.tier()) fill_nvme_stats(out, *nvme);
    fill_recent_moves(out, ctx_);
  });
  return Status::ok();
}

// A page being listed, in three phases a slice at a time: the walk for the page (a
// bounded max-heap of the `limit` smallest keys after the cursor; ids owned, since a
// session may close between slices), the heap's sort, and the descriptions, written
// straight into the reply.
struct AdminService::Listing {
  ConnectionPtr connection;
  uint64_t id = 0;
  uint32_t namespace_id = 0;
  bool all_namespaces = false;
  wire::SessionOrder order = wire::SessionOrder::IDLE;
  std::optional<ListingKey> after;
  std::string after_bytes;  // what `after.id` points into
  uint32_t limit = 0;

  struct Entry {
    uint64_t key;
    uint32_t namespace_id;
    std::string session_id;
    ListingKey listing_key() const { return {key, namespace_id, session_id}; }
  };
  policy::SessionTable::WalkCursor walk;
  std::vector<Entry> page;  // a max-heap while walking, then sorted
  bool more = false;
  uint32_t total = 0;
  enum class Phase : uint8_t { kWalk, kSort, kDescribe };
  Phase phase = Phase::kWalk;
  size_t unsorted = 0;  // kSort: the heap's entries not yet sorted

  capnp::MallocMessageBuilder reply;  // the Response, built as the page is described
  capnp::Orphan<capnp::List<wire::SessionInfo>> sessions;  // its list, until adopted
  size_t next_to_describe = 0;
  unsigned described = 0;  // entries filled (a session closed since the walk is left out)
  std::optional<policy::ReturnPredictor> predictor;
};

Status AdminService::handle_list_sessions(const ConnectionPtr& c, EngineContext& engine,
                                          uint64_t id, const ListSessionsRequest& request) {
  if (request.all_namespaces && !engine.is_admin) {
    return permission_denied("listing all namespaces' sessions needs uid 0 or the admin group");
  }
  if (request.order != wire::SessionOrder::IDLE && request.order != wire::SessionOrder::BYTES) {
    return invalid_argument("ListSessions.sortBy: unknown order {}",
                            static_cast<unsigned>(request.order));
  }
  auto listing = std::make_shared<Listing>();
  listing->connection = c;
  listing->id = id;
  listing->namespace_id = engine.namespace_id;
  listing->all_namespaces = request.all_namespaces;
  listing->order = request.order;
  if (!request.after.empty()) {
    listing->after_bytes = request.after;
    auto decoded = decode_cursor(request.order, listing->after_bytes);
    if (!decoded.is_ok()) return decoded.status();
    listing->after = *decoded;
  }
  listing->limit =
      request.limit == 0 ? kDefaultListingPage : std::min(request.limit, kMaxListingPage);
  listing->walk = ctx_.sessions.walk_start();
  listing->page.reserve(std::min<size_t>(listing->limit, ctx_.sessions.size()) + 1);
  continue_listing(listing);
  return Status::ok();
}

void AdminService::continue_listing(const std::shared_ptr<Listing>& listing) {
  Listing& l = *listing;
  if (ctx_.stopping || !l.connection->is_open()) return;
  const auto by_key = [](const Listing::Entry& a, const Listing::Entry& b) {
    return a.listing_key() < b.listing_key();
  };
  if (l.phase == Listing::Phase::kWalk) {
    if (ctx_.sessions.walk_stale(l.walk)) {
      // The table grew since the walk began: it would visit some sessions twice.
      l.walk = ctx_.sessions.walk_start();
      l.page.clear();
      l.more = false;
      l.total = 0;
    }
    l.walk = ctx_.sessions.walk_some(l.walk, kListingWalkSlice, [&](const policy::Session& s) {
      assert_control_thread();
      if (!l.all_namespaces && s.namespace_id != l.namespace_id) return;
      ++l.total;
      ListingKey key{s.last_active_ms, s.namespace_id, s.id};
      if (l.order == wire::SessionOrder::BYTES) {
        key.key = UINT64_MAX - s.blocks.size() * ctx_.store->block_bytes(s.layout);
      }
      if (l.after && !(*l.after < key)) return;
      if (l.page.size() == l.limit) {
        l.more = true;
        if (!(key < l.page.front().listing_key())) return;
        std::pop_heap(l.page.begin(), l.page.end(), by_key);
        l.page.back() = {key.key, key.namespace_id, s.id};
      } else {
        l.page.push_back({key.key, key.namespace_id, s.id});
      }
      std::push_heap(l.page.begin(), l.page.end(), by_key);
    });
    if (ctx_.sessions.walk_done(l.walk)) {
      l.phase = Listing::Phase::kSort;
      l.unsorted = l.page.size();
    }
    asio::post(ctx_.io, [this, listing] {
      assert_control_thread();
      continue_listing(listing);
    });
    return;
  }
  if (l.phase == Listing::Phase::kSort) {
    // The heap's sort, a slice of pops at a time (each puts the largest left at the end).
    for (size_t n = 0; n < kListingWalkSlice && l.unsorted > 0; ++n, --l.unsorted) {
      std::pop_heap(l.page.begin(), l.page.begin() + static_cast<ptrdiff_t>(l.unsorted), by_key);
    }
    if (l.unsorted == 0) {
      l.phase = Listing::Phase::kDescribe;
      l.sessions = l.reply.getOrphanage().newOrphan<capnp::List<wire::SessionInfo>>(
          static_cast<unsigned>(l.page.size()));
      l.predictor.emplace(ctx_.planner.return_predictor(ctx_.sessions));
    }
    asio::post(ctx_.io, [this, listing] {
      assert_control_thread();
      continue_listing(listing);
    });
    return;
  }
  auto sessions = l.sessions.get();
  const size_t end = std::min(l.page.size(), l.next_to_describe + kListingDescribeSlice);
  for (; l.next_to_describe < end; ++l.next_to_describe) {
    const Listing::Entry& entry = l.page[l.next_to_describe];
    const policy::Session* session = ctx_.sessions.find(entry.namespace_id, entry.session_id);
    if (session == nullptr) continue;  // closed since the walk
    fill_session_info(*session, sessions[l.described++], *l.predictor);
  }
  if (l.next_to_describe < l.page.size()) {
    asio::post(ctx_.io, [this, listing] {
      assert_control_thread();
      continue_listing(listing);
    });
    return;
  }
  if (l.described < l.page.size()) l.sessions.truncate(l.described);
  auto out = l.reply.initRoot<wire::Response>().initListSessions();
  out.adoptSessions(kj::mv(l.sessions));
  if (l.more && !l.page.empty()) {
    const std::string next = encode_cursor(l.order, l.page.back().listing_key());
    out.setNext(
        capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(next.data()), next.size()));
  }
  out.setTotal(l.total);
  replies_.send_built(l.reply, l.connection, l.id);
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
