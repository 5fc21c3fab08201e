// RawConnection: the protocol without kvtier::Client, for requests a well-behaved
// client never sends (broken frames, wrong versions, missing descriptors). Every
// receive has a deadline, so a daemon that never answers fails the test instead of
// hanging it.
//
// Thread-safety: none; one owner.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/client_wire.h"
#include "ipc/client_transport.h"
#include "schema/kvtier.capnp.h"

namespace kvtier::integration {

inline constexpr std::chrono::milliseconds kReplyDeadline{60'000};

class RawConnection {
 public:
  static Result<RawConnection> connect(const std::string& socket_path);

  // Sends one Request with `id` whose body `fill` writes.
  Status send(uint64_t id, const std::function<void(wire::Request::Builder)>& fill,
              std::span<const int> fds = {});
  Status send_bytes(std::span<const std::byte> bytes) { return transport_.send_raw(bytes); }
  void shutdown_write() { transport_.shutdown_write(); }
  // The socket, for poll(): readable when a reply is waiting that receive() has not
  // buffered yet.
  int fd() const { return transport_.fd(); }
  // The next frame; Unavailable once the daemon closed; Internal after `timeout`.
  Result<ipc::Frame> receive(std::chrono::milliseconds timeout = kReplyDeadline);
  // Receives one Response: its id and, for an Error reply, the error as a Status
  // (OK for any other reply kind).
  struct Reply {
    uint64_t id;
    Status error;
    wire::Response::Which which;
  };
  Result<Reply> receive_reply(std::chrono::milliseconds timeout = kReplyDeadline);
  // Reads until the daemon closes the stream; the replies seen, or Internal on timeout.
  Result<std::vector<Reply>> drain_until_closed(std::chrono::milliseconds timeout = kReplyDeadline);

 private:
  explicit RawConnection(ipc::ClientTransport transport) : transport_(std::move(transport)) {}
  ipc::ClientTransport transport_;
};

// Writes `layout` into a wire Layout: Client::hello's own.
using ::kvtier::fill_layout;
// Writes a Save of `refs` to `session` into a wire Request, as Client::save does.
void fill_save(wire::Request::Builder request, const std::string& session,
               std::span<const BlockRef> refs, bool end_of_turn);

}  // namespace kvtier::integration
