// Service: kvtierd's request dispatch, wired to the IPC server, and the owner of the
// parts that serve the requests (daemon_context.h lists them; docs/architecture.md
// shows how a Save, a Load, a demotion and a spill go through them).
//
// Thread-safety: every method runs on the control thread (the io_context's one
// thread). Device copies run on device threads; their completions are posted back
// here, so no state is ever touched from two threads. An executor work guard rides
// with every copy, so io_context::run() returns only after the last copy finished.
// The public methods are where the control thread enters the daemon (main, the ipc
// server, the tests): each asserts the control thread (common/control_thread.h).
#pragma once

#include <boost/asio/io_context.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/daemon_context.h"

namespace kvtier::daemon {

// The parts (daemon_context.h lists them).
class Replies;
class Copies;
class Placement;
class SavePath;
class LoadPath;
class TurnPath;
class EngineSetup;
class AdminService;
class StartupGate;
class SessionJournal;
class RemotePath;
class TierWatch;

// The server's per-connection and connection-count limits from the configuration.
ipc::ConnectionLimits connection_limits(const DaemonConfig& config);

class Service final : public ipc::RequestHandler {
 public:
  // `clock` is the policy's time (idle thresholds, turn gaps); nullptr: an owned
  // SteadyClock. An injected clock is borrowed: it must outlive the Service and is read
  // only on the control thread, so a test's ManualClock must be advanced there too.
  Service(asio::io_context& io, DaemonConfig config, std::unique_ptr<Device> device,
          const policy::Clock* clock = nullptr);
  ~Service() override;

  // kvtierd's exit code after a fatal device error (docs/operations.md).
  static constexpr int kExitDeviceLost = 3;
  static constexpr int kExitCannotStart = 1;

  // Reserves the tiers' memory (the HBM arena: hbm-bytes on every GPU), opens and
  // recovers the NVMe tier, registers the device's fatal-error handler, and starts
  // filling the memory on background threads (StartupGate); returns without waiting
  // for the fill. Requests are served at once, except those that copy bytes (Save,
  // Load, BeginTurn, Drain): they wait until the fill is done, then `ready` runs (on
  // the control thread) and the planner starts. A failed fill stops the daemon with
  // kExitCannotStart.
  Status start();
  void set_ready_callback(std::function<void()> ready) {
    assert_control_thread();
    ready_callback_ = std::move(ready);
  }
  // The tiers' memory is filled: data requests are served.
  bool ready() const {
    assert_control_thread();
    return ctx_.ready;
  }
  // Stops the planner timer; in-flight copies still complete. With an NVMe tier it
  // first drains the RAM/HBM blocks of live sessions to NVMe and writes the session
  // table, for at most drain-timeout; `stopped` runs once that is over (at once
  // without an NVMe tier). A second stop() gives up on the drain: `stopped` runs now.
  void stop(std::function<void()> stopped = {});
  // The server whose connections Stats, status and /metrics count; it outlives the
  // Service's serving (main and the in-process harness stop it first).
  // The server whose connections Stats count; it learns who is an admin from here.
  void attach_server(ipc::Server* server) {
    assert_control_thread();
    // The server asks at accept, in its acceptor's handler.
    server->set_admin_check([this](const ipc::PeerCredentials& peer) {
      assert_control_thread();
      return ctx_.engines.is_admin(peer);
    });
    ctx_.server = server;
  }
  // What main does when the device is lost (stop the server, the metrics endpoint,
  // the signal handlers); called on the control thread with the exit code, after the
  // session table was written and before the event loop is stopped.
  void set_fatal_exit(std::function<void(int exit_code)> exit) {
    assert_control_thread();
    fatal_exit_ = std::move(exit);
  }
  // 0, kExitCannotStart when the tier memory could not be filled, or kExitDeviceLost
  // once the device was lost.
  int exit_code() const {
    assert_control_thread();
    return exit_code_;
  }
  // Takes the reloadable settings (thresholds, watermarks, planner period) of `fresh`;
  // the caller logs what else changed and needs a restart.
  void apply_reloaded_config(const DaemonConfig& fresh);
  const DaemonConfig& config() const {
    assert_control_thread();
    return ctx_.config;
  }
  // One more subscriber to the session table's notices, besides the parts (borrowed: it
  // outlives the Service).
  void subscribe(policy::SessionObserver& observer) {
    assert_control_thread();
    ctx_.sessions.subscribe(observer);
  }
  // One line for systemd's STATUS=: tier occupancy, sessions, connections.
  std::string status_line() const;
  // service_metrics.cpp: the Prometheus text for /metrics. Aggregates only: no
  // session ids, namespaces or content.
  std::string render_metrics() const;
  void count_config_reload(bool ok);

