// The kvtier-bench subcommands. Each runs its measurement and its baseline side by side
// in one process run, and returns a BenchReport (or the error that stopped it: a
// daemon that would not start, a request that failed, bytes that did not verify —
// a benchmark never reports speed for wrong data).
//
// Unless CommonOptions::socket names a running daemon, each subcommand starts its own
// kvtierd (support::DaemonProcess) sized for the run and stops it with SIGTERM at the end.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bench/report.h"
#include "common/status.h"
#include "tests/support/daemon_process.h"

namespace kvtier::bench {

struct CommonOptions {
  std::string socket;          // empty: start a private kvtierd
  std::string kvtierd_path;    // empty: kvtierd next to this executable
  int threads = 2;             // daemon --copy-threads and the memcpy baseline's threads
  bool keep_temp_dir = false;  // keep the private daemon's temp dir (log, data)
};

// How long a private kvtierd gets to exit after SIGTERM before it is SIGKILLed.
inline constexpr std::chrono::milliseconds kDaemonStopTimeout{10'000};

// A private kvtierd for one subcommand, started with `flags`: the binary from --kvtierd
// (else the one next to kvtier-bench), in a fresh temp dir (socket, data dir and log
// there; kept with --keep-temp-dir), never writing to the bench's stdout, and sent
// SIGTERM if the bench dies mid-run.
inline support::DaemonProcessOptions private_daemon_options(const CommonOptions& common,
                                                            std::vector<std::string> flags) {
  support::DaemonProcessOptions options;
  options.binary = common.kvtierd_path.empty() ? support::kvtierd_next_to_this_executable()
                                               : common.kvtierd_path;
  options.temp_prefix = "kvtier-bench";
  options.keep_dir = common.keep_temp_dir;
  options.die_with_parent = true;
  options.ready_timeout = std::chrono::milliseconds{15'000};
  options.flags = std::move(flags);
  return options;
}

struct CopyOptions {
  uint32_t blocks = 256;      // 2 MiB blocks per round (256 = 512 MiB)
  uint32_t rounds = 5;        // fresh hashes each round; the report takes medians
  uint32_t batch = 32;        // blocks per Save/Load request
  uint32_t in_flight = 4;     // requests pipelined on the connection
  uint32_t verify_every = 8;  // verify every Nth loaded block (and the last) bit-exact
};

struct RpcOptions {
  uint32_t iterations = 20'000;  // timed lookups (and as many socketpair round trips)
  uint32_t warmup = 2'000;       // untimed lookups first
  uint32_t hashes = 32;          // hashes per Lookup
};

// Save/load throughput of 2 MiB blocks through the daemon vs memcpy gather/scatter.
Result<BenchReport> run_copy_bench(const CommonOptions& common, const CopyOptions& options);
// Lookup round-trip latency vs a raw socketpair ping-pong of the same sizes.
Result<BenchReport> run_rpc_bench(const CommonOptions& common, const RpcOptions& options);

}  // namespace kvtier::bench
