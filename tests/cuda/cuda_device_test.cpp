// CudaDevice through the CUDA driver API: on the fake driver (tests/fakecuda, ctest
// sets LD_LIBRARY_PATH and KVTIER_TEST_CUDA=fake) and on a real GPU
// (KVTIER_TEST_CUDA=real). On the real driver the tests skip where there is no GPU,
// unless /dev/nvidiactl exists or KVTIER_REQUIRE_GPU=1: then they fail.
//
// Engine memory here is VMM memory made in this process and handed to the device as
// exported fds, as an engine's would arrive; legacy IPC needs a second process and is
// covered by the integration tests.
#include "cuda/cuda_device.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <vector>

#include "cuda/copy_lane.h"
#include "cuda/driver_api.h"

namespace kvtier {
namespace {

using cuda::DriverApi;

bool on_fake_driver() {
  const char* mode = std::getenv("KVTIER_TEST_CUDA");
  return mode != nullptr && std::string(mode) == "fake";
}

bool gpu_required() {
  const char* required = std::getenv("KVTIER_REQUIRE_GPU");
  return (required != nullptr && std::string(required) == "1") ||
         std::filesystem::exists("/dev/nvidiactl");
}

std::byte pattern_byte(uint64_t i, uint64_t seed) {
  return static_cast<std::byte>(((i + seed) * 2654435761u) >> 13);
}

// Exportable device memory made by "the engine": chunks of the granularity mapped
// back to back, with their fds.
class EngineVmm {
 public:
  EngineVmm(const DriverApi& driver, int ordinal, size_t chunks) : driver_(driver) {
    CUdevice device = 0;
    EXPECT_EQ(driver.device_get(&device, ordinal), CUDA_SUCCESS);
    EXPECT_EQ(driver.primary_ctx_retain(&context_, device), CUDA_SUCCESS);
    EXPECT_EQ(driver.ctx_set_current(context_), CUDA_SUCCESS);
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t granularity = 0;
    EXPECT_EQ(driver.mem_get_allocation_granularity(&granularity, &prop,
                                                    CU_MEM_ALLOC_GRANULARITY_MINIMUM),
              CUDA_SUCCESS);
    chunk_bytes_ = granularity;
    bytes_ = chunk_bytes_ * chunks;
    EXPECT_EQ(driver.mem_address_reserve(&base_, bytes_, chunk_bytes_, 0, 0), CUDA_SUCCESS);
    for (size_t i = 0; i < chunks; ++i) {
      CUmemGenericAllocationHandle handle{};
      EXPECT_EQ(driver.mem_create(&handle, chunk_bytes_, &prop, 0), CUDA_SUCCESS);
      EXPECT_EQ(driver.mem_map(base_ + i * chunk_bytes_, chunk_bytes_, 0, handle, 0), CUDA_SUCCESS);
      int fd = -1;
      EXPECT_EQ(driver.mem_export_to_shareable_handle(&fd, handle,
                                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                CUDA_SUCCESS);
      fds_.emplace_back(fd);
      driver.mem_release(handle);
    }
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = ordinal;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    EXPECT_EQ(driver.mem_set_access(base_, bytes_, &access, 1), CUDA_SUCCESS);
  }
  ~EngineVmm() {
    driver_.ctx_set_current(context_);
    driver_.mem_unmap(base_, bytes_);
    driver_.mem_address_free(base_, bytes_);
  }
  uint64_t bytes() const { return bytes_; }
  // A handle for the daemon: duplicates of the chunk fds, the region at `offset`.
  RegionHandle handle(uint64_t offset, uint64_t size, const std::string& uuid) const {
    RegionHandle handle;
    handle.kind = RegionHandle::Kind::kCudaVmmFd;
    handle.offset_bytes = offset;
    handle.size_bytes = size;
    handle.gpu_uuid = uuid;
    for (const UniqueFd& fd : fds_)
      handle.vmm_chunks.push_back({UniqueFd(::dup(fd.get())), chunk_bytes_});
    return handle;
  }
  void write(uint64_t offset, const std::vector<std::byte>& bytes) {
    driver_.ctx_set_current(context_);
    ASSERT_EQ(driver_.memcpy_htod(base_ + offset, bytes.data(), bytes.size()), CUDA_SUCCESS);
  }
  std::vector<std::byte> read(uint64_t offset, uint64_t bytes) {
    std::vector<std::byte> out(bytes);
    driver_.ctx_set_current(context_);
    EXPECT_EQ(driver_.memcpy_dtoh(out.data(), base_ + offset, bytes), CUDA_SUCCESS);
    return out;
  }

 private:
  const DriverApi& driver_;
  CUcontext context_ = nullptr;
  CUdeviceptr base_ = 0;
  uint64_t chunk_bytes_ = 0;
  uint64_t bytes_ = 0;
  std::vector<UniqueFd> fds_;
};

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = make_cuda_device(CudaDeviceOptions{});
    if (!device.is_ok()) {
      if (on_fake_driver() || gpu_required()) FAIL() << device.status().to_string();
      GTEST_SKIP() << device.status().message();
    }
    device_ = std::move(*device);
    driver_ = DriverApi::get().value();
  }

