// The peers' policies (peer_policy.h) on small sequences: each one's textbook
// behaviour, seen through the order of sacrifice it gives a tier's blocks.
#include "policy/peer_policy.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "policy/peer_queues.h"
#include "policy/planner.h"
#include "tests/policy/fake_placement_view.h"

namespace kvtier::policy {
namespace {

using fake::key_of;
using Order = std::vector<int>;

// One tier (HBM) of a peer policy, blocks of 1 byte (so a capacity in bytes is one in
// blocks); every event a request of its own (so no two blocks are "used together").
class Peer {
 public:
  Peer(PolicyMode mode, uint64_t capacity, PlannerConfig config = {})
      : policy_(PeerPolicy::make(mode, config)) {
    policy_->set_capacity(Tier::kHbm, capacity);
  }
  // A Save stores it: it enters the tier.
  void enter(int n, uint32_t position = 0) {
    policy_->block_entered(key_of(static_cast<uint8_t>(n)), Tier::kHbm, 1);
    save(n, position);
  }
  void save(int n, uint32_t position = 0) {
    policy_->block_saved(key_of(static_cast<uint8_t>(n)), position, now_ += 1000);
  }
  void use(int n, uint32_t position = 0) {
    policy_->block_loaded(key_of(static_cast<uint8_t>(n)), position, now_ += 1000);
  }
  void leave(int n, Departure why = Departure::kEvicted) {
    policy_->block_left(key_of(static_cast<uint8_t>(n)), Tier::kHbm, why);
  }
  void wait(uint64_t ms) { now_ += ms; }
  // The blocks `held`, first to go first.
  Order order(Order held, bool leaves_daemon = false) {
    std::vector<BlockKey> keys;
    for (int n : held) keys.push_back(key_of(static_cast<uint8_t>(n)));
    std::vector<PeerRank> ranks;
    policy_->rank(Tier::kHbm, leaves_daemon, keys, now_, ranks);
    // The order is total: distinct keys never rank equal.
    for (size_t i = 0; i < ranks.size(); ++i) {
      for (size_t j = i + 1; j < ranks.size(); ++j) {
        EXPECT_TRUE(ranks[i] < ranks[j] || ranks[j] < ranks[i]) << held[i] << " and " << held[j];
      }
    }
    std::vector<size_t> index(held.size());
    for (size_t i = 0; i < index.size(); ++i) index[i] = i;
    std::sort(index.begin(), index.end(), [&](size_t a, size_t b) { return ranks[a] < ranks[b]; });
    Order out;
    for (size_t i : index) out.push_back(held[i]);
    return out;
  }
  PeerPolicy& policy() { return *policy_; }

