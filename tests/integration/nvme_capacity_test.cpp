// The NVMe capacity limit holds under a stream of saves several times larger than
// every tier together: cold blocks are evicted, the newest session loads bit-exact,
// every load is bit-exact for the prefix it returns, and no slot leaks.
#include <gtest/gtest.h>

#include "tests/integration/nvme_harness.h"

namespace kvtier::integration {
namespace {

constexpr size_t kSessions = 40;
constexpr size_t kBlocks = 8;  // 32 KiB each: 256 KiB per session, 10 MiB in all

TEST(NvmeCapacity, LimitHoldsUnderAStreamOfSavesLargerThanIt) {
  ScratchDir scratch;
  constexpr uint64_t kCapacity = 2ull << 20;  // 64 blocks
  const std::vector<std::string> flags = {
      "--hbm-bytes",        "512KiB", "--ram-bytes",    "1MiB", "--nvme-bytes",  "2MiB",
      "--slab-bytes",       "256KiB", "--hbm-idle-ms",  "0",    "--ram-idle-ms", "0",
      "--plan-interval-ms", "10ms",   "--metrics-addr", "off"};
  auto daemon = PersistentDaemon::start(scratch.path(), scratch.path() + "/data", flags);
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  auto engine = Engine::connect((*daemon)->socket_path(), small_shape(32), "stream");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();

  for (size_t i = 0; i < kSessions; ++i) {
    const std::string session = fmt::format("stream-{}", i);
    Status saved = save_session(*engine, session, kBlocks);
    ASSERT_TRUE(saved.is_ok()) << session << ": " << saved.to_string();
    auto stats = engine->client->stats();
    ASSERT_TRUE(stats.is_ok());
    const TierStatsInfo* nvme = find_tier(*stats, Tier::kNvme);
    ASSERT_NE(nvme, nullptr);
    EXPECT_EQ(nvme->capacity_bytes, kCapacity);
    ASSERT_LE(nvme->used_bytes, kCapacity);
  }
  auto settled = (*daemon)->wait_for_stats([](const StatsInfo& s) {
    return s.copies_in_flight == 0 && s.pinned_blocks == 0 && s.blocks_evicted > 0 &&
           tier_blocks(s, Tier::kNvme) > 0;
  });
  ASSERT_TRUE(settled.is_ok()) << settled.status().to_string();
  EXPECT_LE(find_tier(*settled, Tier::kNvme)->used_bytes, kCapacity);
  // The stream reached NVMe: it holds more than any one session. (How many sessions
  // stay whole depends on how far demotions kept up with the stream: a Save that finds
  // every tier full drops the coldest movable blocks rather than waiting.)
  EXPECT_GT(tier_blocks(*settled, Tier::kNvme), 2 * kBlocks);

  // The newest session comes back whole (checked first: loading the older ones
  // brings them up and makes room by evicting whatever is coldest then), and
  // everything that comes back is bit-exact.
  size_t whole = 0;
  for (size_t n = 0; n < kSessions; ++n) {
    const size_t i = kSessions - 1 - n;
    const std::string session = fmt::format("stream-{}", i);
    auto check = load_session(*engine, session, kBlocks, 16);
    ASSERT_TRUE(check.is_ok()) << session << ": " << check.status().to_string();
    EXPECT_EQ(check->bit_exact, check->loaded) << session << ": " << check->describe();
    if (check->loaded == kBlocks) ++whole;
    if (n == 0) {
      EXPECT_EQ(check->loaded, kBlocks) << check->describe();
    }
  }
  EXPECT_LT(whole, kSessions);  // the stream did not fit: some sessions were evicted

  auto quiet = (*daemon)->wait_for_stats(
      [](const StatsInfo& s) { return s.copies_in_flight == 0 && s.pinned_blocks == 0; });
  ASSERT_TRUE(quiet.is_ok()) << quiet.status().to_string();
  // Slots given up are reusable again once their index entries are gone: none leak.
  auto no_leaks = (*daemon)->wait_for_stats(
      [](const StatsInfo& s) { return NoLeakedSlots(s, small_shape().block_bytes()); });
  EXPECT_TRUE(no_leaks.is_ok()) << no_leaks.status().to_string();
  EXPECT_TRUE((*daemon)->stop().ok());
}

}  // namespace
}  // namespace kvtier::integration
