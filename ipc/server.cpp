#include "ipc/server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <capnp/message.h>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <utility>

#include "common/log.h"
#include "schema/kvtier.capnp.h"

namespace kvtier::ipc {
namespace {

kj::Array<capnp::word> connection_error_reply(wire::ErrorCode code, std::string_view message_text,
                                              bool retryable) {
  capnp::MallocMessageBuilder message;
  auto response = message.initRoot<wire::Response>();
  response.setId(0);
  auto error = response.initError();
  error.setCode(code);
  error.setMessage(std::string(message_text));
  error.setRetryable(retryable);
  return capnp::messageToFlatArray(message);
}

kj::Array<capnp::word> framing_error_reply(const Status& status) {
  return connection_error_reply(wire::ErrorCode::INVALID_ARGUMENT, status.message(), false);
}

}  // namespace

// Returns a received frame's bytes to its connection's account when the handler lets
// go of the frame (on the control thread, where handlers keep frames).
struct Connection::RequestBytesLease {
  std::weak_ptr<Connection> connection;
  uint64_t bytes = 0;
  ~RequestBytesLease() {
    if (auto held = connection.lock()) held->release_request_bytes(bytes);
  }
};

std::string_view refusal_name(Refusal refusal) {
  switch (refusal) {
    case Refusal::kMaxConnections:
      return "max-connections";
    case Refusal::kPerUid:
      return "max-connections-per-tenant";
    case Refusal::kAdminReserved:
      return "admin-reserved-connections";
  }
  return "?";
}

Connection::Connection(asio::local::stream_protocol::socket socket, PeerCredentials peer,
                       uint64_t id, const ConnectionLimits& limits, RequestHandler& handler,
                       std::shared_ptr<ServerCounters> counters, bool admin,
                       std::optional<uid_t> tenant)
    : socket_(std::move(socket)),
      peer_(peer),
      id_(id),
      limits_(limits),
      handler_(handler),
      counters_(counters ? std::move(counters) : std::make_shared<ServerCounters>()),
      admin_(admin),
      tenant_(tenant.value_or(peer.uid)),
      introduction_deadline_(socket_.get_executor()),
      parser_(limits.frame) {}

void Connection::start() {
  socket_.non_blocking(true);
  handler_.on_connect(shared_from_this());
  start_introduction_deadline();
  read_more();
}

void Connection::start_introduction_deadline() {
  if (limits_.introduction_timeout_ms == 0) return;
  introduction_deadline_.expires_after(std::chrono::milliseconds(limits_.introduction_timeout_ms));
  introduction_deadline_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
    auto self = weak.lock();
    if (ec || !self || self->introduced_ || !self->open_) return;
    ++self->counters_->introduction_timeouts;
    KVTIER_LOG_DEBUG("connection {} (pid {} uid {}): not introduced within {} ms; closed",
                     self->id_, self->peer_.pid, self->peer_.uid,
                     self->limits_.introduction_timeout_ms);
    self->close();
  });
}

void Connection::introduced() {
  if (std::exchange(introduced_, true)) return;
  introduction_deadline_.cancel();
}

bool Connection::can_take_more() const {
  return open_ && !close_after_write_ && in_flight_ < limits_.max_in_flight &&
         held_request_bytes_ < limits_.max_held_request_bytes &&
         queued_reply_bytes_ < limits_.max_queued_reply_bytes;
}

void Connection::resume_if_unpaused(bool was_paused) {
  // Resume from the event loop, not from inside the handler that just replied: a
  // synchronous reply to each of many buffered frames must not recurse.
  if (!was_paused || !can_take_more() || resume_posted_) return;
  resume_posted_ = true;
  asio::post(socket_.get_executor(), [self = shared_from_this()] {
    self->resume_posted_ = false;
    self->deliver_frames();
    self->read_more();
  });
}

void Connection::release_request_bytes(uint64_t bytes) {
  const bool was_paused = !can_take_more();
  held_request_bytes_ -= std::min(bytes, held_request_bytes_);
  resume_if_unpaused(was_paused);
}

void Connection::read_more() {
  if (reading_ || !can_take_more()) return;
  reading_ = true;
  socket_.async_receive_into(shared_from_this());
}

