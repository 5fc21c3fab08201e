// The daemon in the test process (inprocess_harness.h), driven by the real client over
// its socket: device faults injected at the copy and at region opening, and idle time
// passed on a manual clock. Every wait polls with a deadline; nothing sleeps to let
// something happen.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/daemon/inprocess_harness.h"
#include "tests/integration/daemon_harness.h"

namespace kvtier::daemon {
namespace {

using integration::Engine;
using integration::IsError;
using integration::kDeadline;
using integration::NoLeakedSlots;

constexpr size_t kBlocks = 4;

PagedCacheShape test_shape() {
  return integration::small_shape(/*num_blocks=*/16);
}

class InProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = InProcessDaemon::start();
    ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
    daemon_ = std::move(*daemon);
    auto engine = Engine::connect(daemon_->socket_path(), test_shape(), "inprocess-engine");
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    engine_ = std::make_unique<Engine>(std::move(*engine));
  }

  // Saves kBlocks blocks of `session` from engine blocks `first_block_id`.. with end
  // of turn.
  Result<SaveResult> save(const std::string& session, uint64_t first_block_id = 0) {
    const auto refs = Engine::refs(PagedCache::chain_hashes(session, kBlocks), first_block_id);
    engine_->fill(refs);
    return engine_->client->save(session, refs, /*end_of_turn=*/true);
  }

  // Loads `session` into engine blocks 8.., wiped first; how many came back bit-exact.
  Result<size_t> load_bit_exact(const std::string& session) {
    const auto refs = Engine::refs(PagedCache::chain_hashes(session, kBlocks), 8);
    engine_->cache.wipe();
    auto loaded = engine_->client->load(session, refs);
    if (!loaded.is_ok()) return loaded.status();
    if (loaded->loaded_count != kBlocks) {
      return internal_error("loaded {} of {} blocks: {}", loaded->loaded_count, kBlocks,
                            loaded->stop_reason.to_string());
    }
    return engine_->count_verified(refs, loaded->loaded_count);
  }

  Result<StatsInfo> wait_until_settled() {
    return daemon_->wait_for_stats(
        [](const StatsInfo& s) { return s.copies_in_flight == 0 && s.pinned_blocks == 0; },
        kDeadline);
  }

  uint64_t block_bytes() const { return engine_->hello.block_bytes; }

  // Declared after the daemon: the engine's connection closes before the daemon stops.
  std::unique_ptr<InProcessDaemon> daemon_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(InProcess, SaveWhoseCopyFailsIsRefusedInvisibleAndSucceedsWhenRetried) {
  const std::string session = "save-fails";
  const auto hashes = PagedCache::chain_hashes(session, kBlocks);
  daemon_->fail_nth_submit(1, unavailable("injected: copy engine stalled"));

  auto failed = save(session);
  EXPECT_TRUE(IsError(failed.status(), StatusCode::kUnavailable, "copying the blocks in failed"));
  EXPECT_TRUE(IsError(failed.status(), StatusCode::kUnavailable, "injected: copy engine stalled"));
  EXPECT_TRUE(failed.status().retryable());  // and it does succeed when retried, below

  auto lookup = engine_->client->lookup(hashes);
  ASSERT_TRUE(lookup.is_ok()) << lookup.status().to_string();
  EXPECT_EQ(lookup->hit_count, 0u) << "blocks whose copy failed became visible";
  auto stats = wait_until_settled();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(integration::total_blocks(*stats), 0u);
  EXPECT_EQ(stats->bytes_saved, 0u);
  EXPECT_TRUE(NoLeakedSlots(*stats, block_bytes())) << "the failed Save's slots were not freed";

  auto retried = save(session);
  ASSERT_TRUE(retried.is_ok()) << retried.status().to_string();
  EXPECT_EQ(retried->stored, kBlocks);
  lookup = engine_->client->lookup(hashes);
  ASSERT_TRUE(lookup.is_ok()) << lookup.status().to_string();
  EXPECT_EQ(lookup->hit_count, kBlocks);
  auto exact = load_bit_exact(session);
  ASSERT_TRUE(exact.is_ok()) << exact.status().to_string();
  EXPECT_EQ(*exact, kBlocks);
}

TEST_F(InProcess, ErrorCodeAndRetryableFlagCrossTheWireUnchanged) {
  // The daemon prefixes the device's error with what it was doing; the client must get
  // the device's code and flag, defaults and overrides alike.
  const std::vector<Status> injected = {
      unavailable("injected: device busy"),                           // retryable by default
      unavailable("injected: device gone").with_retryable(false),     // override: final
      resource_exhausted("injected: staging full"),                   // retryable by default
      data_loss("injected: bytes gone"),                              // final by default
      data_loss("injected: odd but retryable").with_retryable(true),  // override
      not_supported("injected: no such copy"),
      internal_error("injected: a bug"),
  };
  int n = 0;
  for (const Status& error : injected) {
    SCOPED_TRACE(error.to_string());
    daemon_->fail_nth_submit(1, error);
    auto failed = save("wire-" + std::to_string(n++));
    ASSERT_FALSE(failed.is_ok());
    EXPECT_EQ(failed.status().code(), error.code()) << failed.status().to_string();
    EXPECT_EQ(failed.status().retryable(), error.retryable());
    EXPECT_NE(failed.status().message().find(error.message()), std::string::npos);
    EXPECT_NE(failed.status().message().find("copying the blocks in failed"), std::string::npos);
  }
  auto stats = wait_until_settled();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(integration::total_blocks(*stats), 0u);
}

TEST_F(InProcess, LoadWhoseCopyFailsClaimsNothingAndTheBlocksStillLoad) {
  const std::string session = "load-fails";
  auto saved = save(session);
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  ASSERT_EQ(saved->stored, kBlocks);

  daemon_->fail_nth_submit(1, data_loss("injected: scatter failed"));
  const auto refs = Engine::refs(PagedCache::chain_hashes(session, kBlocks), 8);
  engine_->cache.wipe();
  auto failed = engine_->client->load(session, refs);
  EXPECT_TRUE(IsError(failed.status(), StatusCode::kDataLoss, "copying the blocks out failed"));
  EXPECT_TRUE(IsError(failed.status(), StatusCode::kDataLoss, "injected: scatter failed"));
  EXPECT_EQ(engine_->count_verified(refs, kBlocks), 0u) << "a failed Load wrote engine blocks";
  auto stats = wait_until_settled();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->bytes_loaded, 0u) << "a failed Load counted bytes as loaded";
  EXPECT_EQ(integration::total_blocks(*stats), kBlocks) << "a failed Load dropped blocks";

