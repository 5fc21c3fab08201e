// Tier notices (WatchTiers, daemon/tier_watch.h) in the in-process daemon
// (handler_fixture.h), with RAM above a 1 MiB NVMe tier: a subscribed engine hears where
// its layout's blocks went — drained to NVMe, evicted — each block once, with its tier at
// the time of the answer; a waiting WatchTiers is answered by the first change; another
// layout's engine hears nothing of them; a connection that does not ask is bounded and
// told to resynchronise.
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/daemon/handler_fixture.h"

namespace kvtier::daemon {
namespace {

constexpr uint32_t kNoticeLimit = 8;  // max-tier-notices-per-connection here

class TierWatchTest : public HandlerTest {
 protected:
  DaemonConfig daemon_config() const override {
    DaemonConfig config = nvme_below_ram_config();
    config.max_tier_notices_per_connection = kNoticeLimit;
    return config;
  }
  PagedCacheShape shape() const override { return integration::small_shape(/*num_blocks=*/64); }

  // Saves `hashes` as `session` and drains them to NVMe (all of them there on return).
  void save_and_drain(const std::string& session, const std::vector<BlockHash>& hashes) {
    ASSERT_TRUE(save_hashes(*engine_, session, hashes, 0).is_ok());
    ASSERT_TRUE(wait_until_settled().is_ok());
    ASSERT_TRUE(engine_->client->drain().is_ok());
    ASSERT_TRUE(
        wait_until_in_tier(session, Tier::kNvme, static_cast<uint32_t>(hashes.size())).is_ok());
  }

