// HostDevice copies: gather/scatter of engine planes bit-exact, sharding, lifetime of
// in-flight batches, drain and completion semantics.
#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "device/host_device.h"
#include "tests/device/device_test_util.h"

namespace kvtier {
namespace {

using testing::bytes_of;
using testing::fill_random;
using testing::Gate;
using testing::make_memfd;
using testing::memfd_handle;
using testing::submit_async;

// One plane of an engine's KV cache: block b's bytes are at offset + b * stride.
struct Plane {
  uint64_t offset;
  uint64_t stride;
  uint64_t bytes;
};

struct Layout {
  const char* name;
  std::vector<Plane> planes;
  uint64_t region_bytes;
  uint64_t block_bytes() const {
    uint64_t total = 0;
    for (const Plane& p : planes) total += p.bytes;
    return total;
  }
};

// flash-attn style [2, layers, blocks, ...]: many small planes (64 planes x 2 KiB).
Layout many_small_planes() {
  Layout layout{"many_small_planes", {}, 0};
  const uint64_t blocks = 32, plane_bytes = 2048;
  for (uint64_t p = 0; p < 64; ++p) {
    layout.planes.push_back({p * blocks * plane_bytes, plane_bytes, plane_bytes});
  }
  layout.region_bytes = 64 * blocks * plane_bytes;
  return layout;
}

// MLA style: one 5 MiB plane per block (larger than a 4-thread shard) plus a small
// plane with a stride wider than its bytes (padding between blocks).
Layout few_huge_planes() {
  const uint64_t blocks = 4, big = 5 << 20, small_bytes = 64 << 10, small_stride = 96 << 10;
  Layout layout{"few_huge_planes", {}, 0};
  layout.planes.push_back({0, big, big});
  layout.planes.push_back({blocks * big, small_stride, small_bytes});
  layout.region_bytes = blocks * big + blocks * small_stride;
  return layout;
}

// Engine blocks `blocks[k]` -> arena slot k (gather), or the reverse (scatter).
CopyBatch plane_batch(const std::shared_ptr<Memory>& region, const std::shared_ptr<Memory>& arena,
                      const Layout& layout, const std::vector<uint64_t>& blocks, bool gather) {
  CopyBatch batch;
  const uint32_t r = batch.memory_index(region), a = batch.memory_index(arena);
  for (size_t k = 0; k < blocks.size(); ++k) {
    uint64_t slot_offset = k * layout.block_bytes();
    for (const Plane& plane : layout.planes) {
      const uint64_t engine_offset = plane.offset + blocks[k] * plane.stride;
      if (gather) {
        batch.segments.push_back({r, a, engine_offset, slot_offset, plane.bytes});
      } else {
        batch.segments.push_back({a, r, slot_offset, engine_offset, plane.bytes});
      }
      slot_offset += plane.bytes;
    }
  }
  return batch;
}

class HostDeviceCopy : public ::testing::TestWithParam<int> {};

TEST_P(HostDeviceCopy, GatherThenScatterIsBitExact) {
  auto device = make_host_device(GetParam());
  for (const Layout& layout : {many_small_planes(), few_huge_planes()}) {
    SCOPED_TRACE(layout.name);
    UniqueFd memfd = make_memfd(layout.region_bytes);
    // The engine's own view of its region, through a separate mapping.
    void* mapped =
        ::mmap(nullptr, layout.region_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(), 0);
    ASSERT_NE(mapped, MAP_FAILED);
    std::span<std::byte> engine(static_cast<std::byte*>(mapped), layout.region_bytes);
    fill_random(engine, 42);
    const std::vector<std::byte> original(engine.begin(), engine.end());

    auto region = device->open_region(memfd_handle(memfd, layout.region_bytes));
    ASSERT_TRUE(region.is_ok()) << region.status().to_string();
    const std::vector<uint64_t> blocks = {3, 0, 2};
    auto arena = device->allocate_arena(blocks.size() * layout.block_bytes() + 4096);
    ASSERT_TRUE(arena.is_ok()) << arena.status().to_string();

    auto gathered =
        submit_async(*device, plane_batch(*region, *arena, layout, blocks, /*gather=*/true));
    ASSERT_TRUE(gathered.get().is_ok());
    std::span<std::byte> slots = bytes_of(**arena);
    for (size_t k = 0; k < blocks.size(); ++k) {
      uint64_t slot_offset = k * layout.block_bytes();
      for (const Plane& plane : layout.planes) {
        const uint64_t engine_offset = plane.offset + blocks[k] * plane.stride;
        ASSERT_EQ(
            std::memcmp(slots.data() + slot_offset, original.data() + engine_offset, plane.bytes),
            0)
            << "slot " << k << " at " << slot_offset;
        slot_offset += plane.bytes;
      }
    }

    // Wipe the engine's memory and scatter the slots into other blocks (3->1, 0->3,
    // 2->0): only those blocks' planes change, and they change to the saved bytes.
    std::memset(engine.data(), 0, engine.size());
    const std::vector<uint64_t> targets = {1, 3, 0};
    auto scattered =
        submit_async(*device, plane_batch(*region, *arena, layout, targets, /*gather=*/false));
    ASSERT_TRUE(scattered.get().is_ok());
    std::vector<std::byte> expected(layout.region_bytes, std::byte{0});
    for (size_t k = 0; k < blocks.size(); ++k) {
      for (const Plane& plane : layout.planes) {
        std::memcpy(expected.data() + plane.offset + targets[k] * plane.stride,
                    original.data() + plane.offset + blocks[k] * plane.stride, plane.bytes);
      }
    }
    EXPECT_EQ(std::memcmp(engine.data(), expected.data(), expected.size()), 0);
    ::munmap(mapped, layout.region_bytes);
  }
}

TEST_P(HostDeviceCopy, ManyConcurrentBatchesEachCompleteExactlyOnce) {
  auto device = make_host_device(GetParam());
  auto source = device->allocate_pinned_pool(1 << 20);
  auto destination = device->allocate_arena(64 << 20);
  ASSERT_TRUE(source.is_ok() && destination.is_ok());
  fill_random(bytes_of(**source), 7);
  constexpr int kBatches = 64;
  std::vector<std::atomic<int>> calls(kBatches);
  for (int b = 0; b < kBatches; ++b) {
    CopyBatch batch;
    const uint32_t s = batch.memory_index(*source), d = batch.memory_index(*destination);
    batch.segments.push_back({s, d, 0, uint64_t(b) << 20, 1 << 20});
    Status submitted = device->submit(std::move(batch), [&calls, b](Status st) {
      EXPECT_TRUE(st.is_ok());
      calls[b].fetch_add(1);
    });
    ASSERT_TRUE(submitted.is_ok());
  }
  device->drain();
  for (int b = 0; b < kBatches; ++b) {
    EXPECT_EQ(calls[b].load(), 1) << "batch " << b;
    EXPECT_EQ(std::memcmp(bytes_of(**destination).data() + (uint64_t(b) << 20),
                          bytes_of(**source).data(), 1 << 20),
              0);
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, HostDeviceCopy, ::testing::Values(1, 4));

TEST(SplitIntoShards, BalancesBytesAndCoversEverySegmentOnce) {
  // 10 MiB in one segment, then small ones, a zero-byte one and a 3-byte one.
  std::vector<CopySegment> segments = {{0, 1, 0, 0, 10 << 20},
                                       {0, 1, 100, 20 << 20, 4096},
                                       {0, 1, 200, 30 << 20, 0},
                                       {0, 1, 300, 40 << 20, 3}};
  const uint64_t total = (10 << 20) + 4096 + 3;
  auto shards = split_into_shards(segments, 4);
  ASSERT_EQ(shards.size(), 4u);
  std::vector<CopySegment> pieces;
  for (const auto& shard : shards) {
    uint64_t shard_bytes = 0;
    for (const CopySegment& piece : shard) {
      EXPECT_GT(piece.bytes, 0u);
      shard_bytes += piece.bytes;
      pieces.push_back(piece);
    }
    EXPECT_TRUE(shard_bytes == total / 4 || shard_bytes == total / 4 + 1) << shard_bytes;
  }
  // Pieces in order reassemble the non-empty segments exactly.
  size_t next = 0;
  for (const CopySegment& seg : segments) {
    uint64_t covered = 0;
    while (covered < seg.bytes) {
      ASSERT_LT(next, pieces.size());
      const CopySegment& piece = pieces[next++];
      EXPECT_EQ(piece.src_offset, seg.src_offset + covered);
      EXPECT_EQ(piece.dst_offset, seg.dst_offset + covered);
      covered += piece.bytes;
    }
    EXPECT_EQ(covered, seg.bytes);
  }
  EXPECT_EQ(next, pieces.size());
}

TEST(SplitIntoShards, NeverMakesEmptyShardsOrZeroShards) {
  std::vector<CopySegment> tiny = {{0, 1, 0, 0, 2}};
  EXPECT_EQ(split_into_shards(tiny, 8).size(), 2u);
  EXPECT_EQ(split_into_shards({}, 8).size(), 1u);
  EXPECT_EQ(split_into_shards(tiny, 0).size(), 1u);
}

TEST(HostDevice, EmptyBatchCompletesOkOnAWorkerThread) {
  auto device = make_host_device(2);
  std::promise<std::thread::id> ran_on;
  Status submitted = device->submit(CopyBatch{}, [&ran_on](Status st) {
    EXPECT_TRUE(st.is_ok());
    ran_on.set_value(std::this_thread::get_id());
  });
  ASSERT_TRUE(submitted.is_ok());
  EXPECT_NE(ran_on.get_future().get(), std::this_thread::get_id());
}

// A worker held inside a completion callback keeps the next batch queued; the region
// it reads must survive the caller dropping its last reference.
TEST(HostDevice, InFlightBatchKeepsRegionAlive) {
  auto device = make_host_device(1);
  const uint64_t bytes = 1 << 20;
  UniqueFd memfd = make_memfd(bytes);
  auto region = device->open_region(memfd_handle(memfd, bytes));
  auto arena = device->allocate_arena(bytes);
  ASSERT_TRUE(region.is_ok() && arena.is_ok());
  fill_random(bytes_of(**region), 3);
  const std::vector<std::byte> original(bytes_of(**region).begin(), bytes_of(**region).end());

  Gate gate;
  Status blocker = device->submit(CopyBatch{}, [&gate](Status) { gate.wait(); });
  ASSERT_TRUE(blocker.is_ok());
  CopyBatch batch;
  const uint32_t r = batch.memory_index(*region), a = batch.memory_index(*arena);
  batch.segments.push_back({r, a, 0, 0, bytes});
  std::future<Status> copied = submit_async(*device, std::move(batch));

  std::weak_ptr<Memory> weak_region = *region;
  region = Result<std::shared_ptr<Memory>>(internal_error("dropped by the caller"));
  EXPECT_FALSE(weak_region.expired()) << "the queued batch must hold the region";
  gate.open();
  EXPECT_TRUE(copied.get().is_ok());
  device->drain();
  EXPECT_TRUE(weak_region.expired()) << "the device must let go once the batch is done";
  EXPECT_EQ(std::memcmp(bytes_of(**arena).data(), original.data(), bytes), 0);
}

TEST(HostDevice, DrainWaitsForEveryBatch) {
  auto device = make_host_device(1);
  std::atomic<int> completed{0};
  Gate gate;
  Status first = device->submit(CopyBatch{}, [&](Status) {
    gate.wait();
    completed.fetch_add(1);
  });
  Status second = device->submit(CopyBatch{}, [&](Status) { completed.fetch_add(1); });
  ASSERT_TRUE(first.is_ok() && second.is_ok());

  std::promise<void> draining;
  std::future<int> seen_after_drain = std::async(std::launch::async, [&] {
    draining.set_value();
    device->drain();
    return completed.load();
  });
  draining.get_future().wait();
  // While the first callback is held, drain cannot have returned.
  EXPECT_NE(seen_after_drain.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  gate.open();
  EXPECT_EQ(seen_after_drain.get(), 2);
}

TEST(HostDevice, DestructorCompletesQueuedBatches) {
  auto device = make_host_device(1);
  auto source = device->allocate_pinned_pool(8 << 20);
  auto destination = device->allocate_arena(8 << 20);
  ASSERT_TRUE(source.is_ok() && destination.is_ok());
  fill_random(bytes_of(**source), 11);
  std::atomic<int> calls{0};
  for (int i = 0; i < 4; ++i) {
    CopyBatch batch;
    const uint32_t s = batch.memory_index(*source), d = batch.memory_index(*destination);
    batch.segments.push_back({s, d, uint64_t(i) << 21, uint64_t(i) << 21, 2 << 20});
    ASSERT_TRUE(device->submit(std::move(batch), [&calls](Status) { calls.fetch_add(1); }).is_ok());
  }
  device.reset();
  EXPECT_EQ(calls.load(), 4);
  EXPECT_EQ(std::memcmp(bytes_of(**destination).data(), bytes_of(**source).data(), 8 << 20), 0);
}

}  // namespace
}  // namespace kvtier
