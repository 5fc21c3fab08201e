#include "bench/remote_bench.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include <unistd.h>

#include <thread>

#include "client/client.h"
#include "client/paged_cache.h"
#include "tests/support/daemon_process.h"
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

// One kvtierd on the cluster and an engine on it with `blocks` 2 MiB engine blocks.
struct Node {
  std::optional<support::DaemonProcess> daemon;
  std::unique_ptr<Client> client;
  std::optional<PagedCache> cache;
  HelloInfo hello;
};

Result<Node> start_node(const CommonOptions& common, const remote::LocalRedisCluster& redis,
                        uint64_t blocks) {
  std::string seeds;
  for (const remote::Endpoint& e : redis.seeds())
    seeds += (seeds.empty() ? "" : ",") + e.to_string();
  const uint64_t pool =
      (blocks * (2ull << 20) * 2 + (64ull << 20) - 1) / (64ull << 20) * (64ull << 20);
  auto started = support::DaemonProcess::start(private_daemon_options(
      common,
      {"--hbm-bytes", std::to_string(pool), "--ram-bytes", std::to_string(pool), "--copy-threads",
       std::to_string(common.threads), "--remote-nodes", seeds, "--metrics-addr", "off"}));
  if (!started.is_ok()) return started.status();
  Node node;
  node.daemon.emplace(std::move(*started));
  PagedCacheShape shape;  // 32 layers × K/V planes of 32 KiB: 2 MiB blocks
  shape.model_id = "kvtier-bench/remote";
  shape.num_blocks = blocks;
  auto cache = PagedCache::create(shape);
  if (!cache.is_ok()) return cache.status();
  node.cache.emplace(std::move(*cache));
  auto client = Client::connect(node.daemon->socket_path());
  if (!client.is_ok()) return client.status();
  node.client = std::move(*client);
  auto hello = node.client->hello(node.cache->layout(), "kvtier-bench-remote");
  if (!hello.is_ok()) return hello.status();
  node.hello = *hello;
  if (hello->block_bytes != kBlockBytes) {
    return internal_error("kvtierd says blocks are {} bytes; expected {}", hello->block_bytes,
                          kBlockBytes);
  }
  KVTIER_RETURN_IF_ERROR(node.client->register_memfd_region(
      node.cache->region_id(), node.cache->region().fd(), node.cache->region().size_bytes()));
  return node;
}

Status check_loaded(const Result<LoadResult>& loaded, const PagedCache& cache,
                    const std::vector<BlockRef>& refs, const char* what) {
  if (!loaded.is_ok()) return loaded.status().with_context(what);
  if (loaded->loaded_count != refs.size()) {
    return data_loss("{}: loaded {} of {} blocks: {}", what, loaded->loaded_count, refs.size(),
                     loaded->stop_reason.to_string());
  }
  for (const BlockRef& ref : refs) {
    if (!cache.verify(ref.engine_block_id, ref.hash)) {
      return data_loss("{}: engine block {} is not bit-exact", what, ref.engine_block_id);
    }
  }
  return Status::ok();
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
  sub->add_option("--session-blocks", options.session_blocks,
                  "blocks of the session node B resumes from node A")
      ->check(CLI::Range(1u, 1024u));
  return sub;
}

