// What the Service measures per request, and its /metrics page.
//
// A request is timed from its frame's arrival (record_request) to its reply
// (record_reply, called from reply() for every answer, error or not). Lookup hits by
// tier come from the Lookup reply itself; a Load's from the tiers its leading blocks
// were in when it arrived, counted for the blocks the reply says were loaded (a Load of
// a plane range only when the range starts at plane 0, as the Stats counters do).
#include <kj/exception.h>

#include <algorithm>

#include "common/units.h"
#include "daemon/service.h"

#ifndef KVTIER_VERSION
#define KVTIER_VERSION "unknown"
#endif

namespace kvtier::daemon {
namespace {

size_t kind_of(wire::Request::Which which) {
  const auto kind = static_cast<size_t>(which);
  return kind < RequestMetrics::kMaxKinds ? kind : RequestMetrics::kUnknownKind;
}

}  // namespace

void Service::record_request(EngineContext& engine, uint64_t id, wire::Request::Reader request) {
  auto& pending = engine.pending_requests[id];
  pending.kind = kind_of(request.which());
  pending.started = std::chrono::steady_clock::now();
  pending.load_hit_tiers.clear();
  if (request.which() != wire::Request::LOAD || !engine.hello_done || store_ == nullptr) return;
  try {
    // The Loads of a layer-wise load after the one starting at plane 0 name the same
    // blocks again: their hits were counted already.
    if (request.getLoad().getPlaneBegin() != 0) return;
    for (auto block : request.getLoad().getBlocks()) {
      auto hash = block.getHash();
      if (hash.size() == 0 || hash.size() > BlockHash::kMaxBytes) break;
      auto info = store_->lookup(
          {engine.layout_key, BlockHash(std::span<const uint8_t>(hash.begin(), hash.size()))});
      if (!info) break;
      pending.load_hit_tiers.push_back(info->location.tier);
    }
  } catch (const kj::Exception&) {
    // A malformed list: dispatch() reports it; there is nothing to count.
    pending.load_hit_tiers.clear();
  }
}

void Service::record_reply(const ConnectionPtr& c, uint64_t id, wire::Response::Reader response) {
  const StatusCode code =
      response.isError()
          ? static_cast<StatusCode>(static_cast<uint16_t>(response.getError().getCode()))
          : StatusCode::kOk;
  auto engine = std::static_pointer_cast<EngineContext>(c->user_state);
  if (engine == nullptr) return;  // the connection closed; nobody waits for this reply
  auto pending = engine->pending_requests.find(id);
  if (pending == engine->pending_requests.end()) {
    request_metrics_.observe(RequestMetrics::kUnknownKind, std::chrono::nanoseconds(0), code);
    return;
  }
  request_metrics_.observe(pending->second.kind,
                           std::chrono::steady_clock::now() - pending->second.started, code);
  if (response.isLookup()) {
    for (auto tier : response.getLookup().getTiers())
      request_metrics_.count_hit(static_cast<Tier>(tier));
  } else if (response.isLoad()) {
    const auto& tiers = pending->second.load_hit_tiers;
    const size_t loaded = std::min<size_t>(response.getLoad().getLoadedCount(), tiers.size());
    for (size_t i = 0; i < loaded; ++i) request_metrics_.count_hit(tiers[i]);
  }
  if (!admin_pins_.empty() && (response.isSave() || response.isCloseSession())) {
    // A pinned session may have new blocks (pin them) or be gone (unpin).
    refresh_admin_pins();
  }
  engine->pending_requests.erase(pending);
}

std::string Service::render_metrics() const {
  PrometheusText out;
  out.family("kvtier_build_info", "gauge", "Always 1; the labels say what is running.");
  out.sample("kvtier_build_info",
             fmt::format("version=\"{}\",device=\"{}\"", KVTIER_VERSION, device_->name()),
             uint64_t{1});
  out.family("kvtier_uptime_seconds", "gauge", "Seconds since the daemon started.");
  out.sample("kvtier_uptime_seconds", "", static_cast<double>(now_ms() - started_ms_) / 1000.0);

  const auto tiers = store_ ? store_->usage() : std::vector<TierUsage>{};
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

  out.family("kvtier_sessions", "gauge", "Open sessions by state.");
  out.sample("kvtier_sessions", "state=\"active\"",
             static_cast<uint64_t>(sessions_.count(policy::SessionState::kActive)));
  out.sample("kvtier_sessions", "state=\"idle\"",
             static_cast<uint64_t>(sessions_.count(policy::SessionState::kIdle)));
  if (const std::optional<double> lead = planner_.turn_lead_ms()) {
    out.family("kvtier_turn_lead_seconds", "gauge",
               "Mean time from a BeginTurn to the session's next Load over recent turns: "
               "what BeginTurn's promotions have to land in.");
    out.sample("kvtier_turn_lead_seconds", "", *lead / 1000.0);
  }
  out.family("kvtier_pinned_sessions", "gauge", "Sessions an admin pinned (kvtierctl pin).");
  out.sample("kvtier_pinned_sessions", "", static_cast<uint64_t>(admin_pins_.size()));
  out.family("kvtier_connections", "gauge", "Connected clients (engines and kvtierctl).");
  out.sample("kvtier_connections", "",
             static_cast<uint64_t>(server_ ? server_->connection_count() : 0));
  out.family("kvtier_connections_refused_total", "counter",
             "Connections refused because max-connections were open.");
  out.sample("kvtier_connections_refused_total", "", server_ ? server_->refused_connections() : 0);

  out.family("kvtier_lookup_hits_total", "counter", "Blocks found by Lookup and Load.");
  out.sample("kvtier_lookup_hits_total", "", counters_.lookup_hits);
  out.family("kvtier_lookup_misses_total", "counter", "Blocks asked for and not held.");
  out.sample("kvtier_lookup_misses_total", "", counters_.lookup_misses);
  out.family("kvtier_moved_bytes_total", "counter",
             "Bytes moved: save (engine to daemon), load (daemon to engine), demote (down a "
             "tier, a policy move), promote (up a tier, a policy move).");
  out.sample("kvtier_moved_bytes_total", "direction=\"save\"", counters_.bytes_saved);
  out.sample("kvtier_moved_bytes_total", "direction=\"load\"", counters_.bytes_loaded);
  out.sample("kvtier_moved_bytes_total", "direction=\"demote\"", mover_->counters().bytes_demoted);
  out.sample("kvtier_moved_bytes_total", "direction=\"promote\"",
             mover_->counters().bytes_promoted);
  out.family("kvtier_demoted_onto_copy_bytes_total", "counter",
             "Bytes demoted onto a copy the lower tier still held: moved without a write "
             "(not in kvtier_moved_bytes_total{direction=\"demote\"}).");
  out.sample("kvtier_demoted_onto_copy_bytes_total", "",
             mover_->counters().bytes_demoted_onto_copy);
  out.family("kvtier_tier_written_bytes_total", "counter",
             "Bytes the policy's moves wrote into each tier (Saves not included).");
  for (const TierUsage& tier : tiers) {
    out.sample("kvtier_tier_written_bytes_total", fmt::format("tier=\"{}\"", tier_name(tier.tier)),
               mover_->counters().bytes_written[static_cast<size_t>(tier.tier)]);
  }
  out.family("kvtier_copy_dropped_bytes_total", "counter",
             "Bytes of copies (NVMe) given up because their tier needed the room.");
  out.sample("kvtier_copy_dropped_bytes_total", "", mover_->counters().copy_bytes_dropped);
  out.family("kvtier_blocks_evicted_total", "counter",
             "Blocks dropped to make room or by kvtierctl evict (a policy move).");
  out.sample("kvtier_blocks_evicted_total", "", mover_->counters().blocks_evicted);
  out.family("kvtier_data_loss_blocks_total", "counter",
             "Blocks dropped because their bytes were corrupt or lost.");
  out.sample("kvtier_data_loss_blocks_total", "", mover_->counters().blocks_lost);
  out.family("kvtier_copies_in_flight", "gauge",
             "Device copy batches and tier I/O jobs (writes, reads, slot releases) not yet "
             "complete.");
  out.sample("kvtier_copies_in_flight", "", counters_.copies_in_flight + mover_->tier_jobs());
  out.family("kvtier_pinned_blocks", "gauge",
             "Blocks pinned, by reason: copy (a copy is reading them) or admin (kvtierctl pin).");
  out.sample("kvtier_pinned_blocks", "reason=\"copy\"", copy_pinned_blocks());
  out.sample("kvtier_pinned_blocks", "reason=\"admin\"", admin_pinned_blocks());
  request_metrics_.render(out);
  render_remote_metrics(out);  // remote_path.cpp; nothing without remote-nodes
  return out.text();
}

}  // namespace kvtier::daemon
