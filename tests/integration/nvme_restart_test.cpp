// Sessions survive a restart through the NVMe tier: demoted by the planner or drained
// on SIGTERM, they load back bit-exact in a new daemon process, and kvtierctl shows
// them on NVMe; a session read back up keeps its NVMe copy and survives kill -9. A
// second SIGTERM cuts the drain short; a newer on-disk format is refused with both
// version numbers named.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <thread>

#include "tests/integration/nvme_harness.h"
#include "tiers/nvme_index.h"

namespace kvtier::integration {
namespace {

constexpr size_t kAlphaBlocks = 12;
constexpr size_t kBetaBlocks = 20;

const SessionInfo* find_session(const std::vector<SessionInfo>& sessions, const std::string& id) {
  for (const SessionInfo& session : sessions) {
    if (session.session_id == id) return &session;
  }
  return nullptr;
}

TEST(NvmeRestart, SessionsDemotedToNvmeLoadBitExactAfterRestart) {
  ScratchDir scratch;
  const std::string data = scratch.path() + "/data";
  {
    auto daemon = PersistentDaemon::start(scratch.path(), data, nvme_tier_flags());
    ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
    auto engine = Engine::connect((*daemon)->socket_path(), small_shape(64), "saver");
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    ASSERT_TRUE(save_session(*engine, "alpha", kAlphaBlocks).is_ok());
    ASSERT_TRUE(save_session(*engine, "beta", kBetaBlocks).is_ok());
    // Idle thresholds of 0: both sessions go all the way down to NVMe.
    auto settled = (*daemon)->wait_for_stats([](const StatsInfo& s) {
      return tier_blocks(s, Tier::kNvme) == kAlphaBlocks + kBetaBlocks && s.copies_in_flight == 0 &&
             s.pinned_blocks == 0;
    });
    ASSERT_TRUE(settled.is_ok()) << settled.status().to_string();
    EXPECT_TRUE(NoLeakedSlots(*settled, small_shape().block_bytes()));
    ExitStatus stopped = (*daemon)->stop();
    ASSERT_TRUE(stopped.ok()) << stopped.describe();
  }

  auto daemon = PersistentDaemon::start(scratch.path(), data, nvme_tier_flags());
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  // The session table came back with the index: kvtierctl and ListSessions see it.
  ProcessResult ctl = (*daemon)->run_kvtierctl({"sessions"});
  ASSERT_TRUE(ctl.status.ok()) << ctl.describe();
  EXPECT_NE(ctl.stdout_text.find("alpha"), std::string::npos) << ctl.stdout_text;
  EXPECT_NE(ctl.stdout_text.find("beta"), std::string::npos) << ctl.stdout_text;
  ProcessResult status = (*daemon)->run_kvtierctl({"status"});
  ASSERT_TRUE(status.status.ok()) << status.describe();
  EXPECT_NE(status.stdout_text.find("nvme"), std::string::npos) << status.stdout_text;

  auto engine = Engine::connect((*daemon)->socket_path(), small_shape(64), "loader");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  auto sessions = engine->client->list_sessions();
  ASSERT_TRUE(sessions.is_ok()) << sessions.status().to_string();
  const SessionInfo* alpha = find_session(*sessions, "alpha");
  ASSERT_NE(alpha, nullptr);
  EXPECT_EQ(alpha->blocks, kAlphaBlocks);
  EXPECT_EQ(alpha->turns, 1u);
  ASSERT_EQ(alpha->blocks_per_tier.size(), 4u);
  EXPECT_EQ(alpha->blocks_per_tier[static_cast<int>(Tier::kNvme)], kAlphaBlocks);
  auto found = engine->client->lookup(PagedCache::chain_hashes("beta", kBetaBlocks));
  ASSERT_TRUE(found.is_ok());
  EXPECT_EQ(found->hit_count, kBetaBlocks);
  EXPECT_EQ(found->tiers[0], Tier::kNvme);

  for (const auto& [session, blocks] : {std::pair{"alpha", kAlphaBlocks}, {"beta", kBetaBlocks}}) {
    auto check = load_session(*engine, session, blocks, 32);
    ASSERT_TRUE(check.is_ok()) << check.status().to_string();
    EXPECT_EQ(check->loaded, blocks) << session << ": " << check->describe();
    EXPECT_EQ(check->bit_exact, blocks) << session << ": " << check->describe();
    EXPECT_TRUE(check->stop_reason.is_ok()) << check->describe();
  }
  ExitStatus stopped = (*daemon)->stop();
  EXPECT_TRUE(stopped.ok()) << stopped.describe();
}

// NVMe is inclusive below RAM: a session read back up from NVMe keeps its NVMe copy
// (its index entries stay), so a kill -9 while it lives in RAM/HBM loses nothing: the
// next daemon recovers it from NVMe, bit-exact.
TEST(NvmeRestart, APromotedSessionKilledWithSigkillIsRecoveredFromItsNvmeCopy) {
  ScratchDir scratch;
  const std::string data = scratch.path() + "/data";
  auto daemon = PersistentDaemon::start(scratch.path(), data, nvme_tier_flags());
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  {
    auto engine = Engine::connect((*daemon)->socket_path(), small_shape(64), "saver");
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    ASSERT_TRUE(save_session(*engine, "alpha", kAlphaBlocks).is_ok());
  }
  // Idle thresholds of 0: the session goes down to NVMe.
  auto on_nvme = (*daemon)->wait_for_stats([](const StatsInfo& s) {
    return tier_blocks(s, Tier::kNvme) == kAlphaBlocks && s.copies_in_flight == 0;
  });
  ASSERT_TRUE(on_nvme.is_ok()) << on_nvme.status().to_string();
  ASSERT_TRUE((*daemon)->stop().ok());

  // Long idle thresholds: what a Load reads up stays above NVMe.
  const std::vector<std::string> flags =
      with_flag(with_flag(nvme_tier_flags(), "--hbm-idle-ms", "1h"), "--ram-idle-ms", "1h");
  ASSERT_TRUE((*daemon)->restart(flags).is_ok()) << (*daemon)->log();
  {
    auto engine = Engine::connect((*daemon)->socket_path(), small_shape(64), "reader");
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    auto check = load_session(*engine, "alpha", kAlphaBlocks, 32);
    ASSERT_TRUE(check.is_ok()) << check.status().to_string();
    ASSERT_EQ(check->bit_exact, kAlphaBlocks) << check->describe();
  }
  const uint64_t block_bytes = small_shape().block_bytes();
  auto promoted = (*daemon)->wait_for_stats([&](const StatsInfo& s) {
    const TierStatsInfo* nvme = find_tier(s, Tier::kNvme);
    return tier_blocks(s, Tier::kNvme) == 0 && nvme != nullptr &&
           nvme->copy_bytes == kAlphaBlocks * block_bytes && s.copies_in_flight == 0 &&
           s.pinned_blocks == 0;
  });
  ASSERT_TRUE(promoted.is_ok()) << promoted.status().to_string();
  EXPECT_TRUE(NoLeakedSlots(*promoted, block_bytes));
  ProcessResult status = (*daemon)->run_kvtierctl({"status", "--json"});
  ASSERT_TRUE(status.status.ok()) << status.describe();
  EXPECT_NE(status.stdout_text.find(fmt::format("\"copy_bytes\":{}", kAlphaBlocks * block_bytes)),
            std::string::npos)
      << status.stdout_text;

  const ExitStatus killed = (*daemon)->kill9();
  ASSERT_EQ(killed.signal, SIGKILL) << killed.describe();
  ASSERT_TRUE((*daemon)->restart(flags).is_ok()) << (*daemon)->log();
  auto engine = Engine::connect((*daemon)->socket_path(), small_shape(64), "after-crash");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  auto found = engine->client->lookup(PagedCache::chain_hashes("alpha", kAlphaBlocks));
  ASSERT_TRUE(found.is_ok()) << found.status().to_string();
  EXPECT_EQ(found->hit_count, kAlphaBlocks);
  ASSERT_FALSE(found->tiers.empty());
  EXPECT_EQ(found->tiers[0], Tier::kNvme);
  auto check = load_session(*engine, "alpha", kAlphaBlocks, 32);
  ASSERT_TRUE(check.is_ok()) << check.status().to_string();
  EXPECT_EQ(check->loaded, kAlphaBlocks) << check->describe();
  EXPECT_EQ(check->bit_exact, kAlphaBlocks) << check->describe();
  EXPECT_TRUE((*daemon)->stop().ok());
}

TEST(NvmeRestart, SigtermDrainsRamAndHbmToNvme) {
  ScratchDir scratch;
  const std::string data = scratch.path() + "/data";
  // Long idle thresholds: nothing reaches NVMe before the SIGTERM.
  const std::vector<std::string> flags =
      with_flag(with_flag(nvme_tier_flags(), "--hbm-idle-ms", "1h"), "--ram-idle-ms", "1h");
  {
    auto daemon = PersistentDaemon::start(scratch.path(), data, flags);
    ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
    auto engine = Engine::connect((*daemon)->socket_path(), small_shape(64), "saver");
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    ASSERT_TRUE(save_session(*engine, "drained", 24).is_ok());
    // A durationless priority is kept in the session's record; a timed one is not.
    for (const auto& [session, retention] :
         {std::pair{"durable", Retention{90, 0}}, {"timed", Retention{80, 3'600'000}}}) {
      const auto refs = Engine::refs(PagedCache::chain_hashes(session, 4),
                                     std::string(session) == "durable" ? 40 : 44);
      engine->fill(refs);
      SaveOptions options;
      options.retention = retention;
      ASSERT_TRUE(engine->client->save(session, refs, true, options).is_ok());
    }
    auto stats = engine->client->stats();
    ASSERT_TRUE(stats.is_ok());
    EXPECT_EQ(tier_blocks(*stats, Tier::kNvme), 0u);
    ExitStatus stopped = (*daemon)->stop();
    ASSERT_TRUE(stopped.ok()) << stopped.describe();
    EXPECT_NE((*daemon)->log().find("drain to NVMe done"), std::string::npos) << (*daemon)->log();
  }
  auto daemon = PersistentDaemon::start(scratch.path(), data, flags);
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  auto engine = Engine::connect((*daemon)->socket_path(), small_shape(64), "loader");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  auto check = load_session(*engine, "drained", 24, 32);
  ASSERT_TRUE(check.is_ok()) << check.status().to_string();
  EXPECT_EQ(check->loaded, 24u) << check->describe();
  EXPECT_EQ(check->bit_exact, 24u) << check->describe();
  auto durable = engine->client->get_session("durable");
  ASSERT_TRUE(durable.is_ok()) << durable.status().to_string();
  EXPECT_EQ(durable->priority, 90);
  auto timed = engine->client->get_session("timed");
  ASSERT_TRUE(timed.is_ok()) << timed.status().to_string();
  EXPECT_EQ(timed->priority, 35);
  EXPECT_EQ(timed->priority_remaining_ms, 0u);
  auto drained = engine->client->get_session("drained");
  ASSERT_TRUE(drained.is_ok());
  EXPECT_EQ(drained->priority, 35);
  EXPECT_TRUE((*daemon)->stop().ok());
}

TEST(NvmeRestart, SecondSigtermExitsWithoutFinishingTheDrain) {
  ScratchDir scratch;
  const std::string data = scratch.path() + "/data";
  // 2 MiB blocks, 96 MiB to drain: long enough for the second signal to land in it.
  const std::vector<std::string> flags = {"--hbm-bytes",   "32MiB",  "--ram-bytes",    "64MiB",
                                          "--nvme-bytes",  "256MiB", "--hbm-idle-ms",  "1h",
                                          "--ram-idle-ms", "1h",     "--metrics-addr", "off"};
  auto daemon = PersistentDaemon::start(scratch.path(), data, flags);
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  {
    auto engine = Engine::connect((*daemon)->socket_path(), example_shape(48), "big");
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    ASSERT_TRUE(save_session(*engine, "big", 44).is_ok());
  }
  ::kill((*daemon)->pid(), SIGTERM);
  // Two signals sent back to back would merge into one: wait for the first to start
  // the drain (the log says so), then send the second.
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while ((*daemon)->log().find("draining the RAM/HBM") == std::string::npos &&
         (*daemon)->running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds{1});
  }
  ::kill((*daemon)->pid(), SIGTERM);
  ExitStatus stopped = (*daemon)->stop(milliseconds{20'000});
  EXPECT_TRUE(stopped.ok()) << stopped.describe();
  // Whatever part of the drain happened, the store opens cleanly and never serves a
  // wrong byte.
  daemon = PersistentDaemon::start(scratch.path(), data, flags);
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  auto engine = Engine::connect((*daemon)->socket_path(), example_shape(48), "big-reader");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  auto check = load_session(*engine, "big", 44, 0);
  ASSERT_TRUE(check.is_ok()) << check.status().to_string();
  EXPECT_EQ(check->bit_exact, check->loaded) << check->describe();
  if (check->loaded < 44) {
    EXPECT_EQ(check->stop_reason.code(), StatusCode::kNotFound) << check->describe();
  }
  EXPECT_TRUE((*daemon)->stop().ok());
}

TEST(NvmeRestart, RefusesAnotherFormatVersionNamingBothVersions) {
  ScratchDir scratch;
  const std::string data = scratch.path() + "/data";
  {
    auto daemon = PersistentDaemon::start(scratch.path(), data, nvme_tier_flags());
    ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
    ASSERT_TRUE((*daemon)->stop().ok());
  }
  ASSERT_TRUE(NvmeIndex::overwrite_format_version(data + "/nvme/index", 7).is_ok());
  auto daemon = PersistentDaemon::start(scratch.path(), data, nvme_tier_flags());
  ASSERT_FALSE(daemon.is_ok()) << "kvtierd started on a format-7 store";
  const std::string& message = daemon.status().message();
  EXPECT_NE(message.find("exited with code 1"), std::string::npos) << message;
  EXPECT_NE(message.find("format version 7"), std::string::npos) << message;
  EXPECT_NE(message.find(fmt::format("format version {}", kNvmeFormatVersion)), std::string::npos)
      << message;
}

}  // namespace
}  // namespace kvtier::integration
