// kvtierd under systemd's protocols, with the test playing systemd: readiness and
// watchdog notifications on a NOTIFY_SOCKET, and socket activation with a listening
// socket passed as fd 3 — including a restart during which a client's request waits
// in the backlog and is answered by the next daemon.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "common/unique_fd.h"
#include "tests/integration/ops_harness.h"
#include "tests/integration/raw_connection.h"

namespace kvtier::integration {
namespace {

using Clock = std::chrono::steady_clock;

// A Unix datagram socket standing in for systemd's notification socket.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_.reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::snprintf(address.sun_path, sizeof(address.sun_path), "%s", path.c_str());
    bound_ = ::bind(fd_.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  ~NotifySocket() { ::unlink(path_.c_str()); }
  bool bound() const { return bound_; }

  // Reads messages until one contains `wanted` (returned whole) or the deadline passes.
  Result<std::string> wait_for(const std::string& wanted, milliseconds timeout = kDeadline) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      pollfd ready{fd_.get(), POLLIN, 0};
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      if (::poll(&ready, 1, static_cast<int>(std::max<int64_t>(left.count(), 1))) <= 0) continue;
      char buffer[4096];
      ssize_t n = ::recv(fd_.get(), buffer, sizeof(buffer), 0);
      if (n <= 0) continue;
      std::string message(buffer, static_cast<size_t>(n));
      seen_ += message + "\n---\n";
      if (message.find(wanted) != std::string::npos) return message;
    }
    return internal_error("no notification with '{}'; received:\n{}", wanted, seen_);
  }

 private:
  std::string path_;
  UniqueFd fd_;
  bool bound_ = false;
  std::string seen_;
};

TEST(SystemdNotify, ReadyWatchdogReloadingAndStopping) {
  char dir_template[] = "/tmp/kvtier-notify-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  NotifySocket notify(dir + "/notify.sock");
  ASSERT_TRUE(notify.bound());
  // The daemon inherits these (and only it: they are unset again right after).
  ::setenv("NOTIFY_SOCKET", (dir + "/notify.sock").c_str(), 1);
  ::setenv("WATCHDOG_USEC", "200000", 1);
  auto daemon = Daemon::start();
  ::unsetenv("NOTIFY_SOCKET");
  ::unsetenv("WATCHDOG_USEC");
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();

  auto ready = notify.wait_for("READY=1");
  ASSERT_TRUE(ready.is_ok()) << ready.status().to_string();
  EXPECT_NE(ready->find("STATUS=hbm"), std::string::npos) << *ready;
  // READY=1 only once the socket listens: a client gets through right away.
  EXPECT_TRUE((*daemon)->connect().is_ok());
  auto ping = notify.wait_for("WATCHDOG=1");
  EXPECT_TRUE(ping.is_ok()) << ping.status().to_string();
  auto second_ping = notify.wait_for("WATCHDOG=1", milliseconds(5000));
  EXPECT_TRUE(second_ping.is_ok()) << "the watchdog is pinged repeatedly";

  ::kill((*daemon)->pid(), SIGHUP);
  EXPECT_TRUE(notify.wait_for("RELOADING=1").is_ok());
  EXPECT_TRUE(notify.wait_for("READY=1").is_ok()) << "READY=1 again after the reload";

  ExitStatus stopped = (*daemon)->stop();
  EXPECT_TRUE(stopped.ok()) << stopped.describe();
  auto stopping = notify.wait_for("STOPPING=1", milliseconds(5000));
  EXPECT_TRUE(stopping.is_ok()) << stopping.status().to_string();
  daemon->reset();
  std::filesystem::remove_all(dir);
}

// Starts kvtierd with `listening` as fd 3 and LISTEN_FDS=1, as systemd does; its log
// is dir/log_name.
Result<support::DaemonProcess> start_activated(int listening, const std::string& dir,
                                               const std::string& log_name,
                                               const std::vector<std::string>& more_flags = {}) {
  support::DaemonProcessOptions options;
  options.binary = binary_path("kvtierd");
  options.dir = dir;
  // --socket names a path the daemon must not use: it was handed a socket.
  options.socket_path = dir + "/unused.sock";
  options.log_path = dir + "/" + log_name;
  options.flags = {"--metrics-addr", "off"};
  for (const auto& flag : small_tier_flags()) options.flags.push_back(flag);
  options.flags.insert(options.flags.end(), more_flags.begin(), more_flags.end());
  options.activation_fd = listening;
  return support::DaemonProcess::start(std::move(options));
}