std::span<std::byte> Connection::receive_space() {
  return parser_.write_space();
}

void Connection::on_received(Result<Received> received, std::vector<UniqueFd> arrived) {
  reading_ = false;
  if (!open_) {
    finish();
    return;
  }
  if (!received.is_ok()) {
    KVTIER_LOG_DEBUG("connection {}: {}", id_, received.status().to_string());
    finish();
    return;
  }
  for (UniqueFd& fd : arrived) fds_.push_back(std::move(fd));
  if (received->fds_truncated) {
    // The peer's descriptors and the requests that count on them no longer match.
    fail_framing(invalid_argument(
        "file descriptors were lost in transit (MSG_CTRUNC: more than {} in one sendmsg, or "
        "kvtierd is out of descriptors)",
        kMaxFdsPerRecvmsg));
    return;
  }
  if (fds_.size() > limits_.max_queued_fds) {
    fail_framing(
        invalid_argument("too many file descriptors sent: {} wait unclaimed and at most {} may",
                         fds_.size(), limits_.max_queued_fds));
    return;
  }
  if (received->bytes == 0) {
    if (parser_.pending_bytes() > 0) {
      uint64_t expected = parser_.expected_frame_bytes();
      fail_framing(invalid_argument(
          "truncated frame: the stream ended after {} of {} bytes", parser_.pending_bytes(),
          expected == 0 ? std::string("an unknown number of") : std::to_string(expected)));
    } else {
      finish();
    }
    return;
  }
  parser_.commit(received->bytes);
  deliver_frames();
  // The next read goes through the io_context's queue (each read is an operation of its
  // own), so a chatty client takes turns with the others.
  read_more();
}

void Connection::deliver_frames() {
  while (can_take_more()) {
    auto frame = parser_.next();
    if (!frame.is_ok()) {
      fail_framing(frame.status());
      return;
    }
    if (!frame->has_value()) return;
    ++in_flight_;
    const uint64_t bytes = (*frame)->size_bytes();
    held_request_bytes_ += bytes;
    auto lease = std::make_shared<RequestBytesLease>();
    lease->connection = weak_from_this();
    lease->bytes = bytes;
    (*frame)->attach_lease(std::move(lease));
    handler_.on_frame(shared_from_this(), std::move(**frame));
  }
}

void Connection::request_done() {
  const bool was_paused = !can_take_more();
  if (in_flight_ > 0) --in_flight_;
  resume_if_unpaused(was_paused);
}

void Connection::fail_framing(const Status& status) {
  KVTIER_LOG_DEBUG("connection {} (uid {}): framing error: {}", id_, peer_.uid, status.message());
  enqueue(framing_error_reply(status));
  fds_.clear();  // nothing will claim them now
  close_after_write_ = true;
  write_next();
}

