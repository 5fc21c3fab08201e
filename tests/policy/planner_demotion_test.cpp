// plan_demotions: idle demotion and watermark demotion, on a ManualClock.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "policy/clock.h"
#include "policy/planner.h"
#include "policy/session_table.h"
#include "tests/policy/fake_placement_view.h"

namespace kvtier::policy {
namespace {

using fake::describe;
using fake::FakePlacementView;
using Strings = std::vector<std::string>;

class PlanDemotionsTest : public ::testing::Test {
 protected:
  PlanDemotionsTest() {
    view_.set_capacity(Tier::kHbm, 1'000);  // high watermark 900, low 750
    view_.set_capacity(Tier::kRam, 10'000);
  }

  Session& save(const std::string& id, std::initializer_list<uint8_t> blocks, bool end_of_turn,
                uint64_t at_ms) {
    return fake::save_session(clock_, table_, id, blocks, end_of_turn, at_ms);
  }
  void put_hbm(std::initializer_list<uint8_t> ns) {
    for (uint8_t n : ns) view_.put(n, Tier::kHbm);
  }
  Strings plan() { return describe(planner_.plan_demotions(table_, view_)); }

  ManualClock clock_{0};
  SessionTable table_{clock_};
  FakePlacementView view_;
  Planner planner_{PlannerConfig{0.90, 0.75, 30'000}, clock_};
};

TEST_F(PlanDemotionsTest, IdleDemotionStartsExactlyAtTheThreshold) {
  save("s", {1, 2, 3}, true, 1'000);
  put_hbm({1, 2, 3});
  clock_.set_ms(1'000 + 29'999);
  EXPECT_TRUE(plan().empty());
  clock_.set_ms(1'000 + 30'000);
  // Tail first: the prefix is what the next turn reads first.
  EXPECT_EQ(plan(), (Strings{"D 3 hbm->ram", "D 2 hbm->ram", "D 1 hbm->ram"}));
}

TEST_F(PlanDemotionsTest, IdleDemotionIgnoresActiveSessionsAndBlocksBelowHbm) {
  save("busy", {1, 2}, false, 1'000);  // mid-turn: active however long ago
  save("done", {3, 4}, true, 1'000);
  put_hbm({1, 2, 3});
  view_.put(4, Tier::kRam);
  clock_.set_ms(1'000'000);
  EXPECT_EQ(plan(), (Strings{"D 3 hbm->ram"}));
}

TEST_F(PlanDemotionsTest, IdleDemotionKeepsBlocksThatAWarmSessionHolds) {
  save("cold", {1, 2}, true, 1'000);
  save("warm", {1, 3}, true, 20'000);
  put_hbm({1, 2, 3});
  clock_.set_ms(31'000);  // only "cold" has been idle for 30 s
  EXPECT_EQ(plan(), (Strings{"D 2 hbm->ram"}));
  view_.put(2, Tier::kRam);  // that move landed
  clock_.set_ms(50'000);     // "warm" too: the shared block goes with it, once
  EXPECT_EQ(plan(), (Strings{"D 3 hbm->ram", "D 1 hbm->ram"}));
}

TEST_F(PlanDemotionsTest, IdleDemotionSkipsPinnedBlocksAndNeedsRamRoom) {
  save("s", {1, 2, 3, 4}, true, 1'000);
  put_hbm({1, 3, 4});
  view_.put(2, Tier::kHbm, {.movable = false});
  view_.set_capacity(Tier::kRam, 250);
  clock_.set_ms(100'000);
  EXPECT_EQ(plan(), (Strings{"D 4 hbm->ram", "D 3 hbm->ram"}));

  view_.set_capacity(Tier::kRam, 0);  // no RAM tier: nowhere to demote to
  EXPECT_TRUE(plan().empty());
}

TEST_F(PlanDemotionsTest, WatermarkTakesLeastRecentlyActiveSessionFirstAndStopsAtLow) {
  save("busy", {7, 8, 9, 10}, false, 500);
  save("older", {1, 2, 3}, true, 1'000);
  save("newer", {4, 5, 6}, true, 2'000);
  put_hbm({1, 2, 3, 4, 5, 6, 7, 8, 9, 10});  // 1000 > 900
  clock_.set_ms(3'000);                      // nobody idle for 30 s yet
  // 1000 → 700: the first step at or below 750, not merely below 900.
  EXPECT_EQ(plan(), (Strings{"D 3 hbm->ram", "D 2 hbm->ram", "D 1 hbm->ram"}));
}

TEST_F(PlanDemotionsTest, HighWatermarkIsExceededNotReached) {
  save("s", {1, 2, 3, 4, 5, 6, 7, 8, 9}, true, 1'000);
  put_hbm({1, 2, 3, 4, 5, 6, 7, 8, 9});  // exactly 900
  clock_.set_ms(2'000);
  EXPECT_TRUE(plan().empty());
  view_.put(20, Tier::kHbm, {.bytes = 1, .session_refs = 0});    // 901
  EXPECT_EQ(plan(), (Strings{"D 9 hbm->ram", "D 8 hbm->ram"}));  // 901 → 701
}

TEST_F(PlanDemotionsTest, ActiveSessionsGiveUpBlocksOnlyAfterIdleOnes) {
  view_.set_capacity(Tier::kHbm, 500);  // high 450, low 375
  save("busy", {1, 2, 3}, false, 100);  // least recent, but mid-turn
  save("idle", {4, 5}, true, 2'000);
  put_hbm({1, 2, 3, 4, 5});
  view_.put(6, Tier::kHbm, {.session_refs = 0});  // 600 used
  clock_.set_ms(3'000);
  // Idle blocks, then the block nobody holds; the active session keeps everything.
  EXPECT_EQ(plan(), (Strings{"D 5 hbm->ram", "D 4 hbm->ram", "D 6 hbm->ram"}));
}

TEST_F(PlanDemotionsTest, WatermarkMovesASharedBlockOnceWithItsHottestHolder) {
  planner_.set_config(PlannerConfig{0.90, 0.25, 30'000});
  view_.set_capacity(Tier::kHbm, 400);  // high 360, low 100
  save("cold", {1, 2}, true, 1'000);
  save("hot", {1, 3}, false, 2'000);
  put_hbm({1, 2, 3});
  view_.put(9, Tier::kHbm, {.session_refs = 0});  // 400 used
  clock_.set_ms(3'000);
  // 1 goes with "hot" (active), so only 2 leaves in the idle pass; then the
  // unreferenced 9; then the active session's tail.
  EXPECT_EQ(plan(), (Strings{"D 2 hbm->ram", "D 9 hbm->ram", "D 3 hbm->ram"}));
}

TEST_F(PlanDemotionsTest, WatermarkThenUnreferencedBlocksLeastRecentlyUsedFirst) {
  planner_.set_config(PlannerConfig{0.90, 0.20, 30'000});
  view_.set_capacity(Tier::kHbm, 500);  // high 450, low 100
  save("s", {1}, true, 1'000);
  put_hbm({1});
  view_.put(11, Tier::kHbm, {.session_refs = 0, .last_access_ms = 50});
  view_.put(12, Tier::kHbm, {.session_refs = 0, .last_access_ms = 10});
  view_.put(13, Tier::kHbm, {.session_refs = 0, .last_access_ms = 30});
  view_.put(14, Tier::kHbm, {.session_refs = 0, .movable = false, .last_access_ms = 10});
  clock_.set_ms(2'000);
  EXPECT_EQ(plan(), (Strings{"D 1 hbm->ram", "D 12 hbm->ram", "D 13 hbm->ram", "D 11 hbm->ram"}));
}

TEST_F(PlanDemotionsTest, WatermarkSkipsPinnedBlocksAndStopsWhenRamIsFull) {
  planner_.set_config(PlannerConfig{0.90, 0.25, 30'000});
  view_.set_capacity(Tier::kHbm, 400);  // high 360, low 100
  view_.set_capacity(Tier::kRam, 300);
  view_.set_used(Tier::kRam, 100);  // room for two blocks
  save("s", {1, 2, 3, 4}, true, 1'000);
  put_hbm({1, 2, 3});
  view_.put(4, Tier::kHbm, {.movable = false});
  clock_.set_ms(2'000);
  EXPECT_EQ(plan(), (Strings{"D 3 hbm->ram", "D 2 hbm->ram"}));
}

TEST_F(PlanDemotionsTest, IdleDemotionsCountTowardTheWatermark) {
  save("expired", {1, 2}, true, 1'000);
  save("recent", {3, 4, 5, 6, 7, 8, 9, 10}, true, 30'000);
  put_hbm({1, 2, 3, 4, 5, 6, 7, 8, 9, 10});  // 1000 used
  clock_.set_ms(31'000);
  // Idle demotion brings HBM to 800, under the high watermark: nothing more moves.
  EXPECT_EQ(plan(), (Strings{"D 2 hbm->ram", "D 1 hbm->ram"}));
}

}  // namespace
}  // namespace kvtier::policy
