// kvtier::Status and kvtier::Result<T>: the one error vocabulary of the project.
//
// A Status is a code, a message and a retryable flag. Codes say what the caller should do:
//   InvalidArgument   fix the request (the message names the bad field)
//   NotFound          the thing named does not exist (unknown session, region)
//   ResourceExhausted retry later or with a smaller request
//   PermissionDenied  the caller may not do this
//   Unavailable       the peer or the device is not answering now: reconnect / retry
//   DataLoss          the bytes are known to be gone or wrong: recompute them
//   Internal          a bug
//   NotSupported      this daemon / build does not implement that: do it another way
//
// retryable() means the same request, unchanged, may succeed later (after a wait or a
// reconnect). By default Unavailable and ResourceExhausted are retryable and every other
// code is not; a producer that knows better says so with with_retryable() (the
// per-connection region limit is ResourceExhausted, but waiting does not lift it).
// The flag travels on the wire next to the code (wire Error.retryable).
//
// Foreign errors are converted in exactly one helper each: errno here (errno_status),
// rocksdb::Status in tiers/rocksdb_status.h, CUresult in cuda/driver_api.cpp
// (driver_status). An EIO is Unavailable, not DataLoss: the device failed that I/O,
// the bytes are not known to be wrong. DataLoss is for bytes known wrong or gone (a
// checksum mismatch, a short read, an index entry without its payload).
//
// Thread-safety: values; copy freely between threads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace kvtier {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument = 1,
  kNotFound = 2,
  kResourceExhausted = 3,
  kPermissionDenied = 4,
  kUnavailable = 5,
  kDataLoss = 6,
  kInternal = 7,
  kNotSupported = 8,  // appended: codes are wire values, never renumbered
};

std::string_view status_code_name(StatusCode code);

// Unavailable and ResourceExhausted: the retryable flag a Status of `code` starts with.
constexpr bool retryable_by_default(StatusCode code) {
  return code == StatusCode::kUnavailable || code == StatusCode::kResourceExhausted;
}

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)), retryable_(retryable_by_default(code)) {}
  Status(StatusCode code, std::string message, bool retryable)
      : code_(code),
        message_(std::move(message)),
        retryable_(retryable && code != StatusCode::kOk) {}

  static Status ok() { return Status(); }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const = delete;  // say is_ok() explicitly
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // The same request may succeed later unchanged. Never true for OK.
  bool retryable() const { return retryable_; }
  std::string to_string() const;

  // This status with the flag overridden (ignored for OK).
  Status with_retryable(bool retryable) const& { return Status(code_, message_, retryable); }
  Status with_retryable(bool retryable) && { return Status(code_, std::move(message_), retryable); }
  // This status with "context: " before its message; code and flag kept. OK stays OK.
  Status with_context(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  bool retryable_ = false;
};

template <typename... Args>
Status invalid_argument(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kInvalidArgument, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status not_found(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kNotFound, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status resource_exhausted(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kResourceExhausted, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status permission_denied(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kPermissionDenied, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status unavailable(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kUnavailable, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status data_loss(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kDataLoss, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status not_supported(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kNotSupported, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status internal_error(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kInternal, fmt::format(f, std::forward<Args>(args)...));
}

// The one errno conversion: `what` says which call failed ("mmap region 3"). The table
// is in status.cpp; an errno it does not name is Internal.
Status errno_status(int err, std::string_view what);

// Result<T>: a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT: must not be OK

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kvtier

// Propagates a non-OK Status out of the enclosing function.
#define KVTIER_RETURN_IF_ERROR(expr) \
  do {                               \
    ::kvtier::Status _st = (expr);   \
    if (!_st.is_ok()) return _st;    \
  } while (0)
