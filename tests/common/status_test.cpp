#include "common/status.h"

#include <cerrno>

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

TEST(Status, ErrnoMapsToCallerAction) {
  EXPECT_EQ(errno_status(ENOSPC, "write").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(errno_status(EPIPE, "send").code(), StatusCode::kUnavailable);
  EXPECT_EQ(errno_status(EIO, "read").code(), StatusCode::kDataLoss);
  EXPECT_NE(errno_status(ENOENT, "open x").message().find("open x"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
