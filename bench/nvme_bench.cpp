// kvtier-bench nvme, throughput part: NvmeTier vs fio on the same directory.
#include "bench/nvme_bench.h"

#include <sys/mman.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>

#include "tests/support/process.h"
#include "tiers/nvme_tier.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace kvtier::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kBlockBytes = 2ull << 20;
constexpr size_t kBlocksPerJob = 32;  // as the daemon submits them (tiers/move_executor.cpp)

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Anonymous memory prepared like the daemon's RAM pool.
struct Pool {
  std::byte* data = nullptr;
  uint64_t bytes = 0;
  ~Pool() {
    if (data != nullptr) ::munmap(data, bytes);
  }
};

Status allocate(Pool& pool, uint64_t bytes) {
  void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) return errno_status(errno, "mmap pool");
  pool.data = static_cast<std::byte*>(mapped);
  pool.bytes = bytes;
  (void)::madvise(mapped, bytes, MADV_HUGEPAGE);
  if (::madvise(mapped, bytes, MADV_POPULATE_WRITE) != 0) std::memset(mapped, 0, bytes);
  return Status::ok();
}

std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t colon = dirs.find(':', start);
    std::string candidate =
        dirs.substr(start, colon == std::string::npos ? std::string::npos : colon - start) + "/" +
        name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return "";
}

// Runs argv, returning its stdout (an error with stderr when it fails).
Result<std::string> capture(const std::vector<std::string>& argv) {
  // Bounded only against a hung fio: a baseline run takes seconds.
  support::ProcessResult result = support::run_process(argv, std::chrono::hours(1));
  if (!result.status.ok()) {
    return internal_error("{} {}: {}", argv[0], result.status.describe(), result.stderr_text);
  }
  return result.stdout_text;
}

// fio's measured bandwidth (bytes/s) for `rw` ("write" or "read") from its JSON.
Result<double> fio_gbps(const std::string& fio, const std::string& file, uint64_t bytes,
                        unsigned queue_depth, const std::string& rw) {
  auto json = capture({fio, "--name=kvtier-baseline", "--filename=" + file,
                       "--size=" + std::to_string(bytes), "--bs=2M", "--rw=" + rw, "--direct=1",
                       "--ioengine=io_uring", "--iodepth=" + std::to_string(queue_depth),
                       // Registered buffers and files, as the tier uses them.
                       "--fixedbufs", "--registerfiles", "--numjobs=1", "--output-format=json"});
  if (!json.is_ok()) return json.status();
  size_t section = json->find("\"" + rw + "\" : {");
  if (section == std::string::npos) section = json->find("\"" + rw + "\":{");
  size_t at = section == std::string::npos ? section : json->find("\"bw_bytes\"", section);
  if (at == std::string::npos) return internal_error("no {} bw_bytes in fio's output", rw);
  at = json->find(':', at);
  return std::strtod(json->c_str() + at + 1, nullptr) / 1e9;
}

struct Round {
  double tier_write_gbps, tier_read_gbps;
  double fio_write_gbps = 0, fio_read_gbps = 0;
};