  Status run(CopyBatch batch) {
    std::promise<Status> finished;
    Status submitted =
        device_->submit(std::move(batch), [&](Status status) { finished.set_value(status); });
    if (!submitted.is_ok()) return submitted;
    return finished.get_future().get();
  }

  std::unique_ptr<Device> device_;
  const DriverApi* driver_ = nullptr;
};

TEST_F(CudaDeviceTest, GathersIntoEveryGpusArenaPartAndScattersBackBitExact) {
  constexpr uint64_t kPlane = 32 << 10, kPlanes = 64, kBlocks = 8;
  constexpr uint64_t kBytes = kPlane * kPlanes * kBlocks;  // 16 MiB
  const auto gpus = device_->gpus();
  ASSERT_FALSE(gpus.empty());
  auto arena = device_->allocate_arena(kBytes, 2 << 20);
  auto pool = device_->allocate_pinned_pool(2 * kBytes);
  ASSERT_TRUE(arena.is_ok()) << arena.status().to_string();
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  ASSERT_EQ((*arena)->size_bytes(), kBytes * gpus.size());
  std::byte* host = (*pool)->host_data();
  for (size_t gpu = 0; gpu < gpus.size(); ++gpu) {
    const uint64_t part = gpu * kBytes;
    for (uint64_t i = 0; i < kBytes; ++i) host[i] = pattern_byte(i, gpu);
    std::memset(host + kBytes, 0, kBytes);
    // Plane-major in the pool (as an engine keeps it), block-major in the arena.
    CopyBatch up;
    uint32_t src = up.memory_index(*pool), dst = up.memory_index(*arena);
    for (uint64_t b = 0; b < kBlocks; ++b) {
      for (uint64_t p = 0; p < kPlanes; ++p) {
        up.segments.push_back(
            {src, dst, (p * kBlocks + b) * kPlane, part + (b * kPlanes + p) * kPlane, kPlane});
      }
    }
    ASSERT_TRUE(run(std::move(up)).is_ok());
    CopyBatch down;
    src = down.memory_index(*arena);
    dst = down.memory_index(*pool);
    for (uint64_t b = 0; b < kBlocks; ++b) {
      for (uint64_t p = 0; p < kPlanes; ++p) {
        down.segments.push_back({src, dst, part + (b * kPlanes + p) * kPlane,
                                 kBytes + (p * kBlocks + b) * kPlane, kPlane});
      }
    }
    ASSERT_TRUE(run(std::move(down)).is_ok());
    EXPECT_EQ(std::memcmp(host, host + kBytes, kBytes), 0) << "GPU " << gpus[gpu].uuid;
  }
}

TEST_F(CudaDeviceTest, ServesDistinctGpus) {
  const auto gpus = device_->gpus();
  if (on_fake_driver()) {
    ASSERT_EQ(gpus.size(), 2u);
  }
  for (size_t i = 0; i < gpus.size(); ++i) {
    EXPECT_EQ(gpus[i].uuid.rfind("GPU-", 0), 0u) << gpus[i].uuid;
    for (size_t j = 0; j < i; ++j) EXPECT_NE(gpus[i].uuid, gpus[j].uuid);
  }
  CudaDeviceOptions only_last;
  only_last.gpu_uuids = {gpus.back().uuid};
  auto narrowed = make_cuda_device(only_last);
  ASSERT_TRUE(narrowed.is_ok()) << narrowed.status().to_string();
  ASSERT_EQ((*narrowed)->gpus().size(), 1u);
  EXPECT_EQ((*narrowed)->gpus()[0].uuid, gpus.back().uuid);
  CudaDeviceOptions unknown;
  unknown.gpu_uuids = {"GPU-00000000-0000-0000-0000-000000000000"};
  auto refused = make_cuda_device(unknown);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("not on this machine"), std::string::npos);
}

