#include "common/units.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

TEST(ParseBytes, AcceptsBinaryAndDecimalUnits) {
  EXPECT_EQ(parse_bytes("4096").value(), 4096u);
  EXPECT_EQ(parse_bytes("512MiB").value(), 512ull << 20);
  EXPECT_EQ(parse_bytes("4GiB").value(), 4ull << 30);
  EXPECT_EQ(parse_bytes("1.5GiB").value(), 3ull << 29);
  EXPECT_EQ(parse_bytes("10GB").value(), 10'000'000'000ull);
  EXPECT_EQ(parse_bytes("2M").value(), 2ull << 20);
}

TEST(ParseBytes, RejectsGarbageNamingTheInput) {
  auto bad_unit = parse_bytes("12 parsecs");
  ASSERT_FALSE(bad_unit.is_ok());
  EXPECT_EQ(bad_unit.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_unit.status().message().find("parsecs"), std::string::npos);
  EXPECT_FALSE(parse_bytes("").is_ok());
  EXPECT_FALSE(parse_bytes("GiB").is_ok());
  EXPECT_FALSE(parse_bytes("1e30TiB").is_ok());
}

TEST(ParseDuration, AcceptsUnits) {
  EXPECT_EQ(parse_duration_ms("250").value(), 250u);
  EXPECT_EQ(parse_duration_ms("250ms").value(), 250u);
  EXPECT_EQ(parse_duration_ms("30s").value(), 30'000u);
  EXPECT_EQ(parse_duration_ms("5m").value(), 300'000u);
  EXPECT_EQ(parse_duration_ms("2h").value(), 7'200'000u);
  EXPECT_FALSE(parse_duration_ms("5 fortnights").is_ok());
}

TEST(FormatUnits, ReadableOutput) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(3ull << 29), "1.5 GiB");
  EXPECT_EQ(format_duration_ms(340), "340ms");
  EXPECT_EQ(format_duration_ms(125'000), "2m05s");
}

}  // namespace
}  // namespace kvtier