void Connection::send(kj::Array<capnp::word> frame) {
  if (!open_) return;
  if (!writing_ && outgoing_.empty()) {
    // Nothing ahead of it: the reply goes out now, without an asynchronous write and the
    // completion it would post (most replies are small and the socket has room). What
    // the socket does not take, and any error, is left to the asynchronous write below:
    // the connection is never closed from inside the handler that replies.
    const auto bytes = frame.asBytes();
    const ssize_t sent =
        ::send(socket_.native_handle(), bytes.begin(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent == static_cast<ssize_t>(bytes.size())) return;
    if (sent > 0) front_sent_bytes_ = static_cast<size_t>(sent);
  }
  enqueue(kj::mv(frame));
  write_next();
}

void Connection::enqueue(kj::Array<capnp::word> frame) {
  queued_reply_bytes_ += frame.size() * sizeof(capnp::word);
  outgoing_.push_back(kj::mv(frame));
}

void Connection::drop_queued_replies() {
  outgoing_.clear();
  front_sent_bytes_ = 0;
  queued_reply_bytes_ = 0;
}

Result<UniqueFd> Connection::take_fd() {
  if (fds_.empty()) return not_found("no file descriptor was received with this request");
  UniqueFd fd = std::move(fds_.front());
  fds_.pop_front();
  return fd;
}

void Connection::write_next() {
  if (writing_ || !open_) return;
  if (outgoing_.empty()) {
    if (close_after_write_) {
      ::shutdown(socket_.native_handle(), SHUT_WR);
      close();
    }
    return;
  }
  writing_ = true;
  auto bytes = outgoing_.front().asBytes();
  const size_t sent = std::exchange(front_sent_bytes_, 0);
  asio::async_write(socket_, asio::buffer(bytes.begin() + sent, bytes.size() - sent),
                    [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                      self->writing_ = false;
                      const bool was_paused = !self->can_take_more();
                      if (!self->outgoing_.empty()) {
                        self->queued_reply_bytes_ -= std::min<uint64_t>(
                            self->queued_reply_bytes_,
                            self->outgoing_.front().size() * sizeof(capnp::word));
                        self->outgoing_.pop_front();
                      }
                      if (!self->open_) {
                        self->drop_queued_replies();
                        return;
                      }
                      if (ec) {
                        self->close();
                        return;
                      }
                      self->write_next();
                      self->resume_if_unpaused(was_paused);
                    });
}

void Connection::close() {
  if (!open_) return;
  open_ = false;
  introduction_deadline_.cancel();
  boost::system::error_code ignored;
  socket_.cancel(ignored);
  socket_.close(ignored);
  // A write in progress still references the front buffer until its handler runs.
  if (!writing_) drop_queued_replies();
  fds_.clear();
  finish();
}

void Connection::finish() {
  if (disconnected_) return;
  if (open_) {
    close();  // re-enters finish() once closed
    return;
  }
  disconnected_ = true;
  handler_.on_disconnect(shared_from_this());
}

Server::Server(asio::io_context& io, RequestHandler& handler, ConnectionLimits limits)
    : io_(io), handler_(handler), limits_(limits), acceptor_(io) {}

Server::~Server() {
  stop();
}

Status Server::listen(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path parent = fs::path(path).parent_path();
  if (!parent.empty() && !fs::exists(parent, ec)) {
    fs::create_directories(parent, ec);
    if (ec)
      return internal_error("cannot create socket directory {}: {}", parent.string(), ec.message());
    ::chmod(parent.c_str(), 0750);
  }
  if (fs::exists(path, ec)) {
    auto probe = connect_unix(path);
    if (probe.is_ok()) {
      return resource_exhausted("another kvtierd is listening on {}", path);
    }
    fs::remove(path, ec);
  }
  asio::local::stream_protocol::endpoint endpoint(path);
  boost::system::error_code error;
  acceptor_.open(endpoint.protocol(), error);
  if (!error) acceptor_.bind(endpoint, error);
  if (error) return errno_status(error.value(), "bind " + path);
  // Group members (the engines) may connect; others may not.
  if (::chmod(path.c_str(), 0660) != 0) return errno_status(errno, "chmod " + path);
  acceptor_.listen(asio::socket_base::max_listen_connections, error);
  if (error) return errno_status(error.value(), "listen " + path);
  path_ = path;
  owns_path_ = true;
  accept_next();
  return Status::ok();
}

Status Server::adopt(UniqueFd listening_fd) {
  boost::system::error_code error;
  acceptor_.assign(asio::local::stream_protocol(), listening_fd.release(), error);
  if (error) return errno_status(error.value(), "adopt listening socket");
  accept_next();
  return Status::ok();
}

void Server::accept_next() {
  acceptor_.async_accept(
      [this](const boost::system::error_code& ec, asio::local::stream_protocol::socket socket) {
        if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
        if (!ec) {
          auto peer = peer_credentials(socket.native_handle());
          const bool admin = peer.is_ok() && is_admin_ && is_admin_(*peer);
          const uid_t tenant = peer.is_ok() ? tenant_uid(*peer) : 0;
          const std::optional<Refusal> refusal =
              peer.is_ok() ? refusal_for(tenant, admin) : std::nullopt;
          if (refusal) {
            refuse(std::move(socket), *peer, tenant, *refusal);
          } else if (peer.is_ok()) {
            auto connection =
                std::make_shared<Connection>(std::move(socket), *peer, next_connection_id_++,
                                             limits_, handler_, counters_, admin, tenant);
            std::erase_if(connections_, [](const auto& weak) { return weak.expired(); });
            connections_.push_back(connection);
            connection->start();
          } else {
            KVTIER_LOG_WARN("rejecting connection: {}", peer.status().to_string());
          }
        } else {
          KVTIER_LOG_WARN("accept failed: {}", ec.message());
        }
        accept_next();
      });
}

std::optional<Refusal> Server::refusal_for(uid_t tenant, bool admin) const {
  const size_t open = connection_count();
  if (open >= limits_.max_connections) return Refusal::kMaxConnections;
  if (admin) return std::nullopt;
  if (connection_count(tenant) >= limits_.max_connections_per_uid) return Refusal::kPerUid;
  const uint32_t reserved = reserved_for_admins();
  if (open >= limits_.max_connections - reserved) return Refusal::kAdminReserved;
  return std::nullopt;
}

void Server::refuse(asio::local::stream_protocol::socket socket, const PeerCredentials& peer,
                    uid_t tenant, Refusal why) {
  uint64_t& refused = counters_->refused[static_cast<size_t>(why)];
  ++refused;
  std::string message;
  switch (why) {
    case Refusal::kMaxConnections:
      message = fmt::format("kvtierd already serves {} connections (max-connections); retry later",
                            limits_.max_connections);
      break;
    case Refusal::kPerUid:
      message = fmt::format(
          "uid {}{} already holds {} connections to kvtierd (max-connections-per-tenant); "
          "close some or retry later",
          tenant,
          tenant == peer.uid
              ? ""
              : fmt::format(" (connecting as uid {}, from a user namespace of uid {})", peer.uid,
                            tenant),
          limits_.max_connections_per_uid);
      break;
    case Refusal::kAdminReserved:
      message = fmt::format(
          "kvtierd serves {} connections; the last {} of its {} (max-connections) are reserved "
          "for administrators (admin-reserved-connections); retry later",
          connection_count(), reserved_for_admins(), limits_.max_connections);
      break;
  }
  // The first refusal of each reason and every 1000th are logged: a flood must not flood
  // the log.
  if (refused % 1000 == 1) {
    KVTIER_LOG_WARN("refusing a connection from pid {} uid {}: {} ({} refused so far for {})",
                    peer.pid, peer.uid, message, refused, refusal_name(why));
  }
  auto reply = connection_error_reply(wire::ErrorCode::RESOURCE_EXHAUSTED, message, true);
  auto bytes = reply.asBytes();
  // A fresh socket's send buffer holds this small reply; if it does not, the peer
  // still sees the connection close.
  const int fd = socket.native_handle();
  (void)::send(fd, bytes.begin(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  // Closing with unread bytes (a Hello already sent) would make the peer's read fail
  // with ECONNRESET before it sees the reply; a little is read and dropped first.
  std::array<char, 4096> scratch;
  for (int i = 0; i < 16 && ::recv(fd, scratch.data(), scratch.size(), MSG_DONTWAIT) > 0; ++i) {
  }
  boost::system::error_code ignored;
  socket.shutdown(asio::socket_base::shutdown_both, ignored);
  socket.close(ignored);
}

void Server::stop() {
  boost::system::error_code ignored;
  if (acceptor_.is_open()) acceptor_.close(ignored);
  for (auto& weak : connections_) {
    if (auto connection = weak.lock()) connection->close();
  }
  connections_.clear();
  if (owns_path_) {
    ::unlink(path_.c_str());
    owns_path_ = false;
  }
}

size_t Server::connection_count() const {
  size_t count = 0;
  for (const auto& weak : connections_) {
    auto connection = weak.lock();
    if (connection && connection->is_open()) ++count;
  }
  return count;
}

size_t Server::connection_count(uid_t uid) const {
  size_t count = 0;
  for (const auto& weak : connections_) {
    auto connection = weak.lock();
    if (connection && connection->is_open() && !connection->admin() &&
        connection->tenant() == uid) {
      ++count;
    }
  }
  return count;
}

uint64_t Server::refused_connections() const {
  uint64_t total = 0;
  for (uint64_t refused : counters_->refused) total += refused;
  return total;
}

}  // namespace kvtier::ipc
