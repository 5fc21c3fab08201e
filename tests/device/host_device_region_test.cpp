// HostDevice regions, allocations and batch validation: everything an engine or a bug
// in the daemon can hand the device that it must refuse.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "common/units.h"
#include "device/host_device.h"
#include "tests/device/device_test_util.h"

namespace kvtier {
namespace {

using testing::bytes_of;
using testing::make_memfd;
using testing::memfd_handle;

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

void expect_invalid(const Status& status, const std::string& words) {
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
  EXPECT_NE(status.message().find(words), std::string::npos)
      << "\"" << status.message() << "\" should mention \"" << words << "\"";
}

TEST(HostDeviceRegion, OpensAMemfdAndSharesItsBytes) {
  auto device = make_host_device(1);
  EXPECT_EQ(device->name(), "host");
  UniqueFd memfd = make_memfd(1 << 20);
  auto region = device->open_region(memfd_handle(memfd, 1 << 20));
  ASSERT_TRUE(region.is_ok()) << region.status().to_string();
  EXPECT_EQ((*region)->size_bytes(), 1u << 20);
  EXPECT_EQ((*region)->location(), MemoryLocation::kHost);
  EXPECT_EQ((*region)->describe(), "memfd region " + format_bytes(1 << 20));
  // Written through the daemon's mapping, visible through the engine's fd.
  bytes_of(**region)[4096] = std::byte{0x5a};
  unsigned char seen = 0;
  ASSERT_EQ(::pread(memfd.get(), &seen, 1, 4096), 1);
  EXPECT_EQ(seen, 0x5a);
  // The daemon sealed it: the engine can no longer shrink it under a copy.
  EXPECT_NE(::ftruncate(memfd.get(), 4096), 0);
}

TEST(HostDeviceRegion, RejectsCudaKinds) {
  auto device = make_host_device(1);
  RegionHandle ipc;
  ipc.kind = RegionHandle::Kind::kCudaIpc;
  ipc.size_bytes = 4096;
  // Well-formed, but not something this backend implements: NotSupported, not retryable.
  auto result = device->open_region(std::move(ipc));
  EXPECT_EQ(result.status().code(), StatusCode::kNotSupported) << result.status().to_string();
  EXPECT_FALSE(result.status().retryable());
  EXPECT_NE(result.status().message().find("cuda_ipc"), std::string::npos);
  EXPECT_NE(result.status().message().find("host backend cannot open cuda regions"),
            std::string::npos);
  RegionHandle vmm;
  vmm.kind = RegionHandle::Kind::kCudaVmmFd;
  vmm.size_bytes = 4096;
  Status refused = device->open_region(std::move(vmm)).status();
  EXPECT_EQ(refused.code(), StatusCode::kNotSupported) << refused.to_string();
  EXPECT_NE(refused.message().find("cuda_vmm_fd"), std::string::npos);
}

TEST(HostDeviceRegion, RejectsAPipe) {
  auto device = make_host_device(1);
  int ends[2];
  ASSERT_EQ(::pipe(ends), 0);
  UniqueFd read_end(ends[0]), write_end(ends[1]);
  RegionHandle handle;
  handle.size_bytes = 4096;
  handle.fd = std::move(read_end);
  expect_invalid(device->open_region(std::move(handle)).status(), "fd is not a memfd");
}

TEST(HostDeviceRegion, RejectsARegularFile) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  struct statfs fs {};
  ASSERT_EQ(::fstatfs(::fileno(file), &fs), 0);
  if (fs.f_type == TMPFS_MAGIC) {
    std::fclose(file);
    GTEST_SKIP() << "tmpfile() is on tmpfs, whose files are sealable like memfds";
  }
  ASSERT_EQ(::ftruncate(::fileno(file), 4096), 0);
  auto device = make_host_device(1);
  RegionHandle handle;
  handle.size_bytes = 4096;
  handle.fd = UniqueFd(::dup(::fileno(file)));
  std::fclose(file);
  expect_invalid(device->open_region(std::move(handle)).status(), "fd is not a memfd");
}

TEST(HostDeviceRegion, RejectsSizeMismatchAndZeroSize) {
  auto device = make_host_device(1);
  UniqueFd memfd = make_memfd(4096);
  Status larger = device->open_region(memfd_handle(memfd, 8192)).status();
  expect_invalid(larger, "8192");
  expect_invalid(larger, "4096");
  expect_invalid(device->open_region(memfd_handle(memfd, 4095)).status(), "4095");
  expect_invalid(device->open_region(memfd_handle(memfd, 0)).status(), "size_bytes is 0");
  RegionHandle no_fd;
  no_fd.size_bytes = 4096;
  expect_invalid(device->open_region(std::move(no_fd)).status(), "no fd");
}

TEST(HostDeviceRegion, RequiresAMemfdThatCanBeSealedAgainstShrinking) {
  auto device = make_host_device(1);
  UniqueFd unsealable = make_memfd(4096, MFD_CLOEXEC);  // no MFD_ALLOW_SEALING
  expect_invalid(device->open_region(memfd_handle(unsealable, 4096)).status(), "MFD_ALLOW_SEALING");
  // Already sealed by the engine, with sealing closed: accepted as it is.
  UniqueFd sealed = make_memfd(4096);
  ASSERT_EQ(::fcntl(sealed.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL), 0);
  EXPECT_TRUE(device->open_region(memfd_handle(sealed, 4096)).is_ok());
}

TEST(HostDeviceAllocate, ArenaAndPoolAreZeroedWritableHostMemory) {
  auto device = make_host_device(1);
  auto arena = device->allocate_arena(3 << 20);
  auto pool = device->allocate_pinned_pool(5000);
  ASSERT_TRUE(arena.is_ok() && pool.is_ok());
  EXPECT_EQ((*arena)->describe(), "hbm arena (host memory)");
  EXPECT_EQ((*pool)->describe(), "ram pool");
  EXPECT_EQ((*arena)->size_bytes(), 3u << 20);
  EXPECT_EQ((*pool)->size_bytes(), 5000u);
  EXPECT_EQ((*arena)->location(), MemoryLocation::kHost);
  for (std::byte b : bytes_of(**pool)) ASSERT_EQ(b, std::byte{0});
  bytes_of(**arena).back() = std::byte{1};
  EXPECT_EQ(bytes_of(**arena).back(), std::byte{1});
}

TEST(HostDeviceAllocate, RejectsZeroAndReportsExhaustion) {
  auto device = make_host_device(1);
  expect_invalid(device->allocate_arena(0).status(), "bytes is 0");
  expect_invalid(device->allocate_pinned_pool(0).status(), "bytes is 0");
  // 1 EiB exceeds any address space: the mapping itself fails.
  EXPECT_EQ(device->allocate_arena(uint64_t{1} << 60).status().code(),
            StatusCode::kResourceExhausted);
}

// Memory the CPU cannot touch, as a CUDA backend would return.
class GpuOnlyMemory final : public Memory {
 public:
  uint64_t size_bytes() const override { return 4096; }
  MemoryLocation location() const override { return MemoryLocation::kGpu; }
  std::byte* host_data() override { return nullptr; }
  std::string describe() const override { return "gpu test memory"; }
};

class HostDeviceValidation : public ::testing::Test {
 protected:
  void SetUp() override {
    auto a = device_->allocate_arena(1 << 16);
    auto b = device_->allocate_pinned_pool(1 << 16);
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    arena_ = *a;
    pool_ = *b;
  }
  // A batch whose segment 0 is valid and whose segment 1 is `bad`.
  CopyBatch batch_with(CopySegment bad) {
    CopyBatch batch;
    batch.memory_index(arena_);
    batch.memory_index(pool_);
    batch.segments.push_back({0, 1, 0, 0, 1024});
    batch.segments.push_back(bad);
    return batch;
  }
  // Submits, expects InvalidArgument naming segment 1, and that `done` never runs.
  void expect_rejected(CopyBatch batch, const std::string& words) {
    auto called = std::make_shared<std::atomic<bool>>(false);
    Status st = device_->submit(std::move(batch), [called](Status) { called->store(true); });
    expect_invalid(st, words);
    device_->drain();
    EXPECT_FALSE(called->load()) << "done must not run for a rejected batch";
  }