// Writes (or reads) every block through the tier in jobs of kBlocksPerJob, all queued
// at once as the daemon queues them; returns the elapsed seconds.
Result<double> through_tier(NvmeTier& tier, const Pool& pool, uint32_t blocks, uint32_t round,
                            bool write) {
  std::vector<std::future<Status>> jobs;
  const auto start = Clock::now();
  for (uint32_t first = 0; first < blocks; first += kBlocksPerJob) {
    auto promise = std::make_shared<std::promise<Status>>();
    jobs.push_back(promise->get_future());
    const uint32_t end = std::min<uint32_t>(blocks, first + kBlocksPerJob);
    auto key = [round](uint32_t i) {
      const uint64_t id = uint64_t{round} << 32 | i;
      return NvmeBlockKey{
          "bench", 1,
          BlockHash(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&id), sizeof(id)))};
    };
    if (write) {
      std::vector<NvmeTier::WriteItem> items;
      for (uint32_t i = first; i < end; ++i) {
        items.push_back({key(i), pool.data + i * kBlockBytes, kBlockBytes, i * kBlockBytes, 0});
      }
      tier.write_blocks(std::move(items), [promise](std::vector<Status> results) {
        for (Status& result : results) {
          if (!result.is_ok()) return promise->set_value(std::move(result));
        }
        promise->set_value(Status::ok());
      });
    } else {
      std::vector<NvmeTier::ReadItem> items;
      for (uint32_t i = first; i < end; ++i) {
        items.push_back({key(i), pool.data + i * kBlockBytes, kBlockBytes, i * kBlockBytes});
      }
      tier.read_blocks(std::move(items), [promise](std::vector<NvmeTier::ReadOutcome> outcomes) {
        for (auto& outcome : outcomes) {
          if (!outcome.status.is_ok()) return promise->set_value(std::move(outcome.status));
        }
        promise->set_value(Status::ok());  // every block's checksum verified
      });
    }
  }
  for (auto& job : jobs) KVTIER_RETURN_IF_ERROR(job.get());
  return seconds_since(start);
}

}  // namespace

CLI::App* add_nvme_subcommand(CLI::App& app, NvmeBenchOptions& options) {
  CLI::App* nvme = app.add_subcommand(
      "nvme", "NVMe tier write/read of 2 MiB blocks vs fio; recovery time; memory per block");
  nvme->add_option("--dir", options.dir, "directory for the tier's and fio's files");
  nvme->add_option("--blocks", options.blocks, "2 MiB blocks per round")
      ->check(CLI::Range(32u, 1u << 16));
  nvme->add_option("--rounds", options.rounds, "rounds")->check(CLI::Range(1u, 100u));
  nvme->add_option("--queue-depth", options.queue_depth, "I/Os in flight (tier and fio)")
      ->check(CLI::Range(1u, 1024u));
  nvme->add_option("--recovery-blocks", options.recovery_blocks,
                   "small blocks in the recovery index (0: skip recovery and memory)");
  nvme->add_flag("--keep-files", options.keep_files, "leave the directory behind");
  return nvme;
}

