#include "common/status.h"

#include <cerrno>
#include <string>

#include <gtest/gtest.h>

namespace kvtier {
namespace {

Result<int> half(int x) {
  if (x % 2 != 0) return invalid_argument("x={} is odd", x);
  return x / 2;
}

Status chain(int x) {
  KVTIER_RETURN_IF_ERROR(half(x).status());
  return Status::ok();
}

TEST(Status, CarriesCodeAndMessage) {
  auto r = half(3);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().to_string(), "InvalidArgument: x=3 is odd");
  EXPECT_EQ(half(4).value(), 2);
  EXPECT_TRUE(chain(4).is_ok());
  EXPECT_EQ(chain(5).code(), StatusCode::kInvalidArgument);
}

TEST(Status, RetryableDefaultsFollowTheCode) {
  // Retryable: the same request may succeed later unchanged.
  EXPECT_TRUE(unavailable("peer gone").retryable());
  EXPECT_TRUE(resource_exhausted("full").retryable());
  for (const Status& status : {invalid_argument("x"), not_found("x"), permission_denied("x"),
                               data_loss("x"), internal_error("x"), not_supported("x")}) {
    EXPECT_FALSE(status.retryable()) << status.to_string();
  }
  EXPECT_FALSE(Status::ok().retryable());
  EXPECT_FALSE(Status(StatusCode::kOk, "", true).retryable());  // OK is never retryable
  EXPECT_FALSE(Status::ok().with_retryable(true).retryable());
}

TEST(Status, RetryableCanBeOverriddenAndSurvivesContext) {
  const Status final_limit = resource_exhausted("limit of 4").with_retryable(false);
  EXPECT_EQ(final_limit.code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(final_limit.retryable());
  EXPECT_EQ(final_limit.message(), "limit of 4");
  EXPECT_TRUE(data_loss("x").with_retryable(true).retryable());
  EXPECT_TRUE(Status(StatusCode::kInternal, "x", true).retryable());

  const Status wrapped = final_limit.with_context("regionId 3");
  EXPECT_EQ(wrapped.code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(wrapped.retryable());
  EXPECT_EQ(wrapped.message(), "regionId 3: limit of 4");
  EXPECT_TRUE(unavailable("gone").with_context("load").retryable());
  EXPECT_TRUE(Status::ok().with_context("anything").is_ok());
}

TEST(Status, NotSupportedIsAppendedAfterInternal) {
  // Codes are wire values (ErrorCode, kvtier_status): new ones only ever go at the end.
  EXPECT_EQ(static_cast<int>(StatusCode::kInternal), 7);
  EXPECT_EQ(static_cast<int>(StatusCode::kNotSupported), 8);
  EXPECT_EQ(not_supported("memfd on {}", "cuda").to_string(), "NotSupported: memfd on cuda");
  EXPECT_EQ(status_code_name(StatusCode::kNotSupported), "NotSupported");
}

struct ErrnoRow {
  int err;
  StatusCode code;
  bool retryable;
};

TEST(Status, ErrnoTable) {
  const ErrnoRow rows[] = {
      // Waiting helps: the disk, a table or memory frees up.
      {ENOSPC, StatusCode::kResourceExhausted, true},
      {EDQUOT, StatusCode::kResourceExhausted, true},
      {ENOMEM, StatusCode::kResourceExhausted, true},
      {EAGAIN, StatusCode::kResourceExhausted, true},
      {EMFILE, StatusCode::kResourceExhausted, true},
      {ENFILE, StatusCode::kResourceExhausted, true},
      {ENOBUFS, StatusCode::kResourceExhausted, true},
      {EBUSY, StatusCode::kResourceExhausted, true},
      {EFBIG, StatusCode::kResourceExhausted, false},
      // The peer or the device is not answering now.
      {EPIPE, StatusCode::kUnavailable, true},
      {ECONNRESET, StatusCode::kUnavailable, true},
      {ECONNREFUSED, StatusCode::kUnavailable, true},
      {ENOTCONN, StatusCode::kUnavailable, true},
      {ETIMEDOUT, StatusCode::kUnavailable, true},
      // EIO: the device failed the I/O; the bytes are not known to be wrong.
      {EIO, StatusCode::kUnavailable, true},
      {EROFS, StatusCode::kUnavailable, false},
      {ENODEV, StatusCode::kUnavailable, false},
      {EACCES, StatusCode::kPermissionDenied, false},
      {EPERM, StatusCode::kPermissionDenied, false},
      {ENOENT, StatusCode::kNotFound, false},
      {EOPNOTSUPP, StatusCode::kNotSupported, false},
      {ENOTSUP, StatusCode::kNotSupported, false},
      {ENOSYS, StatusCode::kNotSupported, false},
      {ENOTTY, StatusCode::kNotSupported, false},
      {EINVAL, StatusCode::kInvalidArgument, false},
      {EBADF, StatusCode::kInvalidArgument, false},
      {ENOTSOCK, StatusCode::kInvalidArgument, false},
      {ENAMETOOLONG, StatusCode::kInvalidArgument, false},
      {EISDIR, StatusCode::kInvalidArgument, false},
      {EXDEV, StatusCode::kInternal, false},  // not in the table: ours to look at
      {0, StatusCode::kInternal, false},
  };
  for (const ErrnoRow& row : rows) {
    const Status status = errno_status(row.err, "op");
    SCOPED_TRACE(status.to_string());
    EXPECT_EQ(status.code(), row.code);
    EXPECT_EQ(status.retryable(), row.retryable);
  }
  // Never DataLoss: an errno cannot prove bytes wrong (that takes a checksum).
  for (int err = 0; err < 200; ++err) {
    EXPECT_NE(errno_status(err, "op").code(), StatusCode::kDataLoss) << err;
  }
}

TEST(Status, ErrnoMessageNamesTheCallAndTheError) {
  const Status status = errno_status(ENOENT, "open x");
  EXPECT_EQ(status.message(), "open x: No such file or directory");
  EXPECT_NE(errno_status(EIO, "read").message().find("Input/output error"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
