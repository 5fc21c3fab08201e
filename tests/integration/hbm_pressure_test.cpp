// HBM pressure: more blocks than the HBM arena holds are saved; the daemon demotes to
// RAM past the high watermark, every block still loads back bit-exact, and kvtierctl
// reports the RAM tier in use.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "tests/integration/daemon_harness.h"

namespace kvtier::integration {
namespace {

// The number after "key": in the JSON object that starts at `object`.
std::optional<uint64_t> json_number(const std::string& json, size_t object,
                                    const std::string& key) {
  size_t end = json.find('}', object);
  size_t at = json.find("\"" + key + "\":", object);
  if (at == std::string::npos || at > end) return std::nullopt;
  const char* digits = json.c_str() + at + key.size() + 3;
  char* stop = nullptr;
  uint64_t value = std::strtoull(digits, &stop, 10);
  if (stop == digits) return std::nullopt;
  return value;
}

TEST(HbmPressure, DemotesToRamAndEveryBlockLoadsBitExact) {
  auto daemon =
      Daemon::start({"--hbm-bytes", "16MiB", "--ram-bytes", "64MiB", "--hbm-high-watermark", "0.9",
                     "--hbm-low-watermark", "0.5", "--copy-threads", "2"});
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  const PagedCacheShape shape = example_shape(40);
  const uint64_t hbm_capacity = 16ull << 20;
  ASSERT_EQ(shape.block_bytes(), 2ull << 20);

  // 4 turns × 5 blocks of 2 MiB = 40 MiB, against an arena of 8 blocks.
  constexpr size_t kBlocks = 20;
  const std::string session = "long-conversation";
  ProcessResult saver =
      (*daemon)->run_example_engine({"--save-only", "--session", session, "--turns", "4",
                                     "--blocks-per-turn", "5", "--num-blocks", "40"});
  ASSERT_TRUE(saver.status.ok()) << saver.describe();

  auto settled = (*daemon)->wait_for_stats([&](const StatsInfo& s) {
    const TierStatsInfo* hbm = find_tier(s, Tier::kHbm);
    const TierStatsInfo* ram = find_tier(s, Tier::kRam);
    return hbm != nullptr && ram != nullptr && s.bytes_demoted > 0 && ram->used_bytes > 0 &&
           s.copies_in_flight == 0 && s.pinned_blocks == 0 &&
           hbm->used_bytes * 10 <= hbm_capacity * 9;
  });
  ASSERT_TRUE(settled.is_ok()) << settled.status().to_string();
  EXPECT_EQ(total_blocks(*settled), kBlocks);
  EXPECT_TRUE(NoLeakedSlots(*settled, shape.block_bytes()));
  EXPECT_EQ(settled->blocks_evicted, 0u);

  // kvtierctl, as an admin would run it.
  ProcessResult ctl = (*daemon)->run_kvtierctl({"status", "--json"});
  ASSERT_TRUE(ctl.status.ok()) << ctl.describe();
  size_t ram_object = ctl.stdout_text.find("{\"tier\":\"ram\"");
  ASSERT_NE(ram_object, std::string::npos) << ctl.stdout_text;
  auto ram_used = json_number(ctl.stdout_text, ram_object, "used_bytes");
  ASSERT_TRUE(ram_used.has_value()) << ctl.stdout_text;
  EXPECT_GT(*ram_used, 0u) << ctl.stdout_text;
  auto demoted = json_number(ctl.stdout_text, ctl.stdout_text.find("\"bytes\":"), "demoted");
  ASSERT_TRUE(demoted.has_value()) << ctl.stdout_text;
  EXPECT_GT(*demoted, 0u) << ctl.stdout_text;

  // A second engine process's view: every block held, some of them in RAM.
  auto engine = Engine::connect((*daemon)->socket_path(), shape, "pressure-reader");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const std::vector<BlockHash> hashes = PagedCache::chain_hashes(session, kBlocks);
  auto found = engine->client->lookup(hashes);
  ASSERT_TRUE(found.is_ok()) << found.status().to_string();
  ASSERT_EQ(found->hit_count, kBlocks);
  EXPECT_NE(std::count(found->tiers.begin(), found->tiers.end(), Tier::kRam), 0);

  // Load everything back, into engine blocks other than those the saver used.
  auto refs = Engine::refs(hashes, 20);
  auto loaded = engine->client->load(session, refs);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->loaded_count, kBlocks) << loaded->stop_reason.to_string();
  EXPECT_TRUE(loaded->stop_reason.is_ok()) << loaded->stop_reason.to_string();
  EXPECT_EQ(engine->count_verified(refs, loaded->loaded_count), kBlocks);

  // The same through the example engine's own verifier.
  ProcessResult verifier =
      (*daemon)->run_example_engine({"--verify-only", "--session", session, "--turns", "4",
                                     "--blocks-per-turn", "5", "--num-blocks", "40"});
  EXPECT_TRUE(verifier.status.ok()) << verifier.describe();

  ExitStatus stopped = (*daemon)->stop();
  EXPECT_TRUE(stopped.ok()) << "kvtierd " << stopped.describe();
}

}  // namespace
}  // namespace kvtier::integration
