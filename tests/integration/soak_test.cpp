// A short crash-and-restart soak (bench/soak.h; `kvtier-bench soak` runs long ones):
// engine processes run random sessions while kvtierd is SIGKILLed or SIGTERMed and
// restarted, an engine is killed mid-request, (as root) the data directory's tmpfs fills
// up, and NVMe writes fail for a while and then work again (the tier heals without a
// restart). Every block an engine loads is bit-exact or reported missing.
#include <gtest/gtest.h>

#include <cstdio>

#include "bench/soak.h"
#include "tests/integration/daemon_harness.h"

namespace kvtier::integration {
namespace {

TEST(Soak, EveryLoadIsBitExactOrMissingAcrossKillsRestartsDiskFaultsAndAFullDisk) {
  bench::SoakOptions options;
  options.kvtierd = binary_path("kvtierd");
  options.engines = 3;
  options.cycles = 9;
  options.min_uptime = std::chrono::milliseconds(250);
  options.max_uptime = std::chrono::milliseconds(900);
  options.sigterm_percent = 30;
  options.engine_kill_every = 3;
  options.disk_full_cycles = 2;
  options.disk_fault_cycles = 2;
  options.seed = 20261125;
  auto soak = bench::run_soak(options);
  ASSERT_TRUE(soak.is_ok()) << soak.status().to_string();
  const bench::SoakReport& r = *soak;
  std::printf(
      "soak: %u cycles (%u SIGKILL, %u SIGTERM), %u engine kills, disk full: %s (%u cycles); "
      "%u disk-fault cycles (%u injected, %u fill-and-free): %llu degradations, %llu heals; "
      "%llu saves, %llu loads, %llu lookups, %llu begin turns, %llu closes; %llu blocks "
      "verified (%llu after a restart, %llu bytes), %llu missing, %llu wrong; %llu calls "
      "while away, %llu busy, %llu reconnects; %.1f s\n",
      r.cycles, r.sigkill_restarts, r.sigterm_restarts, r.engine_kills, r.disk_full.c_str(),
      r.disk_full_cycles, r.injected_fault_cycles + r.fill_and_free_cycles, r.injected_fault_cycles,
      r.fill_and_free_cycles, static_cast<unsigned long long>(r.nvme_degradations),
      static_cast<unsigned long long>(r.nvme_heals), static_cast<unsigned long long>(r.saves),
      static_cast<unsigned long long>(r.loads), static_cast<unsigned long long>(r.lookups),
      static_cast<unsigned long long>(r.begin_turns), static_cast<unsigned long long>(r.closes),
      static_cast<unsigned long long>(r.blocks_verified),
      static_cast<unsigned long long>(r.blocks_verified_after_restart),
      static_cast<unsigned long long>(r.bytes_verified),
      static_cast<unsigned long long>(r.blocks_missing),
      static_cast<unsigned long long>(r.wrong_blocks),
      static_cast<unsigned long long>(r.unavailable), static_cast<unsigned long long>(r.busy),
      static_cast<unsigned long long>(r.reconnects), r.seconds);
  EXPECT_EQ(r.wrong_blocks, 0u) << r.first_wrong;
  EXPECT_EQ(r.unexpected_errors, 0u) << r.first_unexpected;
  EXPECT_EQ(r.daemon_self_exits, 0u) << r.first_unexpected;
  EXPECT_EQ(r.not_healed, 0u) << r.first_not_healed;
  EXPECT_EQ(r.injected_fault_cycles + r.fill_and_free_cycles, 2u);
  EXPECT_GE(r.nvme_degradations, 1u);
  EXPECT_EQ(r.nvme_heals, r.nvme_degradations);
  EXPECT_EQ(r.cycles, options.cycles);
  EXPECT_EQ(r.engine_kills, 3u);
  EXPECT_GT(r.saves, 0u);
  EXPECT_GT(r.blocks_verified, 0u);
  EXPECT_GT(r.blocks_verified_after_restart, 0u);
  EXPECT_GT(r.reconnects, 0u);
}

}  // namespace
}  // namespace kvtier::integration
