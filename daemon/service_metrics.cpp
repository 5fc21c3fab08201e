// The /metrics page (service.h).
#include <algorithm>

#include "common/units.h"
#include "daemon/admin_service.h"
#include "daemon/remote_path.h"
#include "daemon/replies.h"
#include "daemon/service.h"
#include "daemon/session_journal.h"
#include "daemon/tier_watch.h"

#ifndef KVTIER_VERSION
#define KVTIER_VERSION "unknown"
#endif

namespace kvtier::daemon {
namespace {

// What is running, and for how long.
void render_build_info(PrometheusText& out, const DaemonContext& ctx)
    KVTIER_REQUIRES(control_thread) {
  out.family("kvtier_build_info", "gauge", "Always 1; the labels say what is running.");
  out.sample("kvtier_build_info",
             fmt::format("version=\"{}\",device=\"{}\"", KVTIER_VERSION, ctx.device->name()),
             uint64_t{1});
  out.family("kvtier_uptime_seconds", "gauge", "Seconds since the daemon started.");
  out.sample("kvtier_uptime_seconds", "",
             static_cast<double>(ctx.now_ms() - ctx.started_ms) / 1000.0);
}

// Each tier's capacity and what fills it.
void render_tier_usage(PrometheusText& out, const std::vector<TierUsage>& tiers) {
  auto per_tier = [&](std::string_view name, std::string_view help, auto field) {
    out.family(name, "gauge", help);
    for (const TierUsage& tier : tiers) {
      out.sample(name, fmt::format("tier=\"{}\"", tier_name(tier.tier)), field(tier));
    }
  };
  per_tier("kvtier_tier_capacity_bytes", "Configured capacity of each tier.",
           [](const TierUsage& t) { return t.capacity_bytes; });
  per_tier("kvtier_tier_used_bytes", "Bytes in allocated slots, per tier.",
           [](const TierUsage& t) { return t.used_bytes; });
  per_tier("kvtier_tier_blocks", "Blocks resident, per tier.",
           [](const TierUsage& t) { return t.blocks; });
  per_tier("kvtier_tier_copy_bytes",
           "Bytes of used slots holding copies of blocks that live in a tier above "
           "(NVMe is inclusive below RAM); given up first when room is needed.",
           [](const TierUsage& t) { return t.copy_bytes; });
}

// Sessions and the clients connected, refused and timed out.
void render_sessions_and_connections(PrometheusText& out, const DaemonContext& ctx,
                                     const AdminService& admin) KVTIER_REQUIRES(control_thread) {
  out.family("kvtier_sessions", "gauge", "Open sessions by state.");
  out.sample("kvtier_sessions", "state=\"active\"",
             static_cast<uint64_t>(ctx.sessions.count(policy::SessionState::kActive)));
  out.sample("kvtier_sessions", "state=\"idle\"",
             static_cast<uint64_t>(ctx.sessions.count(policy::SessionState::kIdle)));
  if (const std::optional<double> lead = ctx.planner.turn_lead_ms()) {
    out.family("kvtier_turn_lead_seconds", "gauge",
               "Mean time from a BeginTurn to the session's next Load over recent turns: "
               "what BeginTurn's promotions have to land in.");
    out.sample("kvtier_turn_lead_seconds", "", *lead / 1000.0);
  }
  out.family("kvtier_pinned_sessions", "gauge", "Sessions an admin pinned (kvtierctl pin).");
  out.sample("kvtier_pinned_sessions", "", admin.pinned_sessions());
  out.family("kvtier_connections", "gauge", "Connected clients (engines and kvtierctl).");
  out.sample("kvtier_connections", "",
             static_cast<uint64_t>(ctx.server ? ctx.server->connection_count() : 0));
  out.family("kvtier_connections_refused_total", "counter",
             "Connections refused, by the limit that refused them.");
  for (ipc::Refusal why :
       {ipc::Refusal::kMaxConnections, ipc::Refusal::kPerUid, ipc::Refusal::kAdminReserved}) {
    out.sample("kvtier_connections_refused_total",
               fmt::format("limit=\"{}\"", ipc::refusal_name(why)),
               ctx.server ? ctx.server->refused_connections(why) : 0);
  }
  out.family("kvtier_connections_timed_out_total", "counter",
             "Connections closed for sending neither Hello nor an operator request within "
             "hello-timeout.");
  out.sample("kvtier_connections_timed_out_total", "",
             ctx.server ? ctx.server->introduction_timeouts() : 0);
}

// What the requests found, stored and asked for.
void render_request_counters(PrometheusText& out, const Counters& counters) {
  out.family("kvtier_lookup_hits_total", "counter", "Blocks found by Lookup and Load.");
  out.sample("kvtier_lookup_hits_total", "", counters.lookup_hits);
  out.family("kvtier_lookup_misses_total", "counter", "Blocks asked for and not held.");
  out.sample("kvtier_lookup_misses_total", "", counters.lookup_misses);
  out.family("kvtier_partial_saves_total", "counter",
             "Saves that stored only a prefix: the tiers Saves land in were full of blocks "
             "sessions hold.");
  out.sample("kvtier_partial_saves_total", "", counters.partial_saves);
  out.family("kvtier_blocks_not_saved_total", "counter",
             "Blocks past those prefixes, left for engines to recompute.");
  out.sample("kvtier_blocks_not_saved_total", "", counters.blocks_not_saved);
  out.family("kvtier_staged_requests_total", "counter",
             "Saves and Loads whose blocks the engine packed into a staging region (one copy "
             "per block) instead of kvtierd copying every plane.");
  out.sample("kvtier_staged_requests_total", "kind=\"save\"", counters.staged_saves);
  out.sample("kvtier_staged_requests_total", "kind=\"load\"", counters.staged_loads);
  out.family("kvtier_hellos_total", "counter",
             "Engines joined, by the data path their Hello named (planeCopies: kvtierd copies "
             "each plane; stagingKernels: GPU kernels pack blocks; stagingHost: the CPU does).");
  for (wire::DataPath path : {wire::DataPath::PLANE_COPIES, wire::DataPath::STAGING_KERNELS,
                              wire::DataPath::STAGING_HOST}) {
    out.sample("kvtier_hellos_total", fmt::format("data_path=\"{}\"", data_path_name(path)),
               counters.hellos_by_data_path[static_cast<size_t>(path)]);
  }
}

// The bytes the requests and the policy's moves carried, what the moves dropped, and the
// copies and pins in flight.
void render_moves_and_copies(PrometheusText& out, const DaemonContext& ctx,
                             const std::vector<TierUsage>& tiers, const AdminService& admin)
    KVTIER_REQUIRES(control_thread) {
  out.family("kvtier_moved_bytes_total", "counter",
             "Bytes moved: save (engine to daemon), load (daemon to engine), demote (down a "
             "tier, a policy move), promote (up a tier, a policy move).");
  out.sample("kvtier_moved_bytes_total", "direction=\"save\"", ctx.counters.bytes_saved);
  out.sample("kvtier_moved_bytes_total", "direction=\"load\"", ctx.counters.bytes_loaded);
  out.sample("kvtier_moved_bytes_total", "direction=\"demote\"",
             ctx.mover->counters().bytes_demoted);
  out.sample("kvtier_moved_bytes_total", "direction=\"promote\"",
             ctx.mover->counters().bytes_promoted);
  out.family("kvtier_demoted_onto_copy_bytes_total", "counter",
             "Bytes demoted onto a copy the lower tier still held: moved without a write "
             "(not in kvtier_moved_bytes_total{direction=\"demote\"}).");
  out.sample("kvtier_demoted_onto_copy_bytes_total", "",
             ctx.mover->counters().bytes_demoted_onto_copy);
  out.family("kvtier_copied_down_bytes_total", "counter",
             "Bytes of NVMe copies written below blocks that stay in HBM/RAM "
             "(nvme-copy-after-ms after their Save), so that a crash loses none.");
  out.sample("kvtier_copied_down_bytes_total", "", ctx.mover->counters().bytes_copied_down);
  out.family("kvtier_tier_written_bytes_total", "counter",
             "Bytes the policy's moves wrote into each tier (Saves not included).");
  for (const TierUsage& tier : tiers) {
    out.sample("kvtier_tier_written_bytes_total", fmt::format("tier=\"{}\"", tier_name(tier.tier)),
               ctx.mover->counters().bytes_written[static_cast<size_t>(tier.tier)]);
  }
  out.family("kvtier_copy_dropped_bytes_total", "counter",
             "Bytes of copies (NVMe) given up because their tier needed the room.");
  out.sample("kvtier_copy_dropped_bytes_total", "", ctx.mover->counters().copy_bytes_dropped);
  out.family("kvtier_blocks_evicted_total", "counter",
             "Blocks dropped to make room or by kvtierctl evict (a policy move).");
  out.sample("kvtier_blocks_evicted_total", "", ctx.mover->counters().blocks_evicted);
  out.family("kvtier_data_loss_blocks_total", "counter",
             "Blocks dropped because their bytes were corrupt or lost.");
  out.sample("kvtier_data_loss_blocks_total", "", ctx.mover->counters().blocks_lost);
  out.family("kvtier_copies_in_flight", "gauge",
             "Device copy batches and tier I/O jobs (writes, reads, slot releases) not yet "
             "complete.");
  out.sample("kvtier_copies_in_flight", "", ctx.counters.copies_in_flight + ctx.mover->tier_jobs());
  out.family("kvtier_pinned_blocks", "gauge",
             "Blocks pinned, by reason: copy (a copy is reading them) or admin (kvtierctl pin).");
  out.sample("kvtier_pinned_blocks", "reason=\"copy\"", admin.copy_pinned_blocks());
  out.sample("kvtier_pinned_blocks", "reason=\"admin\"", admin.admin_pinned_blocks());
}

// The NVMe tier's health.
void render_nvme_health(PrometheusText& out, const NvmeTier& nvme) {
  const NvmeHealth health = nvme.health();
  out.family("kvtier_nvme_degraded", "gauge",
             "1 while the NVMe tier is read-only after a write failed (until it heals).");
  out.sample("kvtier_nvme_degraded", "", uint64_t{health.degraded});
  out.family("kvtier_nvme_degradations_total", "counter",
             "Times the NVMe tier degraded (a payload write, sync or index write failed).");
  out.sample("kvtier_nvme_degradations_total", "", health.degradations);
  out.family("kvtier_nvme_heals_total", "counter",
             "Times the NVMe tier healed and took writes again without a restart.");
  out.sample("kvtier_nvme_heals_total", "", health.heals);
}

// Tier notices (WatchTiers): who listens, what was told, what was dropped.
void render_tier_notices(PrometheusText& out, const TierWatch& watch)
    KVTIER_REQUIRES(control_thread) {
  out.family("kvtier_tier_watchers", "gauge",
             "Connections subscribed to tier notices (engines announcing blocks to routers).");
  out.sample("kvtier_tier_watchers", "", static_cast<uint64_t>(watch.watchers()));
  out.family("kvtier_tier_notices_total", "counter",
             "Blocks told to subscribed connections as having changed place.");
  out.sample("kvtier_tier_notices_total", "", watch.notices_sent());
  out.family("kvtier_tier_notice_resyncs_total", "counter",
             "Times a connection's noted blocks passed max-tier-notices-per-connection and "
             "were dropped (it is told to look its blocks up again).");
  out.sample("kvtier_tier_notice_resyncs_total", "", watch.resyncs());
}

}  // namespace

std::string Service::render_metrics() const {
  assert_control_thread();
  PrometheusText out;
  render_build_info(out, ctx_);
  const auto tiers = ctx_.store ? ctx_.store->usage() : std::vector<TierUsage>{};
  render_tier_usage(out, tiers);
  render_sessions_and_connections(out, ctx_, *admin_);
  render_request_counters(out, ctx_.counters);
  render_moves_and_copies(out, ctx_, tiers, *admin_);
  replies_->metrics().render(out);
  if (const NvmeTier* nvme = journal_->tier()) render_nvme_health(out, *nvme);
  remote_->render_remote_metrics(out);  // remote_path.cpp; nothing without remote-nodes
  render_tier_notices(out, *watch_);
  return out.text();
}

}  // namespace kvtier::daemon

namespace kvtier::daemon {

void Service::count_config_reload(bool ok) {
  assert_control_thread();
  replies_->metrics().count_reload(ok);
}

}  // namespace kvtier::daemon
