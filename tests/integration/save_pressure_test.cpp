// Saves under pressure, as an inference server drives kvtierd once its fast tiers are
// full: HBM and RAM of a few blocks above a large NVMe, sessions with retention
// priorities 1, 50 and 100 and without one, each turn opened with BeginTurn and saved at
// its end. Nothing may be cut while NVMe has room, whatever the priority; blocks reach
// NVMe lowest priority first; and after a kill -9 every acknowledged block of every
// priority reloads bit-exact (a session kept in the fast tiers by its priority has its
// NVMe copy written in the background).
#include <gtest/gtest.h>

#include <array>
#include <map>

#include "tests/integration/nvme_harness.h"

namespace kvtier::integration {
namespace {

constexpr size_t kBlocks = 4;                                    // per session
constexpr size_t kRounds = 3;                                    // sessions per priority
constexpr uint64_t kLoadTarget = 32;                             // engine blocks 32.. receive loads
constexpr std::array<uint8_t, 4> kPriorities = {100, 50, 0, 1};  // 0: none given

std::string session_name(uint8_t priority, size_t round) {
  return fmt::format("p{}-{}", priority, round);
}

// Default idle times (30 s, 10 min): only pressure moves blocks, as in a busy server.
// A Save may wait up to 10 s for demotions to land (default 250 ms, then it keeps what
// fits): a cut here is the policy's doing, never a slow disk's on a loaded machine.
std::vector<std::string> pressure_flags(const std::string& policy) {
  return {
      "--hbm-bytes",  "256KiB", "--ram-bytes",          "256KiB", "--nvme-bytes",        "64MiB",
      "--slab-bytes", "256KiB", "--plan-interval-ms",   "20ms",   "--metrics-addr",      "off",
      "--policy",     policy,   "--nvme-copy-after-ms", "200ms",  "--save-room-wait-ms", "10s"};
}

class SavePressure : public ::testing::TestWithParam<std::string> {};

// Where the session's blocks live now, by Lookup (every block must be held).
std::vector<Tier> tiers_of(Engine& engine, const std::string& session) {
  auto found = engine.client->lookup(PagedCache::chain_hashes(session, kBlocks));
  EXPECT_TRUE(found.is_ok()) << found.status().to_string();
  if (!found.is_ok()) return {};
  EXPECT_EQ(found->hit_count, kBlocks) << session;
  return found->tiers;
}

size_t count_on_nvme(Engine& engine, const std::string& session) {
  size_t n = 0;
  for (Tier tier : tiers_of(engine, session)) n += tier == Tier::kNvme ? 1 : 0;
  return n;
}

Status save_with_priority(Engine& engine, const std::string& session, uint8_t priority) {
  (void)engine.client->begin_turn(session);  // a new session: nothing to promote
  const auto refs = Engine::refs(PagedCache::chain_hashes(session, kBlocks), 0);
  engine.fill(refs);
  SaveOptions options;
  options.retention.priority = priority;
  auto saved = engine.client->save(session, refs, /*end_of_turn=*/true, options);
  if (!saved.is_ok()) return saved.status();
  if (saved->saved() != kBlocks) {
    return internal_error("{} was cut short: {} of {} blocks kept", session, saved->saved(),
                          kBlocks);
  }
  return Status::ok();
}

TEST_P(SavePressure, NothingIsCutWhileNvmeHasRoomAndEveryPrioritySurvivesKillNine) {
  ScratchDir scratch;
  const std::string data = scratch.path() + "/data";
  // Watermarks of 1: only the Saves' need for room moves blocks, so where each one goes
  // is the order of sacrifice alone.
  std::vector<std::string> flags = pressure_flags(GetParam());
  for (const char* mark : {"--hbm-high-watermark", "--hbm-low-watermark", "--ram-high-watermark",
                           "--ram-low-watermark"}) {
    flags = with_flag(flags, mark, "1");
  }
  auto daemon = PersistentDaemon::start(scratch.path(), data, flags);
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  auto engine = Engine::connect((*daemon)->socket_path(), small_shape(64), "pressure");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();

  // HBM takes the first two sessions (priorities 100 and 50), RAM the next two (none, 1).
  for (uint8_t priority : kPriorities) {
    ASSERT_TRUE(save_with_priority(*engine, session_name(priority, 0), priority).is_ok());
  }
  // Each further Save needs room: the lowest priority goes down to NVMe first — priority
  // 1's blocks, then those without a priority — while the prioritised sessions stay.
  ASSERT_TRUE(save_with_priority(*engine, "extra-0", 0).is_ok());
  EXPECT_EQ(count_on_nvme(*engine, session_name(1, 0)), kBlocks);
  EXPECT_EQ(count_on_nvme(*engine, session_name(0, 0)), 0u);
  ASSERT_TRUE(save_with_priority(*engine, "extra-1", 0).is_ok());
  EXPECT_EQ(count_on_nvme(*engine, session_name(0, 0)) + count_on_nvme(*engine, "extra-0"),
            kBlocks);
  EXPECT_EQ(count_on_nvme(*engine, session_name(50, 0)), 0u);
  EXPECT_EQ(count_on_nvme(*engine, session_name(100, 0)), 0u);

  // 40 more blocks, every priority: nothing is cut while NVMe has room.
  for (size_t round = 1; round < kRounds; ++round) {
    for (uint8_t priority : kPriorities) {
      const Status saved = save_with_priority(*engine, session_name(priority, round), priority);
      ASSERT_TRUE(saved.is_ok()) << saved.to_string() << "\n" << (*daemon)->log();
    }
  }
  auto settled = (*daemon)->wait_for_stats(
      [](const StatsInfo& s) { return s.copies_in_flight == 0 && s.pinned_blocks == 0; });
  ASSERT_TRUE(settled.is_ok()) << settled.status().to_string();
  EXPECT_EQ(settled->partial_saves, 0u);
  EXPECT_EQ(settled->blocks_evicted, 0u);
  std::map<uint8_t, size_t> on_nvme;
  for (uint8_t priority : kPriorities) {
    for (size_t round = 0; round < kRounds; ++round) {
      on_nvme[priority] += count_on_nvme(*engine, session_name(priority, round));
    }
  }
  SCOPED_TRACE(fmt::format("blocks on NVMe by priority: 1: {}, none: {}, 50: {}, 100: {}",
                           on_nvme[1], on_nvme[0], on_nvme[50], on_nvme[100]));
  EXPECT_LT(on_nvme[100], on_nvme[1]);
  EXPECT_LT(on_nvme[100], on_nvme[0]);

  // Within the copy window every block has its place or a copy on NVMe.
  const uint64_t block_bytes = small_shape().block_bytes();
  const uint64_t total = (kPriorities.size() * kRounds + 2) * kBlocks;
  auto durable = (*daemon)->wait_for_stats([&](const StatsInfo& s) {
    const TierStatsInfo* nvme = find_tier(s, Tier::kNvme);
    return nvme != nullptr && nvme->blocks + nvme->copy_bytes / block_bytes >= total &&
           s.copies_in_flight == 0;
  });
  ASSERT_TRUE(durable.is_ok()) << durable.status().to_string();

  (*daemon)->kill9();
  ASSERT_TRUE((*daemon)->restart().is_ok()) << (*daemon)->log();
  auto after = Engine::connect((*daemon)->socket_path(), small_shape(64), "after-crash");
  ASSERT_TRUE(after.is_ok()) << after.status().to_string();
  std::vector<std::string> sessions = {"extra-0", "extra-1"};
  for (uint8_t priority : kPriorities) {
    for (size_t round = 0; round < kRounds; ++round)
      sessions.push_back(session_name(priority, round));
  }
  for (const std::string& session : sessions) {
    auto check = load_session(*after, session, kBlocks, kLoadTarget);
    ASSERT_TRUE(check.is_ok()) << session << ": " << check.status().to_string();
    EXPECT_EQ(check->loaded, kBlocks) << session << ": " << check->describe();
    EXPECT_EQ(check->bit_exact, check->loaded) << session << ": " << check->describe();
  }
  EXPECT_TRUE((*daemon)->stop().ok());
}

// As vLLM drives it: four conversations at once, each turn opened with BeginTurn, the
// prefix loaded back (the engine lost it), and the whole history saved again with the
// turn's new blocks (its earlier blocks deduplicated), half the conversations with a
// priority; every Save of a turn is sent before any reply is read.
TEST_P(SavePressure, ConcurrentConversationsSavingTheirWholeHistoryAreNeverCut) {
  ScratchDir scratch;
  auto daemon =
      PersistentDaemon::start(scratch.path(), scratch.path() + "/data", pressure_flags(GetParam()));
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  auto engine = Engine::connect((*daemon)->socket_path(), small_shape(64), "conversations");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  constexpr size_t kConversations = 4, kTurns = 4, kNewBlocks = 2;
  const std::array<uint8_t, kConversations> priorities = {50, 0, 100, 0};
  std::vector<std::vector<BlockHash>> history(kConversations);
  for (size_t c = 0; c < kConversations; ++c) {
    history[c] = PagedCache::chain_hashes(fmt::format("conv-{}", c), kTurns * kNewBlocks);
  }
  for (size_t turn = 0; turn < kTurns; ++turn) {
    std::vector<Pending<BeginTurnResult>> begun;
    for (size_t c = 0; c < kConversations; ++c) {
      begun.push_back(engine->client->begin_turn_async(fmt::format("conv-{}", c)));
    }
    for (auto& b : begun) (void)b.wait();
    for (size_t c = 0; c < kConversations && turn > 0; ++c) {
      const std::span<const BlockHash> prefix(history[c].data(), turn * kNewBlocks);
      // Engine blocks 32.. for the loads, so the saves' blocks 0.. are not overwritten.
      auto check = load_session(*engine, fmt::format("conv-{}", c), prefix.size(), kLoadTarget);
      ASSERT_TRUE(check.is_ok()) << check.status().to_string();
      EXPECT_EQ(check->loaded, prefix.size()) << "conv-" << c << ": " << check->describe();
      EXPECT_EQ(check->bit_exact, check->loaded);
    }
    std::vector<std::vector<BlockRef>> refs(kConversations);
    std::vector<Pending<SaveResult>> saves;
    for (size_t c = 0; c < kConversations; ++c) {
      const std::span<const BlockHash> blocks(history[c].data(), (turn + 1) * kNewBlocks);
      refs[c] = Engine::refs(blocks, c * kTurns * kNewBlocks);
    }
    for (size_t c = 0; c < kConversations; ++c) engine->fill(refs[c]);
    for (size_t c = 0; c < kConversations; ++c) {
      SaveOptions options;
      options.retention.priority = priorities[c];
      saves.push_back(
          engine->client->save_async(fmt::format("conv-{}", c), refs[c], true, options));
    }
    for (size_t c = 0; c < kConversations; ++c) {
      auto saved = saves[c].wait();
      ASSERT_TRUE(saved.is_ok()) << "turn " << turn << " conv-" << c << ": "
                                 << saved.status().to_string();
      EXPECT_EQ(saved->saved(), refs[c].size()) << "turn " << turn << " conv-" << c;
    }
  }
  auto settled = (*daemon)->wait_for_stats(
      [](const StatsInfo& s) { return s.copies_in_flight == 0 && s.pinned_blocks == 0; });
  ASSERT_TRUE(settled.is_ok()) << settled.status().to_string();
  EXPECT_EQ(settled->partial_saves, 0u);
  EXPECT_GT(tier_blocks(*settled, Tier::kNvme), 0u);
  EXPECT_TRUE((*daemon)->stop().ok());
}

INSTANTIATE_TEST_SUITE_P(Policies, SavePressure,
                         ::testing::Values("predictive", "session", "lru", "s3fifo"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::erase(name, '-');
                           return name;
                         });

}  // namespace
}  // namespace kvtier::integration