  std::unique_ptr<Device> device_ = make_host_device(2);
  std::shared_ptr<Memory> arena_, pool_;
};

TEST_F(HostDeviceValidation, AcceptsTheValidHalf) {
  auto called = std::make_shared<std::atomic<int>>(0);
  Status st = device_->submit(batch_with({1, 0, 1 << 15, 1 << 15, 1 << 15}),
                              [called](Status s) { called->fetch_add(s.is_ok() ? 1 : 100); });
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  device_->drain();
  EXPECT_EQ(called->load(), 1);
}

TEST_F(HostDeviceValidation, RejectsMemoryIndexOutOfRange) {
  expect_rejected(batch_with({2, 0, 0, 4096, 16}), "segment 1");
  expect_rejected(batch_with({0, 7, 0, 4096, 16}), "out of range");
}

TEST_F(HostDeviceValidation, RejectsSegmentsOutsideTheirMemories) {
  expect_rejected(batch_with({1, 0, (1 << 16) - 8, 4096, 16}), "segment 1: source");
  expect_rejected(batch_with({0, 1, 4096, (1 << 16) - 8, 16}), "segment 1: destination");
  expect_rejected(batch_with({0, 1, (1 << 16) + 1, 4096, 0}), "segment 1: source");
}

TEST_F(HostDeviceValidation, RejectsOffsetsThatWouldWrapAround) {
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  expect_rejected(batch_with({0, 1, max - 10, 4096, 100}), "segment 1: source");
  expect_rejected(batch_with({0, 1, 4096, max - 10, 100}), "segment 1: destination");
  expect_rejected(batch_with({0, 1, 4096, 4096, max}), "segment 1");
  expect_rejected(batch_with({0, 1, 16, 4096, max - 8}), "segment 1");
}

TEST_F(HostDeviceValidation, RejectsOverlappingDestinationsAndInPlaceOverlap) {
  expect_rejected(batch_with({0, 1, 8192, 1000, 100}), "segment 1: destination overlaps segment 0");
  expect_rejected(batch_with({0, 0, 8192, 8200, 100}), "segment 1: source and destination overlap");
  // The same memory listed twice is still the same bytes.
  CopyBatch aliased;
  aliased.memories = {arena_, pool_, arena_};
  aliased.segments = {{1, 0, 0, 0, 64}, {1, 2, 100, 32, 64}};
  expect_rejected(aliased, "segment 1: destination overlaps segment 0");
  aliased.segments = {{1, 0, 0, 0, 64}, {0, 2, 4096, 4100, 64}};
  expect_rejected(std::move(aliased), "segment 1: source and destination overlap");
}

TEST_F(HostDeviceValidation, RejectsNullAndGpuMemories) {
  CopyBatch null_memory = batch_with({0, 1, 4096, 4096, 16});
  null_memory.memories.push_back(nullptr);
  expect_rejected(std::move(null_memory), "memories[2] is null");
  CopyBatch gpu = batch_with({2, 1, 0, 4096, 16});
  gpu.memories.push_back(std::make_shared<GpuOnlyMemory>());
  expect_rejected(std::move(gpu), "not host memory");
}

}  // namespace
}  // namespace kvtier