Result<BenchReport> run_remote_bench(const CommonOptions& common,
                                     const RemoteBenchOptions& options) {
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

  // The hand-off: A saves, B resumes.
  const uint32_t n = options.session_blocks;
  auto node_a = start_node(common, redis, 2ull * n);
  if (!node_a.is_ok()) return node_a.status().with_context("node A");
  auto node_b = start_node(common, redis, 2ull * n);
  if (!node_b.is_ok()) return node_b.status().with_context("node B");
  report.config("session_blocks", int64_t{n});
  report.note(fmt::format("  {:<6} {:>14} {:>14} {:>14}", "round", "resume on B", "load on A",
                          "cluster read"));
  std::vector<double> resume_ms, local_ms, raw_ms, resume_vs_raw;
  const std::string run_id =
      fmt::format("{}-{}", ::getpid(), Clock::now().time_since_epoch().count());
  uint64_t written_before = 0;
  for (uint32_t round = 0; round < options.rounds; ++round) {
    const std::string session = fmt::format("kvtier-bench-remote/{}/{}", run_id, round);
    const auto hashes = PagedCache::chain_hashes(session, n);
    std::vector<BlockRef> save_refs, load_refs;
    for (uint32_t i = 0; i < n; ++i) {
      node_a->cache->fill(i, hashes[i]);
      save_refs.push_back({hashes[i], i});
      load_refs.push_back({hashes[i], uint64_t{n} + i});
    }
    auto saved = node_a->client->save(session, save_refs, /*end_of_turn=*/true);
    if (!saved.is_ok()) return saved.status().with_context("save on A");
    // Written behind: every block confirmed by A, then the record.
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    for (;;) {
      auto stats = node_a->client->stats();
      if (!stats.is_ok()) return stats.status();
      if (stats->remote.written_blocks >= written_before + n &&
          stats->remote.in_flight_bytes == 0 &&
          (*store)->get_session(node_a->hello.namespace_name, session).is_ok()) {
        written_before = stats->remote.written_blocks;
        break;
      }
      if (Clock::now() > deadline) {
        return unavailable("A's write-behind of {} blocks did not finish within 60 s", n);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }

    std::vector<remote::RemoteStore::BlockRead> reads;
    for (const BlockHash& h : hashes) {
      reads.push_back(
          {{node_a->hello.namespace_name, node_a->hello.layout_digest, h}, kBlockBytes});
    }
    // The plain read of the same values, before the resume in odd rounds and after it
    // in even ones, so neither always finds the servers warm.
    double raw = 0;
    auto cluster_read = [&]() -> Status {
      const auto raw_start = Clock::now();
      auto got = (*store)->get_blocks(reads);
      raw = seconds_since(raw_start) * 1e3;
      for (auto& g : got) KVTIER_RETURN_IF_ERROR(g.status());
      return Status::ok();
    };
    // Measured on a quiet cluster: replication of what A wrote is over.
    KVTIER_RETURN_IF_ERROR(redis.wait_for_replication(std::chrono::seconds(60)));
    if (round % 2 == 1) KVTIER_RETURN_IF_ERROR(cluster_read());

    node_b->cache->wipe();  // a load that copied nothing cannot verify
    const auto start = Clock::now();
    auto begun = node_b->client->begin_turn(session);
    if (!begun.is_ok()) return begun.status().with_context("BeginTurn on B");
    const double begin_ms = seconds_since(start) * 1e3;
    auto looked = node_b->client->lookup(hashes);
    if (!looked.is_ok()) return looked.status().with_context("Lookup on B");
    if (looked->hit_count != n) {
      return data_loss("Lookup on B found {} of {} blocks", looked->hit_count, n);
    }
    auto loaded = node_b->client->load(session, load_refs);
    const double resume = seconds_since(start) * 1e3;
    KVTIER_RETURN_IF_ERROR(check_loaded(loaded, *node_b->cache, load_refs, "resume on B"));

    node_a->cache->wipe();
    const auto local_start = Clock::now();
    auto local = node_a->client->load(session, load_refs);
    const double local_load = seconds_since(local_start) * 1e3;
    KVTIER_RETURN_IF_ERROR(check_loaded(local, *node_a->cache, load_refs, "load on A"));

    if (round % 2 == 0) KVTIER_RETURN_IF_ERROR(cluster_read());

    resume_ms.push_back(resume);
    local_ms.push_back(local_load);
    raw_ms.push_back(raw);
    resume_vs_raw.push_back(resume / raw);
    report.note(fmt::format(
        "  {:<6} {:>11.1f} ms {:>11.1f} ms {:>11.1f} ms   (BeginTurn answered at {:.1f} ms)", round,
        resume, local_load, raw, begin_ms));
  }
  report.result("resume_ms", median(resume_ms));
  report.result("local_load_ms", median(local_ms));
  report.result("cluster_read_ms", median(raw_ms));
  report.result("resume_vs_cluster_read_ratio", median(resume_vs_raw));
  node_a->daemon->stop(kDaemonStopTimeout);
  node_b->daemon->stop(kDaemonStopTimeout);
  return report;
}

}  // namespace kvtier::bench