TEST_F(CudaDeviceTest, VmmRegionOfManyChunksAtAnOffsetRoundTripsAndLeavesItsSurroundings) {
  const auto gpus = device_->gpus();
  const int ordinal = gpus.back().ordinal;
  EngineVmm engine(*driver_, ordinal, 10);
  const uint64_t offset = (1 << 20) + 4096;
  const uint64_t size = engine.bytes() - offset - (1 << 20);  // spans all 10 chunks
  std::vector<std::byte> original(engine.bytes());
  for (uint64_t i = 0; i < original.size(); ++i) original[i] = pattern_byte(i, 7);
  engine.write(0, original);

  auto region = device_->open_region(engine.handle(offset, size, gpus.back().uuid));
  ASSERT_TRUE(region.is_ok()) << region.status().to_string();
  auto arena = device_->allocate_arena(size + (2 << 20), 2 << 20);
  ASSERT_TRUE(arena.is_ok()) << arena.status().to_string();
  // Region → arena (one segment per 64 KiB "plane", reversed so nothing is adjacent
  // in the source order), then back into the region shifted by one plane.
  constexpr uint64_t kPiece = 64 << 10;
  const uint64_t pieces = size / kPiece;
  CopyBatch gather;
  uint32_t src = gather.memory_index(*region), dst = gather.memory_index(*arena);
  for (uint64_t i = 0; i < pieces; ++i)
    gather.segments.push_back({src, dst, i * kPiece, (pieces - 1 - i) * kPiece, kPiece});
  ASSERT_TRUE(run(std::move(gather)).is_ok());
  CopyBatch scatter;
  src = scatter.memory_index(*arena);
  dst = scatter.memory_index(*region);
  for (uint64_t i = 0; i + 1 < pieces; ++i)
    scatter.segments.push_back({src, dst, (pieces - 1 - i) * kPiece, (i + 1) * kPiece, kPiece});
  ASSERT_TRUE(run(std::move(scatter)).is_ok());

  std::vector<std::byte> expected = original;
  std::memcpy(expected.data() + offset + kPiece, original.data() + offset, (pieces - 1) * kPiece);
  std::vector<std::byte> actual = engine.read(0, engine.bytes());
  ASSERT_EQ(actual.size(), expected.size());
  EXPECT_EQ(std::memcmp(actual.data(), expected.data(), offset), 0) << "bytes before the region";
  EXPECT_EQ(std::memcmp(actual.data() + offset, expected.data() + offset, size), 0);
  EXPECT_EQ(std::memcmp(actual.data() + offset + size, expected.data() + offset + size,
                        actual.size() - offset - size),
            0)
      << "bytes after the region";
}

