// A seeded random walk over every BlockStore operation, checked after each step
// against a plain model: states, pins, session refs, locations, per-tier used bytes
// and block counts, and that no two live slots overlap. Writes and reads hold the
// store's handles (PendingWrite, PinnedBlock), released by commit/abort, reset,
// assignment over them, or destruction.
#include <algorithm>
#include <cstddef>
#include <map>
#include <optional>
#include <random>
#include <unordered_map>
#include <vector>

#include <gtest/gtest.h>

#include "tests/tiers/test_memory.h"
#include "tiers/block_store.h"

namespace kvtier {
namespace {

using tiers_test::key_of;

constexpr uint64_t kSlab = 2048;
const LayoutKey kLayouts[2] = {{1, 0x10}, {1, 0x20}};
constexpr uint64_t kLayoutBytes[2] = {1024, 2048};
constexpr uint32_t kKeys = 40;

struct ModelBlock {
  BlockState state = BlockState::kWriting;
  BlockLocation location;
  uint32_t pins = 0;     // writer + mover + readers
  uint32_t readers = 0;  // pins held by PinnedBlock handles
  uint32_t session_refs = 0;
  std::optional<BlockLocation> target;    // while kMoving
  std::optional<BlockLocation> deferred;  // old slot waiting for readers
};

class RandomWalk {
 public:
  enum Op {
    kReserve,
    kCommitOrAbort,
    kPin,
    kUnpin,
    kMoveReady,  // begin_move, mostly of a ready block
    kMoveAny,    // begin_move of any present block
    kFinishMove,
    kEvict,
    kSessionRef,
    kOpCount,
  };

  explicit RandomWalk(uint32_t seed)
      : rng_(seed),
        store_({{Tier::kHbm, tiers_test::make_memory(4 * kSlab), kSlab},
                {Tier::kRam, tiers_test::make_memory(8 * kSlab + 100), kSlab}}) {
    for (int i = 0; i < 2; ++i) {
      EXPECT_TRUE(store_.register_layout(kLayouts[i], kLayoutBytes[i]).is_ok());
    }
  }

