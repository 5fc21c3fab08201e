#include "ipc/unix_socket.h"

#include <fcntl.h>
#include <linux/nsfs.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace kvtier::ipc {

uid_t tenant_uid(const PeerCredentials& peer) {
  struct stat ours {};
  if (::stat("/proc/self/ns/user", &ours) != 0) return peer.uid;
  const std::string path = "/proc/" + std::to_string(peer.pid) + "/ns/user";
  UniqueFd ns(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  // Walk up from the peer's namespace; the one whose parent is ours was made by the
  // tenant. User namespaces nest at most 32 deep.
  for (int depth = 0; ns.valid() && depth < 33; ++depth) {
    struct stat here {};
    if (::fstat(ns.get(), &here) != 0) break;
    if (here.st_ino == ours.st_ino && here.st_dev == ours.st_dev) break;  // ours: no owner
    UniqueFd parent(::ioctl(ns.get(), NS_GET_PARENT));
    if (!parent.valid()) break;  // the top of what we can see: not below ours
    struct stat above {};
    if (::fstat(parent.get(), &above) != 0) break;
    if (above.st_ino == ours.st_ino && above.st_dev == ours.st_dev) {
      uid_t owner = 0;
      if (::ioctl(ns.get(), NS_GET_OWNER_UID, &owner) != 0) break;
      return owner;
    }
    ns = std::move(parent);
  }
  return peer.uid;
}

Result<PeerCredentials> peer_credentials(int socket_fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(socket_fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return errno_status(errno, "getsockopt(SO_PEERCRED)");
  }
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

Status send_all(int socket_fd, std::span<const std::byte> bytes, std::span<const int> fds) {
  if (fds.size() > kMaxFdsPerRequest) {
    return invalid_argument("{} descriptors in one request; the limit is {}", fds.size(),
                            kMaxFdsPerRequest);
  }
  const size_t groups = (fds.size() + kMaxFdsPerSendmsg - 1) / kMaxFdsPerSendmsg;
  if (groups > bytes.size()) {
    return invalid_argument(
        "{} descriptors need at least {} bytes to travel with; the message has {}", fds.size(),
        groups, bytes.size());
  }
  size_t sent = 0;
  size_t fds_sent = 0;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerSendmsg)];
  while (sent < bytes.size()) {
    const size_t fd_count = std::min(kMaxFdsPerSendmsg, fds.size() - fds_sent);
    // Every group but the last goes with one byte of its own: descriptors attach to
    // the bytes of the sendmsg that carries them, and the receiver must have them all
    // before the frame's last byte completes the request.
    const bool more_groups = fds_sent + fd_count < fds.size();
    iovec iov{const_cast<std::byte*>(bytes.data() + sent), more_groups ? 1 : bytes.size() - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (fd_count > 0) {
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fd_count);
      cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
      cmsg->cmsg_level = SOL_SOCKET;
      cmsg->cmsg_type = SCM_RIGHTS;
      cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fd_count);
      std::memcpy(CMSG_DATA(cmsg), fds.data() + fds_sent, sizeof(int) * fd_count);
    }
    ssize_t n = ::sendmsg(socket_fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      // On a blocking socket EAGAIN means SO_SNDTIMEO ran out: the peer stopped reading,
      // which is a peer that went away, not a resource to wait for.
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return unavailable("sendmsg: the peer did not take the bytes in time");
      }
      return errno_status(errno, "sendmsg");
    }
    fds_sent += fd_count;
    sent += static_cast<size_t>(n);
  }
  return Status::ok();
}

Result<Received> receive_some(int socket_fd, std::span<std::byte> into, std::vector<UniqueFd>& fds,
                              bool wait) {
  iovec iov{into.data(), into.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerRecvmsg)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(socket_fd, &msg, MSG_CMSG_CLOEXEC | (wait ? 0 : MSG_DONTWAIT));
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Received{0, true, false};
    return errno_status(errno, "recvmsg");
  }
  Received received{static_cast<size_t>(n), false, (msg.msg_flags & MSG_CTRUNC) != 0};
  for (cmsghdr* cmsg = CMSG_FIRSTHDR(&msg); cmsg != nullptr; cmsg = CMSG_NXTHDR(&msg, cmsg)) {
    if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
      fds.emplace_back(fd);
    }
  }
  return received;
}

Result<UniqueFd> connect_unix(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return invalid_argument("socket path '{}' is longer than {} bytes", path,
                            sizeof(addr.sun_path) - 1);
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno_status(errno, "socket");
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return errno_status(errno, "connect " + path);
  }
  return fd;
}

}  // namespace kvtier::ipc
