// merge_adjacent_segments: continuations merge, everything else stays, and the bytes
// a batch moves are the same before and after.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "device/device.h"

namespace kvtier {
namespace {

// Every (memory pair, source byte) → destination byte the segments describe.
std::map<std::tuple<uint32_t, uint32_t, uint64_t>, uint64_t> byte_map(
    const std::vector<CopySegment>& segments) {
  std::map<std::tuple<uint32_t, uint32_t, uint64_t>, uint64_t> bytes;
  for (const CopySegment& s : segments) {
    for (uint64_t i = 0; i < s.bytes; ++i)
      bytes[{s.src_memory, s.dst_memory, s.src_offset + i}] = s.dst_offset + i;
  }
  return bytes;
}

TEST(SegmentMerge, MergesContinuationsInAnyOrder) {
  std::vector<CopySegment> segments = {
      {0, 1, 200, 1200, 100}, {0, 1, 0, 1000, 100}, {0, 1, 100, 1100, 100}};
  EXPECT_EQ(merge_adjacent_segments(segments), 2u);
  ASSERT_EQ(segments.size(), 1u);
  EXPECT_EQ(segments[0].src_offset, 0u);
  EXPECT_EQ(segments[0].dst_offset, 1000u);
  EXPECT_EQ(segments[0].bytes, 300u);
}

TEST(SegmentMerge, NeverJoinsAcrossWhereAMemorySplits) {
  // Memory 1 splits at 1000 (one GPU's part ends): 900..1000 and 1000..1100 stay apart,
  // on either side of the copy.
  std::vector<CopySegment> segments = {{0, 1, 0, 900, 100}, {0, 1, 100, 1000, 100}};
  auto split_at_1000 = [](uint32_t memory, uint64_t offset) {
    return memory == 1 && offset == 1000;
  };
  EXPECT_EQ(merge_adjacent_segments(segments, split_at_1000), 0u);
  EXPECT_EQ(segments.size(), 2u);
  std::vector<CopySegment> reversed = {{1, 0, 900, 0, 100}, {1, 0, 1000, 100, 100}};
  EXPECT_EQ(merge_adjacent_segments(reversed, split_at_1000), 0u);
  EXPECT_EQ(merge_adjacent_segments(segments), 1u);  // without the split they join
}

TEST(SegmentMerge, KeepsWhatDoesNotContinue) {
  std::vector<CopySegment> segments = {
      {0, 1, 0, 1000, 100},    // source continues below but destination does not
      {0, 1, 100, 2000, 100},  //
      {0, 2, 200, 1200, 100},  // another destination memory
      {1, 2, 300, 1300, 100},  // another source memory
  };
  EXPECT_EQ(merge_adjacent_segments(segments), 0u);
  EXPECT_EQ(segments.size(), 4u);
}

TEST(SegmentMerge, PreservesTheBytesMovedOnRandomPlaneLayouts) {
  std::mt19937_64 random(42);
  for (int round = 0; round < 200; ++round) {
    // Blocks of `planes` planes; engine blocks are consecutive ids (adjacent when the
    // plane stride equals its size) gathered into consecutive slots.
    const uint64_t plane = 1 + random() % 64, planes = 1 + random() % 6, blocks = 1 + random() % 8;
    const bool packed = random() % 2 == 0;
    const uint64_t stride = packed ? plane : plane + 1 + random() % 16;
    std::vector<CopySegment> segments;
    for (uint64_t b = 0; b < blocks; ++b) {
      for (uint64_t p = 0; p < planes; ++p) {
        segments.push_back(
            {0, 1, p * stride * blocks + b * stride, (b * planes + p) * plane, plane});
      }
    }
    std::shuffle(segments.begin(), segments.end(), random);
    const auto before = byte_map(segments);
    const size_t count = segments.size();
    const size_t removed = merge_adjacent_segments(segments);
    EXPECT_EQ(segments.size() + removed, count);
    EXPECT_EQ(byte_map(segments), before) << "round " << round;
    if (packed && planes == 1 && blocks > 1) {
      EXPECT_EQ(segments.size(), 1u);
    }
  }
}

}  // namespace
}  // namespace kvtier
