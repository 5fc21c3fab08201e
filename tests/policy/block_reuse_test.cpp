// BlockReuse: use counts that survive a block's eviction, aging, and the reuse curve
// learned from the stream of uses.
#include "policy/block_reuse.h"

#include <array>
#include <cstdint>

#include <gtest/gtest.h>

#include "tests/policy/fake_placement_view.h"

namespace kvtier::policy {
namespace {

// Block number n (up to 65535) of the test layout.
BlockKey block(uint32_t n) {
  const std::array<uint8_t, 3> bytes{0x43, static_cast<uint8_t>(n >> 8),
                                     static_cast<uint8_t>(n & 0xff)};
  return BlockKey{fake::kLayout, BlockHash(bytes)};
}

TEST(BlockReuseTest, CountsUsesUpToItsCeiling) {
  BlockReuse reuse;
  for (int i = 0; i < 3; ++i) reuse.record_use(block(1));
  reuse.record_use(block(2));
  EXPECT_EQ(reuse.uses(block(1)), 3);
  EXPECT_EQ(reuse.uses(block(2)), 1);
  EXPECT_EQ(reuse.uses(block(3)), 0);
  // Another layout's block with the same hash is another block.
  EXPECT_EQ(reuse.uses(BlockKey{LayoutKey{8, 1}, block(1).hash}), 0);
  for (int i = 0; i < 40; ++i) reuse.record_use(block(4));
  EXPECT_EQ(reuse.uses(block(4)), BlockReuse::kMaxCount);
}

TEST(BlockReuseTest, CountsAgeByHalfEverySample) {
  BlockReuse reuse(/*width=*/1024, /*sample_size=*/100);
  for (int i = 0; i < 8; ++i) reuse.record_use(block(1));
  for (uint32_t n = 100; n < 191; ++n) reuse.record_use(block(n));  // 99 increments so far
  EXPECT_EQ(reuse.uses(block(1)), 8);
  reuse.record_use(block(191));  // the 100th: every count halves
  EXPECT_EQ(reuse.uses(block(1)), 4);
  EXPECT_EQ(reuse.uses(block(100)), 0);
}

TEST(BlockReuseTest, LearnsHowLikelyABlockIsToBeUsedAgainFromItsCount) {
  BlockReuse reuse;
  // 600 blocks used once; a third of them a second time; 90 % of those a third time.
  for (uint32_t n = 0; n < 600; ++n) {
    reuse.record_use(block(n));
    if (n % 3 != 0) continue;
    reuse.record_use(block(n));
    if (n % 30 != 0) reuse.record_use(block(n));
  }
  ASSERT_TRUE(reuse.probability_used_again(1).has_value());
  EXPECT_NEAR(*reuse.probability_used_again(1), 1.0 / 3, 0.01);
  EXPECT_NEAR(*reuse.probability_used_again(2), 0.9, 0.01);
  // Per block, by its own count.
  EXPECT_NEAR(*reuse.probability_used_again(block(1)), 1.0 / 3, 0.01);  // used once
  EXPECT_NEAR(*reuse.probability_used_again(block(30)), 0.9, 0.01);     // twice
  // None used 3 times went on, but a block used more is never ranked below one used less.
  EXPECT_NEAR(*reuse.probability_used_again(block(3)), 0.9, 0.01);
}

// Across agings the curve still tells blocks that keep coming back from those that
// came once: 200 blocks asked for every round beside 500 new ones each round, aged
// after 5,000 uses and then every 2,500 (rounds of 700).
TEST(BlockReuseTest, TheCurveOutlivesAging) {
  BlockReuse reuse(/*width=*/1 << 14, /*sample_size=*/5000);
  uint32_t fresh = 1000;
  for (int round = 0; round < 12; ++round) {
    for (uint32_t n = 0; n < 200; ++n) reuse.record_use(block(n));
    for (int i = 0; i < 500; ++i) reuse.record_use(block(fresh++));
  }
  const uint8_t hot = reuse.uses(block(7));
  EXPECT_GE(hot, 2);
  EXPECT_LT(hot, 12);  // aged
  ASSERT_TRUE(reuse.probability_used_again(hot).has_value());
  EXPECT_GT(*reuse.probability_used_again(hot), 0.9);
  EXPECT_EQ(reuse.uses(block(fresh - 1)), 1);
  EXPECT_LT(*reuse.probability_used_again(1), 0.5);
}

TEST(BlockReuseTest, SaysNothingUntilEnoughBlocksWereCounted) {
  BlockReuse reuse;
  for (uint32_t n = 0; n + 1 < BlockReuse::kMinBlocks; ++n) {
    reuse.record_use(block(n));
    reuse.record_use(block(n));
  }
  EXPECT_FALSE(reuse.probability_used_again(1).has_value());
  reuse.record_use(block(9999));
  ASSERT_TRUE(reuse.probability_used_again(1).has_value());
  EXPECT_GT(*reuse.probability_used_again(1), 0.99);
}

}  // namespace
}  // namespace kvtier::policy
