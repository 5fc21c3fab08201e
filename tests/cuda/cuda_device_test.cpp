// CudaDevice on a real GPU; every test skips with "no CUDA device" where there is none.
#include "cuda/cuda_device.h"

#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <numeric>
#include <vector>

namespace kvtier {
namespace {

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = make_cuda_device(CudaDeviceOptions{});
    if (!device.is_ok()) GTEST_SKIP() << device.status().message();
    device_ = std::move(*device);
  }

  Status run(CopyBatch batch) {
    std::promise<Status> finished;
    Status submitted =
        device_->submit(std::move(batch), [&](Status status) { finished.set_value(status); });
    if (!submitted.is_ok()) return submitted;
    return finished.get_future().get();
  }

  std::unique_ptr<Device> device_;
};

TEST_F(CudaDeviceTest, GathersIntoTheArenaAndScattersBackBitExact) {
  constexpr uint64_t kPlane = 32 << 10, kPlanes = 64, kBlocks = 8;
  auto arena = device_->allocate_arena(kPlane * kPlanes * kBlocks);
  auto pool = device_->allocate_pinned_pool(2 * kPlane * kPlanes * kBlocks);
  ASSERT_TRUE(arena.is_ok()) << arena.status().to_string();
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  std::byte* host = (*pool)->host_data();
  const uint64_t half = kPlane * kPlanes * kBlocks;
  for (uint64_t i = 0; i < half; ++i) host[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
  std::memset(host + half, 0, half);

  // Plane-major in the pool (as an engine keeps it), block-major in the arena.
  CopyBatch up;
  uint32_t src = up.memory_index(*pool), dst = up.memory_index(*arena);
  for (uint64_t b = 0; b < kBlocks; ++b) {
    for (uint64_t p = 0; p < kPlanes; ++p) {
      up.segments.push_back(
          {src, dst, (p * kBlocks + b) * kPlane, (b * kPlanes + p) * kPlane, kPlane});
    }
  }
  ASSERT_TRUE(run(std::move(up)).is_ok());
  CopyBatch down;
  src = down.memory_index(*arena);
  dst = down.memory_index(*pool);
  for (uint64_t b = 0; b < kBlocks; ++b) {
    for (uint64_t p = 0; p < kPlanes; ++p) {
      down.segments.push_back(
          {src, dst, (b * kPlanes + p) * kPlane, half + (p * kBlocks + b) * kPlane, kPlane});
    }
  }
  ASSERT_TRUE(run(std::move(down)).is_ok());
  EXPECT_EQ(std::memcmp(host, host + half, half), 0);
}

TEST_F(CudaDeviceTest, RejectsSegmentsOutsideTheArena) {
  auto arena = device_->allocate_arena(1 << 20);
  auto pool = device_->allocate_pinned_pool(1 << 20);
  ASSERT_TRUE(arena.is_ok() && pool.is_ok());
  CopyBatch batch;
  uint32_t src = batch.memory_index(*pool), dst = batch.memory_index(*arena);
  batch.segments.push_back({src, dst, 0, (1 << 20) - 8, 16});
  bool called = false;
  Status status = device_->submit(std::move(batch), [&](Status) { called = true; });
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  device_->drain();
  EXPECT_FALSE(called);
}

TEST_F(CudaDeviceTest, RefusesMemfdRegionsAndForeignIpcHandles) {
  RegionHandle memfd;
  memfd.kind = RegionHandle::Kind::kMemfd;
  memfd.size_bytes = 4096;
  EXPECT_EQ(device_->open_region(std::move(memfd)).status().code(), StatusCode::kInvalidArgument);
  RegionHandle garbage;
  garbage.kind = RegionHandle::Kind::kCudaIpc;
  garbage.size_bytes = 4096;
  std::iota(reinterpret_cast<uint8_t*>(garbage.ipc_handle.data()),
            reinterpret_cast<uint8_t*>(garbage.ipc_handle.data()) + garbage.ipc_handle.size(), 1);
  auto opened = device_->open_region(std::move(garbage));
  EXPECT_FALSE(opened.is_ok());
  RegionHandle other_gpu;
  other_gpu.kind = RegionHandle::Kind::kCudaIpc;
  other_gpu.size_bytes = 4096;
  other_gpu.gpu_uuid = "GPU-00000000-0000-0000-0000-000000000000";
  auto wrong = device_->open_region(std::move(other_gpu));
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier
