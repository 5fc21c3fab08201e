// ReceivingSocket: a Unix stream socket whose reads are a recvmsg of kvtier's own (room
// for SCM_RIGHTS) run by Asio's reactor speculatively, so a connection never re-arms its
// epoll registration and requests that arrive while kvtierd is busy cost no epoll_wait.
//
// Why not Asio's own calls: its reads call recvmsg without a control buffer (descriptors
// sent with the bytes would be closed), and its wait for readability (async_wait) is a
// non-speculative operation, which the epoll reactor starts by re-arming the descriptor
// with epoll_ctl every time: epoll_ctl, epoll_wait, recvmsg and send for each request.
// Here the read is a reactor operation: the reactor runs its recvmsg at once, and only
// when that finds nothing (EAGAIN) does it wait for the descriptor's next edge-triggered
// event, which needs no epoll_ctl (the descriptor stays registered for reading from
// accept to close). A request and its reply alone on a connection: epoll_wait, recvmsg,
// send, and the next read's EAGAIN (which ends the read loop: a short read is not proof
// that nothing follows, as an end of stream can wait behind it; receiving_socket.cpp).
//
// This reaches into Asio's detail layer (reactor_op, the reactor's start_op, the
// socket's reactor registration), which is not public API. It is written against Boost
// 1.81's epoll reactor (the one kvtier builds with); a static_assert in the .cpp stops
// the build on another backend.
#pragma once

#include <boost/asio/local/stream_protocol.hpp>

#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "ipc/unix_socket.h"

namespace kvtier::ipc {

// What a ReceivingSocket's reads go to; both are called on the io_context's thread.
class ReceiveTarget {
 public:
  virtual ~ReceiveTarget() = default;
  // Where the next bytes go; asked right before each recvmsg, so it may change between
  // the start of a read and the read itself.
  virtual std::span<std::byte> receive_space() = 0;
  // One read: what recvmsg received (never would_block), with the descriptors that
  // arrived; or why there was none (its error, or Unavailable when the read was
  // cancelled: the socket was closed).
  virtual void on_received(Result<Received> received, std::vector<UniqueFd> fds) = 0;
};

class ReceivingSocket : public boost::asio::local::stream_protocol::socket {
 public:
  // Takes over an open socket (an accepted one); it must be non-blocking.
  explicit ReceivingSocket(boost::asio::local::stream_protocol::socket socket);

  // Starts one read into `target`, which is kept alive until it has been told. At most
  // one read at a time.
  void async_receive_into(std::shared_ptr<ReceiveTarget> target);

 private:
  void* reactor_;  // the io_context's epoll reactor (the type lives in the .cpp)
};

}  // namespace kvtier::ipc
