// Server and Connection: the daemon's side of the Unix socket, on Asio.
//
// Server listens on a path (mode 0660), accepts connections, reads each peer's
// credentials once (SO_PEERCRED) and runs one Connection per client. A Connection
// reads stream-framed Cap'n Proto messages and the descriptors sent with them, hands
// every whole frame to the RequestHandler, and writes replies in the order they are
// sent (which need not be the order requests came in).
//
// Descriptors (SCM_RIGHTS) are queued per connection in arrival order; a request that
// declares N takes N from the head (take_fd). A request may carry up to
// kMaxFdsPerRequest, arriving over several recvmsg calls before its frame completes.
//
// Framing errors (a header over the limits, a stream ending inside a frame, more
// unclaimed descriptors than `max_queued_fds`, descriptors lost in transit) get an
// Error reply with id 0 and close that connection only. Every other problem is the
// handler's to answer.
//
// What one connection can make the daemon hold is bounded (ConnectionLimits): reading
// pauses while it has `max_in_flight` requests being handled, while the frames its
// handler still holds add up to `max_held_request_bytes`, or while replies it has not
// read add up to `max_queued_reply_bytes`, and resumes as they drain. A peer that never
// reads its replies therefore stops being read, holding at most those bytes (plus one
// frame and the replies of its requests in flight), and everyone else is served
// meanwhile.
//
// What one peer can make the server refuse others is bounded too. A newcomer is refused
// (an Error reply with id 0, resource exhausted, retryable, naming the limit; then
// closed) when `max_connections` are open; or, unless it is an admin (the server's admin
// check: root, the admin group), when its uid's other non-admin connections number
// `max_connections_per_uid` already, or when only the last `admin_reserved_connections`
// (at most half of max_connections) are left (kept for kvtierctl). A connection the
// handler has not called introduced() on (it said who it is: Hello, an operator request)
// within `introduction_timeout_ms` is closed and counted: idle sockets hold no slots.
//
// Thread-safety: everything here runs on the io_context's thread (the control
// thread). Handlers may keep a shared_ptr<Connection> and reply later from the same
// thread; replying to a closed connection is a no-op.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>

#include <boost/asio/steady_timer.hpp>

#include <array>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "ipc/framing.h"
#include "ipc/receiving_socket.h"
#include "ipc/unix_socket.h"

namespace kvtier::ipc {

namespace asio = boost::asio;
class Connection;

class RequestHandler {
 public:
  virtual ~RequestHandler() = default;
  virtual void on_connect(const std::shared_ptr<Connection>& connection) = 0;
  // One whole frame. The handler owns it from here (it may keep it across async work).
  virtual void on_frame(const std::shared_ptr<Connection>& connection, Frame frame) = 0;
  // Called once, after the connection stopped reading; in-flight work may still reply
  // (those replies are dropped).
  virtual void on_disconnect(const std::shared_ptr<Connection>& connection) = 0;
};

struct ConnectionLimits {
  FrameLimits frame;
  uint32_t max_in_flight = 64;  // requests being handled; reading pauses above this
  // Bytes of received frames the handler still holds; reading pauses at this.
  uint64_t max_held_request_bytes = 64ull << 20;
  // Bytes of replies queued and not yet written (the peer is not reading); reading
  // pauses at this.
  uint64_t max_queued_reply_bytes = 32ull << 20;
  // Received descriptors not yet claimed by a request; one request may need them all.
  uint32_t max_queued_fds = kMaxFdsPerRequest;
  // Open connections the server accepts; more are refused. Server-wide.
  uint32_t max_connections = 512;
  // Open connections one peer uid may hold (kvtierd's tenants are peer uids); admins are
  // not held to it.
  uint32_t max_connections_per_uid = 64;
  // The last this many of max_connections only admins may take.
  uint32_t admin_reserved_connections = 4;
  // A connection must be introduced (Connection::introduced) within this many ms, or it
  // is closed; 0: no deadline.
  uint64_t introduction_timeout_ms = 5000;
};

// Why the server refused a connection (counted per reason).
enum class Refusal : uint8_t { kMaxConnections, kPerUid, kAdminReserved };
inline constexpr size_t kRefusalKinds = 3;
// The limit's configuration name ("max-connections", "max-connections-per-tenant",
// "admin-reserved-connections").
std::string_view refusal_name(Refusal refusal);

// Counts the server and its connections share (a connection may outlive the server).
struct ServerCounters {
  std::array<uint64_t, kRefusalKinds> refused{};
  uint64_t introduction_timeouts = 0;  // closed for not being introduced in time
};

class Connection : public std::enable_shared_from_this<Connection>, public ReceiveTarget {
 public:
  Connection(asio::local::stream_protocol::socket socket, PeerCredentials peer, uint64_t id,
             const ConnectionLimits& limits, RequestHandler& handler,
             std::shared_ptr<ServerCounters> counters = nullptr, bool admin = false,
             std::optional<uid_t> tenant = std::nullopt);

  uint64_t id() const { return id_; }
  const PeerCredentials& peer() const { return peer_; }
  // Whether the server's admin check said so when it accepted the connection.
  bool admin() const { return admin_; }
  // The uid it counts as for max_connections_per_uid (tenant_uid(); its own by default).
  uid_t tenant() const { return tenant_; }
  // The peer said who it is (the handler's call): the introduction deadline is off.
  void introduced();
  bool is_open() const { return open_; }