  // Asks until `hashes` were each told of, or 10 s passed; returns each one's latest
  // tier (the resync flag of any answer into `resync`).
  static std::map<std::string, Tier> collect(Client& client, const std::vector<BlockHash>& hashes,
                                             bool* resync = nullptr) {
    std::map<std::string, Tier> seen;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      auto notices = client.watch_tiers_async(200).wait();
      EXPECT_TRUE(notices.is_ok()) << notices.status().to_string();
      if (!notices.is_ok()) break;
      if (resync != nullptr) *resync = *resync || notices->resync;
      for (const TierChange& change : notices->changes) seen[change.hash.to_hex()] = change.tier;
      bool all = true;
      for (const BlockHash& hash : hashes) all = all && seen.contains(hash.to_hex());
      if (all) break;
    }
    return seen;
  }
};

TEST_F(TierWatchTest, DrainAndEvictionAreToldWithEachBlocksTierNow) {
  auto subscribed = engine_->client->watch_tiers_async(0).wait();  // subscribes
  ASSERT_TRUE(subscribed.is_ok()) << subscribed.status().to_string();
  EXPECT_TRUE(subscribed->changes.empty());
  EXPECT_FALSE(subscribed->resync);

  const auto hashes = PagedCache::chain_hashes("watched", 4);
  ASSERT_TRUE(save_hashes(*engine_, "watched", hashes, 0).is_ok());
  ASSERT_TRUE(wait_until_settled().is_ok());
  // The Save's own blocks are not told of (its answer did); whatever is told is true.
  auto after_save = engine_->client->watch_tiers_async(0).wait();
  ASSERT_TRUE(after_save.is_ok()) << after_save.status().to_string();
  for (const TierChange& change : after_save->changes) EXPECT_EQ(change.tier, Tier::kRam);

  ASSERT_TRUE(engine_->client->drain().is_ok());
  ASSERT_TRUE(wait_until_in_tier("watched", Tier::kNvme, 4).is_ok());
  auto drained = collect(*engine_->client, hashes);
  for (const BlockHash& hash : hashes) {
    ASSERT_TRUE(drained.contains(hash.to_hex()))
        << "the drain of block " << hash.to_hex() << " was not told";
    EXPECT_EQ(drained[hash.to_hex()], Tier::kNvme);
  }

  auto evicted = engine_->client->evict("watched", "");
  ASSERT_TRUE(evicted.is_ok()) << evicted.status().to_string();
  ASSERT_EQ(evicted->blocks_evicted, 4u);
  auto gone = collect(*engine_->client, hashes);
  for (const BlockHash& hash : hashes) {
    ASSERT_TRUE(gone.contains(hash.to_hex()));
    EXPECT_EQ(gone[hash.to_hex()], Tier::kNone);
  }
  auto lookup = engine_->client->lookup(hashes);
  ASSERT_TRUE(lookup.is_ok());
  EXPECT_EQ(lookup->hit_count, 0u);
}

// A WatchTiers waiting for a change is answered by the first one, long before its
// maxWaitMs; a second one on the same connection meanwhile is refused.
TEST_F(TierWatchTest, AWaitingWatchIsAnsweredByTheFirstChange) {
  const auto hashes = PagedCache::chain_hashes("waiting", 2);
  ASSERT_TRUE(save_hashes(*engine_, "waiting", hashes, 0).is_ok());
  ASSERT_TRUE(wait_until_settled().is_ok());
  ASSERT_TRUE(engine_->client->watch_tiers_async(0).wait().is_ok());  // subscribes
  // Whatever was noted since (an NVMe copy written below RAM) is taken first.
  (void)engine_->client->watch_tiers_async(0).wait();

  auto waiting = engine_->client->watch_tiers_async(60'000);
  auto second = engine_->client->watch_tiers_async(0).wait();
  EXPECT_TRUE(IsError(second.status(), StatusCode::kInvalidArgument, "already waiting"));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(waiting.ready()) << "answered without a change";

  auto admin = daemon_->connect();
  ASSERT_TRUE(admin.is_ok());
  ASSERT_TRUE((*admin)->drain().is_ok());
  auto notices = waiting.wait();
  ASSERT_TRUE(notices.is_ok()) << notices.status().to_string();
  // An answer at maxWaitMs would be empty: this one was the drain's.
  EXPECT_FALSE(notices->changes.empty());
}

// Another model's engine hears nothing of this one's blocks; a second engine of the same
// layout hears of them too.
TEST_F(TierWatchTest, OnlyEnginesOfTheBlocksLayoutAreTold) {
  PagedCacheShape other_model = shape();
  other_model.model_id = "integration/another-model";
  auto other = Engine::connect(daemon_->socket_path(), other_model, "other-model");
  ASSERT_TRUE(other.is_ok()) << other.status().to_string();
  auto same = Engine::connect(daemon_->socket_path(), shape(), "same-model");
  ASSERT_TRUE(same.is_ok()) << same.status().to_string();
  ASSERT_TRUE(other->client->watch_tiers_async(0).wait().is_ok());
  ASSERT_TRUE(same->client->watch_tiers_async(0).wait().is_ok());

  const auto hashes = PagedCache::chain_hashes("layout", 3);
  ASSERT_NO_FATAL_FAILURE(save_and_drain("layout", hashes));

  auto told = collect(*same->client, hashes);
  for (const BlockHash& hash : hashes) EXPECT_EQ(told[hash.to_hex()], Tier::kNvme);
  auto foreign = other->client->watch_tiers_async(0).wait();
  ASSERT_TRUE(foreign.is_ok());
  EXPECT_TRUE(foreign->changes.empty()) << foreign->changes.size() << " notices of another model";
  EXPECT_FALSE(foreign->resync);
}

// A connection that does not ask holds at most max-tier-notices-per-connection noted
// blocks; past that they are dropped and its next answer says resync.
TEST_F(TierWatchTest, AConnectionThatDoesNotAskIsToldToResynchronise) {
  ASSERT_TRUE(engine_->client->watch_tiers_async(0).wait().is_ok());
  const auto hashes = PagedCache::chain_hashes("many", 2 * kNoticeLimit);
  ASSERT_NO_FATAL_FAILURE(save_and_drain("many", hashes));
  auto notices = engine_->client->watch_tiers_async(0).wait();
  ASSERT_TRUE(notices.is_ok()) << notices.status().to_string();
  EXPECT_TRUE(notices->resync);
  EXPECT_TRUE(notices->changes.empty()) << "dropped notices were told after all";
  EXPECT_EQ(metric("kvtier_tier_notice_resyncs_total"), 1.0);
}

// A connection that closes with a WatchTiers waiting takes its subscription with it;
// the daemon goes on serving (and tells the others).
TEST_F(TierWatchTest, AConnectionClosingWithAWatchWaitingLeavesNothingBehind) {
  {
    auto leaving = Engine::connect(daemon_->socket_path(), shape(), "leaving");
    ASSERT_TRUE(leaving.is_ok()) << leaving.status().to_string();
    ASSERT_TRUE(leaving->client->watch_tiers_async(0).wait().is_ok());
    auto waiting = leaving->client->watch_tiers_async(60'000);
    ASSERT_TRUE(waiting.send_status().is_ok());
    waiting.abandon();
  }  // closed with its WatchTiers waiting
  ASSERT_TRUE(engine_->client->watch_tiers_async(0).wait().is_ok());
  const auto hashes = PagedCache::chain_hashes("after-close", 2);
  ASSERT_NO_FATAL_FAILURE(save_and_drain("after-close", hashes));
  auto told = collect(*engine_->client, hashes);
  for (const BlockHash& hash : hashes) EXPECT_EQ(told[hash.to_hex()], Tier::kNvme);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (metric("kvtier_tier_watchers") != 1.0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(metric("kvtier_tier_watchers"), 1.0) << "the closed connection is still subscribed";
}

TEST_F(TierWatchTest, BadWatchesGetClearErrors) {
  EXPECT_TRUE(IsError(engine_->client->watch_tiers_async(60'001).wait().status(),
                      StatusCode::kInvalidArgument, "maxWaitMs 60001 is over 60000"));
  auto fresh = daemon_->connect();
  ASSERT_TRUE(fresh.is_ok());
  EXPECT_TRUE(IsError((*fresh)->watch_tiers_async(0).wait().status(), StatusCode::kInvalidArgument,
                      "send Hello first"));
}

}  // namespace
}  // namespace kvtier::daemon
