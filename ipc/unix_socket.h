// Unix-socket primitives: sending bytes with attached descriptors (SCM_RIGHTS),
// receiving bytes and descriptors, and reading the peer's credentials (SO_PEERCRED).
// Plain functions over fds; errors are converted with errno_status.
// Thread-safety: as for the underlying socket.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace kvtier::ipc {

inline constexpr size_t kMaxFdsPerMessage = 8;

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

Result<PeerCredentials> peer_credentials(int socket_fd);

// Sends all of `bytes`; `fds` (at most kMaxFdsPerMessage) travel with the first byte.
// Blocking sockets only (the client side).
Status send_all(int socket_fd, std::span<const std::byte> bytes, std::span<const int> fds = {});

struct Received {
  size_t bytes = 0;            // 0 means the peer closed the stream
  bool would_block = false;    // non-blocking socket had nothing to read
  bool fds_truncated = false;  // the peer sent more descriptors than fit (they are closed)
};
// One recvmsg: bytes into `into`, received descriptors appended to `fds`. Descriptors
// are received close-on-exec. With `wait` false it never blocks (would_block instead).
Result<Received> receive_some(int socket_fd, std::span<std::byte> into, std::vector<UniqueFd>& fds,
                              bool wait = false);

// Connects a blocking stream socket to `path`.
Result<UniqueFd> connect_unix(const std::string& path);

}  // namespace kvtier::ipc
