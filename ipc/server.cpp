#include "ipc/server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <capnp/message.h>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

#include <filesystem>

#include "common/log.h"
#include "schema/kvtier.capnp.h"

namespace kvtier::ipc {
namespace {

kj::Array<capnp::word> framing_error_reply(const Status& status) {
  capnp::MallocMessageBuilder message;
  auto response = message.initRoot<wire::Response>();
  response.setId(0);
  auto error = response.initError();
  error.setCode(wire::ErrorCode::INVALID_ARGUMENT);
  error.setMessage(status.message());
  return capnp::messageToFlatArray(message);
}

}  // namespace

Connection::Connection(asio::local::stream_protocol::socket socket, PeerCredentials peer,
                       uint64_t id, const ConnectionLimits& limits, RequestHandler& handler)
    : socket_(std::move(socket)),
      peer_(peer),
      id_(id),
      limits_(limits),
      handler_(handler),
      parser_(limits.frame) {}

void Connection::start() {
  socket_.non_blocking(true);
  handler_.on_connect(shared_from_this());
  read_more();
}

void Connection::read_more() {
  if (!open_ || reading_ || close_after_write_ || in_flight_ >= limits_.max_in_flight) return;
  reading_ = true;
  // Wait for readability, then recvmsg ourselves: Asio's reads cannot carry SCM_RIGHTS.
  socket_.async_wait(asio::socket_base::wait_read,
                     [self = shared_from_this()](const boost::system::error_code& ec) {
                       self->reading_ = false;
                       if (ec || !self->open_) {
                         self->finish();
                         return;
                       }
                       self->on_readable();
                     });
}

void Connection::on_readable() {
  // Drain what the socket has, up to a bound so one chatty client can't starve others.
  for (int rounds = 0; rounds < 16 && open_; ++rounds) {
    auto space = parser_.write_space();
    std::vector<UniqueFd> arrived;
    auto received = receive_some(socket_.native_handle(), space, arrived);
    if (!received.is_ok()) {
      KVTIER_LOG_DEBUG("connection {}: {}", id_, received.status().to_string());
      finish();
      return;
    }
    if (received->would_block) break;
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
    if (in_flight_ >= limits_.max_in_flight) break;
    // A short read means the socket is drained: skip the recvmsg that would only say
    // EAGAIN.
    if (received->bytes < space.size()) break;
  }
  read_more();
}

void Connection::deliver_frames() {
  while (open_ && !close_after_write_ && in_flight_ < limits_.max_in_flight) {
    auto frame = parser_.next();
    if (!frame.is_ok()) {
      fail_framing(frame.status());
      return;
    }
    if (!frame->has_value()) return;
    ++in_flight_;
    handler_.on_frame(shared_from_this(), std::move(**frame));
  }
}

void Connection::request_done() {
  const bool was_paused = in_flight_ >= limits_.max_in_flight;
  if (in_flight_ > 0) --in_flight_;
  // Resume from the event loop, not from inside the handler that just replied: a
  // synchronous reply to each of many buffered frames must not recurse.
  if (was_paused && open_) {
    asio::post(socket_.get_executor(), [self = shared_from_this()] {
      self->deliver_frames();
      self->read_more();
    });
  }
}

void Connection::fail_framing(const Status& status) {
  KVTIER_LOG_DEBUG("connection {} (uid {}): framing error: {}", id_, peer_.uid, status.message());
  outgoing_.push_back(framing_error_reply(status));
  fds_.clear();  // nothing will claim them now
  close_after_write_ = true;
  write_next();
}

void Connection::send(kj::Array<capnp::word> frame) {
  if (!open_) return;
  outgoing_.push_back(kj::mv(frame));
  write_next();
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
  asio::async_write(socket_, asio::buffer(bytes.begin(), bytes.size()),
                    [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                      self->writing_ = false;
                      if (!self->outgoing_.empty()) self->outgoing_.pop_front();
                      if (!self->open_) {
                        self->outgoing_.clear();
                        return;
                      }
                      if (ec) {
                        self->close();
                        return;
                      }
                      self->write_next();
                    });
}

void Connection::close() {
  if (!open_) return;
  open_ = false;
  boost::system::error_code ignored;
  socket_.cancel(ignored);
  socket_.close(ignored);
  // A write in progress still references the front buffer until its handler runs.
  if (!writing_) outgoing_.clear();
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
          if (peer.is_ok()) {
            auto connection = std::make_shared<Connection>(
                std::move(socket), *peer, next_connection_id_++, limits_, handler_);
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

}  // namespace kvtier::ipc
