// kvtier-bench nvme, recovery and memory part: a real kvtierd started on an index of
// `recovery_blocks` small blocks, and on an empty one for the memory baseline.
//
// The index is written straight through NvmeIndex (records naming 4 KiB slots of a
// sparse slab file) rather than through the daemon: what is measured is reopening
// it, and filling it through Save + demotion would take minutes on a small machine.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "bench/benchmarks.h"
#include "bench/nvme_bench.h"
#include "client/client.h"
#include "common/unique_fd.h"
#include "tiers/nvme_index.h"

namespace kvtier::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kSmallBlockBytes = 4096;
constexpr uint64_t kSlabBytes = 64ull << 20;
constexpr uint64_t kBatch = 50'000;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

Status write_index(const std::string& data_dir, uint64_t blocks) {
  auto index = NvmeIndex::open(data_dir + "/nvme/index", kSlabBytes);
  if (!index.is_ok()) return index.status();
  const std::string ns = fmt::format("uid:{}", ::getuid());
  const std::vector<NvmeLayoutRecord> layout = {{ns, 0xbe4c, kSmallBlockBytes}};
  std::vector<std::pair<NvmeBlockKey, NvmeBlockRecord>> batch;
  for (uint64_t i = 0; i < blocks; ++i) {
    const BlockHash hash(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&i), sizeof(i)));
    batch.push_back({{ns, 0xbe4c, hash}, {i * kSmallBlockBytes, kSmallBlockBytes, i, 0}});
    if (batch.size() == kBatch || i + 1 == blocks) {
      KVTIER_RETURN_IF_ERROR(
          (*index)->commit_blocks(batch, i < kBatch ? layout : decltype(layout){}));
      batch.clear();
    }
  }
  return Status::ok();
}

// A sparse slab file of the full size, so that start-up does not spend its time
// preallocating gigabytes (it only allocates what is missing).
Status sparse_slab_file(const std::string& data_dir, uint64_t bytes) {
  std::error_code ec;
  std::filesystem::create_directories(data_dir + "/nvme", ec);
  if (ec) return errno_status(ec.value(), "create " + data_dir);
  UniqueFd fd(::open((data_dir + "/nvme/slabs.dat").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd.valid()) return errno_status(errno, "create slabs.dat");
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0)
    return errno_status(errno, "ftruncate");
  return Status::ok();
}

struct Started {
  support::DaemonProcess daemon;
  double listen_seconds = 0;  // spawn → the socket accepts
};

// kvtierd `name` on `data_dir`, its socket and log named after it in `dir`.
Result<Started> start_daemon(const std::string& kvtierd, const std::string& dir,
                             const std::string& name, const std::string& data_dir,
                             uint64_t nvme_bytes) {
  support::DaemonProcessOptions options;
  options.binary = kvtierd;
  options.dir = dir;
  options.socket_path = dir + "/" + name + ".sock";
  options.log_path = dir + "/" + name + ".log";
  options.data_dir = data_dir;
  options.flags = {
      "--hbm-bytes",  "4MiB",  "--ram-bytes",    "8MiB", "--nvme-bytes", std::to_string(nvme_bytes),
      "--slab-bytes", "64MiB", "--metrics-addr", "off"};
  options.die_with_parent = true;
  options.ready_timeout = std::chrono::milliseconds{120'000};
  const auto start = Clock::now();
  auto daemon = support::DaemonProcess::start(std::move(options));
  if (!daemon.is_ok()) return daemon.status();
  return Started{std::move(*daemon), seconds_since(start)};
}

uint64_t rss_bytes(pid_t pid) {
  std::ifstream status(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// "... recovered N blocks (...) and M sessions (...) in X ms" from the daemon's log.
double recovery_ms_from_log(const std::string& log_path) {
  std::ifstream in(log_path);
  std::string line;
  while (std::getline(in, line)) {
    size_t at = line.find("sessions (");
    if (line.find("recovered") == std::string::npos || at == std::string::npos) continue;
    at = line.find(" in ", at);
    if (at != std::string::npos) return std::strtod(line.c_str() + at + 4, nullptr);
  }
  return -1;
}

}  // namespace

Status run_nvme_recovery_bench(const CommonOptions& common, const NvmeBenchOptions& options,
                               const std::string& dir, BenchReport& report) {
  const uint64_t blocks = options.recovery_blocks;
  // Whole slabs, and room to spare: the planner evicts from NVMe past its high
  // watermark, which would make the count below a policy measurement.
  const uint64_t nvme_bytes =
      (blocks * kSmallBlockBytes * 10 / 9 + kSlabBytes - 1) / kSlabBytes * kSlabBytes;
  const std::string kvtierd = common.kvtierd_path.empty()
                                  ? support::kvtierd_next_to_this_executable()
                                  : common.kvtierd_path;
  const std::string full = dir + "/recovery-full";
  const std::string empty = dir + "/recovery-empty";
  const auto populate_start = Clock::now();
  KVTIER_RETURN_IF_ERROR(write_index(full, blocks));
  const double populate_seconds = seconds_since(populate_start);
  KVTIER_RETURN_IF_ERROR(sparse_slab_file(full, nvme_bytes));
  KVTIER_RETURN_IF_ERROR(sparse_slab_file(empty, nvme_bytes));

  auto baseline = start_daemon(kvtierd, dir, "empty", empty, nvme_bytes);
  if (!baseline.is_ok()) return baseline.status();
  const uint64_t rss_empty = rss_bytes(baseline->daemon.pid());
  KVTIER_RETURN_IF_ERROR(baseline->daemon.stop_cleanly(kDaemonStopTimeout));

  auto recovered = start_daemon(kvtierd, dir, "full", full, nvme_bytes);
  if (!recovered.is_ok()) return recovered.status();
  const uint64_t rss_full = rss_bytes(recovered->daemon.pid());
  uint64_t nvme_blocks = 0;
  if (auto client = Client::connect(recovered->daemon.socket_path()); client.is_ok()) {
    if (auto stats = (*client)->stats(); stats.is_ok()) {
      for (const TierStatsInfo& tier : stats->tiers) {
        if (tier.tier == Tier::kNvme) nvme_blocks = tier.blocks;
      }
    }
  }
  KVTIER_RETURN_IF_ERROR(recovered->daemon.stop_cleanly(kDaemonStopTimeout));
  if (nvme_blocks != blocks) {
    return internal_error("kvtierd recovered {} of {} blocks; see {}", nvme_blocks, blocks,
                          recovered->daemon.log_path());
  }
  const double bytes_per_block = (static_cast<double>(rss_full) - static_cast<double>(rss_empty)) /
                                 static_cast<double>(blocks);
  report.config("recovery_blocks", static_cast<int64_t>(blocks));
  report.config("recovery_block_bytes", static_cast<int64_t>(kSmallBlockBytes));
  report.result("recovery_index_write_s", populate_seconds);
  report.result("recovery_start_to_listen_s", recovered->listen_seconds);
  report.result("recovery_index_reload_ms", recovery_ms_from_log(recovered->daemon.log_path()));
  report.result("empty_start_to_listen_s", baseline->listen_seconds);
  report.result("rss_empty_mib", static_cast<double>(rss_empty) / (1 << 20));
  report.result("rss_recovered_mib", static_cast<double>(rss_full) / (1 << 20));
  report.result("rss_bytes_per_indexed_block", bytes_per_block);
  report.target("recovery_start_to_listen_s", "<=", 5.0);
  report.target("rss_bytes_per_indexed_block", "<=", 128.0);
  return Status::ok();
}

}  // namespace kvtier::bench
