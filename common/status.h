// kvtier::Status and kvtier::Result<T>: the one error vocabulary of the project.
//
// A Status is a code plus a message. Codes say what the caller should do:
//   InvalidArgument   fix the request (the message names the bad field)
//   NotFound          the thing named does not exist (unknown session, region)
//   ResourceExhausted retry later or with a smaller request
//   PermissionDenied  the caller may not do this
//   Unavailable       the peer went away: reconnect
//   DataLoss          the bytes are gone or corrupt: recompute them
//   Internal          a bug
//
// Foreign errors (errno, io_uring, cudaError_t, rocksdb::Status) are converted in
// exactly one helper each; the errno one lives here.
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
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const = delete;  // say is_ok() explicitly
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
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
Status internal_error(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kInternal, fmt::format(f, std::forward<Args>(args)...));
}

// The one errno conversion: `what` says which call failed ("mmap region 3").
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