// A block of an engine on one GPU stored in another GPU's part of the arena and read
// back: cuMemcpyPeerAsync between the GPUs' contexts, with peer access or without it
// (ctest also runs this with the fake's peer access off, where only the owning GPU may
// touch each memory).
TEST_F(CudaDeviceTest, CopiesBetweenGpusWithOrWithoutPeerAccess) {
  const auto gpus = device_->gpus();
  if (gpus.size() < 2) GTEST_SKIP() << "one GPU";
  EngineVmm engine(*driver_, gpus.back().ordinal, 2);
  const uint64_t size = 1 << 20;
  std::vector<std::byte> original(engine.bytes());
  for (uint64_t i = 0; i < original.size(); ++i) original[i] = pattern_byte(i, 11);
  engine.write(0, original);
  auto region = device_->open_region(engine.handle(0, engine.bytes(), gpus.back().uuid));
  ASSERT_TRUE(region.is_ok()) << region.status().to_string();
  auto arena = device_->allocate_arena(2 << 20, 2 << 20);
  auto pool = device_->allocate_pinned_pool(2 << 20);
  ASSERT_TRUE(arena.is_ok() && pool.is_ok());
  CopyBatch to_other_gpu;  // region (last GPU) → arena part 0 (first GPU), in 4 pieces
  uint32_t src = to_other_gpu.memory_index(*region), dst = to_other_gpu.memory_index(*arena);
  for (uint64_t piece = 0; piece < 4; ++piece)
    to_other_gpu.segments.push_back({src, dst, piece * (size / 2), piece * (size / 4), size / 4});
  ASSERT_TRUE(run(std::move(to_other_gpu)).is_ok());
  CopyBatch back_to_engine;  // arena part 0 → the region's second MiB
  src = back_to_engine.memory_index(*arena);
  dst = back_to_engine.memory_index(*region);
  back_to_engine.segments.push_back({src, dst, 0, engine.bytes() / 2, size});
  ASSERT_TRUE(run(std::move(back_to_engine)).is_ok());
  std::vector<std::byte> actual = engine.read(engine.bytes() / 2, size);
  for (uint64_t piece = 0; piece < 4; ++piece) {
    EXPECT_EQ(std::memcmp(actual.data() + piece * (size / 4), original.data() + piece * (size / 2),
                          size / 4),
              0)
        << "piece " << piece;
  }
}

TEST_F(CudaDeviceTest, RejectsBadRegionsWithTheFieldNamed) {
  const auto gpus = device_->gpus();
  EngineVmm engine(*driver_, gpus.front().ordinal, 2);
  auto expect_invalid = [](const Result<std::shared_ptr<Memory>>& opened, const char* fragment) {
    ASSERT_FALSE(opened.is_ok()) << fragment;
    EXPECT_EQ(opened.status().code(), StatusCode::kInvalidArgument) << opened.status().to_string();
    EXPECT_NE(opened.status().message().find(fragment), std::string::npos)
        << opened.status().message();
  };
  expect_invalid(device_->open_region(engine.handle(4096, engine.bytes(), gpus.front().uuid)),
                 "offsetBytes");
  RegionHandle odd = engine.handle(0, 4096, gpus.front().uuid);
  odd.vmm_chunks[0].bytes = 4096;
  expect_invalid(device_->open_region(std::move(odd)), "chunkBytes[0]");
  expect_invalid(
      device_->open_region(engine.handle(0, 4096, "GPU-00000000-0000-0000-0000-000000000000")),
      "not served");
  if (gpus.size() > 1) expect_invalid(device_->open_region(engine.handle(0, 4096, "")), "gpuUuid");
  // A memfd region is well-formed, just not something the CUDA backend takes.
  RegionHandle memfd;
  memfd.kind = RegionHandle::Kind::kMemfd;
  memfd.size_bytes = 4096;
  auto refused = device_->open_region(std::move(memfd));
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kNotSupported) << refused.status().to_string();
  EXPECT_NE(refused.status().message().find("memfd"), std::string::npos);
}

TEST_F(CudaDeviceTest, RejectsSegmentsOutsideTheArenaOrAcrossGpuParts) {
  auto arena = device_->allocate_arena(2 << 20, 2 << 20);
  auto pool = device_->allocate_pinned_pool(4 << 20);
  ASSERT_TRUE(arena.is_ok() && pool.is_ok());
  bool called = false;
  CopyBatch outside;
  uint32_t src = outside.memory_index(*pool), dst = outside.memory_index(*arena);
  outside.segments.push_back({src, dst, 0, (*arena)->size_bytes() - 8, 16});
  EXPECT_EQ(device_->submit(std::move(outside), [&](Status) { called = true; }).code(),
            StatusCode::kInvalidArgument);
  if (device_->gpus().size() > 1) {
    CopyBatch straddling;
    src = straddling.memory_index(*pool);
    dst = straddling.memory_index(*arena);
    straddling.segments.push_back({src, dst, 0, (2 << 20) - 8, 16});
    Status refused = device_->submit(std::move(straddling), [&](Status) { called = true; });
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(refused.message().find("straddles"), std::string::npos) << refused.message();
  }
  device_->drain();
  EXPECT_FALSE(called);
}

