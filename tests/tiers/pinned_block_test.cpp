// PinnedBlock and PendingWrite: the handles BlockStore hands out for its pins.
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "tests/tiers/test_memory.h"
#include "tiers/block_store.h"

namespace kvtier {
namespace {

using tiers_test::key_of;
using tiers_test::make_memory;

static_assert(!std::is_copy_constructible_v<PinnedBlock>);
static_assert(!std::is_copy_assignable_v<PinnedBlock>);
static_assert(std::is_nothrow_move_constructible_v<PinnedBlock>);
static_assert(std::is_nothrow_move_assignable_v<PinnedBlock>);
static_assert(!std::is_copy_constructible_v<PendingWrite>);
static_assert(!std::is_copy_assignable_v<PendingWrite>);
static_assert(std::is_nothrow_move_constructible_v<PendingWrite>);

constexpr uint64_t kBlock = 1024;

// HBM and RAM of 2 blocks each.
class PinnedBlockTest : public ::testing::Test {
 protected:
  PinnedBlockTest()
      : store_(std::make_unique<BlockStore>(
            std::vector<BlockStore::TierMemory>{{Tier::kHbm, make_memory(2 * kBlock), kBlock},
                                                {Tier::kRam, make_memory(2 * kBlock), kBlock}})) {
    EXPECT_TRUE(store_->register_layout(layout_, kBlock).is_ok());
  }

  BlockKey key(uint32_t n) const { return key_of(layout_, n); }
  // A committed block in `tier`.
  BlockLocation put(uint32_t n, Tier tier = Tier::kHbm) {
    const std::vector<Tier> allowed = {tier};
    auto reserved = store_->reserve(key(n), allowed, 0);
    if (!reserved.is_ok() || !reserved->has_value()) {
      ADD_FAILURE() << "block " << n << " was not reserved";
      return {};
    }
    const BlockLocation location = (*reserved)->location();
    (*reserved)->commit();
    return location;
  }
  uint32_t pins(uint32_t n) const {
    auto info = store_->lookup(key(n));
    return info ? info->pins : 0;
  }

