// The staging kernels' index math and copy loop (cuda/staging_index.h), on the CPU,
// against a plain reference for every layout kvtier knows: vLLM's flash-attention cache
// (one tensor per layer and K/V), FlashInfer's (K and V of a block side by side per
// layer), MLA (one latent plane per layer), a cross-layer cache (a block's every layer
// together), and odd ones: plane sizes that are no multiple of 16, planes starting at
// unaligned offsets, planes in several regions. Block ids come in any order; ranges of
// planes are packed like whole blocks; lanes (a CUDA block's threads) together copy
// every byte of a plane and nothing else.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/staging_index.h"

namespace kvtier::staging {
namespace {

// A paged cache described the way a Hello's layout describes it: each plane's region,
// offset of engine block 0 and stride between blocks.
struct PlaneDesc {
  int region;
  uint64_t offset;
  uint64_t stride;
  uint64_t bytes;
};
struct TestLayout {
  std::string name;
  uint64_t num_blocks;
  std::vector<uint64_t> region_bytes;
  std::vector<PlaneDesc> planes;
};

TestLayout vllm_layout(uint32_t layers, uint64_t plane, uint64_t blocks) {
  TestLayout l{"vllm", blocks, {2 * layers * blocks * plane}, {}};
  for (uint32_t p = 0; p < 2 * layers; ++p)
    l.planes.push_back({0, p * blocks * plane, plane, plane});
  return l;
}
TestLayout flashinfer_layout(uint32_t layers, uint64_t plane, uint64_t blocks) {
  // One tensor per layer, [blocks][2][tokens][heads][dim]: K then V of a block together.
  TestLayout l{"flashinfer", blocks, {}, {}};
  for (uint32_t layer = 0; layer < layers; ++layer) {
    l.region_bytes.push_back(blocks * 2 * plane);
    l.planes.push_back({static_cast<int>(layer), 0, 2 * plane, plane});
    l.planes.push_back({static_cast<int>(layer), plane, 2 * plane, plane});
  }
  return l;
}
TestLayout mla_layout(uint32_t layers, uint64_t latent, uint64_t blocks) {
  TestLayout l{"mla", blocks, {layers * blocks * latent}, {}};
  for (uint32_t p = 0; p < layers; ++p)
    l.planes.push_back({0, p * blocks * latent, latent, latent});
  return l;
}
TestLayout cross_layer_layout(uint32_t layers, uint64_t plane, uint64_t blocks) {
  // [blocks][layers][2][…]: a block's every layer in one run.
  const uint64_t block = 2 * layers * plane;
  TestLayout l{"cross-layer", blocks, {blocks * block}, {}};
  for (uint32_t p = 0; p < 2 * layers; ++p) l.planes.push_back({0, p * plane, block, plane});
  return l;
}
// Plane sizes that are no multiple of 16 (or 8, 4, 2), starting at odd offsets.
TestLayout odd_layout(uint64_t blocks) {
  TestLayout l{"odd", blocks, {}, {}};
  const uint64_t sizes[] = {4100, 7, 48, 4096, 1, 4104, 4098};
  const uint64_t lead[] = {3, 0, 16, 5, 1, 8, 2};
  for (size_t p = 0; p < std::size(sizes); ++p) {
    const uint64_t stride = sizes[p] + (p % 3) * 5;
    l.region_bytes.push_back(lead[p] + blocks * stride);
    l.planes.push_back({static_cast<int>(p), lead[p], stride, sizes[p]});
  }
  return l;
}

// Host memory standing in for the GPU: regions, the staging buffer, the plane table,
// each 16-byte aligned at its start.
struct Memory {
  explicit Memory(const TestLayout& layout) {
    for (uint64_t bytes : layout.region_bytes) regions.emplace_back(bytes + 16);
  }
  std::vector<std::vector<unsigned char>> regions;
  unsigned char* region(int r) { return align(regions[r].data()); }
  static unsigned char* align(unsigned char* p) {
    return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(p) + 15) & ~uintptr_t{15});
  }
};

std::vector<Plane> plane_table(const TestLayout& layout, Memory& memory) {
  std::vector<Plane> table;
  uint64_t in_block = 0;
  for (const PlaneDesc& p : layout.planes) {
    table.push_back({reinterpret_cast<uint64_t>(memory.region(p.region)) + p.offset, p.stride,
                     p.bytes, in_block});
    in_block += p.bytes;
  }
  return table;
}

void fill_random(Memory& memory, uint32_t seed) {
  std::mt19937 rng(seed);
  for (auto& r : memory.regions)
    for (auto& b : r) b = static_cast<unsigned char>(rng());
}

