#include "common/status.h"

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
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "OK";
  return fmt::format("{}: {}", status_code_name(code_), message_);
}

Status errno_status(int err, std::string_view what) {
  // Errors a caller can recover from by waiting map to ResourceExhausted; a peer that
  // went away maps to Unavailable; everything else is the request's or our fault.
  StatusCode code = StatusCode::kInternal;
  switch (err) {
    case ENOMEM:
    case ENOSPC:
    case EAGAIN:
    case EMFILE:
    case ENFILE:
    case EDQUOT:
      code = StatusCode::kResourceExhausted;
      break;
    case EPIPE:
    case ECONNRESET:
    case ECONNREFUSED:
    case ENOTCONN:
    case ESHUTDOWN:
      code = StatusCode::kUnavailable;
      break;
    case EACCES:
    case EPERM:
      code = StatusCode::kPermissionDenied;
      break;
    case ENOENT:
      code = StatusCode::kNotFound;
      break;
    case EINVAL:
    case EBADF:
    case ENOTSOCK:
    case ENAMETOOLONG:
      code = StatusCode::kInvalidArgument;
      break;
    case EIO:
      code = StatusCode::kDataLoss;
      break;
    default:
      break;
  }
  return Status(code, fmt::format("{}: {}", what, std::strerror(err)));
}

}  // namespace kvtier
