// Replies: every answer the daemon sends goes through here, and so does the time and
// outcome of every request (the latency, error and hit-by-tier metrics).
//
// A request is timed from its frame's arrival (record_request) to its reply
// (record_reply, called from reply() for every answer, error or not). Lookup hits by
// tier come from the Lookup reply itself; a Load's from the tiers its leading blocks
// were in when it arrived, counted for the blocks the reply says were loaded (a Load of
// a plane range only when the range starts at plane 0, as the Stats counters do).
//
// Thread-safety: control thread only (daemon_context.h).
#pragma once

#include <capnp/message.h>

#include <array>

#include "daemon/daemon_context.h"
#include "daemon/metrics.h"

namespace kvtier::daemon {

// Writes a non-OK status into a wire Error: code (StatusCode and wire ErrorCode share
// their numbers), message and retryable flag. Every error the daemon sends goes through it.
void set_wire_error(wire::Error::Builder out, const Status& status);

class Replies final : public Part {
 public:
  explicit Replies(DaemonContext& ctx) : Part(ctx, *this) {}

  // Builds the response (`fill` sets its body), records it, sends it, and frees the
  // request's in-flight slot on its connection.
  void reply(const ConnectionPtr& connection, uint64_t id, const Fill& fill)
      KVTIER_REQUIRES(control_thread);
  // A reply built over time in a message of its own (a listing described a slice at a
  // time), whose root is the Response: sets its id, then records and sends it as reply().
  void send_built(capnp::MessageBuilder& message, const ConnectionPtr& connection, uint64_t id)
      KVTIER_REQUIRES(control_thread);
  // An error reply: logged (Internal as an error, the rest at debug).
  void reply_error(const ConnectionPtr& connection, uint64_t id, const Status& status)
      KVTIER_REQUIRES(control_thread);
  // A request arrived: its kind and start time (and a Load's hit tiers) are noted.
  void record_request(EngineContext& engine, uint64_t id, wire::Request::Reader request)
      KVTIER_REQUIRES(control_thread);

  RequestMetrics& metrics() KVTIER_REQUIRES(control_thread) { return metrics_; }
  const RequestMetrics& metrics() const KVTIER_REQUIRES(control_thread) { return metrics_; }

 private:
  void send_reply(capnp::MessageBuilder& message, const ConnectionPtr& connection, uint64_t id,
                  const Fill& fill) KVTIER_REQUIRES(control_thread);
  void record_reply(const ConnectionPtr& c, uint64_t id, wire::Response::Reader response)
      KVTIER_REQUIRES(control_thread);

  RequestMetrics metrics_ KVTIER_GUARDED_BY(control_thread);
  // The first segment of every reply's message (zero between replies), 4 KiB.
  std::array<capnp::word, 512> first_segment_ KVTIER_GUARDED_BY(control_thread){};
  // A reply is being built in first_segment_.
  bool building_ KVTIER_GUARDED_BY(control_thread) = false;
};

}  // namespace kvtier::daemon