// The reference: planes [begin, begin + count) of each block, one memcpy each, from
// the layout's own description (no shared arithmetic with the header).
std::vector<unsigned char> reference_gather(const TestLayout& layout, Memory& memory,
                                            const std::vector<uint32_t>& ids, uint32_t begin,
                                            uint32_t count) {
  std::vector<unsigned char> out;
  for (uint32_t id : ids) {
    for (uint32_t p = begin; p < begin + count; ++p) {
      const PlaneDesc& d = layout.planes[p];
      const unsigned char* src = memory.region(d.region) + d.offset + id * d.stride;
      out.insert(out.end(), src, src + d.bytes);
    }
  }
  return out;
}

uint64_t row_of(const TestLayout& layout, uint32_t begin, uint32_t count) {
  uint64_t row = 0;
  for (uint32_t p = begin; p < begin + count; ++p) row += layout.planes[p].bytes;
  return row;
}

Launch make_launch(const std::vector<Plane>& table, unsigned char* staging, uint64_t row,
                   uint32_t begin, uint32_t count, const std::vector<uint32_t>& ids,
                   Direction direction) {
  Launch launch{};
  launch.planes = reinterpret_cast<uint64_t>(table.data());
  launch.staging = reinterpret_cast<uint64_t>(staging);
  launch.row_bytes = row;
  launch.plane_begin = begin;
  launch.plane_count = count;
  launch.block_count = static_cast<uint32_t>(ids.size());
  launch.direction = direction;
  std::copy(ids.begin(), ids.end(), launch.block_ids);
  return launch;
}

// Gathers `ids` (range begin/count) with run_on_host and compares with the reference;
// then scatters the staged rows into wiped regions and checks that exactly the named
// planes of the named blocks came back, every other byte still zero.
void check_round_trip(const TestLayout& layout, const std::vector<uint32_t>& ids, uint32_t begin,
                      uint32_t count, uint64_t staging_lead) {
  SCOPED_TRACE(layout.name + " planes " + std::to_string(begin) + "+" + std::to_string(count) +
               ", " + std::to_string(ids.size()) + " blocks, staging at +" +
               std::to_string(staging_lead));
  Memory memory(layout);
  fill_random(memory, static_cast<uint32_t>(ids.size() * 131 + begin));
  const auto table = plane_table(layout, memory);
  const uint64_t row = row_of(layout, begin, count);
  std::vector<unsigned char> staging_buffer(staging_lead + ids.size() * row + 32, 0xee);
  unsigned char* staging = Memory::align(staging_buffer.data()) + staging_lead;
  run_on_host(make_launch(table, staging, row, begin, count, ids, kGather));
  const auto expected = reference_gather(layout, memory, ids, begin, count);
  ASSERT_EQ(expected.size(), ids.size() * row);
  ASSERT_EQ(std::memcmp(staging, expected.data(), expected.size()), 0) << "gathered rows differ";
  EXPECT_EQ(staging[expected.size()], 0xee) << "the gather wrote past its rows";

  Memory wiped(layout);
  for (auto& r : wiped.regions) std::fill(r.begin(), r.end(), 0);
  const auto wiped_table = plane_table(layout, wiped);
  run_on_host(make_launch(wiped_table, staging, row, begin, count, ids, kScatter));
  // Expected regions: zero, plus the named slices copied from the original.
  Memory want(layout);
  for (auto& r : want.regions) std::fill(r.begin(), r.end(), 0);
  for (uint32_t id : ids) {
    for (uint32_t p = begin; p < begin + count; ++p) {
      const PlaneDesc& d = layout.planes[p];
      std::memcpy(want.region(d.region) + d.offset + id * d.stride,
                  memory.region(d.region) + d.offset + id * d.stride, d.bytes);
    }
  }
  for (size_t r = 0; r < layout.region_bytes.size(); ++r) {
    ASSERT_EQ(std::memcmp(wiped.region(static_cast<int>(r)), want.region(static_cast<int>(r)),
                          layout.region_bytes[r]),
              0)
        << "region " << r << " after the scatter";
  }
}

std::vector<uint32_t> shuffled_ids(uint64_t num_blocks, size_t count, uint32_t seed) {
  std::vector<uint32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  ids.resize(count);
  return ids;
}

std::vector<TestLayout> every_layout() {
  return {vllm_layout(4, 4096, 24),        vllm_layout(3, 8192, 10),
          flashinfer_layout(4, 4096, 16),  mla_layout(5, 16 * 576 * 2, 9),
          cross_layer_layout(4, 4096, 12), odd_layout(11)};
}

TEST(StagingIndexTest, WholeBlocksRoundTripForEveryLayoutInAnyBlockOrder) {
  for (const TestLayout& layout : every_layout()) {
    const auto planes = static_cast<uint32_t>(layout.planes.size());
    check_round_trip(layout, shuffled_ids(layout.num_blocks, layout.num_blocks / 2, 7), 0, planes,
                     0);
    // Descending ids, every block.
    std::vector<uint32_t> all(layout.num_blocks);
    std::iota(all.rbegin(), all.rend(), 0);
    check_round_trip(layout, all, 0, planes, 0);
  }
}

