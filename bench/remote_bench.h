// kvtier-bench remote: the remote tier's store against Redis itself, in one run on one
// cluster. It starts a local Redis Cluster (3 masters, 3 replicas: tests/support/
// redis_cluster.h), then per round
//  * writes `blocks` 2 MiB blocks through RemoteStore::put_blocks in batches of `batch`
//    (pipelined per master, header and checksum per block, TTL set) and reads them back
//    through get_blocks (every block's checksum verified, every 8th compared byte for
//    byte with what was written);
//  * runs redis-benchmark against the same cluster with SET/GET of the same value size,
//    with as many connections as the store has (one per master) and `batch` / masters
//    requests pipelined on each.
// It reports GB/s of both and their ratio (target ≥ 0.8), medians over rounds.
//
// Then the hand-off: two kvtierds (A and B) on the same cluster, an engine on each.
// Per round A saves a `session_blocks`-block session (2 MiB blocks, one turn) and
// writes it behind; B resumes it — BeginTurn (record fetched, blocks prefetched),
// Lookup, Load, every block verified bit-exact — timed from BeginTurn to the Load's
// reply. Baselines in the same round: the same Load on A, where the blocks are local,
// and RemoteStore::get_blocks of the same blocks straight from the cluster (the bytes
// moved, without a daemon).
//
// Thread-safety: run_remote_bench() is called from main only.
#pragma once

#include <cstdint>

#include "bench/benchmarks.h"
#include "bench/report.h"
#include "common/status.h"

namespace CLI {
class App;
}

namespace kvtier::bench {

struct RemoteBenchOptions {
  uint32_t blocks = 96;  // 2 MiB blocks per round
  uint32_t rounds = 3;
  uint32_t batch = 24;           // blocks per put_blocks/get_blocks call
  uint32_t session_blocks = 32;  // blocks of the session node B resumes
};

Result<BenchReport> run_remote_bench(const CommonOptions& common,
                                     const RemoteBenchOptions& options);
CLI::App* add_remote_subcommand(CLI::App& app, RemoteBenchOptions& options);

}  // namespace kvtier::bench
