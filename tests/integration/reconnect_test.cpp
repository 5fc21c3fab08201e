// Engines ride through daemon restarts: the same kvtier::Client, without the engine
// doing anything, fails the calls made while kvtierd is away with Unavailable (at once,
// retryable), and once kvtierd is back it reconnects, repeats its Hello, registers its
// region again, and its later turns load what the daemon kept on NVMe, bit-exact.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "tests/integration/nvme_harness.h"

namespace kvtier::integration {
namespace {

using Clock = std::chrono::steady_clock;

class Reconnect : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = PersistentDaemon::start(run_.path(), data_.path(), flags());
    ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
    daemon_ = std::move(*daemon);
  }
  virtual std::vector<std::string> flags() const { return nvme_tier_flags(); }
  Status restart() {
    daemon_.reset();
    auto daemon = PersistentDaemon::start(run_.path(), data_.path(), flags());
    if (!daemon.is_ok()) return daemon.status();
    daemon_ = std::move(*daemon);
    return Status::ok();
  }
  // Waits until `session` has `blocks` blocks on NVMe (its own connection).
  ::testing::AssertionResult OnNvme(const std::string& session, uint32_t blocks) {
    auto client = Client::connect(daemon_->socket_path());
    if (!client.is_ok()) return ::testing::AssertionFailure() << client.status().to_string();
    const auto deadline = Clock::now() + kDeadline;
    while (Clock::now() < deadline) {
      auto info = (*client)->get_session(session);
      if (info.is_ok() && info->blocks_per_tier.size() > 2 && info->blocks_per_tier[2] == blocks)
        return ::testing::AssertionSuccess();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return ::testing::AssertionFailure() << session << " never had " << blocks << " on NVMe";
  }
  // Repeats a Lookup on `engine` until it goes through (the backoff may defer the first
  // attempts after the restart); how many calls were refused first.
  static Result<int> lookup_until_back(Engine& engine, std::span<const BlockHash> hashes) {
    const auto deadline = Clock::now() + kDeadline;
    int refused = 0;
    while (Clock::now() < deadline) {
      auto found = engine.client->lookup(hashes);
      if (found.is_ok()) return refused;
      if (found.status().code() != StatusCode::kUnavailable) return found.status();
      ++refused;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return internal_error("the client never got back to kvtierd");
  }

  ScratchDir run_;
  ScratchDir data_;
  std::unique_ptr<PersistentDaemon> daemon_;
};

// While kvtierd is away every call fails at once with Unavailable, retryable.
void ExpectAwayFast(Engine& engine, std::span<const BlockHash> hashes) {
  const auto started = Clock::now();
  auto found = engine.client->lookup(hashes);
  ASSERT_FALSE(found.is_ok());
  EXPECT_EQ(found.status().code(), StatusCode::kUnavailable) << found.status().to_string();
  EXPECT_TRUE(found.status().retryable());
  auto saved = engine.client->save("while-away", Engine::refs(hashes, 0), true);
  EXPECT_EQ(saved.status().code(), StatusCode::kUnavailable) << saved.status().to_string();
  // Generous: a call that waited for the daemon would take the whole deadline.
  EXPECT_LT(Clock::now() - started, std::chrono::seconds(5));
  EXPECT_FALSE(engine.client->connected());
}

TEST_F(Reconnect, AfterSigtermTheSameClientComesBackAndLoadsTheEarlierTurnsBitExact) {
  auto engine = Engine::connect(daemon_->socket_path(), small_shape(32));
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  ASSERT_TRUE(save_session(*engine, "conversation", 8).is_ok());
  const auto hashes = PagedCache::chain_hashes("conversation", 8);

  ASSERT_TRUE(daemon_->stop().ok()) << daemon_->log();  // drains to NVMe
  ExpectAwayFast(*engine, hashes);
  ASSERT_TRUE(restart().is_ok());

  auto back = lookup_until_back(*engine, hashes);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(engine->client->reconnects(), 1u);
  EXPECT_TRUE(engine->client->connected());
  engine->cache.wipe();
  auto loaded = load_session(*engine, "conversation", 8, 16);  // needs the region again
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->loaded, 8u) << loaded->describe();
  EXPECT_EQ(loaded->bit_exact, 8u) << loaded->describe();
  // And the next turn saves as usual.
  EXPECT_TRUE(save_session(*engine, "next-turn", 4).is_ok());
}

TEST_F(Reconnect, AfterSigkillBlocksThatReachedNvmeComeBackAndTheRestAreMissing) {
  auto engine = Engine::connect(daemon_->socket_path(), small_shape(32));
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  ASSERT_TRUE(save_session(*engine, "durable", 8).is_ok());
  ASSERT_TRUE(OnNvme("durable", 8));
  daemon_->kill9();
  ExpectAwayFast(*engine, PagedCache::chain_hashes("durable", 8));
  ASSERT_TRUE(restart().is_ok());

  ASSERT_TRUE(lookup_until_back(*engine, PagedCache::chain_hashes("durable", 8)).is_ok());
  EXPECT_EQ(engine->client->reconnects(), 1u);
  engine->cache.wipe();
  auto loaded = load_session(*engine, "durable", 8, 16);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->loaded, 8u) << loaded->describe();
  EXPECT_EQ(loaded->bit_exact, loaded->loaded) << loaded->describe();
  // A session the daemon never held is missing, never wrong.
  auto unknown = load_session(*engine, "never-saved", 4, 24);
  ASSERT_TRUE(unknown.is_ok()) << unknown.status().to_string();
  EXPECT_EQ(unknown->loaded, 0u);
}

