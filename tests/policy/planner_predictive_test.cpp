// kPredictive: value order under pressure, shared prefixes, drop instead of demote,
// idle thresholds that spare imminent returns, and predictive prefetch — with a
// population taught to the GapModel on a ManualClock first.
#include <array>
#include <cmath>
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
using fake::hashes_of;
using fake::kLayout;
using Strings = std::vector<std::string>;

constexpr uint64_t kGapMs = 45'000;  // how long the taught regulars take to come back

class PlannerPredictiveTest : public ::testing::Test {
 protected:
  PlannerPredictiveTest() {
    config_.mode = PolicyMode::kPredictive;
    planner_.set_config(config_);
    view_.set_capacity(Tier::kHbm, 1'000);  // high 900, low 750
    view_.set_capacity(Tier::kRam, 10'000);
    // 40 conversations that always come back after 45 s; 120 that never do. So a first
    // idle period ends in a return a quarter of the time, later ones always.
    start_ = fake::teach_population(clock_, table_, 40, 4, kGapMs, 120, 3'600'000, 0);
  }

  // A session whose turn ended at start_ + at_ms, that has come back `returns` times
  // before (at the taught pace).
  Session& idle(const std::string& id, std::initializer_list<uint8_t> blocks, uint32_t returns,
                uint64_t at_ms) {
    clock_.set_ms(start_ + at_ms);
    Session& s = *table_.get_or_create(kLayout.namespace_id, id, kLayout).value();
    (void)table_.record_save(s, hashes_of(blocks), true);
    s.returns = returns;
    s.sum_log_gap = returns * std::log(kGapMs + 1.0);
    return s;
  }
  void put(Tier tier, std::initializer_list<uint8_t> ns) {
    for (uint8_t n : ns) view_.put(n, tier);
  }
  void at(uint64_t ms) { clock_.set_ms(start_ + ms); }
  Strings plan() { return describe(planner_.plan_demotions(table_, view_)); }
  void reconfigure() { planner_.set_config(config_); }

  ManualClock clock_{0};
  SessionTable table_{clock_};
  FakePlacementView view_;
  PlannerConfig config_{};
  Planner planner_{config_, clock_};
  uint64_t start_ = 0;
};

TEST_F(PlannerPredictiveTest, PressureTakesTheUnlikelyReturnFirstNotTheOldest) {
  idle("regular", {1, 2, 3, 4, 5}, 3, 0);          // older, but comes back
  idle("first-turn", {6, 7, 8, 9, 10}, 0, 1'000);  // newer, a quarter come back
  put(Tier::kHbm, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  at(2'000);
  EXPECT_EQ(plan(), (Strings{"D 10 hbm->ram", "D 9 hbm->ram", "D 8 hbm->ram"}));

  // The session-aware policy would take the least recently active session's tail.
  config_.mode = PolicyMode::kSessionAware;
  reconfigure();
  EXPECT_EQ(plan(), (Strings{"D 5 hbm->ram", "D 4 hbm->ram", "D 3 hbm->ram"}));
}

TEST_F(PlannerPredictiveTest, EqualWorthGoesOneSessionAtATimeTailFirst) {
  view_.set_capacity(Tier::kRam, 1'000);  // the slowest tier: pressure evicts
  idle("older", {1, 2, 3, 4, 5}, 0, 0);
  idle("newer", {6, 7, 8, 9, 10}, 0, 1'000);
  for (uint8_t n = 1; n <= 10; ++n) {
    // The older session's blocks were read more recently than the newer one's.
    view_.put(n, Tier::kRam, {.last_access_ms = n <= 5 ? 300u : 100u});
  }
  at(3 * 86'400'000ull);  // days later both are worth nothing: equal losses
  // The least recently active session's tail first, whatever each block's own
  // access time: cutting a prefix would make the rest of a session useless.
  EXPECT_EQ(plan(), (Strings{"E 5 ram->none", "E 4 ram->none", "E 3 ram->none"}));
}

TEST_F(PlannerPredictiveTest, ASharedPrefixIsWorthMoreThanEitherTail) {
  config_.hbm_low_watermark = 0.25;
  reconfigure();
  view_.set_capacity(Tier::kHbm, 400);  // high 360, low 100
  idle("a", {1, 2}, 0, 0);
  idle("b", {1, 3}, 0, 0);
  idle("c", {4}, 0, 0);
  put(Tier::kHbm, {1, 2, 3, 4});
  at(1'000);
  const Strings moves = plan();
  ASSERT_EQ(moves.size(), 3u);
  EXPECT_EQ(std::count(moves.begin(), moves.end(), "D 1 hbm->ram"), 0);
}

TEST_F(PlannerPredictiveTest, DropsInsteadOfDemotingWhenRecomputeIsFaster) {
  config_.cost.read_bytes_per_s = {1e12, 1e9, 1.0};  // NVMe: 100 s for a 100-byte block
  config_.cost.tokens_per_block = 16;                // 2 ms of prefill at 8k tokens/s
  reconfigure();
  view_.set_capacity(Tier::kRam, 1'000);
  view_.set_capacity(Tier::kNvme, 10'000);
  idle("s", {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 0, 0);
  put(Tier::kRam, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  at(1'000);
  const std::vector<Move> moves = planner_.plan_demotions(table_, view_);
  EXPECT_EQ(describe(moves), (Strings{"E 10 ram->none", "E 9 ram->none", "E 8 ram->none"}));
  for (const Move& move : moves) EXPECT_EQ(move.reason, MoveReason::kRecomputeCheaper);

  // With the default (fast) NVMe the same blocks are demoted.
  config_.cost = CostConfig{};
  reconfigure();
  EXPECT_EQ(plan(), (Strings{"D 10 ram->nvme", "D 9 ram->nvme", "D 8 ram->nvme"}));
}

TEST_F(PlannerPredictiveTest, IdleThresholdSparesSessionsAboutToReturn) {
  idle("regular", {1, 2}, 3, 0);
  idle("first-turn", {3, 4}, 0, 0);
  put(Tier::kHbm, {1, 2, 3, 4});
  at(31'000);  // both past hbm_idle_ms; the regular usually answers at 45 s
  EXPECT_EQ(plan(), (Strings{"D 4 hbm->ram", "D 3 hbm->ram"}));
  put(Tier::kRam, {3, 4});  // those moves landed
  at(200'000);              // long past its rhythm: now it goes too
  EXPECT_EQ(plan(), (Strings{"D 2 hbm->ram", "D 1 hbm->ram"}));
}

TEST_F(PlannerPredictiveTest, PrefetchesImminentReturnsIntoHeadroom) {
  view_.set_capacity(Tier::kNvme, 10'000);
  idle("regular", {1, 2, 3}, 3, 0);
  idle("first-turn", {4, 5}, 0, 0);
  put(Tier::kRam, {1, 2});
  put(Tier::kNvme, {3});
  put(Tier::kRam, {4, 5});
  at(20'000);  // the regular is due around 45 s
  const std::vector<Move> moves = planner_.plan_demotions(table_, view_);
  EXPECT_EQ(describe(moves), (Strings{"P 3 nvme->ram", "P 1 ram->hbm", "P 2 ram->hbm"}));
  for (const Move& move : moves) EXPECT_EQ(move.reason, MoveReason::kPredictedReturn);

  // Only into headroom: HBM at its low watermark takes nothing.
  view_.set_used(Tier::kHbm, 750);
  EXPECT_EQ(plan(), (Strings{"P 3 nvme->ram"}));
}

TEST_F(PlannerPredictiveTest, PrefetchStaysWithinItsShareOfTheLink) {
  config_.cost.read_bytes_per_s = {1e12, 2'000, 5e9};  // RAM → HBM: 2000 B/s
  config_.plan_interval_ms = 100;                      // 200 B per plan, half for prefetch
  reconfigure();
  idle("regular", {1, 2, 3}, 3, 0);
  put(Tier::kRam, {1, 2, 3});
  at(20'000);
  EXPECT_EQ(plan(), (Strings{"P 1 ram->hbm"}));
}

TEST_F(PlannerPredictiveTest, MakeRoomEvictsWhatIsLeastLikelyToBeReadAgain) {
  view_.set_capacity(Tier::kRam, 500);
  idle("regular", {1, 2}, 3, 0);
  idle("first-turn", {3, 4}, 0, 5'000);
  Session& busy = idle("busy", {5}, 3, 0);
  table_.record_activity(busy);
  put(Tier::kRam, {1, 2, 3, 4, 5});
  at(6'000);
  EXPECT_EQ(describe(planner_.make_room(Tier::kRam, 200, table_, view_)),
            (Strings{"E 4 ram->none", "E 3 ram->none"}));
  EXPECT_EQ(describe(planner_.make_room(Tier::kRam, 500, table_, view_)),
            (Strings{"E 4 ram->none", "E 3 ram->none", "E 2 ram->none", "E 1 ram->none",
                     "E 5 ram->none"}));
}

// Leaving the daemon, a block in the middle of a prefix takes the blocks after it with
// it (they cannot be loaded without it): of two sessions alike, the one whose head is
// here keeps it, and the other's tail goes, though its session is the more recent.
TEST_F(PlannerPredictiveTest, EvictionSparesABlockTheRestOfItsPrefixNeeds) {
  view_.set_capacity(Tier::kHbm, 200);
  idle("long", {1, 2, 3, 4, 5, 6}, 0, 0);
  idle("short", {7}, 0, 0);
  put(Tier::kHbm, {1, 7});
  put(Tier::kRam, {2, 3, 4, 5, 6});
  at(1'000);
  EXPECT_EQ(describe(planner_.make_room(Tier::kHbm, 100, table_, view_)),
            (Strings{"E 7 hbm->none"}));
}

// Leaving the daemon, a block is worth at least what its own history says: with blocks
// used twice going on to a third use nine times in ten, and blocks used once coming
// back a third of the time, of two blocks whose sessions are long gone (worth nothing
// by their returns) the one used once leaves first, though its session and its read
// are the more recent.
TEST_F(PlannerPredictiveTest, ABlockUsedMoreOftenIsKeptOverAMoreRecentOne) {
  std::vector<BlockHash> once, twice, thrice;
  for (uint32_t n = 0; n < 600; ++n) {
    const std::array<uint8_t, 3> bytes{0x44, static_cast<uint8_t>(n >> 8),
                                       static_cast<uint8_t>(n & 0xff)};
    once.emplace_back(bytes);
    if (n % 3 == 0) twice.emplace_back(bytes);
    if (n % 3 == 0 && n % 30 != 0) thrice.emplace_back(bytes);
  }
  for (const auto* uses : {&once, &twice, &thrice}) table_.record_uses(kLayout, *uses);
  idle("used-twice", {2}, 0, 0);  // the less recently active: first on equal worth
  idle("used-once", {1}, 0, 0);
  table_.record_uses(kLayout, hashes_of({1, 2, 2}));
  view_.set_capacity(Tier::kNvme, 200);
  view_.put(1, Tier::kNvme, {.last_access_ms = start_ + 500});
  view_.put(2, Tier::kNvme, {.last_access_ms = start_ + 100});
  at(3 * 86'400'000ull);
  EXPECT_EQ(describe(planner_.make_room(Tier::kNvme, 100, table_, view_)),
            (Strings{"E 1 nvme->none"}));
  // A block no session holds is worth nothing, whatever its count: its prefix may be
  // gone (the tail of a session cut short).
  view_.set_capacity(Tier::kNvme, 300);
  view_.put(3, Tier::kNvme, {.session_refs = 0, .last_access_ms = start_ + 900});
  table_.record_uses(kLayout, hashes_of({3, 3}));
  EXPECT_EQ(describe(planner_.make_room(Tier::kNvme, 100, table_, view_)),
            (Strings{"E 3 nvme->none"}));
}

}  // namespace
}  // namespace kvtier::policy
