#include "tiers/slab_allocator.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

namespace kvtier {
namespace {

uint64_t must_allocate(SlabAllocator& slabs, uint64_t slot_bytes) {
  Result<uint64_t> offset = slabs.allocate(slot_bytes);
  EXPECT_TRUE(offset.is_ok()) << offset.status().to_string();
  return offset.is_ok() ? *offset : UINT64_MAX;
}

TEST(SlabAllocatorTest, CarvesWholeSlabsAndIgnoresTail) {
  SlabAllocator slabs(1000, 300);
  EXPECT_EQ(slabs.capacity_bytes(), 1000u);
  EXPECT_EQ(slabs.slab_bytes(), 300u);
  EXPECT_EQ(slabs.free_slabs(), 3u);
  EXPECT_EQ(slabs.used_bytes(), 0u);
  EXPECT_EQ(slabs.used_slots(), 0u);
  std::set<uint64_t> offsets;
  for (int i = 0; i < 3; ++i) offsets.insert(must_allocate(slabs, 300));
  EXPECT_EQ(offsets, (std::set<uint64_t>{0, 300, 600}));
  EXPECT_EQ(slabs.allocate(300).status().code(), StatusCode::kResourceExhausted);
}

TEST(SlabAllocatorTest, SlabLargerThanCapacityIsClampedToOneSlab) {
  SlabAllocator slabs(1500, 4096);
  EXPECT_EQ(slabs.slab_bytes(), 1500u);
  EXPECT_EQ(slabs.free_slabs(), 1u);
  EXPECT_EQ(must_allocate(slabs, 1024), 0u);
  EXPECT_FALSE(slabs.can_allocate(1024));  // 476 bytes left: not a whole 1024 slot

  SlabAllocator zero_slab(2048, 0);  // 0 means "one slab of the whole capacity"
  EXPECT_EQ(zero_slab.slab_bytes(), 2048u);
  EXPECT_EQ(zero_slab.free_slabs(), 1u);
}

TEST(SlabAllocatorTest, ZeroCapacityAllocatesNothing) {
  SlabAllocator slabs(0, 4096);
  EXPECT_EQ(slabs.free_slabs(), 0u);
  EXPECT_FALSE(slabs.can_allocate(1));
  EXPECT_FALSE(slabs.allocate(1).is_ok());
}

TEST(SlabAllocatorTest, RejectsZeroAndOversizeSlots) {
  SlabAllocator slabs(4096, 1024);
  EXPECT_EQ(slabs.allocate(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(slabs.allocate(1025).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(slabs.can_allocate(0));
  EXPECT_FALSE(slabs.can_allocate(1025));
  EXPECT_TRUE(slabs.can_allocate(1024));
  EXPECT_EQ(slabs.used_bytes(), 0u);
  EXPECT_EQ(slabs.free_slabs(), 4u);
}

TEST(SlabAllocatorTest, SlotsOfOneSizeShareASlab) {
  SlabAllocator slabs(4096, 1024);
  std::set<uint64_t> offsets;
  for (int i = 0; i < 4; ++i) offsets.insert(must_allocate(slabs, 256));
  EXPECT_EQ(offsets, (std::set<uint64_t>{0, 256, 512, 768}));
  EXPECT_EQ(slabs.free_slabs(), 3u);
  EXPECT_EQ(slabs.used_bytes(), 1024u);
  EXPECT_EQ(slabs.used_slots(), 4u);
  // The first slab is full now: the fifth slot opens a second slab.
  EXPECT_EQ(must_allocate(slabs, 256) / 1024, 1u);
  EXPECT_EQ(slabs.free_slabs(), 2u);
}

TEST(SlabAllocatorTest, SlotSizeNotDividingSlabLeavesSlabTail) {
  SlabAllocator slabs(2048, 1024);
  std::set<uint64_t> offsets;
  for (int i = 0; i < 3; ++i) offsets.insert(must_allocate(slabs, 300));
  EXPECT_EQ(offsets, (std::set<uint64_t>{0, 300, 600}));
  EXPECT_EQ(must_allocate(slabs, 300), 1024u);
}

TEST(SlabAllocatorTest, PartialSlabIsReusedBeforeAFreeSlab) {
  SlabAllocator slabs(4096, 1024);
  const uint64_t a = must_allocate(slabs, 512);
  const uint64_t b = must_allocate(slabs, 512);
  EXPECT_EQ(a / 1024, b / 1024);
  EXPECT_EQ(slabs.free_slabs(), 3u);
  slabs.free(a, 512);
  EXPECT_EQ(slabs.free_slabs(), 3u);  // b keeps the slab
  EXPECT_EQ(must_allocate(slabs, 512), a);
  EXPECT_EQ(slabs.free_slabs(), 3u);
}

TEST(SlabAllocatorTest, DifferentSlotSizesTakeDifferentSlabs) {
  SlabAllocator slabs(4096, 1024);
  const uint64_t small = must_allocate(slabs, 256);
  const uint64_t medium = must_allocate(slabs, 512);
  const uint64_t large = must_allocate(slabs, 1024);
  std::set<uint64_t> slab_indices{small / 1024, medium / 1024, large / 1024};
  EXPECT_EQ(slab_indices.size(), 3u);
  EXPECT_EQ(slabs.free_slabs(), 1u);
  EXPECT_EQ(slabs.used_bytes(), 256u + 512u + 1024u);
  EXPECT_EQ(slabs.used_slots(), 3u);
}

TEST(SlabAllocatorTest, EmptySlabReturnsToFreeListForAnySize) {
  SlabAllocator slabs(4096, 1024);
  std::vector<uint64_t> small;
  for (int i = 0; i < 6; ++i) small.push_back(must_allocate(slabs, 256));  // two slabs
  EXPECT_EQ(slabs.free_slabs(), 2u);
  for (uint64_t offset : small) slabs.free(offset, 256);
  EXPECT_EQ(slabs.free_slabs(), 4u);
  EXPECT_EQ(slabs.used_bytes(), 0u);
  EXPECT_EQ(slabs.used_slots(), 0u);
  // Every slab serves a whole-slab slot size now.
  std::set<uint64_t> offsets;
  for (int i = 0; i < 4; ++i) offsets.insert(must_allocate(slabs, 1024));
  EXPECT_EQ(offsets, (std::set<uint64_t>{0, 1024, 2048, 3072}));
}

TEST(SlabAllocatorTest, ExhaustionNamesSlotSizeAndUsage) {
  SlabAllocator slabs(4096, 1024);
  std::vector<uint64_t> offsets;
  for (int i = 0; i < 4; ++i) offsets.push_back(must_allocate(slabs, 1024));
  EXPECT_FALSE(slabs.can_allocate(1024));
  Result<uint64_t> full = slabs.allocate(1024);
  ASSERT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("1024 bytes"), std::string::npos)
      << full.status().message();
  EXPECT_NE(full.status().message().find("4096"), std::string::npos) << full.status().message();
  EXPECT_EQ(slabs.used_bytes(), 4096u);  // a failed allocate changes nothing

  slabs.free(offsets[2], 1024);
  EXPECT_TRUE(slabs.can_allocate(1024));
  EXPECT_EQ(must_allocate(slabs, 1024), offsets[2]);
}

TEST(SlabAllocatorTest, FreeSpaceOfAnotherSlotSizeDoesNotHelp) {
  SlabAllocator slabs(4096, 1024);
  for (int i = 0; i < 3; ++i) must_allocate(slabs, 1024);
  must_allocate(slabs, 256);  // last slab now holds 256-byte slots, 768 bytes free
  EXPECT_FALSE(slabs.can_allocate(512));
  EXPECT_EQ(slabs.allocate(512).status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(slabs.can_allocate(256));
  for (int i = 0; i < 3; ++i) must_allocate(slabs, 256);
  EXPECT_FALSE(slabs.can_allocate(256));
  EXPECT_EQ(slabs.used_bytes(), 4096u);
}

// Random allocate/free against a model: live slots never overlap, never cross a slab
// boundary, and every counter matches.
TEST(SlabAllocatorTest, RandomOperationsMatchModel) {
  constexpr uint64_t kSlab = 4096;
  constexpr uint64_t kCapacity = 16 * kSlab + 1000;  // tail of 1000 bytes unused
  const std::vector<uint64_t> sizes = {512, 1000, 1024, 2048, 4096, 3000};
  for (uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    std::mt19937 rng(seed);
    SlabAllocator slabs(kCapacity, kSlab);
    std::map<uint64_t, uint64_t> live;  // offset → slot bytes
    uint64_t model_used = 0;
    for (int step = 0; step < 20000; ++step) {
      const bool do_free = !live.empty() && (rng() % 100 < 45);
      if (do_free) {
        auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
        slabs.free(it->first, it->second);
        model_used -= it->second;
        live.erase(it);
      } else {
        const uint64_t size = sizes[rng() % sizes.size()];
        const bool expected = slabs.can_allocate(size);
        Result<uint64_t> offset = slabs.allocate(size);
        ASSERT_EQ(offset.is_ok(), expected) << "step " << step;
        if (!offset.is_ok()) {
          ASSERT_EQ(offset.status().code(), StatusCode::kResourceExhausted);
        } else {
          const uint64_t at = *offset;
          ASSERT_LE(at + size, 16 * kSlab);
          ASSERT_EQ(at / kSlab, (at + size - 1) / kSlab) << "slot crosses a slab";
          auto next = live.lower_bound(at);
          if (next != live.end()) {
            ASSERT_LE(at + size, next->first) << "overlaps next";
          }
          if (next != live.begin()) {
            auto prev = std::prev(next);
            ASSERT_LE(prev->first + prev->second, at) << "overlaps previous";
          }
          live[at] = size;
          model_used += size;
        }
      }
      ASSERT_EQ(slabs.used_bytes(), model_used);
      ASSERT_EQ(slabs.used_slots(), live.size());
      std::set<uint64_t> busy_slabs;
      for (const auto& [at, size] : live) busy_slabs.insert(at / kSlab);
      ASSERT_EQ(slabs.free_slabs(), 16 - busy_slabs.size());
    }
  }
}

// The HBM arena holds one part per GPU: a writer's part comes first while it has room.
TEST(SlabAllocatorParts, PrefersTheWritersPartAndFallsBackWhenItIsFull) {
  constexpr uint64_t kSlab = 1 << 20;
  SlabAllocator slabs(4 * kSlab, kSlab, 2);  // parts: slabs {0,1} and {2,3}
  ASSERT_EQ(slabs.parts(), 2u);
  std::vector<uint64_t> in_part_one;
  for (int i = 0; i < 8; ++i) {  // 4 slots per slab: two slabs of part 1
    auto offset = slabs.allocate(kSlab / 4, 1);
    ASSERT_TRUE(offset.is_ok());
    EXPECT_EQ(slabs.part_of(*offset), 1u) << i;
    EXPECT_GE(*offset, 2 * kSlab);
    in_part_one.push_back(*offset);
  }
  // Part 1 is full: the next slot comes from part 0 rather than failing.
  auto spilled = slabs.allocate(kSlab / 4, 1);
  ASSERT_TRUE(spilled.is_ok());
  EXPECT_EQ(slabs.part_of(*spilled), 0u);
  EXPECT_EQ(slabs.used_bytes(1), 2 * kSlab);
  EXPECT_EQ(slabs.used_bytes(0), kSlab / 4);
  EXPECT_EQ(slabs.part_capacity_bytes(), 2 * kSlab);
  // A slot freed in part 1 is the next one part 1 gets, before part 0's partial slab.
  slabs.free(in_part_one[3], kSlab / 4);
  auto back = slabs.allocate(kSlab / 4, 1);
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ(*back, in_part_one[3]);
  // Without a preference, partial slabs anywhere come before free slabs.
  auto any = slabs.allocate(kSlab / 4);
  ASSERT_TRUE(any.is_ok());
  EXPECT_EQ(*any / kSlab, *spilled / kSlab);
  EXPECT_EQ(slabs.free_slabs(), 1u);
  // Freed slabs return to their own part.
  for (uint64_t offset : in_part_one) slabs.free(offset, kSlab / 4);
  EXPECT_EQ(slabs.free_slabs(), 3u);
  auto whole = slabs.allocate(kSlab, 1);
  ASSERT_TRUE(whole.is_ok());
  EXPECT_EQ(slabs.part_of(*whole), 1u);
}

TEST(SlabAllocatorParts, RebuildsAnyPartAndIgnoresPartsThatAreNotWholeSlabs) {
  constexpr uint64_t kSlab = 1 << 20;
  SlabAllocator slabs(4 * kSlab, kSlab, 2);
  ASSERT_TRUE(slabs.allocate_at(3 * kSlab + kSlab / 2, kSlab / 2).is_ok());
  EXPECT_EQ(slabs.free_slabs(), 3u);
  auto next = slabs.allocate(kSlab / 2, 1);  // the rest of the rebuilt slab
  ASSERT_TRUE(next.is_ok());
  EXPECT_EQ(*next, 3 * kSlab);
  SlabAllocator uneven(3 * kSlab, kSlab, 2);  // 3 slabs cannot make 2 equal parts
  EXPECT_EQ(uneven.parts(), 1u);
  auto offset = uneven.allocate(kSlab, 1);  // a preference for a part that is not there
  ASSERT_TRUE(offset.is_ok());
  EXPECT_EQ(*offset, 0u);
}

}  // namespace
}  // namespace kvtier
