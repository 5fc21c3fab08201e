#include "ipc/client_transport.h"

#include <sys/socket.h>

#include <cerrno>
#include <vector>

#include "ipc/unix_socket.h"

namespace kvtier::ipc {

Result<ClientTransport> ClientTransport::connect(const std::string& socket_path,
                                                 FrameLimits limits) {
  auto fd = connect_unix(socket_path);
  if (!fd.is_ok()) return fd.status();
  return ClientTransport(std::move(*fd), limits);
}

Status ClientTransport::send(capnp::MessageBuilder& message, std::span<const int> fds) {
  auto words = encode_frame(message, limits_);
  if (!words.is_ok()) return words.status();
  auto bytes = words->asBytes();
  return send_all(fd_.get(), {reinterpret_cast<const std::byte*>(bytes.begin()), bytes.size()},
                  fds);
}

Status ClientTransport::send_raw(std::span<const std::byte> bytes, std::span<const int> fds) {
  return send_all(fd_.get(), bytes, fds);
}

Status ClientTransport::set_timeout(std::chrono::milliseconds timeout) {
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(timeout);
  timeval value{};
  value.tv_sec = static_cast<time_t>(seconds.count());
  value.tv_usec = static_cast<suseconds_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(timeout - seconds).count());
  for (int option : {SO_RCVTIMEO, SO_SNDTIMEO}) {
    if (::setsockopt(fd_.get(), SOL_SOCKET, option, &value, sizeof(value)) != 0) {
      return errno_status(
          errno, option == SO_RCVTIMEO ? "setsockopt(SO_RCVTIMEO)" : "setsockopt(SO_SNDTIMEO)");
    }
  }
  return Status::ok();
}

Result<Frame> ClientTransport::receive() {
  std::vector<UniqueFd> unexpected_fds;  // the daemon never sends any; closed on return
  while (true) {
    auto frame = parser_.next();
    if (!frame.is_ok()) return frame.status();
    if (frame->has_value()) return std::move(**frame);
    auto space = parser_.write_space();
    auto received = receive_some(fd_.get(), space, unexpected_fds, /*wait=*/true);
    if (!received.is_ok()) return received.status();
    // A blocking recvmsg only reports would_block when SO_RCVTIMEO ran out.
    if (received->would_block) return unavailable("kvtierd did not answer in time");
    if (received->bytes == 0) return unavailable("kvtierd closed the connection");
    parser_.commit(received->bytes);
  }
}

Result<std::optional<Frame>> ClientTransport::try_receive() {
  std::vector<UniqueFd> unexpected_fds;
  while (true) {
    auto frame = parser_.next();
    if (!frame.is_ok()) return frame.status();
    if (frame->has_value()) return std::move(*frame);
    auto space = parser_.write_space();
    auto received = receive_some(fd_.get(), space, unexpected_fds, /*wait=*/false);
    if (!received.is_ok()) return received.status();
    if (received->would_block) return std::optional<Frame>();
    if (received->bytes == 0) return unavailable("kvtierd closed the connection");
    parser_.commit(received->bytes);
  }
}

void ClientTransport::shutdown_write() {
  ::shutdown(fd_.get(), SHUT_WR);
}

}  // namespace kvtier::ipc
