// kvtier::Tier is numbered top to bottom (then kNone); the wire and the C ABI keep their
// older numbering (none = 3, remote = 4). Every tier converts both ways, and a wire value
// this build does not know reads as "not held".
#include <gtest/gtest.h>

#include "client/c_api_internal.h"
#include "common/tier_topology.h"
#include "schema/wire_tier.h"

namespace kvtier {
namespace {

TEST(TierNumbering, WireAndCKeepTheirValuesForEveryTier) {
  struct Expected {
    Tier tier;
    wire::Tier wire;
    kvtier_tier c;
  };
  const Expected expected[] = {
      {Tier::kHbm, wire::Tier::HBM, KVTIER_TIER_HBM},
      {Tier::kRam, wire::Tier::RAM, KVTIER_TIER_RAM},
      {Tier::kNvme, wire::Tier::NVME, KVTIER_TIER_NVME},
      {Tier::kRemote, wire::Tier::REMOTE, KVTIER_TIER_REMOTE},
      {Tier::kNone, wire::Tier::NONE, KVTIER_TIER_NONE},
  };
  for (const Expected& e : expected) {
    EXPECT_EQ(to_wire(e.tier), e.wire) << tier_name(e.tier);
    EXPECT_EQ(from_wire(e.wire), e.tier) << tier_name(e.tier);
    EXPECT_EQ(c_api::c_tier(e.tier), e.c) << tier_name(e.tier);
    // The C ABI's numbers are the wire's: both are what clients of older versions see.
    EXPECT_EQ(static_cast<int>(e.c), static_cast<int>(e.wire)) << tier_name(e.tier);
  }
  EXPECT_EQ(static_cast<int>(wire::Tier::NONE), 3);
  EXPECT_EQ(static_cast<int>(wire::Tier::REMOTE), 4);
}

TEST(TierNumbering, AnUnknownWireTierIsNotHeld) {
  EXPECT_EQ(from_wire(static_cast<wire::Tier>(9)), Tier::kNone);
}

}  // namespace
}  // namespace kvtier
