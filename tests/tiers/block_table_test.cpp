// BlockTable against std::unordered_map: random inserts and erases, with an outside
// index kept only from what `moved` reports (as BlockStore keeps its residents).
#include "tiers/block_table.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <unordered_map>
#include <vector>

namespace kvtier {
namespace {

struct Value {
  BlockHash hash;
  uint64_t payload = 0;
  uint32_t at = 0;  // index in the outside vector
};

BlockHash hash_of(uint64_t n, size_t bytes = 8) {
  uint8_t raw[BlockHash::kMaxBytes] = {};
  std::memcpy(raw, &n, sizeof n);
  raw[bytes - 1] ^= 0x5a;
  return BlockHash(std::span<const uint8_t>(raw, bytes));
}

TEST(BlockTable, EmptyTableFindsNothing) {
  BlockTable<Value> table;
  EXPECT_EQ(table.find(hash_of(1)), nullptr);
  EXPECT_FALSE(table.contains(hash_of(1)));
  table.prefetch(hash_of(1));  // no arrays yet: must not touch any
  table.prefetch_value(hash_of(1));
  EXPECT_EQ(table.size(), 0u);
}

TEST(BlockTable, InsertFindsAndSecondInsertReturnsTheSame) {
  BlockTable<Value> table;
  auto none = [](Value&) {};
  auto [v, inserted] = table.try_emplace(hash_of(7), none);
  ASSERT_TRUE(inserted);
  EXPECT_EQ(v->hash, hash_of(7));
  v->payload = 42;
  auto [again, inserted_again] = table.try_emplace(hash_of(7), none);
  EXPECT_FALSE(inserted_again);
  EXPECT_EQ(again->payload, 42u);
  // Hashes differing only in length are different keys.
  EXPECT_EQ(table.find(hash_of(7, 9)), nullptr);
  table.erase(v, none);
  EXPECT_EQ(table.find(hash_of(7)), nullptr);
  EXPECT_EQ(table.size(), 0u);
}

TEST(BlockTable, ReserveKeepsTheLoadBelowSevenEighths) {
  BlockTable<Value> table;
  std::vector<Value*> where;
  table.reserve(1000, [](Value&) {});
  const size_t capacity = table.capacity();
  EXPECT_GE(capacity * 7, 1000u * 8);
  EXPECT_LE(capacity, (1000u * 10 + 6) / 7);  // the count asked at 7/10, not a power of two
  for (uint64_t n = 0; n < 1000; ++n) {
    table.try_emplace(hash_of(n), [](Value&) { ADD_FAILURE() << "moved after reserve"; });
  }
  EXPECT_EQ(table.capacity(), capacity);
}

TEST(BlockTable, GrowingMovesNoValue) {
  BlockTable<Value> table;
  std::vector<Value*> where;
  for (uint64_t n = 0; n < 20000; ++n) {  // grows from 16 slots eleven times
    auto [v, inserted] =
        table.try_emplace(hash_of(n), [](Value&) { ADD_FAILURE() << "moved on insert"; });
    ASSERT_TRUE(inserted);
    v->payload = n;
    where.push_back(v);
  }
  for (uint64_t n = 0; n < 20000; ++n) {
    ASSERT_EQ(table.find(hash_of(n)), where[n]);
    ASSERT_EQ(where[n]->payload, n);
    table.prefetch(hash_of(n));
    table.prefetch_value(hash_of(n));
  }
  // Values are kept densely: what they take grows with the count, not the capacity.
  EXPECT_LE(table.memory_bytes(),
            20000 * sizeof(Value) + 4096 * sizeof(Value) + table.capacity() * 5 + 4096);
}

// Random churn at every load, small tables included (runs wrap around the end).
TEST(BlockTable, RandomChurnMatchesAMapAndMovesAreReported) {
  std::mt19937_64 rng(1234);
  for (uint64_t universe : {20u, 300u, 5000u}) {
    BlockTable<Value> table;
    std::unordered_map<uint64_t, uint64_t> model;  // key → payload
    std::vector<Value*> outside;                   // what a resident list would hold
    auto moved = [&](Value& v) { outside[v.at] = &v; };
    for (int step = 0; step < 200000; ++step) {
      const uint64_t n = rng() % universe;
      const BlockHash h = hash_of(n, 8 + n % 25);
      const bool erase = rng() % 100 < 45;
      Value* found = table.find(h);
      ASSERT_EQ(found != nullptr, model.contains(n)) << "step " << step;
      if (found != nullptr) {
        ASSERT_EQ(found->payload, model[n]);
        ASSERT_EQ(outside[found->at], found);
      }
      if (erase && found != nullptr) {
        // Keep the outside vector dense, as BlockStore does with its residents.
        Value* last = outside.back();
        outside[found->at] = last;
        last->at = found->at;
        outside.pop_back();
        table.erase(found, moved);
        model.erase(n);
      } else if (!erase && found == nullptr) {
        auto [v, inserted] = table.try_emplace(h, moved);
        ASSERT_TRUE(inserted);
        v->payload = rng();
        v->at = static_cast<uint32_t>(outside.size());
        outside.push_back(v);
        model[n] = v->payload;
      }
      ASSERT_EQ(table.size(), model.size());
      ASSERT_LE(table.size() * 8, table.capacity() * 7);
    }
    // Every pointer the outside vector holds is where the table has the value.
    for (Value* v : outside) ASSERT_EQ(table.find(v->hash), v);
    for (const auto& [n, payload] : model) {
      const Value* v = table.find(hash_of(n, 8 + n % 25));
      ASSERT_NE(v, nullptr);
      EXPECT_EQ(v->payload, payload);
    }
  }
}

}  // namespace
}  // namespace kvtier
