#include "tiers/block_store.h"

#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "tests/tiers/test_memory.h"

namespace kvtier {
namespace {

using tiers_test::key_of;
using tiers_test::make_memory;

constexpr uint64_t kBlock = 1024;
const std::vector<Tier> kHbmThenRam = {Tier::kHbm, Tier::kRam};

// HBM holds 2 blocks, RAM 4; one layout of kBlock-byte blocks.
class BlockStoreTest : public ::testing::Test {
 protected:
  BlockStoreTest()
      : hbm_(make_memory(2 * kBlock)),
        ram_(make_memory(4 * kBlock)),
        store_({{Tier::kHbm, hbm_, kBlock}, {Tier::kRam, ram_, kBlock}}) {
    EXPECT_TRUE(store_.register_layout(layout_, kBlock).is_ok());
  }

  BlockKey key(uint32_t n) const { return key_of(layout_, n); }

  // The block's PendingWrite (empty, with a failure, when it was not reserved).
  PendingWrite reserve(uint32_t n, const std::vector<Tier>& allowed = kHbmThenRam) {
    auto reserved = store_.reserve(key(n), allowed, 100);
    EXPECT_TRUE(reserved.is_ok()) << reserved.status().to_string();
    if (!reserved.is_ok() || !reserved->has_value()) {
      ADD_FAILURE() << "block " << n << " was not reserved";
      return {};
    }
    return std::move(**reserved);
  }
  // Reserves and commits; the block's location.
  BlockLocation put(uint32_t n, const std::vector<Tier>& allowed = kHbmThenRam) {
    PendingWrite write = reserve(n, allowed);
    const BlockLocation location = write.location();
    write.commit();
    return location;
  }
  void expect_usage(Tier tier, uint64_t used_bytes, uint64_t blocks) {
    TierUsage usage = store_.usage(tier);
    EXPECT_EQ(usage.used_bytes, used_bytes) << tier_name(tier);
    EXPECT_EQ(usage.blocks, blocks) << tier_name(tier);
  }
  std::vector<BlockKey> visible_in(Tier tier) const {
    std::vector<BlockKey> keys;
    store_.for_each_in_tier(tier, [&](const BlockKey& k, const BlockInfo&) { keys.push_back(k); });
    return keys;
  }