Result<StatsInfo> stats_within(const std::string& socket_path, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    auto client = Client::connect(socket_path);
    if (client.is_ok()) {
      auto stats = (*client)->stats();
      if (stats.is_ok() || Clock::now() >= deadline) return stats;
    } else if (Clock::now() >= deadline) {
      return client.status();
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
}

TEST(SocketActivation, ServesThePassedSocketAcrossARestart) {
  char dir_template[] = "/tmp/kvtier-activation-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string path = dir + "/kvtierd.sock";
  // The test holds the listening socket, as systemd's kvtierd.socket does.
  UniqueFd listening(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::snprintf(address.sun_path, sizeof(address.sun_path), "%s", path.c_str());
  ASSERT_EQ(::bind(listening.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(listening.get(), 16), 0);

  auto first = start_activated(listening.get(), dir, "first.log");
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  auto stats = stats_within(path, kDeadline);
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_FALSE(std::filesystem::exists(dir + "/unused.sock"))
      << "kvtierd listened on --socket although systemd passed a socket";
  {
    auto engine = Engine::connect(path, small_shape(8), "activated");
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    const auto refs = Engine::refs(PagedCache::chain_hashes("activated", 4), 0);
    engine->fill(refs);
    auto saved = engine->client->save("activated", refs, true);
    ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
    EXPECT_EQ(saved->stored, 4u);
  }
  ExitStatus first_exit = first->stop();
  EXPECT_TRUE(first_exit.ok()) << first_exit.describe();
  EXPECT_TRUE(std::filesystem::exists(path)) << "the daemon removed systemd's socket file";

  // Between daemons: the connection waits in the backlog and the request in its buffer.
  auto waiting = RawConnection::connect(path);
  ASSERT_TRUE(waiting.is_ok()) << waiting.status().to_string();
  ASSERT_TRUE(waiting->send(1, [](wire::Request::Builder r) { r.initStats(); }).is_ok());

  auto second = start_activated(listening.get(), dir, "second.log");
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  auto reply = waiting->receive_reply();
  ASSERT_TRUE(reply.is_ok()) << reply.status().to_string();
  EXPECT_EQ(reply->id, 1u);
  EXPECT_EQ(reply->which, wire::Response::STATS) << reply->error.to_string();
  EXPECT_TRUE(second->stop().ok());
  std::filesystem::remove_all(dir);
}

TEST(SocketActivation, APassedFdThatIsNotAListeningSocketIsRefused) {
  char dir_template[] = "/tmp/kvtier-activation-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  UniqueFd not_a_socket(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  auto daemon = start_activated(not_a_socket.get(), dir, "kvtierd.log");
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  ExitStatus status = daemon->wait();
  EXPECT_TRUE(status.exited && status.code == 1) << status.describe();
  EXPECT_NE(daemon->log().find("none is a listening Unix stream socket"), std::string::npos)
      << daemon->log();
  std::filesystem::remove_all(dir);
}

// `systemctl stop` or `reload` while kvtierd is still starting (a long NVMe recovery,
// here a test-only hold before it takes the socket): the signals wait for the loop, so
// SIGHUP does not kill it and SIGTERM ends in a clean exit, not death by signal.
TEST(SocketActivation, SignalsSentWhileStartingAreHandledNotFatal) {
  char dir_template[] = "/tmp/kvtier-activation-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  UniqueFd listening(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::snprintf(address.sun_path, sizeof(address.sun_path), "%s", (dir + "/kvtierd.sock").c_str());
  ASSERT_EQ(::bind(listening.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(listening.get(), 16), 0);

  auto daemon =
      start_activated(listening.get(), dir, "kvtierd.log", {"--fault-start-delay-ms", "1500ms"});
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  const auto deadline = Clock::now() + kDeadline;
  while (daemon->log().find("holding the start") == std::string::npos && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_NE(daemon->log().find("holding the start"), std::string::npos) << daemon->log();
  ::kill(daemon->pid(), SIGHUP);
  ::kill(daemon->pid(), SIGTERM);
  const ExitStatus stopped = daemon->wait();
  EXPECT_TRUE(stopped.ok()) << stopped.describe() << "\n" << daemon->log();
  const std::string log = daemon->log();
  EXPECT_NE(log.find("shutting down"), std::string::npos) << log;
  EXPECT_NE(log.find("kvtierd stopped"), std::string::npos) << log;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvtier::integration
