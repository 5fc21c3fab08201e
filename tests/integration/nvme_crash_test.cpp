// kill -9 while demotions to NVMe are in flight, 20 times over one data directory,
// each time at a different point: the daemon restarts cleanly every time, every
// session ever acknowledged either loads bit-exact or reports where its prefix ends,
// a session that was entirely on NVMe before the kill loads entirely, and no byte is
// ever wrong.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "tests/integration/nvme_harness.h"

namespace kvtier::integration {
namespace {

constexpr int kIterations = 20;
constexpr size_t kBlocksPerSession = 8;
constexpr uint64_t kLoadTarget = 32;  // engine blocks 32.. receive loads; saves use 0..

TEST(NvmeCrash, KillNineDuringDemotionsNeverServesAWrongByte) {
  ScratchDir scratch;
  const std::string data = scratch.path() + "/data";
  // Big enough RAM and NVMe that nothing is evicted: every loss is the crash's doing.
  const std::vector<std::string> flags =
      with_flag(nvme_tier_flags("32MiB"), "--ram-bytes", "32MiB");
  std::vector<std::string> sessions;           // every session whose Save was acknowledged
  std::map<std::string, bool> on_nvme_before;  // entirely on NVMe right before the kill
  std::set<std::string> lost;                  // sessions that lost blocks in a crash (each once)

  for (int iteration = 0; iteration <= kIterations; ++iteration) {
    SCOPED_TRACE(fmt::format("iteration {}", iteration));
    auto daemon = PersistentDaemon::start(scratch.path(), data, flags);
    ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
    auto engine = Engine::connect((*daemon)->socket_path(), small_shape(64), "crash-engine");
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();

    for (const std::string& session : sessions) {
      auto check = load_session(*engine, session, kBlocksPerSession, kLoadTarget);
      ASSERT_TRUE(check.is_ok()) << session << ": " << check.status().to_string();
      ASSERT_EQ(check->bit_exact, check->loaded) << session << ": " << check->describe();
      if (on_nvme_before[session]) {
        EXPECT_EQ(check->loaded, kBlocksPerSession) << session << ": " << check->describe();
      }
      if (check->loaded < kBlocksPerSession) {
        lost.insert(session);
        EXPECT_EQ(check->stop_reason.code(), StatusCode::kNotFound)
            << session << ": " << check->describe();
      }
      // The Load brought the blocks up to RAM. Idle again (a Save of blocks already
      // held copies nothing), the session goes back down to NVMe.
      auto refs = Engine::refs(PagedCache::chain_hashes(session, kBlocksPerSession), 0);
      refs.resize(check->loaded);
      engine->fill(refs);
      ASSERT_TRUE(engine->client->save(session, refs, true).is_ok());
    }
    // Everything known is back on NVMe before the new demotions start, so the kill
    // below lands among the new sessions' demotions.
    auto down = (*daemon)->wait_for_stats([](const StatsInfo& s) {
      return tier_blocks(s, Tier::kHbm) + tier_blocks(s, Tier::kRam) == 0 &&
             s.copies_in_flight == 0 && s.pinned_blocks == 0;
    });
    ASSERT_TRUE(down.is_ok()) << down.status().to_string();
    if (iteration == kIterations) {
      EXPECT_TRUE((*daemon)->stop().ok());
      break;
    }

    for (int n = 0; n < 2; ++n) {
      const std::string session = fmt::format("crash-{}-{}", iteration, n);
      ASSERT_TRUE(save_session(*engine, session, kBlocksPerSession).is_ok());
      sessions.push_back(session);
    }
    // Kill at a different point each time: right after the Save replies, or once some
    // of the new blocks have reached NVMe.
    auto before = engine->client->stats();
    ASSERT_TRUE(before.is_ok());
    const uint64_t wanted = (iteration % 5) * 3;
    if (wanted > 0) {
      (void)(*daemon)->wait_for_stats(
          [&](const StatsInfo& s) {
            return tier_blocks(s, Tier::kNvme) >= tier_blocks(*before, Tier::kNvme) + wanted;
          },
          milliseconds{5'000});
    }
    auto listed = engine->client->list_sessions();
    ASSERT_TRUE(listed.is_ok()) << listed.status().to_string();
    on_nvme_before.clear();
    for (const SessionInfo& info : *listed) {
      on_nvme_before[info.session_id] =
          info.blocks == kBlocksPerSession &&
          info.blocks_per_tier[static_cast<int>(Tier::kNvme)] == kBlocksPerSession;
    }
    ExitStatus killed = (*daemon)->kill9();
    ASSERT_EQ(killed.signal, SIGKILL) << killed.describe();
  }
  // Most sessions reach NVMe long before the next kill; losing most of them would
  // mean recovery is broken even though no byte was wrong.
  EXPECT_LE(lost.size(), sessions.size() / 2) << lost.size() << " of " << sessions.size();
  RecordProperty("sessions", static_cast<int>(sessions.size()));
  RecordProperty("sessions_that_lost_blocks", static_cast<int>(lost.size()));
}

}  // namespace
}  // namespace kvtier::integration
