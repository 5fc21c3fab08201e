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
  void start_fill(std::vector<UnfilledMemory> fills);
  // A stop while the tier memory is filling: the fill gives up.
  void cancel_fill();
  // cancel_fill, and waits for the filler thread (the Service's destructor).
  void join();
  // Whether a request of `which` arriving now must queue behind earlier work.
  bool must_defer(const EngineContext& engine, wire::Request::Which which) const;
  Status defer_request(const ConnectionPtr& c, EngineContext& engine, ipc::Frame frame,
                       std::vector<UniqueFd> fds);
  // Serves `c`'s deferred requests, in order, until one must still wait.
  void resume_deferred(const ConnectionPtr& c);
  // The connection closed: its deferred requests are dropped unanswered.
  void forget(EngineContext& engine);
  uint64_t fill_bytes() const { return fill_bytes_; }

 private:
  void on_fill_done(const Status& status, double seconds);
  void resume_all_deferred();
  void arm_deferred_expiry();

  SessionJournal& journal_;
  Dispatch dispatch_;
  std::function<void(const Status&)> failed_;
  std::function<void()> filled_;
  std::jthread filler_;      // fills the tier memory; joined when done or on stop
  uint64_t fill_bytes_ = 0;  // bytes being filled (Stats while starting)
  // Connections whose EngineContext::deferred is not empty (may hold closed ones).
  std::vector<std::weak_ptr<ipc::Connection>> deferred_connections_;
  uint64_t deferred_requests_ = 0;  // across connections
  // While not ready: wakes up to answer waiting requests whose startup-wait-ms is over.
  asio::steady_timer expiry_timer_;
  bool expiry_armed_ = false;
};

}  // namespace kvtier::daemon
