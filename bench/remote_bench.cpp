#include "bench/remote_bench.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "tests/support/redis_cluster.h"
#include "tiers/remote_store.h"

namespace kvtier::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kBlockBytes = 2ull << 20;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

BlockHash hash_of(uint32_t round, uint32_t n) {
  std::array<uint8_t, 8> bytes{};
  for (int i = 0; i < 4; ++i) {
    bytes[i] = static_cast<uint8_t>(n >> (8 * i));
    bytes[4 + i] = static_cast<uint8_t>(round >> (8 * i));
  }
  return BlockHash(bytes);
}

void fill(std::vector<std::byte>& block, uint32_t seed) {
  uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
  auto* words = reinterpret_cast<uint64_t*>(block.data());
  for (size_t i = 0; i < block.size() / 8; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    words[i] = x;
  }
}

// redis-benchmark's CSV: "SET","<rps>",... → rps per test.
Result<std::pair<double, double>> redis_benchmark(int port, uint32_t requests, uint32_t clients,
                                                  uint32_t pipeline) {
  const std::vector<std::string> argv = {"/usr/bin/redis-benchmark",
                                         "--cluster",
                                         "-h",
                                         "127.0.0.1",
                                         "-p",
                                         std::to_string(port),
                                         "-t",
                                         "set,get",
                                         "-d",
                                         std::to_string(kBlockBytes),
                                         "-n",
                                         std::to_string(requests),
                                         "-r",
                                         std::to_string(requests),
                                         "-c",
                                         std::to_string(clients),
                                         "-P",
                                         std::to_string(pipeline),
                                         "--csv"};
  support::ProcessResult run = support::run_process(argv, std::chrono::milliseconds(300'000));
  if (!run.status.ok()) return unavailable("redis-benchmark: {}", run.describe());
  double set_rps = 0, get_rps = 0;
  std::istringstream lines(run.stdout_text);
  for (std::string line; std::getline(lines, line);) {
    auto rps_of = [&](std::string_view test) -> double {
      const std::string prefix = fmt::format("\"{}\",\"", test);
      if (line.rfind(prefix, 0) != 0) return 0;
      return std::stod(line.substr(prefix.size()));
    };
    if (double r = rps_of("SET"); r > 0) set_rps = r;
    if (double r = rps_of("GET"); r > 0) get_rps = r;
  }
  if (set_rps <= 0 || get_rps <= 0) {
    return internal_error("redis-benchmark printed no SET/GET rates: {}", run.stdout_text);
  }
  return std::pair{set_rps, get_rps};
}

}  // namespace

CLI::App* add_remote_subcommand(CLI::App& app, RemoteBenchOptions& options) {
  CLI::App* sub = app.add_subcommand(
      "remote", "2 MiB blocks through the remote tier's store vs redis-benchmark, same cluster");
  sub->add_option("--blocks", options.blocks, "2 MiB blocks per round")
      ->check(CLI::Range(1u, 4096u));
  sub->add_option("--rounds", options.rounds, "rounds (medians reported)")
      ->check(CLI::Range(1u, 100u));
  sub->add_option("--batch", options.batch, "blocks per store call")->check(CLI::Range(3u, 1024u));
  return sub;
}

Result<BenchReport> run_remote_bench(const RemoteBenchOptions& options) {
  remote::LocalRedisCluster redis;
  KVTIER_RETURN_IF_ERROR(redis.start());
  remote::RemoteStoreOptions store_options;
  store_options.cluster.seeds = redis.seeds();
  store_options.cluster.command_timeout = std::chrono::milliseconds(10'000);
  store_options.budget_bytes = 64ull << 30;
  auto store = remote::RemoteStore::open(store_options);
  if (!store.is_ok()) return store.status();
  const auto masters = static_cast<uint32_t>((*store)->cluster().slots().masters().size());
  const uint32_t per_connection = std::max(1u, options.batch / masters);

  BenchReport report("remote");
  report.config("block_bytes", static_cast<int64_t>(kBlockBytes));
  report.config("blocks_per_round", int64_t{options.blocks});
  report.config("rounds", int64_t{options.rounds});
  report.config("batch", int64_t{options.batch});
  report.config("cluster", "3 masters + 3 replicas, redis-server on loopback");
  report.config("baseline", fmt::format("redis-benchmark --cluster -d {} -c {} -P {}", kBlockBytes,
                                        masters, per_connection));
  report.note(fmt::format("  {:<6} {:>12} {:>12} {:>12} {:>12}", "round", "store write",
                          "redis SET", "store read", "redis GET"));
  std::vector<double> write, read, set, get, write_ratio, read_ratio;
  std::vector<std::vector<std::byte>> payloads(options.batch, std::vector<std::byte>(kBlockBytes));
  for (uint32_t round = 0; round < options.rounds; ++round) {
    // Writes, batch by batch.
    double write_s = 0;
    for (uint32_t first = 0; first < options.blocks; first += options.batch) {
      const uint32_t n = std::min(options.batch, options.blocks - first);
      std::vector<remote::RemoteStore::BlockWrite> writes;
      for (uint32_t i = 0; i < n; ++i) {
        fill(payloads[i], round * 100'000 + first + i);
        writes.push_back({{"bench", 1, hash_of(round, first + i)}, payloads[i]});
      }
      const auto start = Clock::now();
      const auto statuses = (*store)->put_blocks(writes);
      write_s += seconds_since(start);
      for (const Status& s : statuses) KVTIER_RETURN_IF_ERROR(s);
    }
    // Reads, verified.
    double read_s = 0;
    std::vector<std::byte> expected(kBlockBytes);
    for (uint32_t first = 0; first < options.blocks; first += options.batch) {
      const uint32_t n = std::min(options.batch, options.blocks - first);
      std::vector<remote::RemoteStore::BlockRead> reads;
      for (uint32_t i = 0; i < n; ++i) {
        reads.push_back({{"bench", 1, hash_of(round, first + i)}, kBlockBytes});
      }
      const auto start = Clock::now();
      auto got = (*store)->get_blocks(reads);
      read_s += seconds_since(start);
      for (uint32_t i = 0; i < n; ++i) {
        if (!got[i].is_ok()) return got[i].status();
        if ((first + i) % 8 == 0) {
          fill(expected, round * 100'000 + first + i);
          if (std::memcmp(got[i]->data(), expected.data(), kBlockBytes) != 0) {
            return data_loss("block {} of round {} read back different bytes", first + i, round);
          }
        }
      }
    }
    const double bytes = static_cast<double>(options.blocks) * kBlockBytes;
    const double write_gbps = bytes / write_s / 1e9;
    const double read_gbps = bytes / read_s / 1e9;
    auto baseline = redis_benchmark(redis.ports().front(), options.blocks, masters, per_connection);
    if (!baseline.is_ok()) return baseline.status();
    const double set_gbps = baseline->first * kBlockBytes / 1e9;
    const double get_gbps = baseline->second * kBlockBytes / 1e9;
    write.push_back(write_gbps);
    read.push_back(read_gbps);
    set.push_back(set_gbps);
    get.push_back(get_gbps);
    write_ratio.push_back(write_gbps / set_gbps);
    read_ratio.push_back(read_gbps / get_gbps);
    report.note(fmt::format("  {:<6} {:>7.2f} GB/s {:>7.2f} GB/s {:>7.2f} GB/s {:>7.2f} GB/s",
                            round, write_gbps, set_gbps, read_gbps, get_gbps));
  }
  report.result("store_write_gbps", median(write));
  report.result("store_read_gbps", median(read));
  report.result("redis_set_gbps", median(set));
  report.result("redis_get_gbps", median(get));
  report.result("write_vs_redis_ratio", median(write_ratio));
  report.result("read_vs_redis_ratio", median(read_ratio));
  report.target("write_vs_redis_ratio", ">=", 0.8);
  report.target("read_vs_redis_ratio", ">=", 0.8);
  report.note(
      "  resume of a 32-block session on another node: not measured (the daemon writes "
      "to the remote tier but does not read from it yet)");
  return report;
}

}  // namespace kvtier::bench
