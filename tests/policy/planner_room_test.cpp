// make_room (eviction order, impossible requests) and plan_promotions.
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

class PlannerRoomTest : public ::testing::Test {
 protected:
  Session& save(const std::string& id, std::initializer_list<uint8_t> blocks, bool end_of_turn,
                uint64_t at_ms) {
    return fake::save_session(clock_, table_, id, blocks, end_of_turn, at_ms);
  }
  Strings room(Tier tier, uint64_t bytes) {
    return describe(planner_.make_room(tier, bytes, table_, view_));
  }
  Strings promote(const Session& session) {
    return describe(planner_.plan_promotions(session, view_));
  }

  ManualClock clock_{0};
  SessionTable table_{clock_};
  FakePlacementView view_;
  Planner planner_{PlannerConfig{0.90, 0.75, 30'000}, clock_};
};

TEST_F(PlannerRoomTest, MakeRoomIsEmptyWhenTheBytesAlreadyFit) {
  view_.set_capacity(Tier::kRam, 1'000);
  view_.put(11, Tier::kRam, {.session_refs = 0});
  view_.set_used(Tier::kRam, 700);
  EXPECT_TRUE(room(Tier::kRam, 300).empty());
  EXPECT_EQ(room(Tier::kRam, 301), (Strings{"E 11 ram->none"}));
}

// tenant-quota: the namespace furthest above its quota in the tier gives its next block
// (in the policy's order) first, so one within its quota keeps its blocks while another
// stands further above; equal standing follows the policy's order.
TEST_F(PlannerRoomTest, MakeRoomLevelsNamespacesAgainstTheirQuotas) {
  view_.set_capacity(Tier::kRam, 1'000);
  // Namespace 7 holds the oldest blocks; namespace 9 newer ones.
  view_.put(11, Tier::kRam, {.session_refs = 0, .last_access_ms = 10});
  view_.put(12, Tier::kRam, {.session_refs = 0, .last_access_ms = 20});
  const LayoutKey other{9, fake::kLayout.layout_digest};
  for (uint8_t n : {21, 22, 23, 24}) {
    view_.put_key({other, fake::hash_of(n)}, Tier::kRam,
                  {.session_refs = 0, .last_access_ms = 100u + n});
  }
  view_.set_used(Tier::kRam, 1'000);
  EXPECT_EQ(room(Tier::kRam, 300), (Strings{"E 11 ram->none", "E 12 ram->none", "E 21 ram->none"}));
  // 9 is 150 over its quota, 7 150 under: 9 gives until it stands where 7 does.
  view_.set_quota_standing(Tier::kRam, {{9, 150}, {7, -150}});
  EXPECT_EQ(room(Tier::kRam, 400),
            (Strings{"E 21 ram->none", "E 22 ram->none", "E 23 ram->none", "E 11 ram->none"}));
  // A namespace without a quota counts as at it.
  view_.set_quota_standing(Tier::kRam, {{9, 150}});
  EXPECT_EQ(room(Tier::kRam, 400),
            (Strings{"E 21 ram->none", "E 22 ram->none", "E 11 ram->none", "E 23 ram->none"}));
  // Another tier's standing does not touch this one.
  view_.set_quota_standing(Tier::kRam, {});
  view_.set_quota_standing(Tier::kHbm, {{9, 1'000}});
  EXPECT_EQ(room(Tier::kRam, 100), (Strings{"E 11 ram->none"}));
}

// A Save's room when RAM holds only blocks that cannot move (copied, read or pinned by
// requests in flight): HBM's blocks go past RAM to NVMe, lowest retention priority
// first, held or not; nothing without a durable tier below, and nothing leaves the
// daemon while NVMe has room.
TEST_F(PlannerRoomTest, DemoteToDurableSendsBlocksPastAFullTierLowestPriorityFirst) {
  view_.set_capacity(Tier::kHbm, 300);
  view_.set_capacity(Tier::kRam, 200);
  view_.put(31, Tier::kRam, {.movable = false});
  view_.put(32, Tier::kRam, {.movable = false});
  Session& kept = save("kept", {1}, true, 100);
  table_.set_priority(kept, 80);
  save("plain", {2}, true, 200);
  Session& low = save("low", {3}, true, 300);
  table_.set_priority(low, 1);
  view_.put(1, Tier::kHbm, {.session_refs = 1, .last_access_ms = 100});
  view_.put(2, Tier::kHbm, {.session_refs = 1, .last_access_ms = 200});
  view_.put(3, Tier::kHbm, {.session_refs = 1, .last_access_ms = 300});
  auto past = [&](uint64_t bytes) {
    return describe(planner_.make_room(Tier::kHbm, bytes, table_, view_, Room::kDemoteToDurable));
  };
  EXPECT_TRUE(past(100).empty()) << "there is no NVMe tier";
  view_.set_capacity(Tier::kNvme, 1'000);
  EXPECT_EQ(past(100), (Strings{"D 3 hbm->nvme"}));
  EXPECT_EQ(past(300), (Strings{"D 3 hbm->nvme", "D 2 hbm->nvme", "D 1 hbm->nvme"}));
  // The room RAM would give by demoting, it cannot: the old rule finds nothing.
  EXPECT_TRUE(
      describe(planner_.make_room(Tier::kRam, 100, table_, view_, Room::kDemoteEvictingBelow))
          .empty());
}

TEST_F(PlannerRoomTest, MakeRoomEvictsUnreferencedLruThenColdestSessions) {
  view_.set_capacity(Tier::kRam, 1'000);
  save("busy", {1}, false, 100);
  save("idle", {2, 3, 4}, true, 2'000);
  view_.put(11, Tier::kRam, {.session_refs = 0, .last_access_ms = 20});
  view_.put(12, Tier::kRam, {.session_refs = 0, .last_access_ms = 10});
  view_.put(13, Tier::kRam, {.session_refs = 0, .movable = false, .last_access_ms = 5});
  for (uint8_t n : {1, 2, 3}) view_.put(n, Tier::kRam);
  view_.put(4, Tier::kHbm);  // another tier: not evicted from RAM
  view_.set_used(Tier::kRam, 1'000);
  clock_.set_ms(3'000);

  EXPECT_EQ(room(Tier::kRam, 350),
            (Strings{"E 12 ram->none", "E 11 ram->none", "E 3 ram->none", "E 2 ram->none"}));
  EXPECT_EQ(room(Tier::kRam, 450), (Strings{"E 12 ram->none", "E 11 ram->none", "E 3 ram->none",
                                            "E 2 ram->none", "E 1 ram->none"}));
}

TEST_F(PlannerRoomTest, MakeRoomThatCannotSucceedEvictsNothing) {
  view_.set_capacity(Tier::kRam, 1'000);
  save("s", {1, 2, 3}, true, 100);
  view_.put(1, Tier::kRam);
  view_.put(2, Tier::kRam, {.movable = false});
  view_.put(3, Tier::kRam, {.movable = false});
  view_.put(11, Tier::kRam, {.session_refs = 0});
  view_.set_used(Tier::kRam, 1'000);
  EXPECT_EQ(room(Tier::kRam, 200).size(), 2u);  // exactly what is movable
  EXPECT_TRUE(room(Tier::kRam, 201).empty());
  EXPECT_TRUE(room(Tier::kRam, 1'001).empty());  // larger than the tier
  EXPECT_TRUE(room(Tier::kNvme, 1).empty());     // tier not configured
}

TEST_F(PlannerRoomTest, PromotionsFollowPrefixOrderUpToTheHighWatermark) {
  view_.set_capacity(Tier::kHbm, 1'000);  // high watermark 900
  Session& s = save("s", {1, 2, 3, 4, 5, 6, 7}, false, 100);
  view_.put(1, Tier::kHbm);
  view_.put(2, Tier::kRam);
  view_.put(3, Tier::kNvme);
  view_.put(4, Tier::kRam, {.movable = false});
  view_.put(5, Tier::kRam);
  view_.put(6, Tier::kRam);  // 7 is nowhere
  view_.set_used(Tier::kHbm, 600);
  EXPECT_EQ(promote(s), (Strings{"P 2 ram->hbm", "P 3 nvme->hbm", "P 5 ram->hbm"}));
}

TEST_F(PlannerRoomTest, PromotionsStopAtTheFirstBlockThatDoesNotFit) {
  view_.set_capacity(Tier::kHbm, 1'000);
  Session& s = save("s", {1, 2, 3}, false, 100);
  view_.put(1, Tier::kRam);
  view_.put(2, Tier::kRam, {.bytes = 400});
  view_.put(3, Tier::kRam);
  view_.set_used(Tier::kHbm, 500);
  // 3 would fit, but without 2 it does not lengthen the prefix in HBM.
  EXPECT_EQ(promote(s), (Strings{"P 1 ram->hbm"}));

  view_.set_capacity(Tier::kHbm, 0);
  EXPECT_TRUE(promote(s).empty());
}

}  // namespace
}  // namespace kvtier::policy
