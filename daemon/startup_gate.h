// StartupGate: kvtierd listens before its tier memory is filled, so requests can
// arrive while the pages of the HBM arena and the RAM pool are still being faulted in
// (device/page_fill.h) on background threads. This part runs the fill and holds back the
// requests that must wait.
//
// What a request sees meanwhile (docs/protocol.md, docs/operations.md):
//   - Hello, RegisterRegion, UnregisterRegion, Lookup, CloseSession, Stats (which says
//     `starting`), ListSessions, GetSession, Evict, Pin, GetConfig are served at once:
//     they need the block index, never the bytes.
//   - Save, Load, BeginTurn and Drain copy bytes: they wait, in arrival order, until
//     the fill is done, for at most startup-wait-ms each; then Unavailable ("kvtierd is
//     starting ...; retry"). At most kMaxDeferredRequests wait daemon-wide (beyond:
//     Unavailable at once); per connection the in-flight limit bounds them.
//   - Requests on a connection queue behind an earlier one of the same connection that
//     still waits (a Save waiting for the fill, a RegisterRegion whose region is being
//     opened), so each connection's requests take effect in the order they were sent.
//
// Thread-safety: the filler thread only runs the fills and posts the outcome to the
// control thread; every field here belongs to the control thread.
#pragma once

#include <boost/asio/steady_timer.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "daemon/daemon_context.h"

namespace kvtier::daemon {

// Daemon-wide bound on requests waiting for the fill (each holds its frame).
inline constexpr uint64_t kMaxDeferredRequests = 4096;

class SessionJournal;  // session_journal.h

class StartupGate final : public Part {
 public:
  // Serves a request now (Service::dispatch).
  using Dispatch = std::function<Status(const ConnectionPtr&, EngineContext&, wire::Request::Reader,
                                        std::vector<UniqueFd>)>;
  // `dispatch` serves deferred requests; `failed` runs when the fill fails (the daemon
  // must stop); `filled` when it is done, before the deferred requests are served.
  // `journal`: its NVMe tier registers the filled pools as its I/O buffers.
  StartupGate(DaemonContext& ctx, Replies& replies, SessionJournal& journal, Dispatch dispatch,
              std::function<void(const Status&)> failed, std::function<void()> filled);
  ~StartupGate();

  // Fills `fills` on background threads; returns at once. ctx.ready turns true when
  // that is done (then `filled` runs and the waiting requests are served).
  void start_fill(std::vector<UnfilledMemory> fills) KVTIER_REQUIRES(control_thread);
  // A stop while the tier memory is filling: the fill gives up.
  void cancel_fill() KVTIER_REQUIRES(control_thread);
  // cancel_fill, and waits for the filler thread (the Service's destructor).
  void join() KVTIER_REQUIRES(control_thread);
  // Whether a request of `which` arriving now must queue behind earlier work.
  bool must_defer(const EngineContext& engine, wire::Request::Which which) const
      KVTIER_REQUIRES(control_thread);
  Status defer_request(const ConnectionPtr& c, EngineContext& engine, ipc::Frame frame,
                       std::vector<UniqueFd> fds) KVTIER_REQUIRES(control_thread);
  // Serves `c`'s deferred requests, in order, until one must still wait.
  void resume_deferred(const ConnectionPtr& c) KVTIER_REQUIRES(control_thread);
  // The connection closed: its deferred requests are dropped unanswered.
  void forget(EngineContext& engine) KVTIER_REQUIRES(control_thread);
  uint64_t fill_bytes() const KVTIER_REQUIRES(control_thread) { return fill_bytes_; }

 private:
  void on_fill_done(const Status& status, double seconds) KVTIER_REQUIRES(control_thread);
  void resume_all_deferred() KVTIER_REQUIRES(control_thread);
  void arm_deferred_expiry() KVTIER_REQUIRES(control_thread);

  SessionJournal& journal_;
  Dispatch dispatch_;
  std::function<void(const Status&)> failed_;
  std::function<void()> filled_;
  // Fills the tier memory; joined when done or on stop.
  std::jthread filler_ KVTIER_GUARDED_BY(control_thread);
  // Bytes being filled (Stats while starting).
  uint64_t fill_bytes_ KVTIER_GUARDED_BY(control_thread) = 0;
  // Connections whose EngineContext::deferred is not empty (may hold closed ones).
  std::vector<std::weak_ptr<ipc::Connection>> deferred_connections_
      KVTIER_GUARDED_BY(control_thread);
  uint64_t deferred_requests_ KVTIER_GUARDED_BY(control_thread) = 0;  // across connections
  // While not ready: wakes up to answer waiting requests whose startup-wait-ms is over.
  asio::steady_timer expiry_timer_ KVTIER_GUARDED_BY(control_thread);
  bool expiry_armed_ KVTIER_GUARDED_BY(control_thread) = false;
};

}  // namespace kvtier::daemon
