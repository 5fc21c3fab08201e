// SacrificeOrder sorted on demand (sort_on_demand) against one whole std::sort of the
// same keys: random keys with many ties broken only by the block's key, read partly
// (a pass that stops early), read whole, and taken whole after a partial read.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "policy/block_order.h"

namespace kvtier::policy::detail {
namespace {

struct Key {
  uint32_t group;  // few values: most comparisons tie here
  uint32_t at;
};

BlockKey block_key(uint64_t n) {
  uint8_t raw[8];
  std::memcpy(raw, &n, sizeof n);
  return BlockKey{LayoutKey{1, 2}, BlockHash(std::span<const uint8_t>(raw, sizeof raw))};
}

struct Case {
  std::vector<Candidate> blocks;
  std::vector<Key> keys;
};

Case make_case(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  Case c;
  for (size_t i = 0; i < n; ++i) {
    Candidate candidate{};
    candidate.key = block_key(rng());
    candidate.placement.bytes = i;  // names the block in the expectations
    c.blocks.push_back(candidate);
    c.keys.push_back({static_cast<uint32_t>(rng() % 5), static_cast<uint32_t>(i)});
  }
  return c;
}

auto less = [](const std::vector<Candidate>& blocks, const Key& a, const Key& b) {
  if (a.group != b.group) return a.group < b.group;
  return key_less(blocks[a.at].key, blocks[b.at].key);
};

// The blocks' names (placement.bytes) in the order one whole sort gives.
std::vector<uint64_t> whole_sort(const Case& c) {
  std::vector<Key> keys = c.keys;
  std::sort(keys.begin(), keys.end(),
            [&](const Key& a, const Key& b) { return less(c.blocks, a, b); });
  std::vector<uint64_t> out;
  for (const Key& k : keys) out.push_back(c.blocks[k.at].placement.bytes);
  return out;
}

TEST(SacrificeOrder, OnDemandReadsAsOneSortWould) {
  for (size_t n : {0u, 1u, 63u, 64u, 65u, 200u, 1000u, 5000u}) {
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      Case c = make_case(n, seed);
      const std::vector<uint64_t> expected = whole_sort(c);
      // Read whole.
      SacrificeOrder order(c.blocks, sort_on_demand(c.keys, less));
      std::vector<uint64_t> got;
      for (const Candidate& b : order) got.push_back(b.placement.bytes);
      EXPECT_EQ(got, expected) << n << " blocks, seed " << seed;
      // Read partly, then taken whole: the rest follows the front read.
      for (size_t stop : {size_t{1}, size_t{64}, size_t{65}, n / 2}) {
        if (stop > n) continue;
        SacrificeOrder partial(c.blocks, sort_on_demand(c.keys, less));
        std::vector<uint64_t> front;
        for (const Candidate& b : partial) {
          if (front.size() == stop) break;
          front.push_back(b.placement.bytes);
        }
        EXPECT_TRUE(std::equal(front.begin(), front.end(), expected.begin()))
            << n << " blocks, stop " << stop;
        std::vector<uint64_t> all;
        for (const Candidate& b : std::move(partial).take_all()) all.push_back(b.placement.bytes);
        EXPECT_EQ(all, expected) << n << " blocks, taken after " << stop;
      }
    }
  }
}

TEST(SacrificeOrder, WithoutASorterKeepsTheOrderGiven) {
  Case c = make_case(100, 7);
  SacrificeOrder order(c.blocks);
  uint64_t expected = 0;
  for (const Candidate& b : order) EXPECT_EQ(b.placement.bytes, expected++);
  EXPECT_EQ(expected, 100u);
  EXPECT_EQ(std::move(order).take_all().size(), 100u);
}

}  // namespace
}  // namespace kvtier::policy::detail
