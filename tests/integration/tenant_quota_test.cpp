// tenant-quota against the real kvtierd: two tenants (engines forked as two uids) share
// HBM and RAM, and one of them fills both tiers twice over. Without quotas the quiet
// tenant's older session goes first (so the test tells the rule from luck); once
// `tenant-quota` is set by SIGHUP, without a restart, the flooding tenant loses its own
// blocks and the quiet one keeps every block, which loads back bit-exact. Stats show each
// tenant's bytes per tier and its quota. Needs root (engines run as two uids).
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/daemon_harness.h"

namespace kvtier::integration {
namespace {

constexpr uid_t kQuietUid = 65533;
constexpr uid_t kFloodUid = 65534;
constexpr size_t kQuietBlocks = 8;  // 256 KiB: well within half of either tier
constexpr size_t kFloodSessions = 16;
constexpr size_t kFloodBlocks = 16;  // 16 × 16 × 32 KiB = 8 MiB: twice HBM and RAM
constexpr uint64_t kBlockBytes = 32 << 10;

// An engine running as `uid`, with room for `blocks` blocks (in a forked child).
Result<Engine> engine_as(uid_t uid, const std::string& socket, size_t blocks) {
  if (::setgroups(0, nullptr) != 0 || ::setgid(uid) != 0 || ::setuid(uid) != 0) {
    return unavailable("cannot become uid {}", uid);
  }
  return Engine::connect(socket, small_shape(blocks), fmt::format("uid-{}", uid));
}

// Saves `blocks` blocks of each session as `uid`, one Save each that ends the turn; with
// `all_stored`, every Save must store every block.
int save_as(uid_t uid, const std::string& socket, const std::vector<std::string>& sessions,
            size_t blocks, bool all_stored) {
  auto engine = engine_as(uid, socket, blocks);
  if (!engine.is_ok()) return child_failure(10, "connect", engine.status());
  for (const std::string& session : sessions) {
    const auto refs = Engine::refs(PagedCache::chain_hashes(session, blocks), 0);
    engine->fill(refs);
    auto saved = engine->client->save(session, refs, true);
    if (!saved.is_ok()) return child_failure(11, "save " + session, saved.status());
    if (all_stored && saved->stored != blocks) {
      return child_failure(12, fmt::format("{}: stored {} of {}", session, saved->stored, blocks));
    }
  }
  return 0;
}

std::vector<std::string> numbered(const std::string& prefix, size_t count) {
  std::vector<std::string> out;
  for (size_t i = 0; i < count; ++i) out.push_back(fmt::format("{}-{}", prefix, i));
  return out;
}

// Loads `session` as `uid`: every one of its `blocks` blocks must come back bit-exact.
int load_all_as(uid_t uid, const std::string& socket, const std::string& session, size_t blocks) {
  auto engine = engine_as(uid, socket, blocks);
  if (!engine.is_ok()) return child_failure(10, "connect", engine.status());
  const auto refs = Engine::refs(PagedCache::chain_hashes(session, blocks), 0);
  auto loaded = engine->client->load(session, refs);
  if (!loaded.is_ok()) return child_failure(13, "load " + session, loaded.status());
  if (loaded->loaded_count != blocks || engine->count_verified(refs, blocks) != blocks) {
    return child_failure(14,
                         fmt::format("{}: {} of {} blocks loaded ({}), {} bit-exact", session,
                                     loaded->loaded_count, blocks, loaded->stop_reason.to_string(),
                                     engine->count_verified(refs, loaded->loaded_count)));
  }
  return 0;
}

::testing::AssertionResult Ran(pid_t child, const std::string& what) {
  ExitStatus status = wait_for_exit(child);
  if (status.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << status.describe();
}

// The tenant's bytes in HBM and RAM, and its HBM quota (UINT64_MAX: none), from Stats.
struct Held {
  uint64_t bytes = 0;
  uint64_t hbm_quota = UINT64_MAX;
};
std::string describe(const StatsInfo& stats) {
  std::string out = fmt::format("{} blocks evicted;", stats.blocks_evicted);
  for (const auto& t : stats.tenants) {
    out += fmt::format(" {} holds {} B in HBM, {} B in RAM;", t.tenant, t.used_bytes[0],
                       t.used_bytes[1]);
  }
  return out;
}
Held held_by(const StatsInfo& stats, uid_t uid) {
  const std::string tenant = fmt::format("uid:{}", uid);
  for (const auto& t : stats.tenants) {
    if (t.tenant == tenant) return {t.used_bytes[0] + t.used_bytes[1], t.quota_bytes[0]};
  }
  return {};
}

TEST(TenantQuota, TheTenantFillingTheTiersLosesItsOwnBlocksOnceQuotasAreReloaded) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "tenants are engines running as two uids, which needs root";
  }
  const std::string config = std::string(::testing::TempDir()) + "/tenant-quota.toml";
  std::ofstream(config) << "hbm-bytes = \"2MiB\"\nram-bytes = \"2MiB\"\nslab-bytes = \"1MiB\"\n"
                           "metrics-addr = \"off\"\n";
  auto daemon = Daemon::start({"--config", config});
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  Daemon& d = **daemon;
  ASSERT_TRUE(d.open_to_all_users().is_ok());
  auto admin = Client::connect(d.socket_path());
  ASSERT_TRUE(admin.is_ok()) << admin.status().to_string();

