#include "common/gpu_uuid.h"

#include <gtest/gtest.h>

#include <array>

namespace kvtier {
namespace {

TEST(GpuUuid, FormatsLikeNvidiaSmi) {
  std::array<uint8_t, 16> bytes{0x4b, 0x2a, 0x9c, 0x01, 0xde, 0xad, 0xbe, 0xef,
                                0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77};
  EXPECT_EQ(format_gpu_uuid(bytes), "GPU-4b2a9c01-dead-beef-0011-223344556677");
}

}  // namespace
}  // namespace kvtier
