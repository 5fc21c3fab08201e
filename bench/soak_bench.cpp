#include "bench/soak_bench.h"

#include <CLI/CLI.hpp>

namespace kvtier::bench {

CLI::App* add_soak_subcommand(CLI::App& app, SoakBenchOptions& options) {
  CLI::App* soak = app.add_subcommand(
      "soak",
      "engines run random sessions while kvtierd is killed and restarted; every load "
      "is checked bit-exact");
  soak->add_option("--engines", options.soak.engines, "engine processes")
      ->check(CLI::Range(1u, 64u));
  soak->add_option("--cycles", options.soak.cycles, "kill-and-restart cycles")
      ->check(CLI::Range(1u, 1'000'000u));
  soak->add_option("--min-uptime-ms", options.min_uptime_ms, "shortest run between kills")
      ->check(CLI::Range(uint64_t{10}, uint64_t{3'600'000}));
  soak->add_option("--max-uptime-ms", options.max_uptime_ms, "longest run between kills")
      ->check(CLI::Range(uint64_t{10}, uint64_t{3'600'000}));
  soak->add_option("--sigterm-percent", options.soak.sigterm_percent,
                   "cycles that stop kvtierd with SIGTERM instead of SIGKILL")
      ->check(CLI::Range(0u, 100u));
  soak->add_option("--engine-kill-every", options.soak.engine_kill_every,
                   "SIGKILL an engine every Nth cycle (0: never)");
  soak->add_option("--disk-full-cycles", options.soak.disk_full_cycles,
                   "cycles run with the data directory's tmpfs full (needs root; 0: none)");
  soak->add_option("--disk-fault-cycles", options.soak.disk_fault_cycles,
                   "cycles in which NVMe writes fail and then work again while kvtierd runs "
                   "(injected EIO; with root also a tmpfs filled and emptied): the tier must "
                   "heal without a restart (0: none)");
  soak->add_option("--sessions-per-engine", options.soak.sessions_per_engine,
                   "sessions each engine keeps going")
      ->check(CLI::Range(1u, 1000u));
  soak->add_option("--seed", options.soak.seed, "random seed");
  return soak;
}

BenchReport soak_report(const SoakOptions& options, const SoakReport& soak) {
  BenchReport report("soak");
  report.config("engines", int64_t{options.engines});
  report.config("cycles", int64_t{options.cycles});
  report.config("min_uptime_ms", int64_t{options.min_uptime.count()});
  report.config("max_uptime_ms", int64_t{options.max_uptime.count()});
  report.config("sigterm_percent", int64_t{options.sigterm_percent});
  report.config("engine_kill_every", int64_t{options.engine_kill_every});
  report.config("disk_full", soak.disk_full);
  report.config("disk_fault_cycles", int64_t{options.disk_fault_cycles});
  report.config("seed", static_cast<int64_t>(options.seed));
  report.result("cycles", soak.cycles);
  report.result("sigkill_restarts", soak.sigkill_restarts);
  report.result("sigterm_restarts", soak.sigterm_restarts);
  report.result("engine_kills", soak.engine_kills);
  report.result("disk_full_cycles", soak.disk_full_cycles);
  report.result("injected_fault_cycles", soak.injected_fault_cycles);
  report.result("fill_and_free_cycles", soak.fill_and_free_cycles);
  report.result("nvme_degradations", static_cast<double>(soak.nvme_degradations));
  report.result("nvme_heals", static_cast<double>(soak.nvme_heals));
  report.result("not_healed", soak.not_healed);
  report.result("saves", static_cast<double>(soak.saves));
  report.result("lookups", static_cast<double>(soak.lookups));
  report.result("loads", static_cast<double>(soak.loads));
  report.result("begin_turns", static_cast<double>(soak.begin_turns));
  report.result("closes", static_cast<double>(soak.closes));
  report.result("operations", static_cast<double>(soak.saves + soak.lookups + soak.loads +
                                                  soak.begin_turns + soak.closes));
  report.result("blocks_saved", static_cast<double>(soak.blocks_saved));
  report.result("blocks_verified", static_cast<double>(soak.blocks_verified));
  report.result("bytes_verified", static_cast<double>(soak.bytes_verified));
  report.result("blocks_verified_after_restart",
                static_cast<double>(soak.blocks_verified_after_restart));
  report.result("blocks_missing", static_cast<double>(soak.blocks_missing));
  report.result("wrong_blocks", static_cast<double>(soak.wrong_blocks));
  report.result("unavailable_calls", static_cast<double>(soak.unavailable));
  report.result("busy_calls", static_cast<double>(soak.busy));
  report.result("reconnects", static_cast<double>(soak.reconnects));
  report.result("unexpected_errors", static_cast<double>(soak.unexpected_errors));
  report.result("daemon_self_exits", soak.daemon_self_exits);
  report.result("seconds", soak.seconds);
  report.target("wrong_blocks", "<=", 0);
  report.target("unexpected_errors", "<=", 0);
  report.target("daemon_self_exits", "<=", 0);
  report.target("not_healed", "<=", 0);
  if (soak.injected_fault_cycles + soak.fill_and_free_cycles > 0) {
    report.target("nvme_heals", ">=", 1);
  }
  if (!soak.first_not_healed.empty()) report.note("not healed: " + soak.first_not_healed);
  report.target("blocks_verified_after_restart", ">=", 1);
  if (!soak.first_wrong.empty()) report.note("first wrong block: " + soak.first_wrong);
  if (!soak.first_unexpected.empty())
    report.note("first unexpected error: " + soak.first_unexpected);
  return report;
}

Result<BenchReport> run_soak_bench(const CommonOptions& common, SoakBenchOptions options) {
  if (!common.socket.empty()) {
    return invalid_argument("soak starts, kills and restarts its own daemon: drop --socket");
  }
  if (options.min_uptime_ms > options.max_uptime_ms) {
    return invalid_argument("--min-uptime-ms is above --max-uptime-ms");
  }
  options.soak.kvtierd = common.kvtierd_path.empty() ? support::kvtierd_next_to_this_executable()
                                                     : common.kvtierd_path;
  options.soak.min_uptime = std::chrono::milliseconds(options.min_uptime_ms);
  options.soak.max_uptime = std::chrono::milliseconds(options.max_uptime_ms);
  options.soak.keep_dir = common.keep_temp_dir;
  auto soak = run_soak(options.soak);
  if (!soak.is_ok()) return soak.status();
  return soak_report(options.soak, *soak);
}

}  // namespace kvtier::bench
