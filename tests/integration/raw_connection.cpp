#include "tests/integration/raw_connection.h"

#include <poll.h>

#include <capnp/message.h>

#include "ipc/framing.h"

namespace kvtier::integration {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

milliseconds remaining(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? left : milliseconds{0};
}

}  // namespace

Result<RawConnection> RawConnection::connect(const std::string& socket_path) {
  auto transport = ipc::ClientTransport::connect(socket_path);
  if (!transport.is_ok()) return transport.status();
  return RawConnection(std::move(*transport));
}

Status RawConnection::send(uint64_t id, const std::function<void(wire::Request::Builder)>& fill,
                           std::span<const int> fds) {
  capnp::MallocMessageBuilder message;
  auto request = message.initRoot<wire::Request>();
  request.setId(id);
  fill(request);
  return transport_.send(message, fds);
}

Result<ipc::Frame> RawConnection::receive(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    auto frame = transport_.try_receive();
    if (!frame.is_ok()) return frame.status();
    if (frame->has_value()) return std::move(**frame);
    pollfd fd{transport_.fd(), POLLIN, 0};
    if (::poll(&fd, 1, static_cast<int>(remaining(deadline).count())) == 0) {
      return internal_error("no reply from kvtierd within {} ms", timeout.count());
    }
  }
}

Result<RawConnection::Reply> RawConnection::receive_reply(milliseconds timeout) {
  auto frame = receive(timeout);
  if (!frame.is_ok()) return frame.status();
  Reply reply{0, Status::ok(), wire::Response::ERROR};
  Status parsed = ipc::catch_malformed("reply", [&] {
    auto response = frame->reader().getRoot<wire::Response>();
    reply.id = response.getId();
    reply.which = response.which();
    if (response.isError()) reply.error = status_from_wire(response.getError());
    return Status::ok();
  });
  if (!parsed.is_ok()) return parsed;
  return reply;
}

Result<std::vector<RawConnection::Reply>> RawConnection::drain_until_closed(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<Reply> replies;
  while (true) {
    auto reply = receive_reply(remaining(deadline));
    if (!reply.is_ok()) {
      if (reply.status().code() == StatusCode::kUnavailable) return replies;
      return reply.status();
    }
    replies.push_back(std::move(*reply));
  }
}

void fill_save(wire::Request::Builder request, const std::string& session,
               std::span<const BlockRef> refs, bool end_of_turn) {
  auto save = request.initSave();
  save.setSessionId(session);
  save.setEndOfTurn(end_of_turn);
  auto blocks = save.initBlocks(static_cast<unsigned>(refs.size()));
  for (unsigned i = 0; i < refs.size(); ++i) {
    auto bytes = refs[i].hash.bytes();
    blocks[i].setHash(capnp::Data::Reader(bytes.data(), bytes.size()));
    blocks[i].setEngineBlockId(refs[i].engine_block_id);
  }
}

}  // namespace kvtier::integration
