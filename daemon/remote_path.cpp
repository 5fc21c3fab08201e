// The remote tier in the daemon: opening the worker, and what kvtierctl status and the
// metrics say of it (remote_path.h). Writing behind the turn is in
// remote_write_behind.cpp, and reading (Lookup, Load, BeginTurn) in remote_read_path.cpp.
#include "daemon/remote_path.h"

#include <boost/asio/post.hpp>

#include <cstdlib>
#include <fstream>

#include "common/log.h"
#include "daemon/setting_kinds.h"

namespace kvtier::daemon {

RemotePath::RemotePath(DaemonContext& ctx, Replies& replies, SessionJournal& journal)
    : Part(ctx, replies), journal_(journal) {}

RemotePath::~RemotePath() = default;

Status RemotePath::open_remote() {
  if (ctx_.config.remote_nodes.empty()) return Status::ok();
  auto seeds = parse_remote_nodes(ctx_.config.remote_nodes);
  if (!seeds.is_ok()) return seeds.status().with_context("remote-nodes");
  remote::RemoteWorkerOptions options;
  options.store.cluster.seeds = std::move(*seeds);
  options.store.cluster.user = ctx_.config.remote_user;
  if (!ctx_.config.remote_password_file.empty()) {
    std::ifstream file(ctx_.config.remote_password_file);
    if (!file || !std::getline(file, options.store.cluster.password)) {
      return invalid_argument("remote-password-file {}: cannot read its first line",
                              ctx_.config.remote_password_file);
    }
  }
  const auto timeout =
      std::chrono::milliseconds(std::max<uint64_t>(ctx_.config.remote_timeout_ms, 1));
  options.store.cluster.connect_timeout = timeout;
  options.store.cluster.command_timeout = timeout;
  options.store.ttl = std::chrono::milliseconds(ctx_.config.remote_ttl_ms);
  options.store.budget_bytes = std::max<uint64_t>(ctx_.config.remote_bytes, 1);
  options.max_in_flight_bytes = ctx_.config.remote_max_in_flight_bytes;
  remote_ = std::make_unique<RemoteState>();
  // Blocks saved into GPU memory (an engine-facing tier the daemon cannot address) are
  // written behind through pinned host memory: two slabs, the executor's to use.
  std::shared_ptr<Memory> staging;
  bool gpu_memory = false;
  for (Tier tier : ctx_.topology.engine_facing()) {
    gpu_memory |= ctx_.store->memory(tier)->host_data() == nullptr;
  }
  if (gpu_memory) {
    auto allocated = ctx_.device->allocate_pinned_pool(2 * ctx_.config.slab_bytes);
    if (allocated.is_ok()) {
      staging = std::move(*allocated);
    } else {
      // Not a reason to refuse to start: those blocks are written once demoted to RAM.
      KVTIER_LOG_WARN(
          "remote tier: no pinned host memory to stage writes from GPU memory ({}); blocks "
          "saved there are written behind once demoted to RAM",
          allocated.status().to_string());
    }
  }
  // Completions come back to the control thread; after the loop stops they are
  // dropped unrun, and their pins release nothing (tiers/block_store.h).
  remote_->worker = remote::RemoteWorker::start(
      std::move(options), [this](std::function<void()> fn) { asio::post(ctx_.io, std::move(fn)); });
  remote_->tier = std::make_unique<RemoteStorageTier>(
      *remote_->worker,
      [this](const BlockKey& key) {
        assert_control_thread();
        return remote::RemoteBlockId{ctx_.engines.namespaces().name(key.layout.namespace_id),
                                     key.layout.layout_digest, key.hash};
      },
      ctx_.config.remote_bytes);
  // The bottom of the topology; NVMe evictions go to it first and write-behinds copy
  // blocks out to it, at most remote-max-in-flight of either at once.
  const TierTopology local = ctx_.topology;
  ctx_.topology = TierTopology::of([&](Tier tier) {
    assert_control_thread();
    return local.configured(tier) || tier == remote_->tier->id();
  });
  ctx_.mover->attach_spill_tier(*remote_->tier, ctx_.config.remote_max_in_flight_bytes,
                                std::move(staging), ctx_.config.slab_bytes);
  KVTIER_LOG_INFO("remote tier: Redis Cluster at {} (connecting in the background)",
                  ctx_.config.remote_nodes);
  return Status::ok();
}

void RemotePath::fill_remote_stats(wire::RemoteStats::Builder out) const {
  out.setConfigured(remote_ != nullptr);
  if (!remote_) return;
  const remote::RemoteWorker::Snapshot s = remote_->worker->snapshot();
  out.setConnected(s.connected);
  out.setDegraded(s.degraded);
  out.setMasters(static_cast<uint32_t>(s.masters));
  out.setStoredBytes(s.store.stored_bytes);
  out.setBudgetBytes(ctx_.config.remote_bytes);
  out.setInFlightBytes(s.in_flight_bytes);
  out.setWriteLagMs(static_cast<uint64_t>(s.write_lag.count()));
  out.setWrittenBlocks(remote_->written_blocks);
  out.setFetchedBlocks(ctx_.mover->counters().copied_in_blocks);
  out.setLookupHits(remote_->lookup_hits);
  out.setCorruptValues(s.store.corrupt);
  out.setErrors(s.store.errors);
  out.setResumedSessions(remote_->resumed_sessions);
  out.setDeferredBlocks(remote_->deferred_blocks);
  out.setSpilledBlocks(ctx_.mover->counters().spilled_blocks);
  out.setSpillUnwritten(ctx_.mover->counters().spill_unwritten_blocks);
}

void RemotePath::render_remote_metrics(PrometheusText& out) const {
  if (!remote_) return;
  const remote::RemoteWorker::Snapshot s = remote_->worker->snapshot();
  auto gauge = [&](std::string_view name, std::string_view help, auto value) {
    out.family(name, "gauge", help);
    out.sample(name, "", value);
  };
  auto counter = [&](std::string_view name, std::string_view help, uint64_t value) {
    out.family(name, "counter", help);
    out.sample(name, "", value);
  };
  gauge("kvtier_remote_connected", "1 once the remote tier has a slot map of the cluster.",
        uint64_t{s.connected});
  gauge("kvtier_remote_degraded",
        "1 while a Redis node the remote tier needs is down or answering errors.",
        uint64_t{s.degraded});
  gauge("kvtier_remote_masters", "Masters in the remote tier's slot map.",
        static_cast<uint64_t>(s.masters));
  gauge("kvtier_remote_stored_bytes", "Bytes this node keeps stored in the cluster (remote-bytes).",
        s.store.stored_bytes);
  gauge("kvtier_remote_in_flight_bytes", "Payload bytes queued or moving to or from the cluster.",
        s.in_flight_bytes);
  gauge("kvtier_remote_write_lag_seconds",
        "How long the oldest pending write-behind has waited (0: none pending).",
        static_cast<double>(s.write_lag.count()) / 1000.0);
  counter("kvtier_remote_written_bytes_total", "Bytes written to the cluster.",
          s.store.bytes_written);
  counter("kvtier_remote_read_bytes_total", "Bytes read from the cluster.", s.store.bytes_read);
  counter("kvtier_remote_hits_total", "Values found and verified.", s.store.hits);
  counter("kvtier_remote_misses_total", "Values not there (or of another format version).",
          s.store.misses);
  counter("kvtier_remote_corrupt_total", "Values that did not verify (deleted, never served).",
          s.store.corrupt);
  counter("kvtier_remote_errors_total", "Commands a Redis node did not answer or refused.",
          s.store.errors);
  counter("kvtier_remote_written_blocks_total", "Blocks written behind at the end of a turn.",
          remote_->written_blocks);
  counter("kvtier_remote_failed_blocks_total", "Blocks whose write-behind failed.",
          remote_->failed_blocks);
  gauge("kvtier_remote_deferred_blocks",
        "Blocks held here that sessions' last end of turn could not write behind (in GPU "
        "memory or on NVMe).",
        remote_->deferred_blocks);
  counter("kvtier_remote_fetched_blocks_total",
          "Blocks a Load or BeginTurn read from the cluster into RAM.",
          ctx_.mover->counters().copied_in_blocks);
  counter("kvtier_remote_fetch_misses_total",
          "Blocks asked of the cluster and not read (absent, corrupt, unreachable, no room).",
          ctx_.mover->counters().copy_in_misses);
  counter("kvtier_remote_lookup_hits_total", "Blocks a Lookup found only in the remote tier.",
          remote_->lookup_hits);
  counter("kvtier_remote_resumed_sessions_total",
          "Sessions a BeginTurn created here from their record in the remote tier.",
          remote_->resumed_sessions);
  counter("kvtier_remote_spilled_blocks_total",
          "Blocks evicted from NVMe that were written to the cluster on their way out.",
          ctx_.mover->counters().spilled_blocks);
  counter("kvtier_remote_spill_present_blocks_total",
          "Blocks evicted from NVMe that the cluster held already (nothing written).",
          ctx_.mover->counters().spill_present_blocks);
  counter("kvtier_remote_spill_unwritten_blocks_total",
          "Blocks evicted from NVMe without being written to the cluster (the spill bound was "
          "full, the cluster unreachable, or a read or write failed).",
          ctx_.mover->counters().spill_unwritten_blocks);
  counter("kvtier_remote_declined_writes_total", "Write-behinds the in-flight bound declined.",
          remote_->declined_writes);
}

}  // namespace kvtier::daemon
