// TierTopology: the order of the tiers that run and what each can do, for every
// configuration the daemon accepts (HBM and/or RAM, NVMe only under RAM, remote anywhere).
#include "common/tier_topology.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace kvtier {
namespace {

TierTopology with(std::set<Tier> tiers) {
  return TierTopology::of([&](Tier tier) { return tiers.contains(tier); });
}

std::vector<Tier> list(std::span<const Tier> tiers) {
  return {tiers.begin(), tiers.end()};
}

TEST(TierTopology, EveryTierRunsTopToBottom) {
  const TierTopology t = with({Tier::kRemote, Tier::kNvme, Tier::kRam, Tier::kHbm});
  EXPECT_EQ(list(t.tiers()),
            (std::vector<Tier>{Tier::kHbm, Tier::kRam, Tier::kNvme, Tier::kRemote}));
  EXPECT_EQ(list(t.local()), (std::vector<Tier>{Tier::kHbm, Tier::kRam, Tier::kNvme}));
  EXPECT_EQ(list(t.engine_facing()), (std::vector<Tier>{Tier::kHbm, Tier::kRam}));
  EXPECT_EQ(t.top(), Tier::kHbm);
  EXPECT_EQ(t.landing(), Tier::kRam);
  EXPECT_EQ(t.below(Tier::kHbm), Tier::kRam);
  EXPECT_EQ(t.below(Tier::kRam), Tier::kNvme);
  // The planner places nothing in the key-addressed tier: NVMe is the bottom it sees.
  EXPECT_EQ(t.below(Tier::kNvme), Tier::kNone);
  EXPECT_EQ(t.above(Tier::kNvme), Tier::kRam);
  EXPECT_EQ(t.above(Tier::kHbm), Tier::kNone);
  EXPECT_EQ(t.durable(), Tier::kNvme);
  EXPECT_EQ(t.spill(), Tier::kRemote);
}

TEST(TierTopology, MissingTiersAreSkipped) {
  // RAM alone (the host backend's smallest daemon).
  const TierTopology ram = with({Tier::kRam});
  EXPECT_EQ(ram.top(), Tier::kRam);
  EXPECT_EQ(ram.landing(), Tier::kRam);
  EXPECT_EQ(ram.below(Tier::kRam), Tier::kNone);
  EXPECT_EQ(ram.durable(), Tier::kNone);
  EXPECT_EQ(ram.spill(), Tier::kNone);
  EXPECT_FALSE(ram.configured(Tier::kHbm));
  // HBM without RAM: HBM is both the top and where reads land.
  const TierTopology hbm = with({Tier::kHbm, Tier::kRemote});
  EXPECT_EQ(hbm.top(), Tier::kHbm);
  EXPECT_EQ(hbm.landing(), Tier::kHbm);
  EXPECT_EQ(hbm.below(Tier::kHbm), Tier::kNone);
  EXPECT_EQ(hbm.spill(), Tier::kRemote);
  // HBM over NVMe skips the missing RAM in both directions.
  const TierTopology gap = with({Tier::kHbm, Tier::kNvme});
  EXPECT_EQ(gap.below(Tier::kHbm), Tier::kNvme);
  EXPECT_EQ(gap.above(Tier::kNvme), Tier::kHbm);
  // No tiers at all.
  const TierTopology none;
  EXPECT_EQ(none.top(), Tier::kNone);
  EXPECT_EQ(none.landing(), Tier::kNone);
  EXPECT_TRUE(none.tiers().empty());
  EXPECT_FALSE(none.configured(Tier::kNone));
}

TEST(TierTopology, TraitsSayWhatEachTierCanDo) {
  for (Tier tier : TierTopology::kOrder) {
    const TierTraits traits = TierTopology::traits(tier);
    EXPECT_EQ(traits.engine_facing, tier == Tier::kHbm || tier == Tier::kRam) << tier_name(tier);
    EXPECT_EQ(traits.durable, tier == Tier::kNvme || tier == Tier::kRemote) << tier_name(tier);
    EXPECT_EQ(traits.key_addressed, tier == Tier::kRemote) << tier_name(tier);
  }
  const TierTraits none = TierTopology::traits(Tier::kNone);
  EXPECT_FALSE(none.engine_facing || none.durable || none.key_addressed);
}

TEST(TierTopology, TheOrderIsTheEnumsAndNamesAreDistinct) {
  std::set<std::string_view> names;
  for (size_t i = 0; i < TierTopology::kOrder.size(); ++i) {
    EXPECT_EQ(static_cast<size_t>(TierTopology::kOrder[i]), i);
    names.insert(tier_name(TierTopology::kOrder[i]));
  }
  names.insert(tier_name(Tier::kNone));
  EXPECT_EQ(names.size(), TierTopology::kOrder.size() + 1);
  EXPECT_EQ(static_cast<int>(kTierCount), static_cast<int>(TierTopology::kOrder.size()));
}

}  // namespace
}  // namespace kvtier
