// BlockStore with a persistent (memory-less) NVMe tier: recovered blocks take their
// recorded slots, and a slot given up is not reused until its release is confirmed.
#include <gtest/gtest.h>

#include <set>

#include "tests/tiers/test_memory.h"
#include "tiers/block_store.h"

namespace kvtier {
namespace {

using tiers_test::key_of;
using tiers_test::make_memory;

constexpr uint64_t kBlock = 4096;

TEST(SlabAllocatorAllocateAt, RebuildsAllocationsAndRejectsConflicts) {
  SlabAllocator slabs(4 * 4 * kBlock, 4 * kBlock);  // 4 slabs of 4 one-block slots
  ASSERT_TRUE(slabs.allocate_at(2 * kBlock, kBlock).is_ok());
  ASSERT_TRUE(slabs.allocate_at(8 * kBlock, 2 * kBlock).is_ok());  // slab 2: 2-block slots
  EXPECT_EQ(slabs.used_slots(), 2u);
  EXPECT_EQ(slabs.used_bytes(), 3 * kBlock);
  EXPECT_EQ(slabs.free_slabs(), 2u);
  EXPECT_FALSE(slabs.allocate_at(2 * kBlock, kBlock).is_ok());      // taken
  EXPECT_FALSE(slabs.allocate_at(2 * kBlock + 1, kBlock).is_ok());  // not a slot boundary
  EXPECT_FALSE(slabs.allocate_at(16 * kBlock, kBlock).is_ok());     // beyond capacity
  EXPECT_FALSE(slabs.allocate_at(9 * kBlock, kBlock).is_ok());      // slab of another size
  // The skipped slots of slab 0 (0 and 1), then slot 3; nothing is handed out twice.
  std::set<uint64_t> offsets;
  for (int i = 0; i < 3; ++i) {
    auto offset = slabs.allocate(kBlock);
    ASSERT_TRUE(offset.is_ok());
    EXPECT_LT(*offset, 4 * kBlock);
    EXPECT_NE(*offset, 2 * kBlock);
    offsets.insert(*offset);
  }
  EXPECT_EQ(offsets.size(), 3u);
  slabs.free(2 * kBlock, kBlock);
  EXPECT_TRUE(slabs.allocate_at(2 * kBlock, kBlock).is_ok());  // a freed slot can be re-taken
}

class NvmeBlockStoreTest : public ::testing::Test {
 protected:
  NvmeBlockStoreTest()
      : store_({{Tier::kRam, make_memory(4 * kBlock), kBlock},
                {Tier::kNvme, nullptr, 4 * kBlock, 8 * kBlock, /*confirm_release=*/true}}) {
    EXPECT_TRUE(store_.register_layout(layout_, kBlock).is_ok());
  }
  const LayoutKey layout_{1, 0x42};
  BlockStore store_;
};

TEST_F(NvmeBlockStoreTest, RecoveredBlocksAreReadyAtTheirSlots) {
  EXPECT_TRUE(store_.configured(Tier::kNvme));
  EXPECT_EQ(store_.memory(Tier::kNvme), nullptr);
  ASSERT_TRUE(store_.insert_recovered(key_of(layout_, 1), {Tier::kNvme, 5 * kBlock}, 7).is_ok());
  EXPECT_FALSE(store_.insert_recovered(key_of(layout_, 1), {Tier::kNvme, 6 * kBlock}, 7).is_ok());
  EXPECT_FALSE(store_.insert_recovered(key_of(layout_, 2), {Tier::kNvme, 5 * kBlock}, 7).is_ok());
  EXPECT_FALSE(store_.insert_recovered(key_of(layout_, 3), {Tier::kNvme, 8 * kBlock}, 7).is_ok());
  EXPECT_FALSE(store_.insert_recovered(key_of({1, 0x43}, 3), {Tier::kNvme, 0}, 7).is_ok());
  auto info = store_.lookup(key_of(layout_, 1));
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->state, BlockState::kReady);
  EXPECT_EQ(info->location.tier, Tier::kNvme);
  EXPECT_EQ(info->location.offset, 5 * kBlock);
  EXPECT_EQ(info->last_access_ms, 7u);
  TierUsage usage = store_.usage(Tier::kNvme);
  EXPECT_EQ(usage.capacity_bytes, 8 * kBlock);
  EXPECT_EQ(usage.used_bytes, kBlock);
  EXPECT_EQ(usage.blocks, 1u);
}

TEST_F(NvmeBlockStoreTest, NvmeSlotsAreReusedOnlyAfterConfirmation) {
  // Fill the NVMe tier by moving RAM blocks down.
  for (uint32_t n = 0; n < 8; ++n) {
    auto reserved = store_.reserve(key_of(layout_, n), std::vector<Tier>{Tier::kRam}, 1);
    ASSERT_TRUE(reserved.is_ok()) << reserved.status().to_string();
    ASSERT_TRUE(reserved->has_value());
    (*reserved)->commit();
    auto move_1 = store_.begin_move(key_of(layout_, n), Tier::kNvme);
    ASSERT_TRUE(move_1.is_ok());
    move_1->commit();
    EXPECT_TRUE(store_.take_pending_releases().empty());  // RAM slots free at once
  }
  EXPECT_FALSE(store_.has_room(Tier::kNvme, kBlock));
  ASSERT_TRUE(store_.evict(key_of(layout_, 3)));
  EXPECT_EQ(store_.unconfirmed_release_bytes(Tier::kNvme), kBlock);
  EXPECT_FALSE(store_.has_room(Tier::kNvme, kBlock));  // not yet reusable
  auto pending = store_.take_pending_releases();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].key, key_of(layout_, 3));
  EXPECT_EQ(pending[0].location.tier, Tier::kNvme);
  EXPECT_TRUE(store_.take_pending_releases().empty());
  store_.confirm_release(pending[0].location, pending[0].bytes);
  EXPECT_EQ(store_.unconfirmed_release_bytes(Tier::kNvme), 0u);
  EXPECT_TRUE(store_.has_room(Tier::kNvme, kBlock));

  // A promotion back to RAM gives up the NVMe slot the same way.
  auto move_2 = store_.begin_move(key_of(layout_, 4), Tier::kRam);
  ASSERT_TRUE(move_2.is_ok());
  move_2->commit();
  pending = store_.take_pending_releases();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].key, key_of(layout_, 4));
}

}  // namespace
}  // namespace kvtier