  void step() {
    const Op op = static_cast<Op>(rng_() % kOpCount);
    // Operations that need a block in some state mostly pick one in that state, so
    // they run often; one pick in four is any key, to also hit the refusals.
    const uint32_t n = rng_() % 4 == 0 ? rng_() % kKeys : pick_key_for(op);
    const BlockKey key = key_of(kLayouts[n % 2], n);
    const uint64_t bytes = kLayoutBytes[n % 2];
    auto it = model_.find(n);
    ModelBlock* block = it == model_.end() ? nullptr : &it->second;
    const bool visible = block != nullptr && block->state != BlockState::kWriting;
    switch (op) {
      case kReserve: {
        std::vector<Tier> allowed;
        for (Tier tier : {Tier::kRam, Tier::kNvme, Tier::kHbm}) {
          if (rng_() % 3 != 0) allowed.push_back(tier);
        }
        std::optional<Tier> expected_tier;
        for (Tier tier : {Tier::kHbm, Tier::kRam}) {
          bool ok = std::find(allowed.begin(), allowed.end(), tier) != allowed.end() &&
                    store_.has_room(tier, bytes);
          if (ok && !expected_tier) expected_tier = tier;
        }
        auto reserved = store_.reserve(key, allowed, now_ms_);
        if (block != nullptr) {
          ASSERT_TRUE(reserved.is_ok());
          ASSERT_FALSE(reserved->has_value());
        } else if (!expected_tier) {
          ASSERT_EQ(reserved.status().code(), StatusCode::kResourceExhausted);
          ++seen_.exhausted_reserves;
        } else {
          ASSERT_TRUE(reserved.is_ok()) << reserved.status().to_string();
          ASSERT_TRUE(reserved->has_value());
          ASSERT_EQ((*reserved)->location().tier, *expected_tier);
          ModelBlock& added = model_[n];
          added.location = (*reserved)->location();
          added.pins = 1;
          writes_[n] = std::move(**reserved);
        }
        break;
      }
      case kCommitOrAbort:
        if (block == nullptr || block->state != BlockState::kWriting) return;
        if (rng_() % 4 == 0) {
          // Aborted explicitly, or by dropping the handle.
          if (rng_() % 2 == 0) writes_[n].abort();
          writes_.erase(n);
          model_.erase(it);
        } else {
          writes_[n].commit();
          writes_.erase(n);
          block->state = BlockState::kReady;
          block->pins = 0;
        }
        break;
      case kPin: {
        PinnedBlock pin = store_.pin(key, now_ms_);
        ASSERT_EQ(static_cast<bool>(pin), visible);
        if (!visible) return;
        ASSERT_EQ(pin.location().tier, block->location.tier);
        ASSERT_EQ(pin.location().offset, block->location.offset);
        readers_[n].push_back(std::move(pin));
        ++block->pins;
        ++block->readers;
        break;
      }
      case kUnpin: {
        if (block == nullptr || block->readers == 0) return;
        std::vector<PinnedBlock>& held = readers_[n];
        ASSERT_EQ(held.size(), block->readers);
        const size_t at = rng_() % held.size();
        switch (rng_() % 3) {
          case 0:  // reset, then dropped empty
            held[at].reset();
            held.erase(held.begin() + static_cast<std::ptrdiff_t>(at));
            break;
          case 1:  // assigned over by the last one
            held[at] = std::move(held.back());
            held.pop_back();
            break;
          default:  // moved out to a handle that goes out of scope
            PinnedBlock taken = std::move(held[at]);
            held.erase(held.begin() + static_cast<std::ptrdiff_t>(at));
            break;
        }
        --block->readers;
        if (--block->pins == 0) block->deferred.reset();
        break;
      }
      case kMoveReady:
      case kMoveAny: {
        const Tier to = static_cast<Tier>(rng_() % 3);
        const bool movable = block != nullptr && block->state == BlockState::kReady &&
                             block->location.tier != to && !block->deferred && to != Tier::kNvme;
        const bool room = store_.has_room(to, bytes);
        auto move = store_.begin_move(key, to);
        if (!movable) {
          ASSERT_EQ(move.status().code(), StatusCode::kInvalidArgument);
          return;
        }
        if (!room) {
          ASSERT_EQ(move.status().code(), StatusCode::kResourceExhausted);
          return;
        }
        ASSERT_TRUE(move.is_ok()) << move.status().to_string();
        ASSERT_EQ(move->from().tier, block->location.tier);
        ASSERT_EQ(move->from().offset, block->location.offset);
        ASSERT_EQ(move->location().tier, to);
        block->state = BlockState::kMoving;
        block->target = move->location();
        moves_[key] = std::move(*move);
        ++block->pins;
        break;
      }
      case kFinishMove: {
        if (block == nullptr || block->state != BlockState::kMoving) return;
        const bool ok = rng_() % 4 != 0;
        auto pending = moves_.find(key);
        ASSERT_NE(pending, moves_.end());
        ok ? pending->second.commit() : pending->second.abort();
        moves_.erase(pending);
        block->state = BlockState::kReady;
        --block->pins;
        if (ok) {
          if (block->pins > 0) {
            block->deferred = block->location;
            ++seen_.deferred_frees;
          }
          block->location = *block->target;
          ++seen_.moves;
        }
        block->target.reset();
        break;
      }
      case kEvict: {
        const bool evictable =
            block != nullptr && block->state == BlockState::kReady && block->pins == 0;
        ASSERT_EQ(store_.evict(key), evictable);
        if (evictable) model_.erase(it);
        break;
      }
      case kSessionRef:
        if (rng_() % 2 == 0) {
          store_.add_session_ref(key);
          if (block != nullptr) ++block->session_refs;
        } else {
          store_.drop_session_ref(key);
          if (block != nullptr && block->session_refs > 0) --block->session_refs;
        }
        break;
      case kOpCount:
        break;
    }
    ++now_ms_;
  }

