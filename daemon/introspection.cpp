// Stats, ListSessions and the SessionInfo they and GetSession share: read-only views for
// kvtierctl and engines.
#include <algorithm>
#include <cmath>

#include "daemon/service.h"
#include "daemon/startup.h"

namespace kvtier::daemon {

Status Service::handle_stats(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                             bool all_namespaces) {
  if (all_namespaces && !engine.is_admin) {
    return permission_denied("stats of all namespaces need uid 0 or the admin group");
  }
  auto tiers = store_->usage();
  // Admins see every namespace's sessions counted; engines see their own.
  const bool every_namespace = all_namespaces || engine.is_admin;
  const uint64_t active = every_namespace
                              ? sessions_.count(policy::SessionState::kActive)
                              : sessions_.count(engine.namespace_id, policy::SessionState::kActive);
  const uint64_t idle = every_namespace
                            ? sessions_.count(policy::SessionState::kIdle)
                            : sessions_.count(engine.namespace_id, policy::SessionState::kIdle);
  reply(c, id, [&](wire::Response::Builder response) {
    auto out = response.initStats();
    auto list = out.initTiers(static_cast<unsigned>(tiers.size()));
    for (size_t i = 0; i < tiers.size(); ++i) {
      list[i].setTier(static_cast<wire::Tier>(tiers[i].tier));
      list[i].setCapacityBytes(tiers[i].capacity_bytes);
      list[i].setUsedBytes(tiers[i].used_bytes);
      list[i].setBlocks(tiers[i].blocks);
      list[i].setCopyBytes(tiers[i].copy_bytes);
      list[i].setWrittenBytes(mover_->counters().bytes_written[static_cast<size_t>(tiers[i].tier)]);
    }
    out.setSessionsActive(active);
    out.setSessionsIdle(idle);
    out.setLookupHits(counters_.lookup_hits);
    out.setLookupMisses(counters_.lookup_misses);
    out.setBytesSaved(counters_.bytes_saved);
    out.setBytesLoaded(counters_.bytes_loaded);
    out.setBytesDemoted(mover_->counters().bytes_demoted);
    out.setBytesPromoted(mover_->counters().bytes_promoted);
    out.setPinnedBlocks(copy_pinned_blocks());
    out.setAdminPinnedBlocks(admin_pinned_blocks());
    out.setPinnedSessions(static_cast<uint32_t>(admin_pins_.size()));
    out.setCopiesInFlight(counters_.copies_in_flight + mover_->tier_jobs());
    out.setConnections(server_ ? static_cast<uint32_t>(server_->connection_count()) : 0);
    out.setBlocksEvicted(mover_->counters().blocks_evicted);
    out.setDataLossBlocks(mover_->counters().blocks_lost);
    out.setDeviceName(std::string(device_->name()));
    out.setUptimeMs(now_ms() - started_ms_);
    out.setStarting(!ready_);
    if (!ready_) out.setFillBytes(startup_->fill_bytes);
    out.setPolicy(std::string(policy::policy_mode_name(planner_.config().mode)));
    // The arena's parts follow Device::gpus() order.
    const std::vector<uint64_t> hbm_parts = store_->part_used_bytes(Tier::kHbm);
    auto gpus = out.initGpus(static_cast<unsigned>(gpus_.size()));
    for (unsigned i = 0; i < gpus_.size(); ++i) {
      gpus[i].setUuid(gpus_[i].uuid);
      gpus[i].setName(gpus_[i].name);
      const bool has_part = hbm_parts.size() == gpus_.size();
      gpus[i].setHbmCapacityBytes(has_part ? store_->part_capacity_bytes(Tier::kHbm) : 0);
      gpus[i].setHbmUsedBytes(has_part ? hbm_parts[i] : 0);
    }
    fill_remote_stats(out.initRemote());
    const auto& recent = planner_.recent_moves();
    auto moves = out.initRecentMoves(static_cast<unsigned>(recent.size()));
    const uint64_t now = now_ms();
    for (size_t i = 0; i < recent.size(); ++i) {
      const policy::PlanRecord& r = recent[i];
      auto move = moves[static_cast<unsigned>(i)];
      move.setAgoMs(now > r.at_ms ? now - r.at_ms : 0);
      move.setKind(static_cast<wire::MoveKind>(static_cast<uint16_t>(r.kind)));
      move.setFromTier(static_cast<wire::Tier>(r.from));
      move.setToTier(static_cast<wire::Tier>(r.to));
      move.setReason(std::string(policy::move_reason_name(r.reason)));
      move.setBlocks(r.blocks);
      move.setBytes(r.bytes);
    }
  });
  return Status::ok();
}

Status Service::handle_list_sessions(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                                     bool all_namespaces) {
  if (all_namespaces && !engine.is_admin) {
    return permission_denied("listing all namespaces' sessions needs uid 0 or the admin group");
  }
  std::vector<const policy::Session*> visible;
  sessions_.for_each([&](const policy::Session& session) {
    if (all_namespaces || session.namespace_id == engine.namespace_id) visible.push_back(&session);
  });
  // Longest idle first: what an operator looks at.
  std::sort(visible.begin(), visible.end(), [](const auto* a, const auto* b) {
    return a->last_active_ms != b->last_active_ms ? a->last_active_ms < b->last_active_ms
                                                  : a->id < b->id;
  });
  const policy::ReturnPredictor predictor = planner_.return_predictor(sessions_);
  reply(c, id, [&](wire::Response::Builder response) {
    auto list = response.initListSessions().initSessions(static_cast<unsigned>(visible.size()));
    for (size_t i = 0; i < visible.size(); ++i) fill_session_info(*visible[i], list[i], predictor);
  });
  return Status::ok();
}

void Service::fill_session_info(const policy::Session& session,
                                wire::SessionInfo::Builder out) const {
  fill_session_info(session, out, planner_.return_predictor(sessions_));
}

void Service::fill_session_info(const policy::Session& session, wire::SessionInfo::Builder out,
                                const policy::ReturnPredictor& predictor) const {
  out.setSessionId(session.id);
  out.setNamespaceName(engines_.namespaces().name(session.namespace_id));
  bool active = session.state == policy::SessionState::kActive;
  out.setState(active ? wire::SessionState::ACTIVE : wire::SessionState::IDLE);
  out.setIdleMs(active ? 0 : now_ms() - session.last_active_ms);
  out.setTurns(session.turns);
  out.setBlocks(static_cast<uint32_t>(session.blocks.size()));
  out.setLayoutDigest(session.layout.layout_digest);
  uint32_t per_tier[4] = {0, 0, 0, 0};
  for (const BlockHash& hash : session.blocks) {
    auto info = store_->lookup({session.layout, hash});
    per_tier[info ? static_cast<int>(info->location.tier) : 3] += 1;
  }
  auto tiers = out.initBlocksPerTier(4);
  for (unsigned t = 0; t < 4; ++t) tiers.set(t, per_tier[t]);
  const uint64_t held = session.blocks.size() - per_tier[3];
  out.setBytes(held * store_->block_bytes(session.layout));
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