// Two slots that touch across the border of two GPUs' parts are never merged into one
// copy that would straddle them (a copy engine of one GPU would then touch the other's
// memory: the fake faults on that when ctest runs it without peer access).
TEST_F(CudaDeviceTest, ContiguousSlotsOnTwoGpusStayTwoCopies) {
  if (device_->gpus().size() < 2) GTEST_SKIP() << "one GPU";
  constexpr uint64_t kPart = 2 << 20, kSlot = 64 << 10;
  auto arena = device_->allocate_arena(kPart, kPart);
  auto pool = device_->allocate_pinned_pool(kPart);
  ASSERT_TRUE(arena.is_ok() && pool.is_ok());
  std::byte* host = (*pool)->host_data();
  for (uint64_t i = 0; i < 2 * kSlot; ++i) host[i] = pattern_byte(i, 3);
  CopyBatch up;  // the last slot of part 0 and the first of part 1, sources adjacent
  uint32_t src = up.memory_index(*pool), dst = up.memory_index(*arena);
  up.segments.push_back({src, dst, 0, kPart - kSlot, kSlot});
  up.segments.push_back({src, dst, kSlot, kPart, kSlot});
  ASSERT_TRUE(run(std::move(up)).is_ok());
  CopyBatch down;
  src = down.memory_index(*arena);
  dst = down.memory_index(*pool);
  down.segments.push_back({src, dst, kPart - kSlot, 2 * kSlot, kSlot});
  down.segments.push_back({src, dst, kPart, 3 * kSlot, kSlot});
  Status copied = run(std::move(down));
  ASSERT_TRUE(copied.is_ok()) << copied.to_string();
  EXPECT_EQ(std::memcmp(host, host + 2 * kSlot, 2 * kSlot), 0);
}

TEST_F(CudaDeviceTest, ReleasesTheBatchsMemoriesBeforeDone) {
  auto arena = device_->allocate_arena(2 << 20, 2 << 20);
  auto pool = device_->allocate_pinned_pool(2 << 20);
  ASSERT_TRUE(arena.is_ok() && pool.is_ok());
  std::weak_ptr<Memory> watched = *pool;
  CopyBatch batch;
  uint32_t src = batch.memory_index(*pool), dst = batch.memory_index(*arena);
  batch.segments.push_back({src, dst, 0, 0, 1 << 20});
  std::promise<long> uses_at_done;
  ASSERT_TRUE(
      device_
          ->submit(std::move(batch), [&](Status) { uses_at_done.set_value(watched.use_count()); })
          .is_ok());
  EXPECT_EQ(uses_at_done.get_future().get(), 1) << "only the test's own reference is left";
}

// Run with KVTIER_FAKECUDA_COPY_US_PER_MIB set (ctest does) so that the background
// batch takes long on the fake; on a real GPU 512 MiB takes ~10–20 ms.
TEST_F(CudaDeviceTest, SlowCopiesForegroundNeverWaitsBehindBackground) {
  constexpr uint64_t kBackground = 256ull << 20;
  auto arena = device_->allocate_arena(kBackground + (4 << 20), 2 << 20);
  auto pool = device_->allocate_pinned_pool(kBackground + (4 << 20));
  ASSERT_TRUE(arena.is_ok()) << arena.status().to_string();
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  std::promise<std::chrono::steady_clock::time_point> background_done, foreground_done;
  for (auto direction : {0, 1}) {  // same direction as the background, then the other
    background_done = {};
    foreground_done = {};
    CopyBatch background;
    background.priority = CopyPriority::kBackground;
    uint32_t a = background.memory_index(*arena), p = background.memory_index(*pool);
    for (uint64_t offset = 0; offset < kBackground; offset += 2 << 20)
      background.segments.push_back({a, p, offset, offset, 1 << 20});  // not adjacent: no merge
    ASSERT_TRUE(device_
                    ->submit(std::move(background),
                             [&](Status s) {
                               EXPECT_TRUE(s.is_ok()) << s.to_string();
                               background_done.set_value(std::chrono::steady_clock::now());
                             })
                    .is_ok());
    CopyBatch foreground;
    a = foreground.memory_index(*arena);
    p = foreground.memory_index(*pool);
    if (direction == 0) {
      foreground.segments.push_back({a, p, kBackground, kBackground, 1 << 20});
    } else {
      foreground.segments.push_back({p, a, kBackground, kBackground, 1 << 20});
    }
    ASSERT_TRUE(device_
                    ->submit(std::move(foreground),
                             [&](Status s) {
                               EXPECT_TRUE(s.is_ok()) << s.to_string();
                               foreground_done.set_value(std::chrono::steady_clock::now());
                             })
                    .is_ok());
    const auto foreground_at = foreground_done.get_future().get();
    const auto background_at = background_done.get_future().get();
    EXPECT_LT(foreground_at, background_at) << "direction " << direction;
  }
}

