// kvtier-bench soak: the crash-and-restart soak (bench/soak.h) as a subcommand, its
// tallies as a BenchReport. Targets: 0 wrong blocks, 0 unexpected errors, 0 exits the
// daemon made by itself, and blocks verified after a restart (a soak that never read
// anything back proves nothing).
//
// Thread-safety: called from main only (it forks engines).
#pragma once

#include "bench/benchmarks.h"
#include "bench/report.h"
#include "bench/soak.h"

namespace CLI {
class App;
}

namespace kvtier::bench {

struct SoakBenchOptions {
  SoakOptions soak;
  uint64_t min_uptime_ms = 300;
  uint64_t max_uptime_ms = 1500;
};

Result<BenchReport> run_soak_bench(const CommonOptions& common, SoakBenchOptions options);
CLI::App* add_soak_subcommand(CLI::App& app, SoakBenchOptions& options);
// The report of one soak (shared with the test that runs a short one).
BenchReport soak_report(const SoakOptions& options, const SoakReport& soak);

}  // namespace kvtier::bench
