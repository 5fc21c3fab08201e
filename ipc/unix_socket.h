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

// Descriptor passing limits. Linux takes at most SCM_MAX_FD (253) descriptors in one
// SCM_RIGHTS message, so a request with more (a CUDA VMM region is one fd per chunk)
// sends them in several sendmsg calls of at most kMaxFdsPerSendmsg, each carrying at
// least one byte of the request's frame. The receiver never gets two calls' descriptors
// from one recvmsg (Linux ends a read at a message that carries descriptors), so a
// control buffer for kMaxFdsPerRecvmsg always suffices.
inline constexpr size_t kMaxFdsPerSendmsg = 250;
inline constexpr size_t kMaxFdsPerRecvmsg = 253;
inline constexpr size_t kMaxFdsPerRequest = 1024;

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

Result<PeerCredentials> peer_credentials(int socket_fd);

// The uid a peer counts as for per-tenant limits: its own uid, or, when it runs in a user
// namespace below ours (a container, rootless tools, newuidmap over /etc/subuid), the uid
// that created the topmost such namespace, as seen here. So the uids a user maps from
// its subordinate range, at any depth, count as that user. Its own uid when its namespace
// cannot be read (the peer is gone, no /proc) or is not below ours. Reads /proc/<pid>:
// a pid reused after the peer exited may be misattributed (that connection is closing).
uid_t tenant_uid(const PeerCredentials& peer);

// Sends all of `bytes` with `fds` (at most kMaxFdsPerRequest) attached: up to
// kMaxFdsPerSendmsg with each of the first bytes, one sendmsg per group, the last
// group with the rest of the bytes. InvalidArgument when there are more descriptors
// than that or fewer bytes than groups. Blocking sockets only (the client side);
// Unavailable when SO_SNDTIMEO is set and runs out (part of the bytes may have gone).
Status send_all(int socket_fd, std::span<const std::byte> bytes, std::span<const int> fds = {});

struct Received {
  size_t bytes = 0;          // 0 means the peer closed the stream
  bool would_block = false;  // non-blocking socket had nothing to read
  // MSG_CTRUNC: descriptors were lost (more than fit, or this process is out of
  // descriptors); those that arrived are in `fds`. The stream can no longer be trusted.
  bool fds_truncated = false;
};
// One recvmsg: bytes into `into`, received descriptors appended to `fds`. Descriptors
// are received close-on-exec. With `wait` false it never blocks (would_block instead);
// with `wait` true it reports would_block only when SO_RCVTIMEO is set and runs out.
Result<Received> receive_some(int socket_fd, std::span<std::byte> into, std::vector<UniqueFd>& fds,
                              bool wait = false);

// Connects a blocking stream socket to `path`.
Result<UniqueFd> connect_unix(const std::string& path);

}  // namespace kvtier::ipc