// Run with KVTIER_FAKECUDA_FAULT_FILE set (ctest does); the file appears mid-run.
TEST_F(CudaDeviceTest, StickyErrorFailsTheBatchAndCallsTheFatalHandlerOnce) {
  const char* trigger = std::getenv("KVTIER_FAKECUDA_FAULT_FILE");
  ASSERT_NE(trigger, nullptr) << "ctest sets KVTIER_FAKECUDA_FAULT_FILE for this test";
  std::filesystem::remove(trigger);
  auto arena = device_->allocate_arena(2 << 20, 2 << 20);
  auto pool = device_->allocate_pinned_pool(2 << 20);
  ASSERT_TRUE(arena.is_ok() && pool.is_ok());
  std::atomic<int> fatal_calls{0};
  std::promise<Status> fatal;
  device_->set_fatal_error_handler([&](const Status& error) {
    if (fatal_calls.fetch_add(1) == 0) fatal.set_value(error);
  });
  auto copy = [&] {
    CopyBatch batch;
    uint32_t src = batch.memory_index(*pool), dst = batch.memory_index(*arena);
    batch.segments.push_back({src, dst, 0, 0, 1 << 20});
    return run(std::move(batch));
  };
  ASSERT_TRUE(copy().is_ok());
  std::ofstream(trigger) << "illegal-address\n";
  Status failed = copy();
  std::filesystem::remove(trigger);
  EXPECT_EQ(failed.code(), StatusCode::kDataLoss) << failed.to_string();
  Status reported = fatal.get_future().get();
  EXPECT_EQ(reported.code(), StatusCode::kDataLoss);
  EXPECT_NE(reported.message().find("CUDA_ERROR_ILLEGAL_ADDRESS"), std::string::npos)
      << reported.message();
  Status after = copy();
  EXPECT_EQ(after.code(), StatusCode::kUnavailable) << after.to_string();
  device_->drain();
  EXPECT_EQ(fatal_calls.load(), 1);
}

// ---- strided copies -------------------------------------------------------------

cuda::LaneRun run_of(const std::vector<std::array<uint64_t, 3>>& copies, uint64_t pair = 0) {
  cuda::LaneRun run;
  for (const auto& [dst, src, bytes] : copies) run.add(dst, src, bytes, -1, pair);
  return run;
}

TEST(FoldStrided, ABlocksPlanesAtTheirEngineStrideBecomeOneCopyPerBlock) {
  constexpr uint64_t kPlane = 8 << 10, kBlocks = 512;
  std::vector<std::array<uint64_t, 3>> copies;
  for (uint64_t b = 0; b < 2; ++b) {
    for (uint64_t p = 0; p < 4; ++p)  // slot contiguous, engine plane-major
      copies.push_back(
          {0x100000 + b * 4 * kPlane + p * kPlane, 0x7000000 + (p * kBlocks + b) * kPlane, kPlane});
  }
  cuda::LaneRun run = run_of(copies);
  run.fold_strided(2, 1ull << 31);
  ASSERT_EQ(run.count(), 2u);
  for (uint64_t b = 0; b < 2; ++b) {
    EXPECT_EQ(run.rows[b], 4u);
    EXPECT_EQ(run.sizes[b], kPlane);
    EXPECT_EQ(run.dst_pitches[b], kPlane);
    EXPECT_EQ(run.src_pitches[b], kBlocks * kPlane);
    EXPECT_EQ(run.dsts[b], 0x100000 + b * 4 * kPlane);
    EXPECT_EQ(run.bytes(b), 4 * kPlane);
  }
}