  // Sends a serialized reply: at once when nothing is queued ahead of it and the socket
  // takes it whole, else queued for an asynchronous write (which also reports errors:
  // never closes the connection from inside the caller). Dropped when it is closed.
  void send(kj::Array<capnp::word> frame);
  // Takes the oldest received descriptor not yet claimed; NotFound when none.
  Result<UniqueFd> take_fd();
  size_t queued_fds() const { return fds_.size(); }
  // What this connection holds now (ConnectionLimits bounds them).
  uint64_t held_request_bytes() const { return held_request_bytes_; }
  uint64_t queued_reply_bytes() const { return queued_reply_bytes_; }
  // Reading is paused by one of the limits.
  bool reading_paused() const { return open_ && !can_take_more(); }

  // The handler finished one request (for the in-flight limit).
  void request_done();
  // Closes now: no further frames are delivered; queued replies are dropped.
  void close();

  // Per-connection state the daemon attaches (its session/engine context).
  std::shared_ptr<void> user_state;

 private:
  friend class Server;
  struct RequestBytesLease;  // gives a frame's bytes back when the handler drops it
  void start();
  bool can_take_more() const;
  // Called after a count that can pause reading went down.
  void resume_if_unpaused(bool was_paused);
  void release_request_bytes(uint64_t bytes);
  void read_more();
  // ReceiveTarget: the parser's free room; one read's bytes and descriptors.
  std::span<std::byte> receive_space() override;
  void on_received(Result<Received> received, std::vector<UniqueFd> arrived) override;
  void deliver_frames();
  void fail_framing(const Status& status);
  void enqueue(kj::Array<capnp::word> frame);
  void drop_queued_replies();
  void write_next();
  void finish();
  // Closes the connection when it is not introduced within introduction_timeout_ms.
  void start_introduction_deadline();

  ReceivingSocket socket_;
  const PeerCredentials peer_;
  const uint64_t id_;
  const ConnectionLimits limits_;
  RequestHandler& handler_;
  std::shared_ptr<ServerCounters> counters_;
  const bool admin_;
  const uid_t tenant_;
  asio::steady_timer introduction_deadline_;
  bool introduced_ = false;
  FrameParser parser_;
  std::deque<UniqueFd> fds_;  // received, unclaimed, oldest first
  std::deque<kj::Array<capnp::word>> outgoing_;
  size_t front_sent_bytes_ = 0;  // of outgoing_.front(), sent by send() before it was queued
  uint32_t in_flight_ = 0;
  uint64_t held_request_bytes_ = 0;
  uint64_t queued_reply_bytes_ = 0;
  bool resume_posted_ = false;
  bool reading_ = false;
  bool writing_ = false;
  bool open_ = true;
  bool close_after_write_ = false;
  bool disconnected_ = false;
};

class Server {
 public:
  Server(asio::io_context& io, RequestHandler& handler, ConnectionLimits limits = {});
  ~Server();

  // Creates the socket at `path` (making its directory, 0750, if missing), mode 0660.
  // A stale socket file nobody listens on is replaced; a live one is
  // ResourceExhausted ("another kvtierd is listening").
  Status listen(const std::string& path);
  // Uses an already listening socket (socket activation).
  Status adopt(UniqueFd listening_fd);
  // Stops accepting and closes every connection.
  void stop();

  // Who is an admin (kept out of the per-uid limit, may take the reserved connections).
  // Without one, nobody is.
  void set_admin_check(std::function<bool(const PeerCredentials&)> is_admin) {
    is_admin_ = std::move(is_admin);
  }

  size_t connection_count() const;
  // Open connections that count as `uid` (tenant_uid()), admin ones left out.
  size_t connection_count(uid_t uid) const;
  // Connections refused, all reasons together and by reason.
  uint64_t refused_connections() const;
  uint64_t refused_connections(Refusal why) const {
    return counters_->refused[static_cast<size_t>(why)];
  }
  // Connections closed for not being introduced within introduction_timeout_ms.
  uint64_t introduction_timeouts() const { return counters_->introduction_timeouts; }
  const std::string& path() const { return path_; }

 private:
  void accept_next();
  // Why a newcomer from `peer` is refused now; nullopt: accepted.
  std::optional<Refusal> refusal_for(uid_t tenant, bool admin) const;
  void refuse(asio::local::stream_protocol::socket socket, const PeerCredentials& peer,
              uid_t tenant, Refusal why);
  // admin_reserved_connections, at most half of max_connections.
  uint32_t reserved_for_admins() const {
    return std::min(limits_.admin_reserved_connections, limits_.max_connections / 2);
  }

  asio::io_context& io_;
  RequestHandler& handler_;
  const ConnectionLimits limits_;
  asio::local::stream_protocol::acceptor acceptor_;
  std::string path_;
  bool owns_path_ = false;
  uint64_t next_connection_id_ = 1;
  std::shared_ptr<ServerCounters> counters_ = std::make_shared<ServerCounters>();
  std::function<bool(const PeerCredentials&)> is_admin_;
  std::vector<std::weak_ptr<Connection>> connections_;
};

}  // namespace kvtier::ipc
