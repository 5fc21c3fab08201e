#include "daemon/systemd.h"

#include <sys/socket.h>
#include <systemd/sd-daemon.h>

#include <algorithm>
#include <cstdlib>

#include "common/log.h"

namespace kvtier::daemon {
namespace {

// STATUS= is refreshed this often even when the watchdog wants nothing sooner.
constexpr std::chrono::milliseconds kStatusPeriod{5000};

}  // namespace

Result<UniqueFd> take_activation_socket() {
  // unset_environment=1: children (none today) must not think the fds are theirs.
  int count = sd_listen_fds(1);
  if (count < 0) return errno_status(-count, "sd_listen_fds");
  UniqueFd chosen;
  for (int fd = SD_LISTEN_FDS_START; fd < SD_LISTEN_FDS_START + count; ++fd) {
    UniqueFd passed(fd);
    if (!chosen.valid() && sd_is_socket_unix(fd, SOCK_STREAM, 1, nullptr, 0) > 0) {
      chosen = std::move(passed);
    } else {
      KVTIER_LOG_WARN(
          "socket activation: ignoring passed fd {} (not the first listening Unix "
          "stream socket)",
          fd);
    }
  }
  if (count > 0 && !chosen.valid()) {
    return invalid_argument(
        "systemd passed {} fds but none is a listening Unix stream socket; check kvtierd.socket "
        "(ListenStream= must be a path)",
        count);
  }
  return chosen;
}

ServiceNotifier::ServiceNotifier(boost::asio::io_context& io,
                                 std::function<std::string()> status_line)
    : timer_(io), status_line_(std::move(status_line)), period_(kStatusPeriod) {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
    watchdog_ = std::chrono::microseconds(usec);
    // Half the interval, as sd_watchdog_enabled(3) recommends.
    period_ = std::min<std::chrono::milliseconds>(
        period_, std::max<std::chrono::milliseconds>(
                     std::chrono::milliseconds(1),
                     std::chrono::duration_cast<std::chrono::milliseconds>(watchdog_ / 2)));
  }
}

void ServiceNotifier::notify(const std::string& message) {
  int sent = sd_notify(0, message.c_str());
  if (sent < 0) KVTIER_LOG_WARN("sd_notify failed: {}", errno_status(-sent, "").message());
}

void ServiceNotifier::starting() {
  if (std::getenv("NOTIFY_SOCKET") == nullptr) return;
  notify("STATUS=" + status_line_());
}

void ServiceNotifier::ready() {
  if (std::getenv("NOTIFY_SOCKET") == nullptr) return;
  ready_ = true;
  notify("READY=1\nSTATUS=" + status_line_());
  if (watchdog_.count() > 0) {
    KVTIER_LOG_INFO("systemd watchdog: pinging every {} ms", period_.count());
  }
  next_status_ = std::chrono::steady_clock::now() + kStatusPeriod;
  tick();
}

void ServiceNotifier::reloading() {
  if (!ready_) return;  // still starting: READY=1 comes when the start-up is done
  notify("RELOADING=1\nSTATUS=reloading configuration");
}

void ServiceNotifier::reloaded() {
  if (!ready_) return;
  notify("READY=1\nSTATUS=" + status_line_());
}

void ServiceNotifier::stopping() {
  stopped_ = true;
  timer_.cancel();
  notify("STOPPING=1\nSTATUS=stopping");
}

void ServiceNotifier::tick() {
  if (stopped_) return;
  std::string message;
  if (watchdog_.count() > 0) message = "WATCHDOG=1";
  const auto now = std::chrono::steady_clock::now();
  if (now >= next_status_) {
    message += (message.empty() ? "" : "\n") + std::string("STATUS=") + status_line_();
    next_status_ = now + kStatusPeriod;
  }
  if (!message.empty()) notify(message);
  timer_.expires_after(period_);
  timer_.async_wait([this](const boost::system::error_code& ec) {
    assert_control_thread();
    if (!ec) tick();
  });
}

}  // namespace kvtier::daemon