Result<BenchReport> run_nvme_bench(const CommonOptions& common, const NvmeBenchOptions& options) {
  std::string parent = options.dir.empty() ? "./var" : options.dir;
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  std::string pattern = parent + "/kvtier-nvme-bench-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) return errno_status(errno, "mkdtemp in " + parent);
  const std::string dir = pattern;
  struct Cleanup {
    std::string dir;
    bool keep;
    ~Cleanup() {
      std::error_code ignored;
      if (!keep) std::filesystem::remove_all(dir, ignored);
    }
  } cleanup{dir, options.keep_files};

  const uint64_t bytes = uint64_t{options.blocks} * kBlockBytes;
  Pool pool;
  KVTIER_RETURN_IF_ERROR(allocate(pool, bytes));
  for (uint64_t i = 0; i < bytes / 8; ++i) {
    reinterpret_cast<uint64_t*>(pool.data)[i] = i * 0x9E3779B97F4A7C15ull;
  }
  NvmeTierOptions tier_options;
  tier_options.dir = dir + "/tier";
  tier_options.capacity_bytes = bytes;
  tier_options.queue_depth = options.queue_depth;
  tier_options.io_buffers = {{pool.data, pool.bytes}};
  NvmeRecovery recovered;
  auto tier = NvmeTier::open(tier_options, &recovered);
  if (!tier.is_ok()) return tier.status();
  const std::string fio = find_on_path("fio");

  std::vector<Round> rounds;
  const double gb = static_cast<double>(bytes) / 1e9;
  for (uint32_t r = 0; r < options.rounds; ++r) {
    Round round{};
    // The tier and fio alternate going first, so neither always meets the same state.
    auto tier_write = [&]() -> Status {
      auto seconds = through_tier(**tier, pool, options.blocks, r, true);
      if (!seconds.is_ok()) return seconds.status();
      round.tier_write_gbps = gb / *seconds;
      return Status::ok();
    };
    auto tier_read = [&]() -> Status {
      std::memset(pool.data, 0, bytes);  // what comes back must come from the disk
      auto seconds = through_tier(**tier, pool, options.blocks, r, false);
      if (!seconds.is_ok()) return seconds.status();
      round.tier_read_gbps = gb / *seconds;
      return Status::ok();
    };
    auto fio_run = [&](const std::string& rw, double& out) -> Status {
      if (fio.empty()) return Status::ok();
      auto measured = fio_gbps(fio, dir + "/fio.dat", bytes, options.queue_depth, rw);
      if (!measured.is_ok()) return measured.status();
      out = *measured;
      return Status::ok();
    };
    if (r % 2 == 0) {
      KVTIER_RETURN_IF_ERROR(tier_write());
      KVTIER_RETURN_IF_ERROR(fio_run("write", round.fio_write_gbps));
      KVTIER_RETURN_IF_ERROR(tier_read());
      KVTIER_RETURN_IF_ERROR(fio_run("read", round.fio_read_gbps));
    } else {
      KVTIER_RETURN_IF_ERROR(fio_run("write", round.fio_write_gbps));
      KVTIER_RETURN_IF_ERROR(tier_write());
      KVTIER_RETURN_IF_ERROR(fio_run("read", round.fio_read_gbps));
      KVTIER_RETURN_IF_ERROR(tier_read());
    }
    rounds.push_back(round);
  }
  const std::string io_mode = (*tier)->describe();
  tier->reset();

  BenchReport report("nvme");
  report.config("dir", dir);
  report.config("block_bytes", static_cast<int64_t>(kBlockBytes));
  report.config("blocks_per_round", int64_t{options.blocks});
  report.config("rounds", int64_t{options.rounds});
  report.config("queue_depth", int64_t{options.queue_depth});
  report.config("blocks_per_job", static_cast<int64_t>(kBlocksPerJob));
  report.config("tier_io", io_mode);
  report.config("fio", fio.empty() ? std::string("not found on PATH: baseline skipped") : fio);
  report.config("aggregate",
                std::string("median over rounds; ratios are medians of per-round ratios"));
  std::vector<double> write, read, fio_write, fio_read, write_ratio, read_ratio;
  report.note(fmt::format("  {:<6} {:>12} {:>12} {:>12} {:>12}", "round", "tier write", "fio write",
                          "tier read", "fio read"));
  for (size_t r = 0; r < rounds.size(); ++r) {
    const Round& x = rounds[r];
    write.push_back(x.tier_write_gbps);
    read.push_back(x.tier_read_gbps);
    report.note(fmt::format("  {:<6} {:>8.2f} GB/s {:>7.2f} GB/s {:>7.2f} GB/s {:>7.2f} GB/s",
                            r + 1, x.tier_write_gbps, x.fio_write_gbps, x.tier_read_gbps,
                            x.fio_read_gbps));
    if (fio.empty()) continue;
    fio_write.push_back(x.fio_write_gbps);
    fio_read.push_back(x.fio_read_gbps);
    write_ratio.push_back(x.tier_write_gbps / x.fio_write_gbps);
    read_ratio.push_back(x.tier_read_gbps / x.fio_read_gbps);
  }
  report.result("tier_write_gbps", median(write));
  report.result("tier_read_gbps", median(read));
  if (fio.empty()) {
    report.note("  fio is not installed (apt-get install fio): no baseline, no ratio targets");
  } else {
    report.result("fio_write_gbps", median(fio_write));
    report.result("fio_read_gbps", median(fio_read));
    report.result("write_vs_fio_ratio", median(write_ratio));
    report.result("read_vs_fio_ratio", median(read_ratio));
    report.target("write_vs_fio_ratio", ">=", 0.8);
    report.target("read_vs_fio_ratio", ">=", 0.8);
  }
  if (options.recovery_blocks > 0) {
    KVTIER_RETURN_IF_ERROR(run_nvme_recovery_bench(common, options, dir, report));
  }
  return report;
}

}  // namespace kvtier::bench