  const LayoutKey layout_{3, 0x5eed};
  std::unique_ptr<BlockStore> store_;
};

TEST_F(PinnedBlockTest, AnEmptyHandleHoldsNothing) {
  PinnedBlock empty;
  EXPECT_FALSE(empty);
  empty.reset();  // no-op
  PendingWrite no_write;
  EXPECT_FALSE(no_write);
  no_write.commit();
  no_write.abort();
  EXPECT_EQ(store_->pinned_blocks(), 0u);
}

TEST_F(PinnedBlockTest, DestructionUnpinsExactlyOnce) {
  const BlockLocation location = put(1);
  PinnedBlock outer = store_->pin(key(1), 0);
  {
    PinnedBlock inner = store_->pin(key(1), 0);
    ASSERT_TRUE(inner);
    EXPECT_EQ(inner.key(), key(1));
    EXPECT_EQ(inner.location().tier, location.tier);
    EXPECT_EQ(inner.location().offset, location.offset);
    EXPECT_EQ(pins(1), 2u);
  }
  EXPECT_EQ(pins(1), 1u);  // inner's pin, once; outer's stays
  EXPECT_EQ(store_->pinned_blocks(), 1u);
  outer.reset();
  EXPECT_FALSE(outer);
  EXPECT_EQ(pins(1), 0u);
  EXPECT_EQ(store_->pinned_blocks(), 0u);
}

TEST_F(PinnedBlockTest, MovesTransferThePin) {
  put(1);
  put(2);
  PinnedBlock first = store_->pin(key(1), 0);
  PinnedBlock moved(std::move(first));
  EXPECT_FALSE(first);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  ASSERT_TRUE(moved);
  EXPECT_EQ(moved.key(), key(1));
  EXPECT_EQ(pins(1), 1u);
  first.reset();  // the moved-from handle releases nothing
  EXPECT_EQ(pins(1), 1u);

  // Assigning over a handle releases what it held and takes the other's pin.
  PinnedBlock other = store_->pin(key(2), 0);
  EXPECT_EQ(pins(2), 1u);
  other = std::move(moved);
  EXPECT_EQ(pins(2), 0u);
  EXPECT_EQ(pins(1), 1u);
  EXPECT_EQ(other.key(), key(1));
  other = std::move(other);  // self-move keeps the pin
  EXPECT_EQ(pins(1), 1u);

  // Through a vector that grows (its elements move): still one pin per handle.
  std::vector<PinnedBlock> held;
  for (int i = 0; i < 20; ++i) held.push_back(store_->pin(key(2), 0));
  held.push_back(std::move(other));
  EXPECT_EQ(pins(2), 20u);
  EXPECT_EQ(pins(1), 1u);
  held.erase(held.begin(), held.begin() + 5);
  EXPECT_EQ(pins(2), 15u);
  held.clear();
  EXPECT_EQ(pins(1), 0u);
  EXPECT_EQ(pins(2), 0u);
  EXPECT_EQ(store_->pinned_blocks(), 0u);
}

TEST_F(PinnedBlockTest, AMovedBlocksOldSlotIsFreedWhenTheLastHandleGoes) {
  const BlockLocation old = put(1, Tier::kHbm);
  PinnedBlock reader = store_->pin(key(1), 0);
  PinnedBlock second_reader = store_->pin(key(1), 0);
  auto move_1 = store_->begin_move(key(1), Tier::kRam);
  ASSERT_TRUE(move_1.is_ok());
  move_1->commit();
  EXPECT_EQ(store_->lookup(key(1))->location.tier, Tier::kRam);
  // The readers still name the slot they pinned, which is still allocated.
  EXPECT_EQ(reader.location().tier, Tier::kHbm);
  EXPECT_EQ(reader.location().offset, old.offset);
  EXPECT_EQ(store_->usage(Tier::kHbm).used_bytes, kBlock);

  PinnedBlock handed_on = std::move(reader);  // a move is not a release
  EXPECT_EQ(store_->usage(Tier::kHbm).used_bytes, kBlock);
  second_reader.reset();
  EXPECT_EQ(store_->usage(Tier::kHbm).used_bytes, kBlock);
  handed_on.reset();  // the last pin: the old slot is free
  EXPECT_EQ(store_->usage(Tier::kHbm).used_bytes, 0u);
  EXPECT_EQ(store_->usage(Tier::kRam).used_bytes, kBlock);
  EXPECT_EQ(store_->pinned_blocks(), 0u);
  EXPECT_TRUE(store_->begin_move(key(1), Tier::kHbm).is_ok());  // no free pending
}

TEST_F(PinnedBlockTest, AHandleKeepsItsBlockThroughAnEvictionAttempt) {
  const BlockLocation location = put(1);
  PinnedBlock pin = store_->pin(key(1), 0);
  EXPECT_FALSE(store_->evict(key(1)));
  auto info = store_->lookup(key(1));
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->location.offset, location.offset);
  EXPECT_EQ(store_->usage(Tier::kHbm).used_bytes, kBlock);
  // Its slot is not handed out: the one other HBM slot goes, then there is no room.
  put(2);
  EXPECT_FALSE(store_->has_room(Tier::kHbm, kBlock));

  pin.reset();
  EXPECT_TRUE(store_->evict(key(1)));
  EXPECT_EQ(store_->lookup(key(1)), std::nullopt);
  EXPECT_TRUE(store_->has_room(Tier::kHbm, kBlock));
}

TEST_F(PinnedBlockTest, APendingWriteKeepsItsBlockInvisibleAndUnevictable) {
  const std::vector<Tier> hbm = {Tier::kHbm};
  auto reserved = store_->reserve(key(1), hbm, 0);
  ASSERT_TRUE(reserved.is_ok() && reserved->has_value());
  PendingWrite write = std::move(**reserved);
  EXPECT_FALSE(store_->evict(key(1)));
  EXPECT_FALSE(store_->pin(key(1), 0));
  EXPECT_EQ(store_->lookup(key(1)), std::nullopt);
  write.commit();
  EXPECT_FALSE(write);
  EXPECT_TRUE(store_->pin(key(1), 0));
  write.abort();  // spent: nothing happens
  EXPECT_TRUE(store_->lookup(key(1)).has_value());
}

TEST_F(PinnedBlockTest, HandlesThatOutliveTheStoreReleaseNothing) {
  put(1);
  PinnedBlock pin = store_->pin(key(1), 0);
  PinnedBlock second = store_->pin(key(1), 0);
  const std::vector<Tier> ram = {Tier::kRam};
  auto reserved = store_->reserve(key(2), ram, 0);
  ASSERT_TRUE(reserved.is_ok() && reserved->has_value());
  PendingWrite write = std::move(**reserved);
  store_.reset();  // as when the event loop drops a completion unrun at shutdown
  EXPECT_TRUE(pin);
  pin.reset();
  PinnedBlock moved = std::move(second);
  moved.reset();
  write.abort();  // the last handle: frees what it shared with the store
  EXPECT_FALSE(pin);
  EXPECT_FALSE(write);
}

}  // namespace
}  // namespace kvtier