TEST(FoldStrided, KeepsWhatDoesNotAdvanceByOneStep) {
  // Two rows, then a stride break, a size change, a row going backwards, an overlap
  // (step below the width) and a step past the maximum pitch.
  cuda::LaneRun run = run_of({{1000, 5000, 100},
                              {1100, 5200, 100},
                              {1200, 5400, 100},  // three rows at (100, 200)
                              {1350, 5600, 100},  // dst step 150: a new stride starts
                              {1500, 5800, 100},  // ... and continues (150, 200)
                              {1600, 6000, 50},   // another size
                              {1550, 6100, 50},   // backwards
                              {1700, 6120, 50},   // src step 20 < 50: rows would overlap
                              {1740, 6300, 50},   // dst step 40 < 50: likewise
                              {1800, 1u << 20, 50},
                              {1900, (1u << 20) + (1u << 16), 50}});  // src step > max pitch
  const uint64_t max_pitch = 1 << 15;
  run.fold_strided(2, max_pitch);
  std::vector<std::array<uint64_t, 4>> got;  // dst, rows, dst pitch, src pitch
  for (size_t i = 0; i < run.count(); ++i)
    got.push_back({run.dsts[i], run.rows[i], run.dst_pitches[i], run.src_pitches[i]});
  const std::vector<std::array<uint64_t, 4>> want = {
      {1000, 3, 100, 200}, {1350, 2, 150, 200}, {1600, 1, 0, 0}, {1550, 1, 0, 0},
      {1700, 1, 0, 0},     {1740, 1, 0, 0},     {1800, 1, 0, 0}, {1900, 1, 0, 0}};
  EXPECT_EQ(got, want);
}

TEST(FoldStrided, NeverJoinsTwoMemoriesPeerCopiesOrFewerRowsThanAsked) {
  cuda::LaneRun run;
  run.add(0, 10000, 64, -1, 1);
  run.add(64, 10128, 64, -1, 2);  // the same steps, another memory pair
  run.add(128, 10256, 64, 1);     // from another GPU
  run.add(192, 10384, 64, 1);
  run.fold_strided(2, 1 << 20);
  EXPECT_EQ(run.count(), 4u);
  for (size_t i = 0; i < run.count(); ++i) EXPECT_EQ(run.rows[i], 1u);

  cuda::LaneRun pair = run_of({{0, 1000, 10}, {20, 1020, 10}, {100, 2000, 10}});
  pair.fold_strided(3, 1 << 20);
  EXPECT_EQ(pair.count(), 3u);  // two rows are fewer than three
}

