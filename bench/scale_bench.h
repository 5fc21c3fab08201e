// kvtier-bench scale: what one request costs as the daemon grows (kvtier issue 11).
//
// One kvtierd on the host backend, with 2 KiB blocks, is grown to each of `sizes`
// sessions (each a finished turn: a shared 2-block system prompt and 4 blocks of its
// own; scale_workload.h). At each size it times, interleaved, `ops_per_size` rounds of
//   BeginTurn of an idle session · Lookup of 32 held hashes (the prefix, then blocks
//   of sessions across the daemon) · Load of a 16-block prefix, verified bit-exact ·
//   Save of 16 new blocks ending that session's turn (timed to its reply, and again
//   until the daemon answers the next request: save_until_idle, which catches the
//   work done after the reply) · Stats (`kvtierctl status`),
// after `warmup_per_size` untimed rounds. Each request is sent once an untimed 1-hash
// Lookup has come back, so none waits behind another's leftovers (the planner's
// timer may still run before any of them). Twice, each on a daemon of its own:
//  * nopressure: HBM holds every block below its high watermark;
//  * pressure: HBM of 1 MiB, always over its high watermark once grown, so Saves
//    trigger demotions to RAM and BeginTurn displaces idle sessions' blocks.
// In both, idle demotion is off (hbm-idle-ms 1h) and RAM never fills: no evictions.
//
// With --notice-rounds, at the largest size: tier notices (WatchTiers) told to a
// subscribed connection of the engine's layout per second (changes, and their bytes on
// the wire), and the Save's p50/p99 with and without that subscriber (target: within
// noise), in alternating phases on the same daemon.
//
// Targets: each op's p50 and p99 at the largest size within 2× of its value at the
// smallest; the daemon's RSS growth from start to the largest size (before its
// measured rounds) within 1 KiB per session + 8 B per session reference + 128 B per
// block held (docs/benchmarks.md, scale). Missing a target is a result, not a failure.
//
// Thread-safety: run_scale_bench() is called from main only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/benchmarks.h"
#include "bench/report.h"
#include "common/status.h"

namespace CLI {
class App;
}

namespace kvtier::bench {

struct ScaleBenchOptions {
  std::vector<uint64_t> sizes = {100, 1'000, 10'000, 50'000};  // sessions, ascending
  uint32_t ops_per_size = 300;    // timed rounds per size (each times every op once)
  uint32_t warmup_per_size = 16;  // untimed rounds first
  std::vector<std::string> modes = {"nopressure", "pressure"};
  // Grow under the measured settings too (today the planner then indexes every session
  // after every Save, and growing to 50k sessions takes a long time).
  bool grow_as_measured = false;
  // At the largest size: Lookups timed on an idle daemon and while another connection
  // pages through the whole session listing, over and over (0: skip).
  uint32_t listing_lookups = 0;
  uint32_t listing_page = 0;  // sessions per listing page (0: the daemon's default)
  // At the largest size: rounds in phases without and with a second connection of the
  // engine's layout subscribed to tier notices (WatchTiers), alternating; what the
  // subscriber is told per second, and the Save's latency in either phase (0: skip).
  uint32_t notice_rounds = 0;
  uint32_t notice_phases = 6;
  // Blocks of its own per grown session, after the shared prefix (the memory per held
  // block is measured at 50k sessions of 16: --own-blocks 14).
  uint32_t own_blocks = 4;
};

Result<BenchReport> run_scale_bench(const CommonOptions& common, const ScaleBenchOptions& options);
CLI::App* add_scale_subcommand(CLI::App& app, ScaleBenchOptions& options);

}  // namespace kvtier::bench
