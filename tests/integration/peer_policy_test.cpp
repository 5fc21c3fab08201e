// The peers' policies (policy = s3fifo | slru | arc | tinylfu-lru | workload) in the real
// daemon: they learn from what the daemon's stores and request paths report, so under
// HBM pressure sessions that were loaded since their Save outlive newer sessions that
// were saved once and never used. LRU tiering, which sees only recency, gives the oldest
// up first: the same run with `lru` shows the opposite, so the test can tell a peer's
// history from plain recency. Every block loads back bit-exact either way.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/daemon_harness.h"

namespace kvtier::integration {
namespace {

constexpr uint32_t kBlocks = 4;  // per session; HBM holds 16 (low watermark 12)

// Polls ListSessions until `session` has `blocks` blocks in `tier`.
Result<SessionInfo> wait_for_blocks(const Daemon& daemon, const std::string& session, Tier tier,
                                    uint32_t blocks) {
  auto client = daemon.connect();
  if (!client.is_ok()) return client.status();
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  std::string last = "not listed";
  while (std::chrono::steady_clock::now() < deadline) {
    auto sessions = (*client)->list_sessions();
    if (!sessions.is_ok()) return sessions.status();
    for (const SessionInfo& s : *sessions) {
      if (s.session_id != session || s.blocks_per_tier.size() < 4) continue;
      if (s.blocks_per_tier[static_cast<size_t>(tier)] == blocks) return s;
      last = fmt::format("hbm {} ram {}", s.blocks_per_tier[0], s.blocks_per_tier[1]);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return unavailable("session '{}' never had {} blocks in {}; last seen: {}", session, blocks,
                     tier_name(tier), last);
}

// Polls until `sessions` have at least `blocks` blocks in RAM between them (how many go
// down past that depends on when the planner runs against the watermarks).
Status wait_for_ram(const Daemon& daemon, const std::vector<std::string>& sessions,
                    uint32_t blocks) {
  auto client = daemon.connect();
  if (!client.is_ok()) return client.status();
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  uint32_t seen = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    auto listed = (*client)->list_sessions();
    if (!listed.is_ok()) return listed.status();
    seen = 0;
    for (const SessionInfo& s : *listed) {
      if (std::find(sessions.begin(), sessions.end(), s.session_id) == sessions.end()) continue;
      if (s.blocks_per_tier.size() > 1) seen += s.blocks_per_tier[1];
    }
    if (seen >= blocks) return Status::ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return unavailable("the one-hit sessions never had {} blocks in RAM; last seen {}", blocks, seen);
}

class PeerPolicyDaemonTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PeerPolicyDaemonTest, SessionsUsedSinceTheirSaveOutliveNewerOneHitSessions) {
  const std::string policy = GetParam();
  auto daemon =
      Daemon::start({"--hbm-bytes", "512KiB", "--ram-bytes", "1MiB", "--slab-bytes", "128KiB",
                     "--plan-interval-ms", "20ms", "--policy", policy, "--metrics-addr", "off"});
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  auto engine = Engine::connect((*daemon)->socket_path(), small_shape(64), "peer-policy");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  ASSERT_EQ(engine->hello.block_bytes, 32u << 10) << "HBM holds 16 of these blocks";

  // Two sessions are saved and each is loaded twice; then two newer sessions are saved
  // once. HBM (16 blocks) is full: over its high watermark, blocks go down to RAM (at
  // least 4; more when the planner runs between the Saves).
  // (Requests a few ms apart: recency is kept to the millisecond.)
  const auto apart = [] { std::this_thread::sleep_for(std::chrono::milliseconds(5)); };
  const std::vector<std::string> used_ids = {"used-0", "used-1"};
  const std::vector<std::string> once_ids = {"once-0", "once-1"};
  std::map<std::string, std::vector<BlockHash>> hashes;
  uint64_t next_block = 0;
  auto save = [&](const std::string& id) {
    hashes[id] = PagedCache::chain_hashes(id, kBlocks);
    const auto refs = Engine::refs(hashes[id], next_block);
    next_block += kBlocks;
    engine->fill(refs);
    apart();
    auto saved = engine->client->save(id, refs, /*end_of_turn=*/true);
    ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  };
  for (const std::string& id : used_ids) save(id);
  for (int round = 0; round < 2; ++round) {
    for (const std::string& id : used_ids) {
      apart();
      const auto refs = Engine::refs(hashes[id], 32);
      auto loaded = engine->client->load(id, refs);
      ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
      ASSERT_EQ(loaded->loaded_count, kBlocks);
    }
  }
  for (const std::string& id : once_ids) save(id);

  if (policy == "lru") {
    // Recency alone: the least recently used session goes down.
    auto down = wait_for_blocks(**daemon, "used-0", Tier::kRam, kBlocks);
    ASSERT_TRUE(down.is_ok()) << down.status().to_string() << "\n" << (*daemon)->log();
  } else {
    // The blocks that went down are the one-hit sessions'; once they have, the used
    // sessions are still whole in HBM (checked after the planner acted, not before).
    auto settled = wait_for_ram(**daemon, once_ids, kBlocks);
    EXPECT_TRUE(settled.is_ok()) << settled.to_string();
    for (const std::string& id : used_ids) {
      auto kept = wait_for_blocks(**daemon, id, Tier::kHbm, kBlocks);
      EXPECT_TRUE(kept.is_ok()) << kept.status().to_string() << "\n" << (*daemon)->log();
    }
  }
  ProcessResult status = (*daemon)->run_kvtierctl({"status", "--json"});
  ASSERT_TRUE(status.status.ok()) << status.describe();
  EXPECT_NE(status.stdout_text.find("\"policy\":\"" + policy + "\""), std::string::npos)
      << status.stdout_text;

  // Wherever they are, every block is the engine's, bit-exact.
  for (const auto& [id, chain] : hashes) {
    const auto refs = Engine::refs(chain, 48);
    auto loaded = engine->client->load(id, refs);
    ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
    EXPECT_EQ(engine->count_verified(refs, loaded->loaded_count), kBlocks) << id;
  }
  ExitStatus stopped = (*daemon)->stop();
  EXPECT_TRUE(stopped.ok()) << "kvtierd " << stopped.describe();
}

INSTANTIATE_TEST_SUITE_P(Policies, PeerPolicyDaemonTest,
                         ::testing::Values("lru", "s3fifo", "slru", "arc", "tinylfu-lru",
                                           "w-tinylfu", "workload"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace kvtier::integration
