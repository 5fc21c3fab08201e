// InProcessDaemon: kvtierd inside the test process — the real Service and ipc::Server,
// wired as daemon/main.cpp wires them, on an io_context run by one thread of the test
// (the control thread), listening on a Unix socket in a fresh temporary directory.
// Two things differ from the real daemon, and they are why it exists:
//  * the Device is a FaultInjectingDevice over the host backend, so
//    a test can make a copy or the opening of a region fail on command, or hold copies
//    in flight until it lets them go;
//  * the policy's clock is a ManualClock, so idle time passes when the test says so.
//    Timers (the planner's period) still run on real time: a test that waits for the
//    planner polls with a deadline (wait_for_stats, wait_for_session).
// Tests reach the daemon as engines do, over the socket with the real client library
// (tests/integration/daemon_harness.h's Engine).
//
// Thread-safety: the Service, the device's fault switches and the ManualClock belong
// to the control thread, exactly as kvtierd's state does; ManualClock in particular is
// single-threaded. The test thread touches them only through run_on_control_thread()
// (advance_clock_ms, now_ms, fail_nth_submit, fail_open_region and the copy gate use
// it), which posts the work to the io_context and waits for it to have run.
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <sys/types.h>

#include "client/client.h"
#include "daemon/config.h"
#include "daemon/service.h"
#include "device/device.h"
#include "ipc/server.h"
#include "policy/clock.h"

namespace kvtier::daemon {

// Small tiers for in-process tests: 4 MiB of "HBM", 8 MiB of RAM, 1 MiB slabs, the
// session-aware policy with a 1 s (manual-clock) HBM idle threshold, planning every
// 10 ms of real time, no metrics endpoint and no NVMe tier.
DaemonConfig inprocess_config();

class InProcessDaemon {
 public:
  // Where the ManualClock starts: far from 0, so that no "now - earlier" can wrap.
  static constexpr uint64_t kClockStartMs = 1'000'000;

  // Starts the daemon with `config` (its socket_path and data_dir are replaced by
  // paths in a fresh temporary directory) and returns once the socket accepts.
  static Result<std::unique_ptr<InProcessDaemon>> start(DaemonConfig config = inprocess_config());
  // Stops the server and the Service on the control thread, joins it (in-flight copies
  // finish first) and removes the temporary directory.
  ~InProcessDaemon();
  InProcessDaemon(const InProcessDaemon&) = delete;
  InProcessDaemon& operator=(const InProcessDaemon&) = delete;

  const std::string& socket_path() const { return config_.socket_path; }
  const DaemonConfig& config() const { return config_; }
  Result<std::unique_ptr<Client>> connect() const { return Client::connect(config_.socket_path); }
  // A connection whose peer credentials (SO_PEERCRED, what the daemon derives the
  // namespace and admin rights from) are `uid` and `gid`. The test process must be
  // root for any uid but its own: the connect then runs on a thread of its own that
  // switches only its own effective ids (the raw syscalls, not glibc's process-wide
  // wrappers) and ends with them. Opens the socket and its directory to every user
  // for that. PermissionDenied when the ids cannot be taken (the caller skips).
  Result<std::unique_ptr<Client>> connect_as(uid_t uid, gid_t gid) const;

  // Runs `work` on the control thread and returns once it has run.
  void run_on_control_thread(const std::function<void()>& work);
  void advance_clock_ms(uint64_t millis);
  // `observer` hears of every session change from now on, on the control thread (it
  // outlives the daemon; read what it recorded through run_on_control_thread).
  void subscribe_to_sessions(policy::SessionObserver& observer);
  // The Prometheus text /metrics would serve now.
  std::string metrics_text();
  uint64_t now_ms();
  // FaultInjectingDevice's switches (device/device.h), set on the control thread: the
  // Nth device submit from now fails with `error`; every open_region fails with `error`
  // until an OK status clears it.
  void fail_nth_submit(int nth, Status error);
  void fail_open_region(Status error);
  // FaultInjectingDevice::hold_submits (device/device.h): while held, copies the daemon
  // submits wait (they count as in flight) until release_copies(), which submits them in
  // order.
  // The destructor releases them too.
  void hold_copies();
  void release_copies();
  // FaultInjectingDevice::release_oldest_submits: the `count` oldest held copies go
  // ahead; the rest, and copies submitted later, stay held.
  void release_oldest_copies(size_t count);
  size_t held_copies();
  // Polls held_copies() until it reaches `count`; false when `timeout` passes first.
  bool wait_for_held_copies(size_t count, std::chrono::milliseconds timeout);

  // Polls Stats on one connection until `done` holds; the last Stats, or an error
  // saying what was last seen when `timeout` passes.
  Result<StatsInfo> wait_for_stats(const std::function<bool(const StatsInfo&)>& done,
                                   std::chrono::milliseconds timeout) const;
  // Polls GetSession until `done` holds for `session_id`; likewise.
  Result<SessionInfo> wait_for_session(const std::string& session_id,
                                       const std::function<bool(const SessionInfo&)>& done,
                                       std::chrono::milliseconds timeout) const;

 private:
  InProcessDaemon(DaemonConfig config, std::string dir);
  Status start_serving();

  DaemonConfig config_;
  std::string dir_;
  boost::asio::io_context io_{1};
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_guard_;
  policy::ManualClock clock_{kClockStartMs};  // control thread only
  FaultInjectingDevice* device_ = nullptr;    // owned by service_; control thread only
  std::unique_ptr<Service> service_;
  std::unique_ptr<ipc::Server> server_;
  std::thread control_thread_;
};

}  // namespace kvtier::daemon