  // Without quotas: the quiet tenant's session (in RAM: HBM is full when it comes) is the
  // least recently used, and goes.
  ASSERT_TRUE(Ran(fork_child([&] {
                    return save_as(kFloodUid, d.socket_path(), numbered("fill", 5), kFloodBlocks,
                                   false);
                  }),
                  "fill HBM"));
  ASSERT_TRUE(Ran(fork_child([&] {
                    return save_as(kQuietUid, d.socket_path(), {"quiet-1"}, kQuietBlocks, true);
                  }),
                  "quiet save"));
  ASSERT_TRUE(Ran(fork_child([&] {
                    return save_as(kFloodUid, d.socket_path(), numbered("flood-1", kFloodSessions),
                                   kFloodBlocks, false);
                  }),
                  "flood"));
  auto before = (*admin)->stats(true);
  ASSERT_TRUE(before.is_ok()) << before.status().to_string();
  EXPECT_LT(held_by(*before, kQuietUid).bytes, kQuietBlocks * kBlockBytes)
      << "without quotas the quiet tenant's blocks should have gone first: " << describe(*before);
  EXPECT_EQ(held_by(*before, kFloodUid).hbm_quota, UINT64_MAX);

  // Quotas by SIGHUP: every tenant keeps half of each tier when it is full.
  std::ofstream(config) << "hbm-bytes = \"2MiB\"\nram-bytes = \"2MiB\"\nslab-bytes = \"1MiB\"\n"
                           "metrics-addr = \"off\"\ntenant-quota = [\"* hbm=50% ram=50%\"]\n";
  ASSERT_EQ(::kill(d.pid(), SIGHUP), 0);
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  Result<StatsInfo> reloaded = (*admin)->stats(true);
  while (reloaded.is_ok() && held_by(*reloaded, kFloodUid).hbm_quota == UINT64_MAX &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    reloaded = (*admin)->stats(true);
  }
  ASSERT_TRUE(reloaded.is_ok()) << reloaded.status().to_string();
  ASSERT_EQ(held_by(*reloaded, kFloodUid).hbm_quota, 1ull << 20) << d.log();

  ASSERT_TRUE(Ran(fork_child([&] {
                    return save_as(kQuietUid, d.socket_path(), {"quiet-2"}, kQuietBlocks, true);
                  }),
                  "quiet save"));
  ASSERT_TRUE(Ran(fork_child([&] {
                    return save_as(kFloodUid, d.socket_path(), numbered("flood-2", kFloodSessions),
                                   kFloodBlocks, false);
                  }),
                  "flood"));
  auto after = (*admin)->stats(true);
  ASSERT_TRUE(after.is_ok()) << after.status().to_string();
  // The quiet tenant holds every block of its session; the flood paid for its own.
  EXPECT_GE(held_by(*after, kQuietUid).bytes, kQuietBlocks * kBlockBytes) << describe(*after);
  EXPECT_GT(after->blocks_evicted, before->blocks_evicted);
  EXPECT_TRUE(Ran(
      fork_child([&] { return load_all_as(kQuietUid, d.socket_path(), "quiet-2", kQuietBlocks); }),
      "quiet load"));
  // kvtierctl status shows the tenants and their quotas.
  auto status = d.run_kvtierctl({"status"});
  ASSERT_TRUE(status.status.ok()) << status.describe();
  EXPECT_NE(status.stdout_text.find("uid:65533"), std::string::npos) << status.stdout_text;
  EXPECT_NE(status.stdout_text.find("(1.0 MiB)"), std::string::npos) << status.stdout_text;
  EXPECT_TRUE(d.stop().ok());
}

}  // namespace
}  // namespace kvtier::integration