 private:
  std::unique_ptr<PeerPolicy> policy_;
  uint64_t now_ = 0;
};

TEST(PeerPolicyTest, NamesParseAndOnlyPeersGetAPolicy) {
  for (const char* name : {"s3fifo", "slru", "arc", "tinylfu-lru", "w-tinylfu", "workload"}) {
    auto mode = parse_policy_mode(name);
    ASSERT_TRUE(mode.has_value()) << name;
    EXPECT_EQ(policy_mode_name(*mode), name);
    EXPECT_TRUE(PeerPolicy::is_peer(*mode));
    EXPECT_NE(PeerPolicy::make(*mode, {}), nullptr);
  }
  for (PolicyMode mode : {PolicyMode::kLru, PolicyMode::kSessionAware, PolicyMode::kPredictive}) {
    EXPECT_FALSE(PeerPolicy::is_peer(mode));
    EXPECT_EQ(PeerPolicy::make(mode, {}), nullptr);
  }
  EXPECT_FALSE(parse_policy_mode("s3-fifo").has_value());
}

// ---- S3-FIFO (small FIFO 10 % of the tier: 3 of 30 blocks) ----

TEST(S3FifoTest, NewBlocksLeaveInFifoOrder) {
  Peer p(PolicyMode::kS3Fifo, 30);
  for (int n = 1; n <= 5; ++n) p.enter(n);
  EXPECT_EQ(p.order({5, 3, 1, 4, 2}), (Order{1, 2, 3, 4, 5}));
}

TEST(S3FifoTest, GhostHitEntersMain) {
  Peer p(PolicyMode::kS3Fifo, 30);
  for (int n = 1; n <= 5; ++n) p.enter(n);
  p.leave(1);  // unused in the small FIFO: its key goes to the ghost
  p.enter(1);  // back: found in the ghost, it enters main
  // Small holds 2..5 (4 >= 3): it gives 2 and 3, then (under 3) main gives 1, then
  // small the rest. Had 1 come back into small as the newest, it would go last.
  EXPECT_EQ(p.order({1, 2, 3, 4, 5}), (Order{2, 3, 1, 4, 5}));
}

TEST(S3FifoTest, UsedInSmallMovesToMainAndMainIsAClock) {
  Peer p(PolicyMode::kS3Fifo, 30);
  for (int n = 1; n <= 4; ++n) p.enter(n);
  p.use(1);
  // 1 (used) moves to main instead of leaving; 2 goes; small is under 3, so main's
  // clock passes 1 once (its use spent) and then takes it; then small's 3 and 4.
  EXPECT_EQ(p.order({1, 2, 3, 4}), (Order{2, 1, 3, 4}));
}

TEST(S3FifoTest, MovedUpIsNoGhost) {
  Peer p(PolicyMode::kS3Fifo, 30);
  for (int n = 1; n <= 5; ++n) p.enter(n);
  p.leave(1, Departure::kPromoted);  // to a faster tier: not an eviction
  p.enter(1);                        // comes back down: new to this tier again
  EXPECT_EQ(p.order({1, 2, 3, 4, 5}), (Order{2, 3, 4, 5, 1}));
}

// ---- SLRU (protected 80 %) ----

TEST(SlruTest, SecondHitProtects) {
  Peer p(PolicyMode::kSlru, 10);
  for (int n = 1; n <= 3; ++n) p.enter(n);
  EXPECT_EQ(p.order({1, 2, 3}), (Order{1, 2, 3}));
  p.use(1);  // a hit on probation: protected
  EXPECT_EQ(p.order({1, 2, 3}), (Order{2, 3, 1}));
}

TEST(SlruTest, FullProtectedSegmentPutsItsOldestBackOnProbation) {
  Peer p(PolicyMode::kSlru, 2);  // protected: 1 block
  for (int n = 1; n <= 3; ++n) p.enter(n);
  p.use(1);
  p.use(2);  // protects 2; 1, the protected segment's oldest, goes back on probation
  EXPECT_EQ(p.order({1, 2, 3}), (Order{3, 1, 2}));
}

// ---- ARC ----

TEST(ArcTest, SecondUseMovesToT2) {
  Peer p(PolicyMode::kArc, 4);
  for (int n = 1; n <= 3; ++n) p.enter(n);
  p.use(1);
  EXPECT_EQ(p.order({1, 2, 3}), (Order{2, 3, 1}));  // p = 0: T1 goes first
}

TEST(ArcTest, GhostHitsMoveTheTarget) {
  Peer p(PolicyMode::kArc, 4);
  p.enter(1);
  p.enter(2);
  EXPECT_EQ(p.order({1, 2}), (Order{1, 2}));
  p.leave(1);  // from T1: its key to B1
  p.enter(1);  // a B1 hit: p grows to 1, and 1 enters T2
  // T1 = {2} holds no more than p = 1: REPLACE takes T2 first.
  EXPECT_EQ(p.order({1, 2}), (Order{1, 2}));
  p.leave(1);  // from T2: to B2
  p.enter(1);  // a B2 hit: p back to 0
  EXPECT_EQ(p.order({1, 2}), (Order{2, 1}));
}

// ---- TinyLFU in front of LRU ----

TEST(TinyLfuTest, OneHitNewcomerLosesToAHotVictim) {
  Peer p(PolicyMode::kTinyLfuLru, 2);
  p.enter(1);
  p.enter(2);  // the tier had room: both admitted
  for (int i = 0; i < 5; ++i) {
    p.save(1);
    p.save(2);
  }
  p.enter(3);  // full: a newcomer, seen once
  // 3 against the LRU end (1, seen 6 times): 3 goes first, then the LRU order.
  EXPECT_EQ(p.order({1, 2, 3}), (Order{3, 1, 2}));
}

TEST(TinyLfuTest, FrequentNewcomerDisplacesTheLruBlock) {
  Peer p(PolicyMode::kTinyLfuLru, 2);
  p.enter(1);
  p.enter(2);
  for (int i = 0; i < 8; ++i) p.save(3);  // requested often, not held
  p.enter(3);
  EXPECT_EQ(p.order({1, 2, 3}), (Order{1, 2, 3}));
  p.leave(1);  // the LRU block goes: 3 won its place and is admitted now
  p.enter(4);  // a one-hit newcomer against LRU end 2 (seen once): not more often
  EXPECT_EQ(p.order({2, 3, 4}), (Order{4, 2, 3}));
}

// ---- W-TinyLFU (4 blocks: a window of 1, main of 3) ----

TEST(WTinyLfuTest, OneHitBlockLeavingTheWindowLosesToAFrequentVictim) {
  Peer p(PolicyMode::kWTinyLfu, 4);
  for (int n = 1; n <= 4; ++n) p.enter(n);  // 1..3 passed the window into main (room)
  for (int i = 0; i < 5; ++i) {
    for (int n = 1; n <= 3; ++n) p.save(n);
  }
  p.enter(5);  // 4 leaves the window: main is full, so it is a candidate, seen once
  // 4 against probation's LRU end (1, seen 6 times) goes first; then main in order;
  // the window's 5 last.
  EXPECT_EQ(p.order({1, 2, 3, 4, 5}), (Order{4, 1, 2, 3, 5}));
}

TEST(WTinyLfuTest, FrequentCandidateDisplacesProbationsLruEnd) {
  Peer p(PolicyMode::kWTinyLfu, 4);
  for (int n = 1; n <= 4; ++n) p.enter(n);
  for (int i = 0; i < 8; ++i) p.save(4);  // requested often while in the window
  p.enter(5);
  EXPECT_EQ(p.order({1, 2, 3, 4, 5}), (Order{1, 2, 3, 4, 5}));
  p.leave(1);  // main gave 1 up: 4 won its place and is admitted now
  p.use(2);    // a hit on probation protects 2
  p.enter(6);  // 5 leaves the window: one hit, against 3 (probation's LRU end, one hit)
  EXPECT_EQ(p.order({2, 3, 4, 5, 6}), (Order{5, 3, 4, 2, 6}));
}

// ---- workload-aware ----

// Requests whose blocks at one depth come back and at another never do: the policy
// learns it and gives the never-reused ones up first, whatever their depth.
TEST(WorkloadAwareTest, LearnsWhichCategoryComesBack) {
  Peer p(PolicyMode::kWorkloadAware, 100);
  // 40 requests: block at position 0 never used again, block at position 80 reused
  // 10 s later.
  for (int i = 0; i < 40; ++i) {
    const int shallow = 2 * i, deep = 2 * i + 1;
    p.enter(shallow, 0);
    p.enter(deep, 80);
    p.wait(10'000);
    p.use(deep, 80);
    p.leave(shallow);
    p.leave(deep);
  }
  p.enter(200, 0);
  p.enter(201, 80);
  // Equal value would put the deeper block first; learned reuse keeps it.
  EXPECT_EQ(p.order({201, 200}, /*leaves_daemon=*/true), (Order{200, 201}));
}

TEST(WorkloadAwareTest, AgeLowersTheValueOfAWaitingBlock) {
  Peer p(PolicyMode::kWorkloadAware, 100);
  // Blocks at position 0 come back after about 5 s, at their second turn (the first
  // Save is turn 1).
  for (int i = 0; i < 40; ++i) {
    p.enter(i, 0);
    p.wait(5'000);
    p.use(i, 0);
    p.leave(i);
  }
  p.enter(100, 0);
  p.wait(120'000);  // long past the usual reuse
  p.enter(101, 0);  // fresh
  EXPECT_EQ(p.order({101, 100}, true), (Order{100, 101}));
}

// A ghost dropped as soon as it is made (a one-block tier) frees its block's id once:
// two blocks never come to share one.
TEST(PeerPolicyTest, AGhostDroppedAtOnceFreesItsIdOnce) {
  for (PolicyMode mode : {PolicyMode::kS3Fifo, PolicyMode::kArc}) {
    Peer p(mode, 1);
    p.enter(1);
    p.enter(2);
    p.leave(1);  // its key to the ghost, which is over its size at once
    p.enter(3);
    p.enter(4);
    p.leave(3);
    // Block 4 is still known after 3 left (had they shared an id, 3's leaving would have
    // made 4 unknown): it ranks before a block never seen, whatever the order asked.
    EXPECT_EQ(p.order({99, 4}), (Order{4, 99})) << policy_mode_name(mode);
    p.leave(4);
    p.leave(2);
    p.enter(5);
    EXPECT_EQ(p.order({5}), (Order{5})) << policy_mode_name(mode);
  }
}

// ---- every per-tier peer: blocks one request named go together, tail first ----

TEST(PeerPolicyTest, ARequestsBlocksGoTailFirst) {
  for (PolicyMode mode : {PolicyMode::kS3Fifo, PolicyMode::kSlru, PolicyMode::kArc,
                          PolicyMode::kTinyLfuLru, PolicyMode::kWTinyLfu}) {
    auto policy = PeerPolicy::make(mode, {});
    policy->set_capacity(Tier::kHbm, 30);
    std::vector<BlockKey> keys;
    for (uint8_t n = 1; n <= 4; ++n) {  // one Save: positions 0..3, in that order
      keys.push_back(key_of(n));
      policy->block_entered(keys.back(), Tier::kHbm, 1);
    }
    for (uint32_t i = 0; i < keys.size(); ++i) policy->block_saved(keys[i], i, 1000);
    std::vector<PeerRank> ranks;
    policy->rank(Tier::kHbm, false, keys, 2000, ranks);
    for (size_t i = 1; i < keys.size(); ++i) {
      EXPECT_TRUE(ranks[i] < ranks[i - 1]) << policy_mode_name(mode) << " position " << i;
    }
  }
}

// The peers' key → id index (peer_queues.h) through growth, releases and reused ids:
// every live key is found under its id, every released one is not.
TEST(PeerEntriesTest, EveryLiveKeyIsFoundThroughGrowthReleaseAndReuse) {
  peer::Entries entries;
  auto key = [](uint32_t n) {
    uint8_t bytes[4];
    std::memcpy(bytes, &n, sizeof(bytes));
    return BlockKey{LayoutKey{}, BlockHash(std::span<const uint8_t>(bytes, sizeof(bytes)))};
  };
  std::map<uint32_t, uint32_t> live;  // n → id
  for (uint32_t n = 0; n < 5000; ++n) live[n] = entries.get(key(n));
  for (uint32_t n = 0; n < 5000; n += 3) {
    entries.release_if_unused(live[n]);
    entries.release_if_unused(live[n]);  // idempotent
    live.erase(n);
  }
  for (uint32_t n = 0; n < 5000; n += 3) ASSERT_EQ(entries.find(key(n)), peer::kNil) << n;
  for (uint32_t n = 5000; n < 7000; ++n) live[n] = entries.get(key(n));  // reuse freed ids
  std::set<uint32_t> ids;
  for (const auto& [n, id] : live) {
    ASSERT_EQ(entries.find(key(n)), id) << n;
    ASSERT_EQ(entries.get(key(n)), id) << n;
    ASSERT_TRUE(entries[id].key == key(n)) << n;
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), live.size());
  EXPECT_EQ(entries.capacity(), 5000u + 2000u - 5000u / 3 - 1);  // freed ids were reused
  for (uint32_t n = 0; n < 5000; n += 3)
    EXPECT_EQ(entries.find(key(n)), peer::kNil) << n;  // after reuse
}

}  // namespace
}  // namespace kvtier::policy
