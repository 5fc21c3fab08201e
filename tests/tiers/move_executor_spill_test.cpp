// MoveExecutor's spills (move_executor.h, move_executor_spill.cpp) against a fake NVMe
// tier and a fake key-addressed spill tier, with a control thread the test drives by
// hand. Planned evictions out of NVMe:
//  - write the blocks the spill tier lacks there, bit-exact, and then evict them; blocks
//    it holds already are evicted without a write; their bytes count as leaving NVMe
//    while the writes are in flight, and no longer once they are done;
//  - are evicted at once, counted unwritten, with the tier unreachable, after a stop, or
//    past the in-flight bound; a stop mid-spill evicts the blocks then, counted once;
//  - are evicted unwritten when the spill tier declines or fails the write, or when the
//    block cannot be read out of NVMe (then it is written nowhere);
//  - leave a block used while its spill ran (touched, or taken by a session) where it
//    is, written but not evicted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <deque>
#include <functional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tests/tiers/spill_fakes.h"
#include "tests/tiers/test_memory.h"
#include "tiers/block_store.h"
#include "tiers/move_executor.h"
#include "tiers/tier.h"

namespace kvtier {
namespace {

using tiers_test::key_of;
using namespace tiers_test::spill_fakes;

class MoveExecutorSpillTest : public ::testing::Test {
 protected:
  MoveExecutorSpillTest()
      : store_({{Tier::kNvme, nullptr, 4 * kBlockBytes, kNvmeBytes, /*confirm_release=*/true,
                 /*parts=*/1, /*keep_copies=*/true}}),
        executor_(store_, {&nvme_}, hooks()) {
    EXPECT_TRUE(store_.register_layout(kLayout, kBlockBytes).is_ok());
  }

  MoveExecutor::Hooks hooks() {
    MoveExecutor::Hooks hooks;
    hooks.copy = [](CopyBatch, std::function<void(Status)>) {
      ADD_FAILURE() << "an eviction made a Device copy";
      return internal_error("no copies here");
    };
    hooks.control_thread = [this] { return control_.poster(); };
    hooks.room_by_demotion = [](Tier, uint64_t) {
      ADD_FAILURE() << "an eviction asked for room";
      return std::vector<policy::Move>{};
    };
    hooks.not_moved = [this](const BlockKey& key) { not_moved_.push_back(key); };
    hooks.removed = [this](const std::vector<BlockKey>& keys, bool lost) {
      EXPECT_FALSE(lost);
      removed_.insert(removed_.end(), keys.begin(), keys.end());
    };
    hooks.before_persistent_write = [] {};
    hooks.settled = [this] { ++settled_; };
    hooks.now_ms = [this] { return now_ms_; };
    hooks.wall_ms_of = [](uint64_t steady_ms) { return steady_ms + kWallClockOffsetMs; };
    return hooks;
  }

  // Block n, recovered into NVMe slot n with its bytes there.
  BlockKey on_nvme(uint32_t n) { return recover_on_nvme(store_, nvme_, n); }

  void plan_evictions(const std::vector<BlockKey>& keys) {
    std::vector<policy::Move> moves;
    for (const BlockKey& key : keys) {
      moves.push_back({policy::MoveKind::kEvict, key, Tier::kNvme, Tier::kNone,
                       policy::MoveReason::kWatermark, kBlockBytes});
    }
    executor_.apply(moves);
  }

  // Runs what was posted to the control thread, and what that posts, until none is left.
  void drain_control_thread() { control_.drain(); }
  // Until nothing is posted and no write is in flight.
  void run_until_settled() { tiers_test::spill_fakes::run_until_settled(control_, spill_); }

  bool in_store(const BlockKey& key) const { return store_.lookup(key).has_value(); }
  bool was_removed(const BlockKey& key) const {
    return std::find(removed_.begin(), removed_.end(), key) != removed_.end();
  }
  bool write_attempted(const BlockKey& key) const {
    const auto& attempts = spill_.write_attempts;
    return std::find(attempts.begin(), attempts.end(), key) != attempts.end();
  }
  const MoveExecutor::Counters& counters() const { return executor_.counters(); }

