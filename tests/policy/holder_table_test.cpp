// HolderTable against std::unordered_map: random inserts and erases, each entry's Id
// checked to stay where it was made until erased, and a reused Id to start afresh.
#include "policy/holder_table.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <unordered_map>

namespace kvtier::policy {
namespace {

struct Facts {
  uint64_t payload = 0;
};
using Table = HolderTable<Facts>;

BlockHash hash_of(uint64_t n, size_t bytes = 8) {
  uint8_t raw[BlockHash::kMaxBytes] = {};
  std::memcpy(raw, &n, sizeof n);
  raw[bytes - 1] ^= 0x5a;
  return BlockHash(std::span<const uint8_t>(raw, bytes));
}

TEST(HolderTable, EmptyTableFindsNothing) {
  Table table;
  EXPECT_EQ(table.find(hash_of(1)), Table::kNone);
  EXPECT_EQ(table.size(), 0u);
}

TEST(HolderTable, InsertFindsAndSecondInsertReturnsTheSame) {
  Table table;
  auto [a, made_a] = table.try_emplace(hash_of(5));
  auto [b, made_b] = table.try_emplace(hash_of(6));
  EXPECT_TRUE(made_a && made_b);
  EXPECT_NE(a, b);
  table.at(a).holders.payload = 1;
  table.at(b).holders.payload = 2;
  EXPECT_EQ(table.try_emplace(hash_of(5)), std::make_pair(a, false));
  EXPECT_EQ(table.at(table.find(hash_of(6))).holders.payload, 2u);
  EXPECT_EQ(table.at(a).hash, hash_of(5));
  // Hashes differing only in length are different keys.
  EXPECT_EQ(table.find(hash_of(5, 9)), Table::kNone);
  table.erase(a);
  EXPECT_EQ(table.find(hash_of(5)), Table::kNone);
  EXPECT_EQ(table.find(hash_of(6)), b);
  EXPECT_EQ(table.size(), 1u);
  // The Id is handed out again, its facts reset.
  auto [c, made_c] = table.try_emplace(hash_of(7));
  EXPECT_TRUE(made_c);
  EXPECT_EQ(c, a);
  EXPECT_EQ(table.at(c).holders.payload, 0u);
}

// Random churn at every load, small tables included (runs wrap around the end).
TEST(HolderTable, RandomChurnMatchesAMapAndIdsStayPut) {
  std::mt19937_64 rng(4321);
  for (uint64_t universe : {20u, 300u, 20000u}) {
    Table table;
    struct Model {
      uint64_t payload;
      Table::Id id;
      const Table::Entry* address;
    };
    std::unordered_map<uint64_t, Model> model;
    for (int step = 0; step < 200000; ++step) {
      const uint64_t n = rng() % universe;
      const BlockHash hash = hash_of(n, 8 + n % 25);
      const bool erase = rng() % 100 < 45;
      const Table::Id found = table.find(hash);
      ASSERT_EQ(found != Table::kNone, model.contains(n)) << "step " << step;
      if (found != Table::kNone) {
        const Model& m = model[n];
        ASSERT_EQ(found, m.id);
        ASSERT_EQ(&table.at(found), m.address);
        ASSERT_EQ(table.at(found).holders.payload, m.payload);
        ASSERT_EQ(table.at(found).hash, hash);
      }
      if (erase && found != Table::kNone) {
        table.erase(found);
        model.erase(n);
      } else if (!erase && found == Table::kNone) {
        auto [id, made] = table.try_emplace(hash);
        ASSERT_TRUE(made);
        EXPECT_EQ(table.at(id).holders.payload, 0u) << "a reused Id keeps old facts";
        const uint64_t payload = rng();
        table.at(id).holders.payload = payload;
        model[n] = {payload, id, &table.at(id)};
      }
      ASSERT_EQ(table.size(), model.size());
    }
    for (const auto& [n, m] : model) EXPECT_EQ(table.find(hash_of(n, 8 + n % 25)), m.id);
  }
}

}  // namespace
}  // namespace kvtier::policy
