// Engines ride through daemon restarts: the same kvtier::Client, without the engine
// doing anything, fails the calls made while kvtierd is away with Unavailable (at once,
// retryable), and once kvtierd is back it reconnects, repeats its Hello, registers its
// region again, and its later turns load what the daemon kept on NVMe, bit-exact. A
// daemon that comes back with the engine in another namespace is refused, not joined.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
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
  // kvtierd again on the same socket and data directory (SIGKILLs one still running).
  Status restart(std::optional<std::vector<std::string>> new_flags = std::nullopt) {
    daemon_.reset();
    auto daemon = PersistentDaemon::start(run_.path(), data_.path(), new_flags.value_or(flags()));
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
  // Data requests wait while the pools fill, and the fill is held for longer than the
  // test can take (the daemon is killed under the waiting Save, so nothing waits the
  // hold out), as is the start-up wait: the Save's reply is owed when the daemon dies.
  std::vector<std::string> flags() const override {
    return with_flag(with_flag(nvme_tier_flags(), "--fault-fill-delay-ms", "10m"),
                     "--startup-wait-ms", "10m");
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

// Four threads share one Client and look a session up without pause through a SIGTERM
// and a restart: each call hits or fails with a retryable Unavailable, never anything
// else, and the client reconnects once for all of them.
TEST_F(Reconnect, ManyThreadsOnOneClientRideThroughARestartAndReconnectOnce) {
  auto engine = Engine::connect(daemon_->socket_path(), small_shape(32));
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  ASSERT_TRUE(save_session(*engine, "threads", 8).is_ok());
  const auto hashes = PagedCache::chain_hashes("threads", 8);

  std::atomic<bool> restarted{false};
  std::atomic<int> unexpected{0};
  auto caller = [&] {
    bool hit_after_restart = false;
    const auto deadline = Clock::now() + kDeadline;
    while (!hit_after_restart && Clock::now() < deadline) {
      const bool was_restarted = restarted.load();
      auto found = engine->client->lookup(hashes);
      if (found.is_ok()) {
        if (found->hit_count != 8u) ++unexpected;
        hit_after_restart = was_restarted;
      } else if (found.status().code() != StatusCode::kUnavailable || !found.status().retryable()) {
        ++unexpected;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    if (!hit_after_restart) ++unexpected;
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back(caller);
  ExitStatus stopped = daemon_->stop();  // drains the session to NVMe
  Status back = restart();
  restarted = true;
  for (std::thread& thread : threads) thread.join();
  ASSERT_TRUE(stopped.ok()) << stopped.describe();
  ASSERT_TRUE(back.is_ok()) << back.to_string();
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_EQ(engine->client->reconnects(), 1u);
}

// A separate engine process (kvtier-example-engine) saves its session, pauses, kvtierd
// restarts under it, and its Lookup and Load then go through the same client, which
// reconnected by itself: every block bit-exact.
TEST_F(Reconnect, AnEngineProcessRidesThroughARestart) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  UniqueFd output(fds[0]), output_write(fds[1]);
  // 16 KiB blocks, 12 of them: the session fits the small tiers.
  auto engine = spawn({binary_path("kvtier-example-engine"), "--socket", daemon_->socket_path(),
                       "--session", "example-restart", "--layers", "2", "--kv-heads", "2",
                       "--head-dim", "64", "--num-blocks", "64", "--pause-before-load"},
                      output_write.get(), output_write.get());
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  output_write.reset();
  std::string text = read_pipe_until(output.get(), "paused before load");
  ASSERT_NE(text.find("paused before load"), std::string::npos) << text;

  ASSERT_TRUE(daemon_->stop().ok()) << daemon_->log();
  ASSERT_TRUE(restart().is_ok());
  ASSERT_EQ(::kill(*engine, SIGUSR1), 0);
  ExitStatus exited = wait_for_exit(*engine);
  text += read_pipe_until(output.get());
  EXPECT_TRUE(exited.ok()) << exited.describe() << "\n" << text;
  EXPECT_NE(text.find("lookup hit 12/12, loaded 12, bit-exact 12"), std::string::npos) << text;
  EXPECT_NE(text.find("connection: 1 reconnects"), std::string::npos) << text;
}

// While kvtierd is away, unregistering a region needs no connection (the daemon dropped
// it with the connection), and the reconnect does not register it again.
TEST_F(Reconnect, UnregisteringWhileAwayForgetsTheRegionWithoutTheDaemon) {
  auto engine = Engine::connect(daemon_->socket_path(), small_shape(32));
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  ASSERT_TRUE(save_session(*engine, "gone-region", 4).is_ok());
  ASSERT_TRUE(daemon_->stop().ok()) << daemon_->log();
  ASSERT_FALSE(engine->client->lookup(PagedCache::chain_hashes("gone-region", 4)).is_ok());
  Status unregistered = engine->client->unregister_region(engine->cache.region_id());
  EXPECT_TRUE(unregistered.is_ok()) << unregistered.to_string();
  ASSERT_TRUE(restart().is_ok());
  ASSERT_TRUE(lookup_until_back(*engine, PagedCache::chain_hashes("gone-region", 4)).is_ok());
  // The region is not there: a Load into it is refused, naming it.
  auto loaded = engine->client->load("gone-region",
                                     Engine::refs(PagedCache::chain_hashes("gone-region", 4), 8));
  ASSERT_FALSE(loaded.is_ok() && loaded->loaded_count > 0);
  const Status& why = loaded.is_ok() ? loaded->stop_reason : loaded.status();
  EXPECT_NE(why.message().find("region"), std::string::npos) << why.to_string();
  // And unregistering it again, connected, is the daemon's NotFound.
  EXPECT_EQ(engine->client->unregister_region(engine->cache.region_id()).code(),
            StatusCode::kNotFound);
}

// kvtierd comes back with the engine's uid in a shared namespace: the client refuses to
// join (its blocks are elsewhere), with PermissionDenied, not retryable, never
// Unavailable, and serves nothing from the other namespace.
TEST_F(Reconnect, ADaemonThatMovedTheEngineToAnotherNamespaceIsRefusedNotJoined) {
  auto engine = Engine::connect(daemon_->socket_path(), small_shape(32));
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  ASSERT_TRUE(save_session(*engine, "moved", 4).is_ok());
  ASSERT_TRUE(daemon_->stop().ok()) << daemon_->log();
  std::vector<std::string> shared = flags();
  shared.insert(shared.end(), {"--shared-namespace", fmt::format("team={}", ::getuid())});
  ASSERT_TRUE(restart(shared).is_ok());

  const auto hashes = PagedCache::chain_hashes("moved", 4);
  const auto deadline = Clock::now() + kDeadline;
  Status status = unavailable("not asked yet");
  while (status.code() == StatusCode::kUnavailable && Clock::now() < deadline) {
    status = engine->client->lookup(hashes).status();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied) << status.to_string();
  EXPECT_FALSE(status.retryable()) << status.to_string();
  EXPECT_NE(status.message().find("namespace 'team'"), std::string::npos) << status.to_string();
  EXPECT_EQ(engine->client->reconnects(), 0u);
  EXPECT_FALSE(engine->client->connected());
}

}  // namespace
}  // namespace kvtier::integration
