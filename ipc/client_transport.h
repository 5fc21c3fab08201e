// ClientTransport: the engine's side of the socket. Blocking sends of whole frames
// (with descriptors) and blocking receives of whole frames, optionally bounded by a
// timeout (set_timeout; none by default).
//
// Thread-safety: send() and receive() may run concurrently with each other (one
// sender and one receiver at a time); callers serialize senders and receivers among
// themselves (client/ does).
#pragma once

#include <chrono>
#include <span>
#include <string>

#include "common/status.h"
#include "common/unique_fd.h"
#include "ipc/framing.h"

namespace kvtier::ipc {

class ClientTransport {
 public:
  static Result<ClientTransport> connect(const std::string& socket_path, FrameLimits limits = {});

  ClientTransport(ClientTransport&&) = default;
  ClientTransport& operator=(ClientTransport&&) = default;

  Status send(capnp::MessageBuilder& message, std::span<const int> fds = {});
  // Sends raw bytes as they are (tests use it to send malformed frames).
  Status send_raw(std::span<const std::byte> bytes, std::span<const int> fds = {});
  // Blocks until one whole frame arrives. Unavailable when the daemon closed the
  // stream or (with a timeout set) did not answer in time; InvalidArgument when what
  // arrived is not a valid frame.
  Result<Frame> receive();
  // Like receive() but returns nullopt at once when no whole frame has arrived yet.
  Result<std::optional<Frame>> try_receive();

  // Bounds each blocking send and receive syscall by `timeout` (SO_SNDTIMEO and
  // SO_RCVTIMEO); zero blocks without bound again (the default). A send or receive
  // that runs out of time is Unavailable and leaves the stream mid-frame: drop the
  // transport after one.
  Status set_timeout(std::chrono::milliseconds timeout);

  int fd() const { return fd_.get(); }
  void shutdown_write();

 private:
  ClientTransport(UniqueFd fd, FrameLimits limits)
      : fd_(std::move(fd)), limits_(limits), parser_(limits) {}

  UniqueFd fd_;
  FrameLimits limits_;
  FrameParser parser_;
};

}  // namespace kvtier::ipc