  void check() const {
    uint64_t pinned = 0;
    std::map<Tier, uint64_t> used_bytes, blocks;
    std::map<std::pair<Tier, uint64_t>, uint64_t> slots;  // (tier, offset) → bytes
    auto add_slot = [&](const BlockLocation& location, uint64_t bytes) {
      used_bytes[location.tier] += bytes;
      ASSERT_TRUE(slots.emplace(std::pair(location.tier, location.offset), bytes).second)
          << "two live slots at " << tier_name(location.tier) << " offset " << location.offset;
    };
    for (const auto& [n, block] : model_) {
      const BlockKey key = key_of(kLayouts[n % 2], n);
      const uint64_t bytes = kLayoutBytes[n % 2];
      if (block.pins > 0) ++pinned;
      ++blocks[block.location.tier];
      add_slot(block.location, bytes);
      if (block.target) add_slot(*block.target, bytes);
      if (block.deferred) add_slot(*block.deferred, bytes);

      auto info = store_.lookup(key);
      ASSERT_EQ(info.has_value(), block.state != BlockState::kWriting) << "block " << n;
      if (!info) continue;
      ASSERT_EQ(info->state, block.state) << "block " << n;
      ASSERT_EQ(info->location.tier, block.location.tier) << "block " << n;
      ASSERT_EQ(info->location.offset, block.location.offset) << "block " << n;
      ASSERT_EQ(info->pins, block.pins) << "block " << n;
      ASSERT_EQ(info->session_refs, block.session_refs) << "block " << n;
    }
    ASSERT_EQ(store_.block_count(), model_.size());
    ASSERT_EQ(store_.pinned_blocks(), pinned);
    std::vector<TierUsage> usage = store_.usage();
    ASSERT_EQ(usage.size(), 2u);
    for (const TierUsage& tier : usage) {
      ASSERT_EQ(tier.used_bytes, used_bytes[tier.tier]) << tier_name(tier.tier);
      ASSERT_EQ(tier.blocks, blocks[tier.tier]) << tier_name(tier.tier);
      ASSERT_LE(tier.used_bytes, tier.capacity_bytes);
      uint64_t visible = 0;
      store_.for_each_in_tier(tier.tier, [&](const BlockKey&, const BlockInfo& info) {
        EXPECT_NE(info.state, BlockState::kWriting);
        ++visible;
      });
      uint64_t expected_visible = 0;
      for (const auto& [n, block] : model_) {
        expected_visible += block.state != BlockState::kWriting && block.location.tier == tier.tier;
      }
      ASSERT_EQ(visible, expected_visible) << tier_name(tier.tier);
    }
    // Live slots never overlap within a tier.
    for (auto it = slots.begin(); it != slots.end(); ++it) {
      auto next = std::next(it);
      if (next == slots.end() || next->first.first != it->first.first) continue;
      ASSERT_LE(it->first.second + it->second, next->first.second)
          << "overlap in " << tier_name(it->first.first);
    }
  }

  size_t blocks() const { return model_.size(); }

  // How often the interesting paths ran, so the walk provably reaches them.
  struct Seen {
    uint64_t exhausted_reserves = 0;
    uint64_t moves = 0;
    uint64_t deferred_frees = 0;
  };
  const Seen& seen() const { return seen_; }

 private:
  // A random key whose model block suits `op`, or a random key when none does.
  uint32_t pick_key_for(Op op) {
    std::vector<uint32_t> candidates;
    for (const auto& [n, block] : model_) {
      bool fits = true;
      if (op == kCommitOrAbort) fits = block.state == BlockState::kWriting;
      if (op == kUnpin) fits = block.readers > 0;
      if (op == kMoveReady || op == kEvict) fits = block.state == BlockState::kReady;
      if (op == kFinishMove) fits = block.state == BlockState::kMoving;
      if (op == kReserve) fits = false;  // reserve wants mostly new keys
      if (fits) candidates.push_back(n);
    }
    if (candidates.empty()) return rng_() % kKeys;
    return candidates[rng_() % candidates.size()];
  }

  std::mt19937 rng_;
  BlockStore store_;
  // The handles, after the store: released before it goes.
  std::map<uint32_t, PendingWrite> writes_;
  std::map<uint32_t, std::vector<PinnedBlock>> readers_;
  std::unordered_map<BlockKey, PendingMove, BlockKeyHasher> moves_;  // the kMoving blocks
  std::map<uint32_t, ModelBlock> model_;
  uint64_t now_ms_ = 0;
  Seen seen_;
};

TEST(BlockStoreRandomTest, UsageAndStateMatchAModel) {
  for (uint32_t seed : {11u, 22u, 33u, 44u}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    RandomWalk walk(seed);
    size_t max_blocks = 0;
    for (int step = 0; step < 20000; ++step) {
      SCOPED_TRACE(::testing::Message() << "step " << step);
      walk.step();
      if (::testing::Test::HasFatalFailure()) return;
      walk.check();
      if (::testing::Test::HasFatalFailure()) return;
      max_blocks = std::max(max_blocks, walk.blocks());
    }
    EXPECT_GT(max_blocks, 10u);  // the walk really filled the tiers
    EXPECT_GT(walk.seen().exhausted_reserves, 100u);
    EXPECT_GT(walk.seen().moves, 100u);
    EXPECT_GT(walk.seen().deferred_frees, 30u);
  }
}

}  // namespace
}  // namespace kvtier
