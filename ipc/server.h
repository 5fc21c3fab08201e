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
// Thread-safety: everything here runs on the io_context's thread (the control
// thread). Handlers may keep a shared_ptr<Connection> and reply later from the same
// thread; replying to a closed connection is a no-op.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "ipc/framing.h"
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
  // Received descriptors not yet claimed by a request; one request may need them all.
  uint32_t max_queued_fds = kMaxFdsPerRequest;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(asio::local::stream_protocol::socket socket, PeerCredentials peer, uint64_t id,
             const ConnectionLimits& limits, RequestHandler& handler);

  uint64_t id() const { return id_; }
  const PeerCredentials& peer() const { return peer_; }
  bool is_open() const { return open_; }

  // Queues a serialized reply. Dropped when the connection is closed.
  void send(kj::Array<capnp::word> frame);
  // Takes the oldest received descriptor not yet claimed; NotFound when none.
  Result<UniqueFd> take_fd();
  size_t queued_fds() const { return fds_.size(); }

  // The handler finished one request (for the in-flight limit).
  void request_done();
  // Closes now: no further frames are delivered; queued replies are dropped.
  void close();

  // Per-connection state the daemon attaches (its session/engine context).
  std::shared_ptr<void> user_state;

 private:
  friend class Server;
  void start();
  void read_more();
  void on_readable();
  void deliver_frames();
  void fail_framing(const Status& status);
  void write_next();
  void finish();

  asio::local::stream_protocol::socket socket_;
  const PeerCredentials peer_;
  const uint64_t id_;
  const ConnectionLimits limits_;
  RequestHandler& handler_;
  FrameParser parser_;
  std::deque<UniqueFd> fds_;  // received, unclaimed, oldest first
  std::deque<kj::Array<capnp::word>> outgoing_;
  uint32_t in_flight_ = 0;
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

  size_t connection_count() const;
  const std::string& path() const { return path_; }

 private:
  void accept_next();

  asio::io_context& io_;
  RequestHandler& handler_;
  const ConnectionLimits limits_;
  asio::local::stream_protocol::acceptor acceptor_;
  std::string path_;
  bool owns_path_ = false;
  uint64_t next_connection_id_ = 1;
  std::vector<std::weak_ptr<Connection>> connections_;
};

}  // namespace kvtier::ipc
