// The Service's start-up state: kvtierd listens before its tier memory is filled, so
// requests can arrive while the pages of the HBM arena and the RAM pool are still
// being faulted in (cuda/page_fill.h) on background threads.
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

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "ipc/server.h"

namespace kvtier::daemon {

// Daemon-wide bound on requests waiting for the fill (each holds its frame).
inline constexpr uint64_t kMaxDeferredRequests = 4096;

struct StartupState {
  explicit StartupState(boost::asio::io_context& io) : expiry_timer(io) {}

  std::jthread filler;      // fills the tier memory; joined when done or on stop
  uint64_t fill_bytes = 0;  // bytes being filled (Stats while starting)
  // Connections whose EngineContext::deferred is not empty (may hold closed ones).
  std::vector<std::weak_ptr<ipc::Connection>> deferred_connections;
  uint64_t deferred_requests = 0;  // across connections
  // While not ready: wakes up to answer waiting requests whose startup-wait-ms is over.
  boost::asio::steady_timer expiry_timer;
  bool expiry_armed = false;
};

}  // namespace kvtier::daemon
