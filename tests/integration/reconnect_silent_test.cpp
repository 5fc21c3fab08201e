// A daemon that accepts the client's new connection but never answers (stopped with
// SIGSTOP while restarting, deadlocked) counts as away: the reconnect's replay gives up
// after its deadline, the call gets Unavailable (retryable) instead of waiting forever,
// and once a real kvtierd is back the same client reconnects and serves.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <thread>

#include "tests/integration/nvme_harness.h"

namespace kvtier::integration {
namespace {

using Clock = std::chrono::steady_clock;

// Runs `call` on a thread of its own and returns its result; a call still running after
// `limit` ends the test binary with a failure, so a regression fails rather than hangs.
template <typename Call>
auto within(std::chrono::seconds limit, Call call) {
  using Value = decltype(call());
  std::packaged_task<Value()> task(std::move(call));
  auto result = task.get_future();
  std::thread(std::move(task)).detach();
  if (result.wait_for(limit) != std::future_status::ready) {
    std::fprintf(stderr, "FAILED: a client call was still blocked after %lld s\n",
                 static_cast<long long>(limit.count()));
    std::fflush(stderr);
    std::_Exit(1);
  }
  return result.get();
}

// A Unix socket at `path` that listens and never reads or writes: the kernel completes
// every connection, so a client connects and sends, and no reply ever comes.
UniqueFd silent_listener(const std::string& path) {
  ::unlink(path.c_str());  // the killed daemon's socket file
  UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listener.valid()) return listener;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listener.get(), 64) != 0) {
    return UniqueFd();
  }
  return listener;
}

TEST(ReconnectToSilentDaemon, ADaemonThatAcceptsButNeverAnswersCountsAsAwayUntilARealOneIsBack) {
  ScratchDir run;
  ScratchDir data;
  auto daemon = PersistentDaemon::start(run.path(), data.path(), nvme_tier_flags());
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  const std::string socket_path = (*daemon)->socket_path();
  // The Hello and the region are what the reconnect replays.
  auto engine = Engine::connect(socket_path, small_shape(32));
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const auto hashes = PagedCache::chain_hashes("silent", 4);
  ASSERT_TRUE(engine->client->lookup(hashes).is_ok());

  (*daemon)->kill9();
  daemon->reset();
  UniqueFd silent = silent_listener(socket_path);
  ASSERT_TRUE(silent.valid()) << std::strerror(errno);

  // Calls until one has tried the replay on the silent socket and given up.
  bool replay_timed_out = false;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (!replay_timed_out && Clock::now() < deadline) {
    Status status =
        within(std::chrono::seconds(30), [&] { return engine->client->lookup(hashes).status(); });
    ASSERT_EQ(status.code(), StatusCode::kUnavailable) << status.to_string();
    EXPECT_TRUE(status.retryable()) << status.to_string();
    // (A call that hangs fails the 30 s guard of within(); how long one takes is not
    // asserted: speed is bench/'s business.)
    replay_timed_out = status.message().find("did not answer") != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(replay_timed_out) << "no call ever tried to reconnect to the silent listener";
  EXPECT_FALSE(engine->client->connected());
  EXPECT_EQ(engine->client->reconnects(), 0u);

  // A real kvtierd in its place, on the same socket and data directory.
  silent.reset();
  ::unlink(socket_path.c_str());
  auto again = PersistentDaemon::start(run.path(), data.path(), nvme_tier_flags());
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  ASSERT_EQ((*again)->socket_path(), socket_path);
  Status back = unavailable("not asked yet");
  const auto back_deadline = Clock::now() + kDeadline;
  while (!back.is_ok() && Clock::now() < back_deadline) {
    back =
        within(std::chrono::seconds(30), [&] { return engine->client->lookup(hashes).status(); });
    if (!back.is_ok()) {
      ASSERT_EQ(back.code(), StatusCode::kUnavailable) << back.to_string();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ASSERT_TRUE(back.is_ok()) << back.to_string();
  EXPECT_TRUE(engine->client->connected());
  EXPECT_EQ(engine->client->reconnects(), 1u);
}

}  // namespace
}  // namespace kvtier::integration
