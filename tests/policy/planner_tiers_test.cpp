// The cost model, kLru (the LRU-tiering baseline) and the session-aware rules that
// involve RAM and NVMe: watermark cascades, the RAM idle threshold, durable sessions
// and BeginTurn (plan_turn_start), on a ManualClock.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "policy/clock.h"
#include "policy/cost_model.h"
#include "policy/planner.h"
#include "policy/session_table.h"
#include "tests/policy/fake_placement_view.h"

namespace kvtier::policy {
namespace {

using fake::describe;
using fake::FakePlacementView;
using fake::kLayout;
using Strings = std::vector<std::string>;

TEST(CostModelTest, ReloadAgainstRecompute) {
  CostModel cost(CostConfig{{1000e9, 25e9, 5e9}, 8000, 512});
  EXPECT_DOUBLE_EQ(cost.recompute_ms(kLayout), 64.0);  // 512 tokens at 8k tokens/s
  EXPECT_NEAR(cost.reload_ms(Tier::kNvme, 64ull << 20), 13.42, 0.01);
  EXPECT_TRUE(std::isinf(cost.reload_ms(Tier::kNone, 1)));
  EXPECT_NEAR(cost.saving_ms(Tier::kRam, kLayout, 64ull << 20), 64.0 - 2.684, 0.01);
  EXPECT_TRUE(cost.worth_keeping(Tier::kNvme, kLayout, 64ull << 20));
  // A small model on a slow disk: recomputing 16 tokens beats reading 64 MiB.
  cost.set_layout(kLayout, LayoutCost{16, 20'000});
  EXPECT_DOUBLE_EQ(cost.recompute_ms(kLayout), 0.8);
  EXPECT_FALSE(cost.worth_keeping(Tier::kNvme, kLayout, 64ull << 20));
  EXPECT_EQ(cost.saving_ms(Tier::kNvme, kLayout, 64ull << 20), 0.0);
  EXPECT_TRUE(cost.worth_keeping(Tier::kHbm, kLayout, 64ull << 20));
}

class PlannerTiersTest : public ::testing::Test {
 protected:
  PlannerTiersTest() {
    view_.set_capacity(Tier::kHbm, 1'000);   // high 900, low 750
    view_.set_capacity(Tier::kRam, 1'000);   // high 900, low 750
    view_.set_capacity(Tier::kNvme, 1'000);  // high 980, low 950
  }
  void use(PolicyMode mode) {
    config_.mode = mode;
    planner_.set_config(config_);
  }
  Session& save(const std::string& id, std::initializer_list<uint8_t> blocks, bool end_of_turn,
                uint64_t at_ms) {
    return fake::save_session(clock_, table_, id, blocks, end_of_turn, at_ms);
  }
  void put(Tier tier, std::initializer_list<uint8_t> ns, uint64_t last_access_ms = 0) {
    for (uint8_t n : ns) view_.put(n, tier, {.last_access_ms = last_access_ms});
  }
  Strings plan() { return describe(planner_.plan_demotions(table_, view_)); }
  Strings turn_start(const Session& s) {
    return describe(planner_.plan_turn_start(s, table_, view_));
  }
  Session& hbm_nearly_full_and_s_below(bool neighbour_idle = true);

  ManualClock clock_{0};
  SessionTable table_{clock_};
  FakePlacementView view_;
  PlannerConfig config_{};
  Planner planner_{config_, clock_};
};

TEST_F(PlannerTiersTest, LruDemotesLeastRecentlyUsedDeepestFirstAndCascades) {
  use(PolicyMode::kLru);
  save("a", {1, 2, 3}, true, 100);
  save("b", {4, 5, 6, 7, 8, 9, 10}, true, 200);
  put(Tier::kHbm, {1, 2, 3}, 100);  // one request's blocks: same access time
  put(Tier::kHbm, {4, 5, 6, 7, 8, 9, 10}, 200);
  for (uint8_t n = 11; n <= 19; ++n) {  // 900: at the high mark, unreferenced
    view_.put(n, Tier::kRam, {.session_refs = 0, .last_access_ms = 60u - n});
  }
  view_.put(20, Tier::kNvme, {.bytes = 980, .session_refs = 0, .last_access_ms = 1});
  clock_.set_ms(300);
  // HBM 1000 → 750 (three blocks go); RAM would reach 1150 → sheds 400 to NVMe; NVMe
  // would reach 1380 → evicts. Planned bottom-up, so each level has room.
  EXPECT_EQ(plan(),
            (Strings{"E 20 nvme->none", "D 19 ram->nvme", "D 18 ram->nvme", "D 17 ram->nvme",
                     "D 16 ram->nvme", "D 3 hbm->ram", "D 2 hbm->ram", "D 1 hbm->ram"}));
}

TEST_F(PlannerTiersTest, LruIgnoresIdleTimeAndTurnStarts) {
  use(PolicyMode::kLru);
  Session& s = save("s", {1, 2}, true, 0);
  put(Tier::kHbm, {1});
  put(Tier::kRam, {2});
  clock_.set_ms(10'000'000);  // idle far past every threshold
  EXPECT_TRUE(plan().empty());
  table_.record_activity(s);
  EXPECT_TRUE(turn_start(s).empty());  // request-scoped: no BeginTurn prefetch
}

TEST_F(PlannerTiersTest, HbmOnlyEvictsLeastRecentlyUsedPastTheWatermark) {
  use(PolicyMode::kLru);
  view_.set_capacity(Tier::kRam, 0);
  view_.set_capacity(Tier::kNvme, 0);
  save("s", {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, true, 0);
  for (uint8_t n = 1; n <= 10; ++n) view_.put(n, Tier::kHbm, {.last_access_ms = n});
  EXPECT_EQ(plan(), (Strings{"E 1 hbm->none", "E 2 hbm->none", "E 3 hbm->none"}));
}

TEST_F(PlannerTiersTest, RamIdleThresholdMovesIdleSessionsToNvme) {
  use(PolicyMode::kSessionAware);
  config_.ram_idle_ms = 60'000;
  planner_.set_config(config_);
  save("old", {1, 2}, true, 0);
  save("young", {3}, true, 50'000);
  put(Tier::kRam, {1, 2, 3});
  clock_.set_ms(59'999);
  EXPECT_TRUE(plan().empty());
  clock_.set_ms(60'000);
  EXPECT_EQ(plan(), (Strings{"D 2 ram->nvme", "D 1 ram->nvme"}));
  view_.set_capacity(Tier::kNvme, 0);  // RAM is then the slowest tier: blocks stay
  EXPECT_TRUE(plan().empty());
}

TEST_F(PlannerTiersTest, DurableSessionsSkipIdleThresholdsAndLeaveLast) {
  use(PolicyMode::kSessionAware);
  Session& durable = save("system-prompt", {1, 2}, true, 0);
  table_.set_priority(durable, 90);
  save("chat", {3, 4, 5, 6, 7, 8, 9, 10}, false, 500);  // active
  put(Tier::kHbm, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  clock_.set_ms(1'000'000);
  // Over the high watermark (1000 > 900): the active chat's tail goes, the durable
  // prompt stays although it is idle and older.
  EXPECT_EQ(plan(), (Strings{"D 10 hbm->ram", "D 9 hbm->ram", "D 8 hbm->ram"}));
}

// Retention priorities come before each policy's own order: under pressure the lowest
// priority goes first, a priority above the default keeps a block however old, a
// block's own priority overrides its session's, and a timed priority ends.
TEST(PlannerRetentionTest, EveryPolicyGivesUpTheLowestPriorityFirst) {
  for (PolicyMode mode : {PolicyMode::kLru, PolicyMode::kSessionAware, PolicyMode::kPredictive}) {
    SCOPED_TRACE(policy_mode_name(mode));
    ManualClock clock{0};
    SessionTable table{clock};
    FakePlacementView view;
    view.set_capacity(Tier::kHbm, 1'000);  // high 900, low 750: three blocks go
    view.set_capacity(Tier::kRam, 10'000);
    PlannerConfig config;
    config.mode = mode;
    Planner planner{config, clock};
    Session& old_chat = fake::save_session(clock, table, "old", {1, 2, 3, 4}, true, 0);
    Session& tool_call = fake::save_session(clock, table, "tool-call", {5, 6, 7}, true, 400);
    fake::save_session(clock, table, "chat", {8, 9, 10}, true, 500);
    for (uint8_t n = 1; n <= 10; ++n) {
      view.put(n, Tier::kHbm, {.last_access_ms = n <= 4 ? 0u : n <= 7 ? 400u : 500u});
    }
    clock.set_ms(1'000);  // every session idle, none past an idle threshold
    auto first_three = [&] {
      auto moves = describe(planner.plan_demotions(table, view));
      EXPECT_EQ(moves.size(), 3u);
      moves.resize(std::min<size_t>(moves.size(), 3));
      std::sort(moves.begin(), moves.end());
      return moves;
    };
    const Strings old_tail{"D 2 hbm->ram", "D 3 hbm->ram", "D 4 hbm->ram"};
    const Strings tool_call_blocks{"D 5 hbm->ram", "D 6 hbm->ram", "D 7 hbm->ram"};
    const Strings unprioritized = first_three();
    // LRU and session-aware give up the oldest session's tail; predictive by its losses.
    if (mode != PolicyMode::kPredictive) {
      EXPECT_EQ(unprioritized, old_tail);
    }

    table.set_priority(tool_call, 10);  // one-off: goes before older blocks
    EXPECT_EQ(first_three(), tool_call_blocks);

    table.set_priority(tool_call, kDefaultPriority);
    table.set_priority(old_chat, 90, /*until_ms=*/2'000);  // durable for a while
    for (const std::string& move : first_three()) {
      for (const char* kept : {"D 1 ", "D 2 ", "D 3 ", "D 4 "}) {
        EXPECT_FALSE(move.starts_with(kept)) << move;
      }
    }
    clock.set_ms(2'000);
    table.expire_priorities(clock.now_ms());
    EXPECT_EQ(old_chat.priority, kDefaultPriority);
    EXPECT_EQ(table.holders(fake::key_of(1))->max_priority, kDefaultPriority);
    if (mode != PolicyMode::kPredictive) {  // (predictive's losses moved with the clock)
      EXPECT_EQ(first_three(), old_tail);
    }

    // A block's own priority overrides its session's, both ways.
    table.set_priority(old_chat, 90);
    ASSERT_TRUE(table.set_block_priority(fake::key_of(1), 5));
    auto moves = describe(planner.plan_demotions(table, view));
    ASSERT_FALSE(moves.empty());
    EXPECT_EQ(moves.front(), "D 1 hbm->ram");
    ASSERT_TRUE(table.set_block_priority(fake::key_of(1), 0));  // cleared: the session's
    moves = describe(planner.plan_demotions(table, view));
    EXPECT_TRUE(std::find(moves.begin(), moves.end(), "D 1 hbm->ram") == moves.end());
    EXPECT_FALSE(table.set_block_priority(fake::key_of(99), 50));  // held by no session
  }
}

// A range never lowers a block other sessions hold; a block lowered while one session
// held it goes back to its holders' priority when a session that wants it more takes
// it up; a timed block priority ends; ranges in one call apply in order.
TEST(PlannerRetentionTest, ABlocksOwnPriorityRespectsItsOtherHolders) {
  ManualClock clock{0};
  SessionTable table{clock};
  Session& agent = fake::save_session(clock, table, "agent", {1, 2}, true, 0);
  table.set_priority(agent, 90);
  fake::save_session(clock, table, "batch", {1, 2, 3}, true, 10);
  // The batch request calls its whole prefix one-off: the agent's prompt stays at 90.
  ASSERT_TRUE(table.set_block_priority(fake::key_of(1), 10));
  EXPECT_EQ(table.holders(fake::key_of(1))->priority(), 90);
  ASSERT_TRUE(table.set_block_priority(fake::key_of(3), 10));  // its own block: lowered
  EXPECT_EQ(table.holders(fake::key_of(3))->priority(), 10);
  ASSERT_TRUE(table.set_block_priority(fake::key_of(1), 95, /*until_ms=*/500));  // raised
  EXPECT_EQ(table.holders(fake::key_of(1))->priority(), 95);
  clock.set_ms(500);
  table.expire_priorities(clock.now_ms());
  EXPECT_EQ(table.holders(fake::key_of(1))->priority(), 90);
  EXPECT_EQ(table.holders(fake::key_of(1))->block_priority, 0);
  // Another session of the default priority takes block 3 up: back to its holders'.
  fake::save_session(clock, table, "retry", {1, 2, 3, 4}, true, 600);
  EXPECT_EQ(table.holders(fake::key_of(3))->block_priority, 0);
  EXPECT_EQ(table.holders(fake::key_of(3))->priority(), kDefaultPriority);
}

// A neighbour session (idle, or busy when not `neighbour_idle`) and a busy one fill HBM
// to 800 of the 900 allowed; session "s" has block 11 in RAM and 12, 13 in NVMe, and begins its
// turn at 300 ms.
Session& PlannerTiersTest::hbm_nearly_full_and_s_below(bool neighbour_idle) {
  save("neighbour", {1, 2, 3, 4}, neighbour_idle, 100);
  save("busy", {5, 6, 7, 8}, false, 150);
  Session& s = save("s", {11, 12, 13}, true, 200);
  put(Tier::kHbm, {1, 2, 3, 4, 5, 6, 7, 8});
  put(Tier::kRam, {11});
  put(Tier::kNvme, {12, 13});
  clock_.set_ms(300);
  table_.record_activity(s);
  return s;
}

TEST_F(PlannerTiersTest, TurnStartPromotesThePrefixDisplacingIdleSessions) {
  use(PolicyMode::kSessionAware);
  Session& s = hbm_nearly_full_and_s_below();
  // 11 fits; 12 needs room: the idle session's tail leaves (the active one's does not).
  EXPECT_EQ(turn_start(s), (Strings{"P 11 ram->hbm", "D 4 hbm->ram", "P 12 nvme->hbm",
                                    "D 3 hbm->ram", "P 13 nvme->hbm"}));
}

// Engines load 1 ms after BeginTurn and a block takes 1 ms from NVMe: only the first
// NVMe block can land in time, so only it comes up (displacing); the later one stays
// on NVMe, for the Load to read up itself. With no lead at all nothing is displaced
// and nothing comes up from NVMe.
TEST_F(PlannerTiersTest, TurnStartDisplacesOnlyForWhatLandsWithinTheTurnLead) {
  use(PolicyMode::kSessionAware);
  config_.cost.read_bytes_per_s = {1e9, 1e6, 1e5};  // 100-byte blocks: 1 ms from NVMe
  planner_.set_config(config_);
  Session& s = hbm_nearly_full_and_s_below();
  EXPECT_FALSE(planner_.turn_lead_ms().has_value());
  planner_.observe_turn_lead(1);
  EXPECT_EQ(turn_start(s), (Strings{"P 11 ram->hbm", "D 4 hbm->ram", "P 12 nvme->hbm"}));
  // Engines that load at once: the average falls toward 0 (1/8 to each new turn).
  for (int i = 0; i < 64; ++i) planner_.observe_turn_lead(0);
  EXPECT_LT(*planner_.turn_lead_ms(), 0.01);
  EXPECT_EQ(turn_start(s), (Strings{"P 11 ram->hbm"}));
}

// Session "s" wants 300 bytes in HBM, which has 100 under its high watermark and
// nothing idle to give up (an active session fills the rest): none of it comes up to
// HBM — part of a prefix there gains little and ties the tier up while the request
// waits — and its NVMe blocks come up to RAM. (The old rule brought 11 up.) (With room to displace,
// as in TurnStartPromotesThePrefixDisplacingIdleSessions, it does come up.)
TEST_F(PlannerTiersTest, TurnStartLeavesASessionTooLargeForTheTopTierBelowIt) {
  use(PolicyMode::kSessionAware);
  Session& s = hbm_nearly_full_and_s_below(/*neighbour_idle=*/false);
  EXPECT_EQ(turn_start(s), (Strings{"P 12 nvme->ram", "P 13 nvme->ram"}));
  // Engines that load at once, on links where nothing lands first: its NVMe blocks stay
  // there and are not counted, and what is left (11) fits the free room.
  config_.cost.read_bytes_per_s = {1e9, 1e6, 1e5};
  planner_.set_config(config_);
  planner_.observe_turn_lead(0);
  EXPECT_EQ(turn_start(s), (Strings{"P 11 ram->hbm"}));
}

TEST_F(PlannerTiersTest, TurnStartBringsNvmeBlocksToRamWhenHbmIsFull) {
  use(PolicyMode::kSessionAware);
  save("busy", {1, 2, 3, 4, 5, 6, 7, 8, 9}, false, 100);
  Session& s = save("s", {11, 12}, true, 200);
  put(Tier::kHbm, {1, 2, 3, 4, 5, 6, 7, 8, 9});  // full of an active session
  put(Tier::kNvme, {11, 12});
  clock_.set_ms(300);
  table_.record_activity(s);
  EXPECT_EQ(turn_start(s), (Strings{"P 11 nvme->ram", "P 12 nvme->ram"}));
}

TEST_F(PlannerTiersTest, RecentMovesSummarizeEachPlan) {
  use(PolicyMode::kSessionAware);
  save("s", {1, 2, 3}, true, 0);
  put(Tier::kHbm, {1, 2, 3});
  clock_.set_ms(40'000);
  ASSERT_EQ(plan().size(), 3u);
  ASSERT_EQ(planner_.recent_moves().size(), 1u);
  const PlanRecord& record = planner_.recent_moves().back();
  EXPECT_EQ(record.at_ms, 40'000u);
  EXPECT_EQ(record.kind, MoveKind::kDemote);
  EXPECT_EQ(record.from, Tier::kHbm);
  EXPECT_EQ(record.to, Tier::kRam);
  EXPECT_EQ(record.reason, MoveReason::kIdle);
  EXPECT_EQ(record.blocks, 3u);
  EXPECT_EQ(record.bytes, 300u);
  EXPECT_EQ(move_reason_name(record.reason), "idle");
}

}  // namespace
}  // namespace kvtier::policy
