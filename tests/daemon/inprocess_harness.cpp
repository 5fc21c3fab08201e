#include "tests/daemon/inprocess_harness.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <boost/asio/post.hpp>

#include <filesystem>
#include <future>

#include "ipc/unix_socket.h"

namespace kvtier::daemon {
namespace {

using Clock = std::chrono::steady_clock;

// The polls below re-check their condition at this interval until their deadline;
// nothing is synchronised by the interval itself.
constexpr std::chrono::milliseconds kPollInterval{2};

std::string describe_tiers(const StatsInfo& stats) {
  std::string text;
  for (const TierStatsInfo& tier : stats.tiers) {
    text += fmt::format("{}: {} blocks, {} bytes used ({} copies); ", tier_name(tier.tier),
                        tier.blocks, tier.used_bytes, tier.copy_bytes);
  }
  return text + fmt::format("copies_in_flight {}, pinned_blocks {}", stats.copies_in_flight,
                            stats.pinned_blocks);
}

std::string describe_session(const SessionInfo& session) {
  std::string text =
      fmt::format("active {}, idle_ms {}, blocks {}, per tier (hbm ram nvme none):", session.active,
                  session.idle_ms, session.blocks);
  for (uint32_t count : session.blocks_per_tier) text += fmt::format(" {}", count);
  return text;
}

}  // namespace

DaemonConfig inprocess_config() {
  DaemonConfig config = default_config();
  config.device = "host";
  config.hbm_bytes = 4ull << 20;
  config.ram_bytes = 8ull << 20;
  config.slab_bytes = 1ull << 20;
  config.copy_threads = 2;
  config.policy = "session";
  config.hbm_idle_ms = 1'000;  // on the manual clock
  config.plan_interval_ms = 10;
  config.metrics_addr = "off";
  return config;
}

InProcessDaemon::InProcessDaemon(DaemonConfig config, std::string dir)
    : config_(std::move(config)), dir_(std::move(dir)), work_guard_(io_.get_executor()) {
  config_.socket_path = dir_ + "/kvtierd.sock";
  config_.data_dir = dir_ + "/data";
}

Result<std::unique_ptr<InProcessDaemon>> InProcessDaemon::start(DaemonConfig config) {
  char pattern[] = "/tmp/kvtier-inprocess-XXXXXX";
  if (::mkdtemp(pattern) == nullptr) return errno_status(errno, "mkdtemp");
  std::unique_ptr<InProcessDaemon> daemon(new InProcessDaemon(std::move(config), pattern));
  KVTIER_RETURN_IF_ERROR(daemon->start_serving());
  return daemon;
}

// As daemon/main.cpp does, minus signals, systemd and /metrics: the Service first (it
// allocates the tiers), then the server on its socket, then the control thread.
Status InProcessDaemon::start_serving() {
  auto device = std::make_unique<FaultInjectingDevice>(make_host_device(config_.copy_threads));
  device_ = device.get();
  service_ = std::make_unique<Service>(io_, config_, std::move(device), &clock_);
  KVTIER_RETURN_IF_ERROR(service_->start());
  server_ = std::make_unique<ipc::Server>(io_, *service_, connection_limits(config_));
  service_->attach_server(server_.get());
  KVTIER_RETURN_IF_ERROR(server_->listen(config_.socket_path));
  control_thread_ = std::thread([this] { io_.run(); });
  // listen() returned, so the socket accepts (connections wait in its backlog until
  // the control thread takes them); checked once so a broken setup fails here.
  auto probe = ipc::connect_unix(config_.socket_path);
  return probe.is_ok() ? Status::ok() : probe.status();
}

InProcessDaemon::~InProcessDaemon() {
  if (control_thread_.joinable()) {
    run_on_control_thread([this] {
      device_->release_submits();  // a held copy would keep run() from returning
      server_->stop();
      service_->stop();
    });
    // Without the guard, run() returns once the last in-flight copy has completed.
    work_guard_.reset();
    control_thread_.join();
  }
  server_.reset();
  service_.reset();  // drains the device
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

// Unbounded wait: the control thread never blocks, so the work runs within one turn of
// the event loop; a test that hangs regardless is ended by ctest's timeout.
void InProcessDaemon::run_on_control_thread(const std::function<void()>& work) {
  std::promise<void> done;
  boost::asio::post(io_, [&] {
    work();
    done.set_value();
  });
  done.get_future().wait();
}

std::string InProcessDaemon::metrics_text() {
  std::string text;
  run_on_control_thread([&] { text = service_->render_metrics(); });
  return text;
}

void InProcessDaemon::subscribe_to_sessions(policy::SessionObserver& observer) {
  run_on_control_thread([&] { service_->subscribe(observer); });
}

void InProcessDaemon::advance_clock_ms(uint64_t millis) {
  run_on_control_thread([&] { clock_.advance_ms(millis); });
}

uint64_t InProcessDaemon::now_ms() {
  uint64_t now = 0;
  run_on_control_thread([&] { now = clock_.now_ms(); });
  return now;
}

void InProcessDaemon::fail_nth_submit(int nth, Status error) {
  run_on_control_thread([&] { device_->fail_nth_submit(nth, std::move(error)); });
}

void InProcessDaemon::fail_open_region(Status error) {
  run_on_control_thread([&] { device_->fail_open_region(std::move(error)); });
}

void InProcessDaemon::hold_copies() {
  run_on_control_thread([&] { device_->hold_submits(); });
}

void InProcessDaemon::release_copies() {
  run_on_control_thread([&] { device_->release_submits(); });
}

void InProcessDaemon::release_oldest_copies(size_t count) {
  run_on_control_thread([&] { device_->release_oldest_submits(count); });
}

size_t InProcessDaemon::held_copies() {
  size_t held = 0;
  run_on_control_thread([&] { held = device_->held_submits(); });
  return held;
}

bool InProcessDaemon::wait_for_held_copies(size_t count, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (held_copies() < count) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(kPollInterval);
  }
  return true;
}

Result<std::unique_ptr<Client>> InProcessDaemon::connect_as(uid_t uid, gid_t gid) const {
  if (::geteuid() == uid && ::getegid() == gid) return connect();
  if (::geteuid() != 0) {
    return permission_denied("connecting as uid {} gid {} needs root; this test runs as uid {}",
                             uid, gid, ::geteuid());
  }
  // The connecting thread gives up root, and with it the right to ignore file modes.
  if (::chmod(dir_.c_str(), 0755) != 0) return errno_status(errno, "chmod " + dir_);
  if (::chmod(config_.socket_path.c_str(), 0666) != 0) {
    return errno_status(errno, "chmod " + config_.socket_path);
  }
  Result<std::unique_ptr<Client>> client = internal_error("the connecting thread did not run");
  // glibc's setresuid() changes every thread of the process; the raw syscall changes only
  // the calling one, whose credentials end with it. Real and saved ids stay 0.
  std::thread connecting([&] {
    if (::syscall(SYS_setresgid, -1, gid, -1) != 0) {
      client = errno_status(errno, fmt::format("setresgid to {}", gid));
      return;
    }
    if (::syscall(SYS_setresuid, -1, uid, -1) != 0) {
      client = errno_status(errno, fmt::format("setresuid to {}", uid));
      return;
    }
    client = connect();
  });
  connecting.join();
  if (!client.is_ok()) {
    return client.status().with_context(fmt::format("connecting as uid {} gid {}", uid, gid));
  }
  return client;
}

Result<StatsInfo> InProcessDaemon::wait_for_stats(const std::function<bool(const StatsInfo&)>& done,
                                                  std::chrono::milliseconds timeout) const {
  auto client = connect();
  if (!client.is_ok()) return client.status();
  const auto deadline = Clock::now() + timeout;
  while (true) {
    auto stats = (*client)->stats();
    if (!stats.is_ok() || done(*stats)) return stats;
    if (Clock::now() >= deadline) {
      return internal_error("condition not reached within {} ms; last stats: {}", timeout.count(),
                            describe_tiers(*stats));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

Result<SessionInfo> InProcessDaemon::wait_for_session(
    const std::string& session_id, const std::function<bool(const SessionInfo&)>& done,
    std::chrono::milliseconds timeout) const {
  auto client = connect();
  if (!client.is_ok()) return client.status();
  const auto deadline = Clock::now() + timeout;
  while (true) {
    auto session = (*client)->get_session(session_id);
    if (!session.is_ok() || done(*session)) return session;
    if (Clock::now() >= deadline) {
      return internal_error("session '{}': condition not reached within {} ms; last seen: {}",
                            session_id, timeout.count(), describe_session(*session));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

}  // namespace kvtier::daemon