  const LayoutKey layout_{7, 0xabcdef};
  std::shared_ptr<Memory> hbm_;
  std::shared_ptr<Memory> ram_;
  BlockStore store_;
};

TEST_F(BlockStoreTest, MemoryAndUsageListConfiguredTiersFastestFirst) {
  BlockStore store({{Tier::kRam, ram_, kBlock}, {Tier::kHbm, hbm_, kBlock}});  // out of order
  EXPECT_EQ(store.memory(Tier::kHbm), hbm_);
  EXPECT_EQ(store.memory(Tier::kRam), ram_);
  EXPECT_EQ(store.memory(Tier::kNvme), nullptr);
  std::vector<TierUsage> usage = store.usage();
  ASSERT_EQ(usage.size(), 2u);
  EXPECT_EQ(usage[0].tier, Tier::kHbm);
  EXPECT_EQ(usage[0].capacity_bytes, 2 * kBlock);
  EXPECT_EQ(usage[1].tier, Tier::kRam);
  EXPECT_EQ(usage[1].capacity_bytes, 4 * kBlock);
  TierUsage nvme = store.usage(Tier::kNvme);
  EXPECT_EQ(nvme.capacity_bytes + nvme.used_bytes + nvme.blocks, 0u);
}

TEST_F(BlockStoreTest, RegisterLayoutChecksBlockSize) {
  EXPECT_EQ(store_.block_bytes(layout_), kBlock);
  EXPECT_TRUE(store_.register_layout(layout_, kBlock).is_ok());
  EXPECT_EQ(store_.register_layout(layout_, 2 * kBlock).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_.block_bytes(layout_), kBlock);
  const LayoutKey other{8, 0xabcdef};  // same digest, other namespace: another layout
  EXPECT_EQ(store_.block_bytes(other), 0u);
  EXPECT_EQ(store_.register_layout(other, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(store_.register_layout(other, 512).is_ok());
  EXPECT_EQ(store_.block_bytes(other), 512u);
}

TEST_F(BlockStoreTest, ReserveOfUnregisteredLayoutIsInvalid) {
  auto reserved = store_.reserve(key_of(LayoutKey{1, 2}, 1), kHbmThenRam, 0);
  EXPECT_EQ(reserved.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_.block_count(), 0u);
}

TEST_F(BlockStoreTest, ReserveFallsBackFromHbmToRamThenExhausts) {
  std::set<std::pair<Tier, uint64_t>> slots;
  std::vector<PendingWrite> writes;
  for (uint32_t n = 0; n < 6; ++n) {
    writes.push_back(reserve(n, {Tier::kRam, Tier::kHbm}));  // order of `allowed` is ignored
    const BlockLocation location = writes.back().location();
    EXPECT_EQ(location.tier, n < 2 ? Tier::kHbm : Tier::kRam) << n;
    slots.insert({location.tier, location.offset});
  }
  EXPECT_EQ(slots.size(), 6u);
  auto full = store_.reserve(key(6), kHbmThenRam, 0);
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(store_.lookup(key(6)), std::nullopt);
  EXPECT_EQ(store_.block_count(), 6u);
  expect_usage(Tier::kHbm, 2 * kBlock, 2);
  expect_usage(Tier::kRam, 4 * kBlock, 4);
}

TEST_F(BlockStoreTest, ReserveUsesOnlyAllowedConfiguredTiers) {
  PendingWrite write = reserve(1, {Tier::kRam});
  EXPECT_EQ(write.location().tier, Tier::kRam);  // HBM has room but is not allowed
  const std::vector<Tier> nvme_only = {Tier::kNvme};
  EXPECT_EQ(store_.reserve(key(2), nvme_only, 0).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(store_.reserve(key(3), {}, 0).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(store_.block_count(), 1u);
  expect_usage(Tier::kHbm, 0, 0);
  expect_usage(Tier::kRam, kBlock, 1);
}

TEST_F(BlockStoreTest, ReserveDedupsWritingAndReadyBlocks) {
  PendingWrite write = reserve(1);
  auto again = store_.reserve(key(1), kHbmThenRam, 0);
  ASSERT_TRUE(again.is_ok());
  EXPECT_FALSE(again->has_value());
  write.commit();
  again = store_.reserve(key(1), kHbmThenRam, 0);
  ASSERT_TRUE(again.is_ok());
  EXPECT_FALSE(again->has_value());
  EXPECT_EQ(store_.block_count(), 1u);
  expect_usage(Tier::kHbm, kBlock, 1);
}

TEST_F(BlockStoreTest, WritingBlockIsInvisibleUntilCommit) {
  PendingWrite write = reserve(1);
  const BlockLocation location = write.location();
  EXPECT_EQ(write.key(), key(1));
  EXPECT_EQ(store_.lookup(key(1)), std::nullopt);
  EXPECT_FALSE(store_.pin(key(1), 200));
  EXPECT_TRUE(visible_in(Tier::kHbm).empty());
  EXPECT_EQ(store_.pinned_blocks(), 1u);  // the writer's pin
  EXPECT_EQ(store_.block_count(), 1u);

  write.commit();
  EXPECT_FALSE(write);
  auto info = store_.lookup(key(1));
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->state, BlockState::kReady);
  EXPECT_EQ(info->location.tier, location.tier);
  EXPECT_EQ(info->location.offset, location.offset);
  EXPECT_EQ(info->pins, 0u);
  EXPECT_EQ(info->last_access_ms, 100u);
  EXPECT_EQ(store_.pinned_blocks(), 0u);
  EXPECT_EQ(visible_in(Tier::kHbm), std::vector<BlockKey>{key(1)});
}

TEST_F(BlockStoreTest, AbortFreesTheSlot) {
  PendingWrite write = reserve(1);
  const BlockLocation location = write.location();
  write.abort();
  EXPECT_FALSE(write);
  EXPECT_EQ(store_.lookup(key(1)), std::nullopt);
  EXPECT_EQ(store_.block_count(), 0u);
  EXPECT_EQ(store_.pinned_blocks(), 0u);
  expect_usage(Tier::kHbm, 0, 0);
  // The key is gone, not deduped, and its slot is free again.
  PendingWrite again = reserve(1);
  EXPECT_EQ(again.location().tier, location.tier);
  EXPECT_EQ(again.location().offset, location.offset);
  // A committed write is spent: aborting or destroying it does nothing.
  again.commit();
  again.abort();
  write.abort();
  EXPECT_TRUE(store_.lookup(key(1)).has_value());
}

TEST_F(BlockStoreTest, PendingWriteDroppedUncommittedAborts) {
  {
    PendingWrite write = reserve(1);
    EXPECT_EQ(store_.block_count(), 1u);
  }
  EXPECT_EQ(store_.lookup(key(1)), std::nullopt);
  EXPECT_EQ(store_.block_count(), 0u);
  EXPECT_EQ(store_.pinned_blocks(), 0u);
  expect_usage(Tier::kHbm, 0, 0);

  // Assigned over: the old write aborts, the new one is held.
  PendingWrite write = reserve(2);
  write = reserve(3);
  EXPECT_EQ(write.key(), key(3));
  EXPECT_EQ(store_.block_count(), 1u);
  expect_usage(Tier::kHbm, kBlock, 1);
  // Moved: the new owner commits, the moved-from handle is empty.
  PendingWrite moved = std::move(write);
  EXPECT_FALSE(write);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  moved.commit();
  EXPECT_TRUE(store_.lookup(key(3)).has_value());
  EXPECT_EQ(store_.pinned_blocks(), 0u);
}

TEST_F(BlockStoreTest, PinAndUnpinCount) {
  const BlockLocation location = put(1);
  put(2);
  PinnedBlock first = store_.pin(key(1), 500);
  ASSERT_TRUE(first);
  EXPECT_EQ(first.key(), key(1));
  EXPECT_EQ(first.location().offset, location.offset);
  PinnedBlock second = store_.pin(key(1), 600);
  PinnedBlock other = store_.pin(key(2), 600);
  EXPECT_TRUE(second);
  EXPECT_TRUE(other);
  EXPECT_EQ(store_.lookup(key(1))->pins, 2u);
  EXPECT_EQ(store_.lookup(key(1))->last_access_ms, 600u);
  EXPECT_EQ(store_.pinned_blocks(), 2u);
  first.reset();
  EXPECT_EQ(store_.lookup(key(1))->pins, 1u);
  EXPECT_EQ(store_.pinned_blocks(), 2u);
  second.reset();
  other.reset();
  EXPECT_EQ(store_.pinned_blocks(), 0u);
  first.reset();  // a released handle is empty: no second unpin, no wrap-around
  EXPECT_EQ(store_.lookup(key(1))->pins, 0u);
  EXPECT_EQ(store_.pinned_blocks(), 0u);
  EXPECT_FALSE(store_.pin(key(9), 0));
}

// A background pin (a copy to another tier) protects the slot like any pin but is not
// a use: the access time the policy ranks by stays.
TEST_F(BlockStoreTest, ABackgroundPinLeavesTheAccessTime) {
  put(1);
  PinnedBlock used = store_.pin(key(1), 500);
  PinnedBlock background = store_.pin_in_background(key(1));
  ASSERT_TRUE(background);
  EXPECT_EQ(background.location().offset, used.location().offset);
  EXPECT_EQ(store_.lookup(key(1))->pins, 2u);
  EXPECT_EQ(store_.lookup(key(1))->last_access_ms, 500u);
  used.reset();
  EXPECT_FALSE(store_.evict(key(1)));  // still pinned
  background.reset();
  EXPECT_EQ(store_.lookup(key(1))->last_access_ms, 500u);
  EXPECT_TRUE(store_.evict(key(1)));
  EXPECT_FALSE(store_.pin_in_background(key(1)));
}

TEST_F(BlockStoreTest, EvictRefusesPinnedWritingAndMovingBlocks) {
  PendingWrite write = reserve(1);
  EXPECT_FALSE(store_.evict(key(1)));  // writing
  write.commit();
  {
    PinnedBlock pin = store_.pin(key(1), 0);
    ASSERT_TRUE(pin);
    EXPECT_FALSE(store_.evict(key(1)));  // pinned
  }
  auto move_1 = store_.begin_move(key(1), Tier::kRam);
  ASSERT_TRUE(move_1.is_ok());
  EXPECT_FALSE(store_.evict(key(1)));  // moving
  move_1->commit();
  EXPECT_FALSE(store_.evict(key(9)));  // absent
  EXPECT_EQ(store_.block_count(), 1u);

  EXPECT_TRUE(store_.evict(key(1)));
  EXPECT_EQ(store_.lookup(key(1)), std::nullopt);
  EXPECT_EQ(store_.block_count(), 0u);
  expect_usage(Tier::kHbm, 0, 0);
  expect_usage(Tier::kRam, 0, 0);
  EXPECT_FALSE(store_.evict(key(1)));
}

TEST_F(BlockStoreTest, MoveThatSucceedsSwitchesTierAndFreesSource) {
  const BlockLocation from = put(1);
  ASSERT_EQ(from.tier, Tier::kHbm);
  auto move = store_.begin_move(key(1), Tier::kRam);
  ASSERT_TRUE(move.is_ok()) << move.status().to_string();
  EXPECT_EQ(move->from().tier, Tier::kHbm);
  EXPECT_EQ(move->from().offset, from.offset);
  EXPECT_EQ(move->location().tier, Tier::kRam);
  const BlockLocation to = move->location();

  auto info = store_.lookup(key(1));  // still readable at its old place
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->state, BlockState::kMoving);
  EXPECT_EQ(info->location.tier, Tier::kHbm);
  EXPECT_EQ(info->pins, 1u);
  EXPECT_EQ(store_.pinned_blocks(), 1u);
  EXPECT_EQ(store_.pin(key(1), 0).location().tier, Tier::kHbm);  // unpinned at once
  EXPECT_EQ(store_.lookup(key(1))->pins, 1u);
  expect_usage(Tier::kHbm, kBlock, 1);
  expect_usage(Tier::kRam, kBlock, 0);  // destination reserved, block not counted yet
  EXPECT_EQ(visible_in(Tier::kHbm).size(), 1u);
  EXPECT_TRUE(visible_in(Tier::kRam).empty());

  move->commit();
  info = store_.lookup(key(1));
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->state, BlockState::kReady);
  EXPECT_EQ(info->location.tier, Tier::kRam);
  EXPECT_EQ(info->location.offset, to.offset);
  EXPECT_EQ(info->pins, 0u);
  EXPECT_EQ(store_.pinned_blocks(), 0u);
  expect_usage(Tier::kHbm, 0, 0);
  expect_usage(Tier::kRam, kBlock, 1);
  EXPECT_TRUE(visible_in(Tier::kHbm).empty());
  EXPECT_EQ(visible_in(Tier::kRam), std::vector<BlockKey>{key(1)});
  EXPECT_EQ(store_.block_count(), 1u);
}

TEST_F(BlockStoreTest, MoveThatFailsKeepsBlockWhereItWas) {
  const BlockLocation from = put(1);
  auto move_2 = store_.begin_move(key(1), Tier::kRam);
  ASSERT_TRUE(move_2.is_ok());
  move_2->abort();
  auto info = store_.lookup(key(1));
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->state, BlockState::kReady);
  EXPECT_EQ(info->location.tier, Tier::kHbm);
  EXPECT_EQ(info->location.offset, from.offset);
  EXPECT_EQ(info->pins, 0u);
  EXPECT_EQ(store_.pinned_blocks(), 0u);
  expect_usage(Tier::kHbm, kBlock, 1);
  expect_usage(Tier::kRam, 0, 0);
  EXPECT_TRUE(store_.begin_move(key(1), Tier::kRam).is_ok());  // can be retried
}

TEST_F(BlockStoreTest, BeginMoveRejectsWhatCannotMove) {
  auto code = [&](uint32_t n, Tier to) { return store_.begin_move(key(n), to).status().code(); };
  EXPECT_EQ(code(1, Tier::kRam), StatusCode::kInvalidArgument);  // absent
  PendingWrite write = reserve(1);
  EXPECT_EQ(code(1, Tier::kRam), StatusCode::kInvalidArgument);  // writing
  write.commit();
  EXPECT_EQ(code(1, Tier::kHbm), StatusCode::kInvalidArgument);   // already there
  EXPECT_EQ(code(1, Tier::kNvme), StatusCode::kInvalidArgument);  // not configured
  auto move_3 = store_.begin_move(key(1), Tier::kRam);
  ASSERT_TRUE(move_3.is_ok());
  EXPECT_EQ(code(1, Tier::kRam), StatusCode::kInvalidArgument);  // moving
  move_3->commit();
  expect_usage(Tier::kRam, kBlock, 1);

  // A full destination: the block stays ready and nothing leaks.
  for (uint32_t n = 2; n < 5; ++n) put(n, {Tier::kRam});
  put(5, {Tier::kHbm});
  EXPECT_EQ(code(5, Tier::kRam), StatusCode::kResourceExhausted);
  EXPECT_EQ(store_.lookup(key(5))->state, BlockState::kReady);
  EXPECT_EQ(store_.lookup(key(5))->pins, 0u);
  expect_usage(Tier::kRam, 4 * kBlock, 4);
  expect_usage(Tier::kHbm, kBlock, 1);
  EXPECT_EQ(store_.pinned_blocks(), 0u);
}

TEST_F(BlockStoreTest, MoveUnderAReaderDefersTheFreeUntilUnpin) {
  const BlockLocation old = put(1, {Tier::kHbm});
  PinnedBlock reader = store_.pin(key(1), 0);  // a load is reading HBM
  ASSERT_EQ(reader.location().offset, old.offset);
  auto move_4 = store_.begin_move(key(1), Tier::kRam);
  ASSERT_TRUE(move_4.is_ok());
  move_4->commit();

  auto info = store_.lookup(key(1));
  EXPECT_EQ(info->location.tier, Tier::kRam);
  EXPECT_EQ(info->pins, 1u);
  expect_usage(Tier::kHbm, kBlock, 0);  // old slot still held for the reader
  expect_usage(Tier::kRam, kBlock, 1);
  EXPECT_EQ(store_.begin_move(key(1), Tier::kHbm).status().code(), StatusCode::kInvalidArgument);

  // The reader's slot is not handed out again: one HBM slot is left, then none.
  PendingWrite second = reserve(2, {Tier::kHbm});
  EXPECT_NE(second.location().offset, old.offset);
  EXPECT_EQ(store_.reserve(key(3), std::vector<Tier>{Tier::kHbm}, 0).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_FALSE(store_.has_room(Tier::kHbm, kBlock));

  EXPECT_EQ(reader.location().tier, Tier::kHbm);  // the reader still names its slot
  reader.reset();
  expect_usage(Tier::kHbm, kBlock, 1);    // only block 2
  EXPECT_EQ(store_.pinned_blocks(), 1u);  // block 2 is still being written
  PendingWrite third = reserve(3, {Tier::kHbm});
  EXPECT_EQ(third.location().offset, old.offset);
  second.commit();
  third.commit();
  EXPECT_EQ(store_.pinned_blocks(), 0u);
  EXPECT_EQ(store_.block_count(), 3u);
}

TEST_F(BlockStoreTest, DeferredFreeWaitsForReadersOfTheNewPlaceToo) {
  put(1, {Tier::kHbm});
  PinnedBlock old_reader = store_.pin(key(1), 0);  // reader of the old place
  ASSERT_TRUE(old_reader);
  auto move_5 = store_.begin_move(key(1), Tier::kRam);
  ASSERT_TRUE(move_5.is_ok());
  move_5->commit();
  PinnedBlock new_reader = store_.pin(key(1), 0);  // reader of the new place
  ASSERT_EQ(new_reader.location().tier, Tier::kRam);
  old_reader.reset();
  // The store counts pins per block, not per place: the old slot stays until both left.
  expect_usage(Tier::kHbm, kBlock, 0);
  new_reader.reset();
  expect_usage(Tier::kHbm, 0, 0);
  expect_usage(Tier::kRam, kBlock, 1);
  EXPECT_EQ(store_.pinned_blocks(), 0u);
  EXPECT_TRUE(store_.begin_move(key(1), Tier::kHbm).is_ok());  // no free pending now
}

TEST_F(BlockStoreTest, SessionRefsCount) {
  put(1);
  store_.add_session_ref(key(1));
  store_.add_session_ref(key(1));
  EXPECT_EQ(store_.lookup(key(1))->session_refs, 2u);
  store_.drop_session_ref(key(1));
  EXPECT_EQ(store_.lookup(key(1))->session_refs, 1u);
  store_.drop_session_ref(key(1));
  store_.drop_session_ref(key(1));  // no wrap-around
  EXPECT_EQ(store_.lookup(key(1))->session_refs, 0u);
  store_.add_session_ref(key(9));  // absent: ignored
  store_.drop_session_ref(key(9));
  EXPECT_EQ(store_.lookup(key(9)), std::nullopt);
  EXPECT_EQ(store_.block_count(), 1u);
}

TEST_F(BlockStoreTest, HasRoomFollowsTheAllocator) {
  EXPECT_TRUE(store_.has_room(Tier::kHbm, kBlock));
  EXPECT_FALSE(store_.has_room(Tier::kHbm, 2 * kBlock));  // larger than a slab
  EXPECT_FALSE(store_.has_room(Tier::kNvme, kBlock));     // not configured
  put(1);
  put(2);
  EXPECT_FALSE(store_.has_room(Tier::kHbm, kBlock));
  EXPECT_TRUE(store_.has_room(Tier::kRam, kBlock));
  ASSERT_TRUE(store_.evict(key(1)));
  EXPECT_TRUE(store_.has_room(Tier::kHbm, kBlock));
}

TEST_F(BlockStoreTest, LayoutsAreSeparateKeySpacesSharingTiers) {
  const LayoutKey small{7, 0x1234};
  ASSERT_TRUE(store_.register_layout(small, kBlock / 4).is_ok());
  put(1);
  // Same hash, other layout: a different block, not a dedup.
  auto reserved = store_.reserve(key_of(small, 1), kHbmThenRam, 0);
  ASSERT_TRUE(reserved.is_ok());
  ASSERT_TRUE(reserved->has_value());
  // The second HBM slab, carved into 256-byte slots.
  EXPECT_EQ((*reserved)->location().tier, Tier::kHbm);
  (*reserved)->commit();
  expect_usage(Tier::kHbm, kBlock + kBlock / 4, 2);
  EXPECT_EQ(visible_in(Tier::kHbm).size(), 2u);
  EXPECT_EQ(store_.block_count(), 2u);
  ASSERT_TRUE(store_.evict(key(1)));
  EXPECT_TRUE(store_.lookup(key_of(small, 1)).has_value());
  expect_usage(Tier::kHbm, kBlock / 4, 1);
}

TEST(BlockStoreTinyTierTest, TierSmallerThanASlabStillHoldsABlock) {
  auto hbm = tiers_test::make_memory(1500);
  BlockStore store({{Tier::kHbm, hbm, 1 << 20}});
  const LayoutKey layout{1, 1};
  ASSERT_TRUE(store.register_layout(layout, 1024).is_ok());
  EXPECT_TRUE(store.has_room(Tier::kHbm, 1024));
  const std::vector<Tier> hbm_only = {Tier::kHbm};
  auto first = store.reserve(key_of(layout, 1), hbm_only, 0);
  ASSERT_TRUE(first.is_ok());
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ(store.reserve(key_of(layout, 2), hbm_only, 0).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(store.usage(Tier::kHbm).capacity_bytes, 1500u);
}

}  // namespace
}  // namespace kvtier