  auto exact = load_bit_exact(session);
  ASSERT_TRUE(exact.is_ok()) << exact.status().to_string();
  EXPECT_EQ(*exact, kBlocks);
  stats = wait_until_settled();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->bytes_loaded, kBlocks * block_bytes());
}

// Two sessions end their turns 600 ms apart on the manual clock; the clock then moves
// past the 1 s idle threshold of the first only. The planner (every 10 ms of real
// time) demotes the first to RAM; the second, never past its threshold, stays in HBM.
TEST_F(InProcess, IdleTimeOnTheManualClockDemotesToRamAndBeginTurnBringsItBack) {
  const uint64_t idle_ms = daemon_->config().hbm_idle_ms;
  const auto in_tier = [](Tier tier) {
    return [tier](const SessionInfo& s) {
      return s.blocks_per_tier.size() > static_cast<size_t>(tier) &&
             s.blocks_per_tier[static_cast<size_t>(tier)] == kBlocks;
    };
  };
  auto first = save("idle-first");
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  daemon_->advance_clock_ms(600);
  auto second = save("idle-second", /*first_block_id=*/4);
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  auto fresh = daemon_->wait_for_session("idle-first", in_tier(Tier::kHbm), kDeadline);
  ASSERT_TRUE(fresh.is_ok()) << fresh.status().to_string();
  EXPECT_EQ(fresh->idle_ms, 600u) << "the session's idle time is not the manual clock's";

  daemon_->advance_clock_ms(idle_ms - 600 + 1);
  auto demoted = daemon_->wait_for_session("idle-first", in_tier(Tier::kRam), kDeadline);
  ASSERT_TRUE(demoted.is_ok()) << demoted.status().to_string();
  EXPECT_FALSE(demoted->active);
  auto kept =
      daemon_->wait_for_session("idle-second", in_tier(Tier::kHbm), std::chrono::milliseconds{0});
  ASSERT_TRUE(kept.is_ok()) << "a session idle " << idle_ms - 600 + 1
                            << " ms left HBM before its threshold: " << kept.status().to_string();

  auto turn = engine_->client->begin_turn("idle-first");
  ASSERT_TRUE(turn.is_ok()) << turn.status().to_string();
  EXPECT_EQ(turn->known_blocks, kBlocks);
  auto back = daemon_->wait_for_session("idle-first", in_tier(Tier::kHbm), kDeadline);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_TRUE(back->active);
  auto stats = wait_until_settled();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->bytes_demoted, kBlocks * block_bytes());
  EXPECT_EQ(stats->bytes_promoted, kBlocks * block_bytes());
  auto exact = load_bit_exact("idle-first");
  ASSERT_TRUE(exact.is_ok()) << exact.status().to_string();
  EXPECT_EQ(*exact, kBlocks);
}

TEST_F(InProcess, RegionThatCannotBeOpenedIsRefusedAndTheDaemonKeepsServing) {
  daemon_->fail_open_region(resource_exhausted("injected: no address space for the mapping"));
  auto cache = PagedCache::create(test_shape());
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  auto client = daemon_->connect();
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  ASSERT_TRUE((*client)->hello(cache->layout(), "refused-engine").is_ok());
  Status refused = (*client)->register_memfd_region(cache->region_id(), cache->region().fd(),
                                                    cache->region().size_bytes());
  EXPECT_TRUE(IsError(refused, StatusCode::kResourceExhausted,
                      fmt::format("regionId {}: injected: no address space", cache->region_id())));
  // The region is not registered: a Save naming it is refused, not copied.
  const auto refs = Engine::refs(PagedCache::chain_hashes("unopened", kBlocks), 0);
  auto unsaved = (*client)->save("unopened", refs, true);
  EXPECT_TRUE(IsError(unsaved.status(), StatusCode::kInvalidArgument, "is not registered"));

  daemon_->fail_open_region(Status::ok());
  // The same connection registers once the device opens regions again, and the engine
  // connected before the failure was never disturbed.
  Status registered = (*client)->register_memfd_region(cache->region_id(), cache->region().fd(),
                                                       cache->region().size_bytes());
  ASSERT_TRUE(registered.is_ok()) << registered.to_string();
  auto saved = save("after-refusal");
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  auto exact = load_bit_exact("after-refusal");
  ASSERT_TRUE(exact.is_ok()) << exact.status().to_string();
  EXPECT_EQ(*exact, kBlocks);
}

}  // namespace
}  // namespace kvtier::daemon