  void on_connect(const std::shared_ptr<ipc::Connection>& connection) override;
  void on_frame(const std::shared_ptr<ipc::Connection>& connection, ipc::Frame frame) override;
  void on_disconnect(const std::shared_ptr<ipc::Connection>& connection) override;

 private:
  using ConnectionPtr = std::shared_ptr<ipc::Connection>;

  Status claim_descriptors(const ConnectionPtr& connection, wire::Request::Reader request,
                           std::vector<UniqueFd>& fds);
  Status dispatch(const ConnectionPtr& connection, EngineContext& engine,
                  wire::Request::Reader request, std::vector<UniqueFd> fds)
      KVTIER_REQUIRES(control_thread);
  // A Save or a Load: its blocks (and staging, a Save's retention, a Load's planes)
  // decoded against the engine's layout, then handed to SavePath or LoadPath.
  Status dispatch_save(const ConnectionPtr& connection, EngineContext& engine, uint64_t id,
                       wire::Save::Reader save) KVTIER_REQUIRES(control_thread);
  Status dispatch_load(const ConnectionPtr& connection, EngineContext& engine, uint64_t id,
                       wire::Load::Reader load) KVTIER_REQUIRES(control_thread);
  // The device hit an error that leaves it unusable (device/device.h): log, write the session
  // table, and stop with kExitDeviceLost. RAM and HBM are not drained: after a lost
  // context their bytes cannot be trusted.
  void on_device_lost(const Status& status) KVTIER_REQUIRES(control_thread);
  // The fill failed: stop with kExitCannotStart.
  void on_cannot_start() KVTIER_REQUIRES(control_thread);
  // The tiers behind the executor, and the executor with its hooks into the parts;
  // built once the store exists (start()).
  void make_mover() KVTIER_REQUIRES(control_thread);

  // Declared first, destroyed last: the parts below borrow it.
  DaemonContext ctx_;
  // The parts, destroyed in reverse: the remote worker first (its thread may read tier
  // memory), then the NVMe tier's workers (they read into and write from the store's
  // memory), and every handle (pins, pending writes) before the store in ctx_.
  std::unique_ptr<Replies> replies_;
  std::unique_ptr<Copies> copies_;
  std::unique_ptr<Placement> placement_;
  std::unique_ptr<SavePath> saves_;
  std::unique_ptr<LoadPath> loads_;
  std::unique_ptr<TurnPath> turns_;
  std::unique_ptr<AdminService> admin_;
  std::unique_ptr<EngineSetup> setup_;
  std::unique_ptr<StartupGate> startup_;
  std::unique_ptr<SessionJournal> journal_;
  std::unique_ptr<RemotePath> remote_;
  std::unique_ptr<TierWatch> watch_;

  std::function<void(int)> fatal_exit_ KVTIER_GUARDED_BY(control_thread);
  std::function<void()> ready_callback_ KVTIER_GUARDED_BY(control_thread);
  int exit_code_ KVTIER_GUARDED_BY(control_thread) = 0;
};

}  // namespace kvtier::daemon
