#include "ipc/receiving_socket.h"

#include <boost/asio/detail/reactor.hpp>
#include <boost/asio/detail/reactor_op.hpp>
#include <boost/asio/execution/context.hpp>
#include <boost/asio/query.hpp>

#include <optional>
#include <type_traits>
#include <utility>

namespace kvtier::ipc {
namespace {

namespace asio = boost::asio;
using Reactor = asio::detail::reactor;
static_assert(std::is_same_v<Reactor, asio::detail::epoll_reactor>,
              "ReceivingSocket is written against Asio's epoll reactor");

// One read: the reactor calls perform() (at once, and again on each of the descriptor's
// events) until it is not would_block, then queues complete() on the io_context, which
// tells the target.
class ReceiveOp : public asio::detail::reactor_op {
 public:
  ReceiveOp(int fd, std::shared_ptr<ReceiveTarget> target)
      : reactor_op(boost::system::error_code(), &ReceiveOp::perform, &ReceiveOp::complete),
        fd_(fd),
        target_(std::move(target)) {}

 private:
  static status perform(reactor_op* base) {
    auto* op = static_cast<ReceiveOp*>(base);
    Result<Received> received = receive_some(op->fd_, op->target_->receive_space(), op->fds_);
    if (received.is_ok() && received->would_block) return not_done;
    // Exhausted (the reactor waits for the next event before the next read tries) only
    // after an error or the end of the stream. A short read does not prove the socket
    // empty: the peer's end of stream (a shutdown right after its last bytes) may wait
    // behind it, and its edge was the same event as the bytes', so no event would come
    // for it; and Linux ends a read at a message that carried descriptors. So the next
    // read is tried at once, and only its EAGAIN waits for an event.
    const bool exhausted = !received.is_ok() || received->bytes == 0;
    op->received_.emplace(std::move(received));
    return exhausted ? done_and_exhausted : done;
  }

  static void complete(void* owner, asio::detail::operation* base,
                       const boost::system::error_code& /*unused: ec_ is the op's own*/,
                       std::size_t /*bytes*/) {
    std::unique_ptr<ReceiveOp> op(static_cast<ReceiveOp*>(base));
    if (owner == nullptr) return;  // the io_context is being destroyed: nobody to tell
    std::shared_ptr<ReceiveTarget> target = std::move(op->target_);
    std::vector<UniqueFd> fds = std::move(op->fds_);
    Result<Received> received =
        op->ec_ ? Result<Received>(unavailable("read ended: {}", op->ec_.message()))
        : op->received_.has_value()
            ? std::move(*op->received_)
            : Result<Received>(internal_error("a read completed without receiving"));
    op.reset();
    target->on_received(std::move(received), std::move(fds));
  }

  const int fd_;
  std::shared_ptr<ReceiveTarget> target_;
  std::vector<UniqueFd> fds_;
  std::optional<Result<Received>> received_;
};

}  // namespace

ReceivingSocket::ReceivingSocket(asio::local::stream_protocol::socket socket)
    : asio::local::stream_protocol::socket(std::move(socket)),
      reactor_(&asio::use_service<Reactor>(asio::query(get_executor(), asio::execution::context))) {
}

void ReceivingSocket::async_receive_into(std::shared_ptr<ReceiveTarget> target) {
  auto& impl = impl_.get_implementation();
  auto* op = new ReceiveOp(impl.socket_, std::move(target));
  // Speculative: the reactor reads at once (only a read that failed or met the end of
  // the stream makes it wait for an event first); what finds nothing waits for the
  // descriptor's next event. A continuation: it is started from the last read's handler
  // (or the connection's start), so an immediate result is queued on this thread.
  static_cast<Reactor*>(reactor_)->start_op(Reactor::read_op, impl.socket_, impl.reactor_data_, op,
                                            /*is_continuation=*/true,
                                            /*allow_speculative=*/true);
}

}  // namespace kvtier::ipc
