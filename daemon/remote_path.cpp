// The remote tier in the daemon: opening the worker, and writing each turn's new
// blocks and the session record behind the turn (daemon/service.h, remote_path.h).
#include "daemon/remote_path.h"

#include <boost/asio/post.hpp>

#include <fstream>

#include "common/log.h"
#include "daemon/persistence.h"
#include "daemon/setting_kinds.h"

namespace kvtier::daemon {

Status Service::open_remote() {
  if (config_.remote_nodes.empty()) return Status::ok();
  auto seeds = parse_remote_nodes(config_.remote_nodes);
  if (!seeds.is_ok()) return seeds.status().with_context("remote-nodes");
  remote::RemoteWorkerOptions options;
  options.store.cluster.seeds = std::move(*seeds);
  options.store.cluster.user = config_.remote_user;
  if (!config_.remote_password_file.empty()) {
    std::ifstream file(config_.remote_password_file);
    if (!file || !std::getline(file, options.store.cluster.password)) {
      return invalid_argument("remote-password-file {}: cannot read its first line",
                              config_.remote_password_file);
    }
  }
  const auto timeout = std::chrono::milliseconds(std::max<uint64_t>(config_.remote_timeout_ms, 1));
  options.store.cluster.connect_timeout = timeout;
  options.store.cluster.command_timeout = timeout;
  options.store.ttl = std::chrono::milliseconds(config_.remote_ttl_ms);
  options.store.budget_bytes = std::max<uint64_t>(config_.remote_bytes, 1);
  remote_ = std::make_unique<RemoteState>();
  // Completions come back to the control thread; after the loop stops they are
  // dropped unrun, and their pins release nothing (tiers/block_store.h).
  remote_->worker = remote::RemoteWorker::start(
      std::move(options), [this](std::function<void()> fn) { asio::post(io_, std::move(fn)); });
  KVTIER_LOG_INFO("remote tier: Redis Cluster at {} (connecting in the background)",
                  config_.remote_nodes);
  return Status::ok();
}

void Service::write_behind(const policy::Session& session) {
  if (!remote_) return;
  const policy::SessionKey key{session.namespace_id, session.id};
  uint32_t& synced = remote_->synced[key];
  // Cut meanwhile (an evicted block): what it holds now is written again.
  if (synced > session.blocks.size()) synced = 0;
  const std::string& ns = engines_.namespaces().name(session.namespace_id);
  const uint64_t block_bytes = store_->block_bytes(session.layout);
  const uint64_t now = now_ms();
  auto pins = std::make_shared<std::vector<PinnedBlock>>();
  std::vector<remote::RemoteStore::BlockWrite> writes;
  for (size_t i = synced; i < session.blocks.size(); ++i) {
    const BlockKey block{session.layout, session.blocks[i]};
    auto info = store_->lookup(block);
    if (!info) break;
    const std::shared_ptr<Memory>& memory = store_->memory(info->location.tier);
    // In GPU memory or on NVMe: not written behind (yet); the prefix stops here.
    if (memory == nullptr || memory->host_data() == nullptr) break;
    PinnedBlock pinned = store_->pin(block, now);
    if (!pinned) break;
    const std::byte* bytes = memory->host_data() + pinned.location().offset;
    writes.push_back({{ns, session.layout.layout_digest, block.hash}, {bytes, block_bytes}});
    pins->push_back(std::move(pinned));
  }
  const uint32_t from = synced;
  const auto upto = static_cast<uint32_t>(from + writes.size());
  remote_->deferred_blocks += session.blocks.size() - upto;
  NvmeSessionRecord record = to_record(session, ns, now, wall_now_ms());
  std::string value = encode_session_value(record);
  if (writes.empty()) {
    remote_->worker->put_session(ns, session.id, std::move(value), [](Status) {});
    return;
  }
  synced = upto;  // handed over; lowered again below if some fail
  const bool queued = remote_->worker->put_borrowed(
      std::move(writes),
      [this, pins, key, from, ns, value = std::move(value)](std::vector<Status> statuses) mutable {
        pins->clear();  // the worker is done with the slots
        size_t ok = 0;
        while (ok < statuses.size() && statuses[ok].is_ok()) ++ok;
        remote_->written_blocks += ok;
        if (ok < statuses.size()) {
          remote_->failed_blocks += statuses.size() - ok;
          auto it = remote_->synced.find(key);
          if (it != remote_->synced.end()) {
            it->second = std::min<uint32_t>(it->second, from + static_cast<uint32_t>(ok));
          }
        }
        // The record after its blocks: a node that finds it finds them (or misses).
        remote_->worker->put_session(ns, key.id, std::move(value), [](Status) {});
      });
  if (!queued) {
    ++remote_->declined_writes;
    synced = from;
  }
}

void Service::render_remote_metrics(PrometheusText& out) const {
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
  counter("kvtier_remote_deferred_blocks_total",
          "Blocks not written behind because they were not in host memory at the end of "
          "their turn.",
          remote_->deferred_blocks);
  counter("kvtier_remote_declined_writes_total", "Write-behinds the in-flight bound declined.",
          remote_->declined_writes);
}

}  // namespace kvtier::daemon