// The same plane layouts through every direction with strided copies and with one copy
// per plane: equal bytes, and both equal to what the layout says on the host. Blocks are listed in
// order, in reverse plane order (no fold) and with a plane of another size between regular ones (a
// fold ends, another starts).
TEST_F(CudaDeviceTest, StridedAndPerPlaneCopiesMoveTheSameBytes) {
  const auto gpus = device_->gpus();
  constexpr uint64_t kPlane = 4 << 10, kPlanes = 32, kBlocks = 8;
  constexpr uint64_t kBlockBytes = kPlane * kPlanes + 1000;  // planes + one odd piece
  constexpr uint64_t kOdd = 1000;
  EngineVmm engine(*driver_, gpus.front().ordinal, 2);  // 4 MiB: layout + scatter target
  const uint64_t half = engine.bytes() / 2;
  std::vector<std::byte> original(engine.bytes());
  for (uint64_t i = 0; i < original.size(); ++i) original[i] = pattern_byte(i, 11);
  // Engine layout: plane p of block b at (p · kBlocks + b) · kPlane, the odd pieces
  // after all planes; a slot holds planes 0..15, the odd piece, planes 16..31.
  auto engine_offset = [&](uint64_t b, uint64_t p) { return (p * kBlocks + b) * kPlane; };
  const uint64_t odd_base = kPlanes * kBlocks * kPlane;
  auto slot_layout = [&](uint64_t b, auto&& emit) {  // emit(engine offset, slot offset, bytes)
    const bool reversed = b == 3;
    for (uint64_t k = 0; k < kPlanes; ++k) {
      const uint64_t p = reversed ? kPlanes - 1 - k : k;
      const uint64_t in_slot = p * kPlane + (p >= kPlanes / 2 ? kOdd : 0);
      emit(engine_offset(b, p), b * kBlockBytes + in_slot, kPlane);
      if (p == kPlanes / 2 - 1 && !reversed)
        emit(odd_base + b * kOdd, b * kBlockBytes + kPlane * 16, kOdd);
      if (p == kPlanes / 2 && reversed)
        emit(odd_base + b * kOdd, b * kBlockBytes + kPlane * 16, kOdd);
    }
  };
  std::vector<std::byte> expected_slots(kBlocks * kBlockBytes);
  std::vector<std::byte> expected_engine = original;
  for (uint64_t b = 0; b < kBlocks; ++b) {
    slot_layout(b, [&](uint64_t e, uint64_t slot, uint64_t bytes) {
      std::memcpy(expected_slots.data() + slot, original.data() + e, bytes);
      std::memcpy(expected_engine.data() + half + e, original.data() + e, bytes);
    });
  }

  for (bool strided : {true, false}) {
    SCOPED_TRACE(strided ? "strided copies" : "one copy per plane");
    CudaDeviceOptions options;
    options.gpu_uuids = {gpus.front().uuid};
    options.strided_copies = strided;
    auto made = make_cuda_device(options);
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    Device& device = **made;
    engine.write(0, original);
    auto region = device.open_region(engine.handle(0, engine.bytes(), gpus.front().uuid));
    auto arena = device.allocate_arena(2 << 20, 2 << 20);
    auto pool = device.allocate_pinned_pool(2 << 20);
    ASSERT_TRUE(region.is_ok() && arena.is_ok() && pool.is_ok());
    auto run_on = [&](CopyBatch batch) {
      std::promise<Status> finished;
      Status submitted = device.submit(std::move(batch), [&](Status s) { finished.set_value(s); });
      return submitted.is_ok() ? finished.get_future().get() : submitted;
    };
    // Engine → arena (device to device), arena → pool whole (device to host).
    CopyBatch save;
    uint32_t e = save.memory_index(*region), a = save.memory_index(*arena);
    for (uint64_t b = 0; b < kBlocks; ++b) {
      slot_layout(b, [&](uint64_t eo, uint64_t slot, uint64_t bytes) {
        save.segments.push_back({e, a, eo, slot, bytes});
      });
    }
    ASSERT_TRUE(run_on(std::move(save)).is_ok());
    CopyBatch demote;
    a = demote.memory_index(*arena);
    uint32_t p = demote.memory_index(*pool);
    demote.segments.push_back({a, p, 0, 0, kBlocks * kBlockBytes});
    ASSERT_TRUE(run_on(std::move(demote)).is_ok());
    EXPECT_EQ(std::memcmp((*pool)->host_data(), expected_slots.data(), expected_slots.size()), 0);
    // Pool → engine's second half, plane by plane (host to device).
    CopyBatch load;
    p = load.memory_index(*pool);
    e = load.memory_index(*region);
    for (uint64_t b = 0; b < kBlocks; ++b) {
      slot_layout(b, [&](uint64_t eo, uint64_t slot, uint64_t bytes) {
        load.segments.push_back({p, e, slot, half + eo, bytes});
      });
    }
    ASSERT_TRUE(run_on(std::move(load)).is_ok());
    std::vector<std::byte> actual = engine.read(0, engine.bytes());
    EXPECT_EQ(std::memcmp(actual.data(), expected_engine.data(), actual.size()), 0);
  }
}

}  // namespace
}  // namespace kvtier
