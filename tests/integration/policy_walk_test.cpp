// The placement policy in the real daemon: an idle session walks down the tiers on its
// idle thresholds — HBM → RAM, and RAM → NVMe when that tier is configured — and comes
// back to HBM on BeginTurn, bit-exact; kvtierctl shows its predicted return and the
// planner's recent moves. Small thresholds (hundreds of ms) keep the walk quick; every
// wait polls with a deadline.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/daemon_harness.h"

namespace kvtier::integration {
namespace {

constexpr size_t kBlocks = 4;

// Polls ListSessions until `session` has all kBlocks blocks in `tier`.
Result<SessionInfo> wait_for_placement(const Daemon& daemon, const std::string& session,
                                       Tier tier) {
  auto client = daemon.connect();
  if (!client.is_ok()) return client.status();
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  std::string last = "not listed";
  while (std::chrono::steady_clock::now() < deadline) {
    auto sessions = (*client)->list_sessions();
    if (!sessions.is_ok()) return sessions.status();
    for (const SessionInfo& s : *sessions) {
      if (s.session_id != session || s.blocks_per_tier.size() < 4) continue;
      if (s.blocks_per_tier[static_cast<size_t>(tier)] == kBlocks) return s;
      last = fmt::format("hbm {} ram {} nvme {} gone {}", s.blocks_per_tier[0],
                         s.blocks_per_tier[1], s.blocks_per_tier[2], s.blocks_per_tier[3]);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return unavailable("session '{}' never had its {} blocks in {}; last seen: {}", session, kBlocks,
                     tier_name(tier), last);
}

class PolicyWalkTest : public ::testing::TestWithParam<std::string> {
 protected:
  // The harness gives each daemon its own data directory (the NVMe tier's files).
  std::vector<std::string> flags(bool with_nvme) {
    std::vector<std::string> out = {"--hbm-bytes",        "4MiB",     "--ram-bytes",    "8MiB",
                                    "--slab-bytes",       "1MiB",     "--hbm-idle-ms",  "200ms",
                                    "--plan-interval-ms", "20ms",     "--copy-threads", "2",
                                    "--policy",           GetParam(), "--metrics-addr", "off"};
    if (with_nvme) {
      for (const char* flag : {"--nvme-bytes", "16MiB", "--ram-idle-ms", "400ms"}) {
        out.emplace_back(flag);
      }
    }
    return out;
  }

  // Saves a 4-block session, waits for it to reach `lowest`, brings it back with
  // BeginTurn and loads it bit-exact into other engine blocks.
  void walk(const Daemon& daemon, Tier lowest) {
    auto engine = Engine::connect(daemon.socket_path(), small_shape(16), "policy-walker");
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    const std::string session = "walker";
    const std::vector<BlockHash> hashes = PagedCache::chain_hashes(session, kBlocks);
    const auto saved_refs = Engine::refs(hashes, 0);
    engine->fill(saved_refs);
    auto saved = engine->client->save(session, saved_refs, /*end_of_turn=*/true);
    ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
    ASSERT_EQ(saved->stored, kBlocks);

    if (lowest == Tier::kNvme) {
      auto in_ram = wait_for_placement(daemon, session, Tier::kRam);
      (void)in_ram;  // passing through RAM may be quicker than one poll
    }
    auto idle = wait_for_placement(daemon, session, lowest);
    ASSERT_TRUE(idle.is_ok()) << idle.status().to_string() << "\n" << daemon.log();
    EXPECT_FALSE(idle->active);
    EXPECT_GT(idle->return_probability, 0.0);
    EXPECT_LE(idle->return_probability, 1.0);

    // kvtierctl shows the prediction and why the blocks moved.
    ProcessResult sessions = daemon.run_kvtierctl({"sessions", "--json"});
    ASSERT_TRUE(sessions.status.ok()) << sessions.describe();
    EXPECT_NE(sessions.stdout_text.find("\"return_probability\":"), std::string::npos)
        << sessions.stdout_text;
    ProcessResult status = daemon.run_kvtierctl({"status", "--json"});
    ASSERT_TRUE(status.status.ok()) << status.describe();
    EXPECT_NE(status.stdout_text.find("\"policy\":\"" + GetParam() + "\""), std::string::npos)
        << status.stdout_text;
    EXPECT_NE(status.stdout_text.find(R"("kind":"demote","from":"hbm","to":"ram","reason":"idle")"),
              std::string::npos)
        << status.stdout_text;
    ProcessResult table = daemon.run_kvtierctl({"status"});
    EXPECT_NE(table.stdout_text.find("recent moves"), std::string::npos) << table.stdout_text;

    // The next turn: everything comes back up to HBM.
    auto turn = engine->client->begin_turn(session);
    ASSERT_TRUE(turn.is_ok()) << turn.status().to_string();
    EXPECT_EQ(turn->known_blocks, kBlocks);
    auto back = wait_for_placement(daemon, session, Tier::kHbm);
    ASSERT_TRUE(back.is_ok()) << back.status().to_string() << "\n" << daemon.log();
    EXPECT_TRUE(back->active);

    const auto load_refs = Engine::refs(hashes, 8);
    auto loaded = engine->client->load(session, load_refs);
    ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
    EXPECT_EQ(loaded->loaded_count, kBlocks) << loaded->stop_reason.to_string();
    EXPECT_EQ(engine->count_verified(load_refs, loaded->loaded_count), kBlocks);
  }
};

TEST_P(PolicyWalkTest, IdleSessionLeavesHbmForRamAndComesBackOnBeginTurn) {
  auto daemon = Daemon::start(flags(/*with_nvme=*/false));
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  walk(**daemon, Tier::kRam);
  ExitStatus stopped = (*daemon)->stop();
  EXPECT_TRUE(stopped.ok()) << "kvtierd " << stopped.describe();
}

TEST_P(PolicyWalkTest, IdleSessionWalksDownToNvmeAndComesBackOnBeginTurn) {
  auto daemon = Daemon::start(flags(/*with_nvme=*/true));
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  walk(**daemon, Tier::kNvme);
  ExitStatus stopped = (*daemon)->stop();
  EXPECT_TRUE(stopped.ok()) << "kvtierd " << stopped.describe();
}

INSTANTIATE_TEST_SUITE_P(Policies, PolicyWalkTest, ::testing::Values("session", "predictive"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kvtier::integration