class ReconnectWhileStarting : public Reconnect {
 protected:
  // Data requests wait while the pools fill: long enough to kill the daemon under them.
  std::vector<std::string> flags() const override {
    return with_flag(nvme_tier_flags(), "--fault-fill-delay-ms", "3s");
  }
};

TEST_F(ReconnectWhileStarting, RepliesOwedWhenTheDaemonDiesFailAtOnceAsUnavailable) {
  auto engine = Engine::connect(daemon_->socket_path(), small_shape(32));
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const auto refs = Engine::refs(PagedCache::chain_hashes("owed", 4), 0);
  engine->fill(refs);
  auto owed = engine->client->save_async("owed", refs, true);
  ASSERT_TRUE(owed.send_status().is_ok()) << owed.send_status().to_string();
  EXPECT_FALSE(owed.ready()) << "the daemon answered a data request before its pools filled";
  daemon_->kill9();
  auto reply = owed.wait();
  ASSERT_FALSE(reply.is_ok());
  EXPECT_EQ(reply.status().code(), StatusCode::kUnavailable) << reply.status().to_string();
  EXPECT_TRUE(reply.status().retryable());
  EXPECT_NE(reply.status().message().find("lost"), std::string::npos) << reply.status().message();
}

TEST(ReconnectOff, AClientThatDoesNotReconnectStaysAway) {
  ScratchDir run;
  ScratchDir data;
  auto daemon = PersistentDaemon::start(run.path(), data.path(), nvme_tier_flags());
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  ClientOptions options;
  options.reconnect = false;
  auto client = Client::connect((*daemon)->socket_path(), options);
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  ASSERT_TRUE((*client)->stats().is_ok());
  (*daemon)->kill9();
  daemon->reset();
  auto again = PersistentDaemon::start(run.path(), data.path(), nvme_tier_flags());
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  for (int i = 0; i < 5; ++i) {
    auto stats = (*client)->stats();
    ASSERT_FALSE(stats.is_ok());
    EXPECT_EQ(stats.status().code(), StatusCode::kUnavailable) << stats.status().to_string();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ((*client)->reconnects(), 0u);
  // A new client gets in: the daemon is there.
  auto fresh = Client::connect((*again)->socket_path());
  ASSERT_TRUE(fresh.is_ok());
  EXPECT_TRUE((*fresh)->stats().is_ok());
}

}  // namespace
}  // namespace kvtier::integration