TEST(StagingIndexTest, PlaneRangesPackOnlyTheirPlanes) {
  for (const TestLayout& layout : every_layout()) {
    const auto planes = static_cast<uint32_t>(layout.planes.size());
    const auto ids = shuffled_ids(layout.num_blocks, 5, 11);
    check_round_trip(layout, ids, 0, 1, 0);                    // the first plane
    check_round_trip(layout, ids, planes - 1, 1, 0);           // the last
    check_round_trip(layout, ids, planes / 2, planes / 2, 0);  // a middle-to-end run
    if (planes >= 4) check_round_trip(layout, ids, 2, 2, 0);   // one layer's K and V
  }
}

TEST(StagingIndexTest, StagingAtUnalignedOffsetsStillCopiesEveryByte) {
  for (uint64_t lead : {1u, 4u, 8u, 12u, 15u}) {
    check_round_trip(vllm_layout(2, 4096, 8), shuffled_ids(8, 6, 3), 0, 4, lead);
    check_round_trip(odd_layout(6), shuffled_ids(6, 6, 5), 1, 5, lead);
  }
}

TEST(StagingIndexTest, TheMostBlocksOneLaunchCarries) {
  const TestLayout layout = vllm_layout(1, 64, kMaxBlocksPerLaunch + 40);
  check_round_trip(layout, shuffled_ids(layout.num_blocks, kMaxBlocksPerLaunch, 9), 0, 2, 0);
}

// unit_copy against hand-computed addresses for one vLLM layout.
TEST(StagingIndexTest, UnitsAreBlockMajorWithPlanesInLayoutOrder) {
  const uint64_t plane = 4096, blocks = 10;
  std::vector<Plane> table;
  for (uint32_t p = 0; p < 4; ++p)
    table.push_back({1000000 + p * blocks * plane, plane, plane, p * plane});
  Launch launch{};
  launch.planes = reinterpret_cast<uint64_t>(table.data());
  launch.staging = 5000000;
  launch.row_bytes = 2 * plane;
  launch.plane_begin = 2;
  launch.plane_count = 2;
  launch.block_count = 2;
  launch.block_ids[0] = 7;
  launch.block_ids[1] = 3;
  launch.direction = kGather;
  ASSERT_EQ(unit_count(launch), 4u);
  const Copy u0 = unit_copy(launch, table.data(), 0);  // block 7, plane 2
  EXPECT_EQ(u0.src, 1000000 + 2 * blocks * plane + 7 * plane);
  EXPECT_EQ(u0.dst, 5000000u);
  EXPECT_EQ(u0.bytes, plane);
  const Copy u3 = unit_copy(launch, table.data(), 3);  // block 3, plane 3
  EXPECT_EQ(u3.src, 1000000 + 3 * blocks * plane + 3 * plane);
  EXPECT_EQ(u3.dst, 5000000 + 2 * plane + plane);
  launch.direction = kScatter;
  const Copy s3 = unit_copy(launch, table.data(), 3);
  EXPECT_EQ(s3.src, u3.dst);
  EXPECT_EQ(s3.dst, u3.src);
}

// Lanes together copy every byte and nothing outside the copy, for every alignment, odd
// sizes and a few lane counts.
TEST(StagingIndexTest, LanesCoverEveryByteExactlyOnce) {
  std::vector<unsigned char> src(9000), dst(9000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 1);
  unsigned char* s = Memory::align(src.data());
  unsigned char* d = Memory::align(dst.data());
  for (uint64_t src_off : {0u, 4u, 8u, 1u}) {
    for (uint64_t dst_off : {0u, 8u, 3u}) {
      for (uint64_t bytes : {0u, 1u, 15u, 16u, 17u, 4096u, 4100u, 8191u}) {
        for (uint32_t lanes : {1u, 32u, 256u}) {
          std::fill(dst.begin(), dst.end(), 0);
          for (uint32_t lane = 0; lane < lanes; ++lane) {
            copy_lanes({reinterpret_cast<uint64_t>(s + src_off),
                        reinterpret_cast<uint64_t>(d + dst_off), bytes},
                       lane, lanes);
          }
          ASSERT_EQ(std::memcmp(d + dst_off, s + src_off, bytes), 0)
              << "src+" << src_off << " dst+" << dst_off << " " << bytes << " bytes, " << lanes
              << " lanes";
          EXPECT_EQ(d[dst_off + bytes], 0) << "wrote past the end";
          if (dst_off > 0) {
            EXPECT_EQ(d[dst_off - 1], 0) << "wrote before the start";
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvtier::staging
