#include "common/status.h"

#include <cerrno>
#include <cstring>

namespace kvtier {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kNotFound:
      return "NotFound";
    case StatusCode::kResourceExhausted:
      return "ResourceExhausted";
    case StatusCode::kPermissionDenied:
      return "PermissionDenied";
    case StatusCode::kUnavailable:
      return "Unavailable";
    case StatusCode::kDataLoss:
      return "DataLoss";
    case StatusCode::kInternal:
      return "Internal";
    case StatusCode::kNotSupported:
      return "NotSupported";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "OK";
  return fmt::format("{}: {}", status_code_name(code_), message_);
}

Status Status::with_context(std::string_view context) const {
  if (is_ok()) return *this;
  return Status(code_, fmt::format("{}: {}", context, message_), retryable_);
}

namespace {

struct ErrnoClass {
  StatusCode code;
  bool retryable;
};

// What a caller should do about each errno. Waiting helps with a full disk or table,
// a peer that went away and a device that failed one I/O; the rest will fail the same
// way unchanged.
ErrnoClass classify_errno(int err) {
  constexpr bool kRetry = true;
  constexpr bool kFinal = false;
  switch (err) {
    case ENOMEM:
    case ENOSPC:
    case EDQUOT:
    case EAGAIN:  // == EWOULDBLOCK
    case EMFILE:
    case ENFILE:
    case ENOBUFS:
    case EBUSY:
      return {StatusCode::kResourceExhausted, kRetry};
    case EFBIG:  // a file-size limit: the same write will never fit
      return {StatusCode::kResourceExhausted, kFinal};
    case EPIPE:
    case ECONNRESET:
    case ECONNREFUSED:
    case ECONNABORTED:
    case ENOTCONN:
    case ESHUTDOWN:
    case ETIMEDOUT:
    case EINTR:
      return {StatusCode::kUnavailable, kRetry};
    // The device failed this I/O. The bytes on it are not known to be wrong (that
    // takes a checksum), and a transient fault passes, so this is not DataLoss.
    case EIO:
      return {StatusCode::kUnavailable, kRetry};
    // The file system went read-only (usually after errors): no retry helps until an
    // operator remounts it.
    case EROFS:
    case ENODEV:
    case ENXIO:
      return {StatusCode::kUnavailable, kFinal};
    case EACCES:
    case EPERM:
      return {StatusCode::kPermissionDenied, kFinal};
    case ENOENT:
      return {StatusCode::kNotFound, kFinal};
    case EOPNOTSUPP:  // == ENOTSUP
    case ENOSYS:
    case ENOTTY:
    case EAFNOSUPPORT:
    case EPROTONOSUPPORT:
      return {StatusCode::kNotSupported, kFinal};
    case EINVAL:
    case EBADF:
    case EFAULT:
    case ENOTSOCK:
    case ENAMETOOLONG:
    case ENOTDIR:
    case EISDIR:
    case ELOOP:
    case EMSGSIZE:
    case E2BIG:
    case ERANGE:
    case EOVERFLOW:
      return {StatusCode::kInvalidArgument, kFinal};
    default:
      return {StatusCode::kInternal, kFinal};
  }
}

}  // namespace

Status errno_status(int err, std::string_view what) {
  const ErrnoClass c = classify_errno(err);
  return Status(c.code, fmt::format("{}: {}", what, std::strerror(err)), c.retryable);
}

}  // namespace kvtier
