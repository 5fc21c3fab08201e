// kvtierd's side of the systemd protocols, over libsystemd: readiness and status
// notification (sd_notify), the watchdog, and socket activation (sd_listen_fds).
// Outside systemd (no NOTIFY_SOCKET, no LISTEN_FDS, no WATCHDOG_USEC) every call is a
// no-op and the daemon runs the same.
//
// Thread-safety: ServiceNotifier belongs to the control thread (common/control_thread.h):
// its timer runs there, so a wedged control loop stops the WATCHDOG=1 pings and systemd
// restarts the daemon.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <string_view>

#include "common/control_thread.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace kvtier::daemon {

// The listening Unix stream socket systemd passed (socket activation), or an invalid
// fd when none was passed. InvalidArgument when systemd passed something else.
Result<UniqueFd> take_activation_socket();

class ServiceNotifier {
 public:
  // `status_line` is called on the control thread for each STATUS= update.
  ServiceNotifier(boost::asio::io_context& io, std::function<std::string()> status_line);

  // STATUS= only, while the daemon serves its socket but not yet data (start-up).
  void starting() KVTIER_REQUIRES(control_thread);
  // READY=1 with a first STATUS=, then starts the watchdog/status timer.
  void ready() KVTIER_REQUIRES(control_thread);
  // RELOADING=1 … READY=1 around a SIGHUP reload (STATUS= only before ready()).
  void reloading() KVTIER_REQUIRES(control_thread);
  void reloaded() KVTIER_REQUIRES(control_thread);
  // STOPPING=1; stops the timer (the watchdog stays quiet from here: TimeoutStopSec rules).
  void stopping() KVTIER_REQUIRES(control_thread);

  // The interval systemd expects WATCHDOG=1 within (0 when the watchdog is off).
  std::chrono::microseconds watchdog_interval() const { return watchdog_; }

 private:
  void tick() KVTIER_REQUIRES(control_thread);
  static void notify(const std::string& message);

  boost::asio::steady_timer timer_ KVTIER_GUARDED_BY(control_thread);
  // Constant after construction.
  std::function<std::string()> status_line_;
  std::chrono::microseconds watchdog_{0};
  std::chrono::milliseconds period_;

  std::chrono::steady_clock::time_point next_status_ KVTIER_GUARDED_BY(control_thread);
  bool stopped_ KVTIER_GUARDED_BY(control_thread) = false;
  // READY=1 was sent: a reload may send it again.
  bool ready_ KVTIER_GUARDED_BY(control_thread) = false;
};

}  // namespace kvtier::daemon