  // Nothing is left pinned, leaving, or unreleased in NVMe.
  void expect_nothing_left_behind() {
    EXPECT_EQ(executor_.leaving_bytes(Tier::kNvme), 0u);
    EXPECT_EQ(store_.pinned_blocks(), 0u);
    EXPECT_EQ(store_.unconfirmed_release_bytes(Tier::kNvme), 0u);
    EXPECT_FALSE(executor_.busy());
  }

  BlockStore store_;
  FakeNvmeTier nvme_;
  FakeSpillTier spill_;
  ControlThread control_;
  std::vector<BlockKey> removed_;
  std::vector<BlockKey> not_moved_;
  size_t settled_ = 0;
  uint64_t now_ms_ = 200;
  MoveExecutor executor_;
};

TEST_F(MoveExecutorSpillTest, MissingBlocksAreWrittenBitExactThenEvictedPresentOnesAtOnce) {
  const BlockKey first = on_nvme(1);
  const BlockKey second = on_nvme(2);
  const BlockKey held_already = on_nvme(3);
  const Bytes held_bytes = contents_of(99);  // not block 3's: a rewrite would show
  spill_.stored[held_already] = held_bytes;
  executor_.attach_spill_tier(spill_, 8 * kBlockBytes);

  plan_evictions({first, second, held_already});
  // Pinned on their way until the probe answers.
  EXPECT_EQ(executor_.leaving_bytes(Tier::kNvme), 3 * kBlockBytes);
  EXPECT_TRUE(in_store(first) && in_store(second) && in_store(held_already));
  EXPECT_TRUE(removed_.empty());

  drain_control_thread();  // probed, read out of NVMe; the writes are in flight
  EXPECT_EQ(spill_.probed.size(), 3u);
  EXPECT_FALSE(in_store(held_already));
  EXPECT_TRUE(was_removed(held_already));
  EXPECT_FALSE(write_attempted(held_already));
  EXPECT_EQ(spill_.stored[held_already], held_bytes);
  EXPECT_EQ(counters().spill_present_blocks, 1u);
  EXPECT_EQ(executor_.leaving_bytes(Tier::kNvme), 2 * kBlockBytes);
  EXPECT_TRUE(in_store(first) && in_store(second));
  EXPECT_EQ(counters().spilled_blocks, 0u);

  spill_.complete_writes();
  drain_control_thread();
  EXPECT_EQ(spill_.stored[first], contents_of(1));
  EXPECT_EQ(spill_.stored[second], contents_of(2));
  EXPECT_EQ(spill_.stored_wall_ms[first], kRecoveredAccessMs + kWallClockOffsetMs);
  EXPECT_FALSE(in_store(first));
  EXPECT_FALSE(in_store(second));
  EXPECT_EQ(removed_.size(), 3u);
  EXPECT_EQ(counters().spilled_blocks, 2u);
  EXPECT_EQ(counters().spill_present_blocks, 1u);
  EXPECT_EQ(counters().spill_unwritten_blocks, 0u);
  EXPECT_EQ(counters().blocks_evicted, 3u);
  EXPECT_EQ(nvme_.released_slots, 3u);
  EXPECT_TRUE(not_moved_.empty());
  expect_nothing_left_behind();
}

TEST_F(MoveExecutorSpillTest, UnreachableTierEvictsAtOnceUnwritten) {
  const BlockKey first = on_nvme(1);
  const BlockKey second = on_nvme(2);
  executor_.attach_spill_tier(spill_, 8 * kBlockBytes);
  spill_.reachable_now = false;

  plan_evictions({first, second});
  EXPECT_FALSE(in_store(first));  // before anything ran on the control thread
  EXPECT_FALSE(in_store(second));
  EXPECT_EQ(removed_.size(), 2u);
  EXPECT_EQ(counters().spill_unwritten_blocks, 2u);
  run_until_settled();
  EXPECT_TRUE(spill_.probed.empty());
  EXPECT_TRUE(spill_.write_attempts.empty());
  EXPECT_EQ(counters().spilled_blocks + counters().spill_present_blocks, 0u);
  expect_nothing_left_behind();
}

TEST_F(MoveExecutorSpillTest, AfterAStopEvictionsAreNotSpilled) {
  const BlockKey first = on_nvme(1);
  const BlockKey second = on_nvme(2);
  executor_.attach_spill_tier(spill_, 8 * kBlockBytes);
  executor_.stop_spills();

  plan_evictions({first, second});
  EXPECT_FALSE(in_store(first));
  EXPECT_FALSE(in_store(second));
  EXPECT_EQ(counters().spill_unwritten_blocks, 2u);
  run_until_settled();
  EXPECT_TRUE(spill_.probed.empty());
  EXPECT_TRUE(spill_.write_attempts.empty());
  EXPECT_EQ(counters().spilled_blocks + counters().spill_present_blocks, 0u);
  expect_nothing_left_behind();
}

TEST_F(MoveExecutorSpillTest, AStopMidSpillEvictsNowAndCountsEachBlockOnce) {
  const BlockKey block = on_nvme(1);
  executor_.attach_spill_tier(spill_, 8 * kBlockBytes);
  plan_evictions({block});
  drain_control_thread();
  ASSERT_EQ(spill_.writes_in_flight.size(), 1u);

  executor_.stop_spills();  // does not wait for the write
  EXPECT_FALSE(in_store(block));
  EXPECT_EQ(counters().spill_unwritten_blocks, 1u);
  EXPECT_EQ(executor_.leaving_bytes(Tier::kNvme), 0u);
  run_until_settled();  // the write's answer comes after the stop
  EXPECT_EQ(counters().spilled_blocks + counters().spill_present_blocks +
                counters().spill_unwritten_blocks,
            1u);
  EXPECT_EQ(counters().blocks_evicted, 1u);
  expect_nothing_left_behind();
}

TEST_F(MoveExecutorSpillTest, DeclinedWriteEvictsUnwritten) {
  const BlockKey first = on_nvme(1);
  const BlockKey second = on_nvme(2);
  executor_.attach_spill_tier(spill_, 8 * kBlockBytes);
  spill_.decline_writes = true;

  plan_evictions({first, second});
  run_until_settled();
  EXPECT_FALSE(in_store(first));
  EXPECT_FALSE(in_store(second));
  EXPECT_TRUE(spill_.stored.empty());
  EXPECT_EQ(counters().spill_unwritten_blocks, 2u);
  EXPECT_EQ(counters().spilled_blocks, 0u);
  expect_nothing_left_behind();
}

TEST_F(MoveExecutorSpillTest, FailedWriteEvictsUnwritten) {
  const BlockKey written = on_nvme(1);
  const BlockKey failed = on_nvme(2);
  executor_.attach_spill_tier(spill_, 8 * kBlockBytes);
  spill_.failing_writes.insert(failed);

  plan_evictions({written, failed});
  run_until_settled();
  EXPECT_FALSE(in_store(written));
  EXPECT_FALSE(in_store(failed));
  EXPECT_TRUE(spill_.stored.contains(written));
  EXPECT_FALSE(spill_.stored.contains(failed));
  EXPECT_EQ(counters().spilled_blocks, 1u);
  EXPECT_EQ(counters().spill_unwritten_blocks, 1u);
  expect_nothing_left_behind();
}

TEST_F(MoveExecutorSpillTest, UnreadableBlockIsWrittenNowhereAndEvicted) {
  const BlockKey readable = on_nvme(1);
  const BlockKey unreadable = on_nvme(2);
  executor_.attach_spill_tier(spill_, 8 * kBlockBytes);
  nvme_.unreadable.insert(unreadable);

  plan_evictions({readable, unreadable});
  run_until_settled();
  EXPECT_FALSE(write_attempted(unreadable));
  EXPECT_FALSE(spill_.stored.contains(unreadable));
  EXPECT_EQ(spill_.stored[readable], contents_of(1));
  EXPECT_FALSE(in_store(readable));
  EXPECT_FALSE(in_store(unreadable));
  EXPECT_TRUE(was_removed(unreadable));
  EXPECT_EQ(counters().spilled_blocks, 1u);
  EXPECT_EQ(counters().spill_unwritten_blocks, 1u);
  EXPECT_EQ(counters().blocks_lost, 0u);
  expect_nothing_left_behind();
}

TEST_F(MoveExecutorSpillTest, BlocksUsedWhileSpillingAreWrittenButStay) {
  const BlockKey touched = on_nvme(1);
  const BlockKey taken_by_a_session = on_nvme(2);
  const BlockKey unused = on_nvme(3);
  executor_.attach_spill_tier(spill_, 8 * kBlockBytes);

  plan_evictions({touched, taken_by_a_session, unused});
  drain_control_thread();  // the writes are in flight
  now_ms_ = 300;
  ASSERT_TRUE(store_.pin(touched, now_ms_));  // a read: pinned and let go at once
  store_.add_session_ref(taken_by_a_session);
  run_until_settled();

  EXPECT_EQ(spill_.stored[touched], contents_of(1));
  EXPECT_EQ(spill_.stored[taken_by_a_session], contents_of(2));
  EXPECT_EQ(spill_.stored[unused], contents_of(3));
  EXPECT_EQ(counters().spilled_blocks, 3u);
  for (const BlockKey& stays : {touched, taken_by_a_session}) {
    const auto info = store_.lookup(stays);
    ASSERT_TRUE(info.has_value());
    EXPECT_EQ(info->location.tier, Tier::kNvme);
    EXPECT_EQ(info->pins, 0u);
    EXPECT_FALSE(was_removed(stays));
  }
  EXPECT_FALSE(in_store(unused));
  EXPECT_EQ(removed_, std::vector<BlockKey>{unused});
  EXPECT_EQ(counters().blocks_evicted, 1u);
  expect_nothing_left_behind();
}

TEST_F(MoveExecutorSpillTest, PastTheInFlightBoundBlocksAreEvictedAtOnce) {
  const BlockKey spilled = on_nvme(1);
  const BlockKey over_the_bound = on_nvme(2);
  executor_.attach_spill_tier(spill_, kBlockBytes);

  plan_evictions({spilled, over_the_bound});
  EXPECT_FALSE(in_store(over_the_bound));  // before anything ran on the control thread
  EXPECT_TRUE(was_removed(over_the_bound));
  EXPECT_TRUE(in_store(spilled));
  EXPECT_EQ(counters().spill_unwritten_blocks, 1u);
  EXPECT_EQ(executor_.leaving_bytes(Tier::kNvme), kBlockBytes);

  run_until_settled();
  EXPECT_EQ(spill_.probed, std::vector<BlockKey>{spilled});
  EXPECT_FALSE(write_attempted(over_the_bound));
  EXPECT_EQ(spill_.stored[spilled], contents_of(1));
  EXPECT_FALSE(in_store(spilled));
  EXPECT_EQ(counters().spilled_blocks, 1u);
  EXPECT_EQ(counters().spill_unwritten_blocks, 1u);
  expect_nothing_left_behind();
}

// A block a reader holds is not evicted, so it is not counted as evicted unwritten either,
// whether or not the spill tier can be reached.
TEST_F(MoveExecutorSpillTest, APinnedBlockIsNeitherEvictedNorCountedWhenTheTierIsUnreachable) {
  const BlockKey block = on_nvme(1);
  executor_.attach_spill_tier(spill_, 8 * kBlockBytes);
  spill_.reachable_now = false;
  PinnedBlock reader = store_.pin(block, 150);
  plan_evictions({block});
  run_until_settled();
  EXPECT_TRUE(in_store(block));
  EXPECT_EQ(counters().blocks_evicted, 0u);
  EXPECT_EQ(counters().spill_unwritten_blocks, 0u);
}

// A spill tier that answers with the wrong number of entries leaves no block pinned and
// is not read past its end: the blocks it did not answer for count as failed.
TEST_F(MoveExecutorSpillTest, ATierThatMiscountsItsAnswersLeavesNothingPinned) {
  const BlockKey first = on_nvme(1);
  const BlockKey second = on_nvme(2);
  executor_.attach_spill_tier(spill_, 8 * kBlockBytes);
  spill_.miscount = true;
  plan_evictions({first, second});
  run_until_settled();
  EXPECT_EQ(store_.pinned_blocks(), 0u);
  EXPECT_EQ(executor_.leaving_bytes(Tier::kNvme), 0u);
  EXPECT_FALSE(in_store(first));
  EXPECT_FALSE(in_store(second));
  EXPECT_EQ(counters().spilled_blocks + counters().spill_unwritten_blocks, 2u);
}

}  // namespace
}  // namespace kvtier
