// HolderTable against std::unordered_map: random inserts and erases over keys of
// several layouts, each entry's Id checked to stay where it was made until erased, and
// the layouts' numbers given back when their last entry goes.
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

LayoutKey layout_of(uint64_t n) {
  return LayoutKey{static_cast<uint32_t>(n % 2), 0x1000 + n % 3};
}

TEST(HolderTable, EmptyTableFindsNothing) {
  Table table;
  EXPECT_EQ(table.find({layout_of(0), hash_of(1)}), Table::kNone);
  EXPECT_EQ(table.size(), 0u);
}

TEST(HolderTable, KeysOfAnotherLayoutAreOtherEntries) {
  Table table;
  const BlockKey a{LayoutKey{1, 7}, hash_of(5)};
  const BlockKey b{LayoutKey{1, 8}, hash_of(5)};
  const BlockKey c{LayoutKey{2, 7}, hash_of(5)};
  auto [ia, made_a] = table.try_emplace(a);
  auto [ib, made_b] = table.try_emplace(b);
  auto [ic, made_c] = table.try_emplace(c);
  EXPECT_TRUE(made_a && made_b && made_c);
  EXPECT_NE(ia, ib);
  EXPECT_NE(ib, ic);
  table.at(ia).holders.payload = 1;
  table.at(ib).holders.payload = 2;
  EXPECT_EQ(table.try_emplace(a), std::make_pair(ia, false));
  EXPECT_EQ(table.at(table.find(b)).holders.payload, 2u);
  EXPECT_EQ(table.key_of(ic), c);
  // Hashes differing only in length are different keys.
  EXPECT_EQ(table.find({a.layout, hash_of(5, 9)}), Table::kNone);
  table.erase(ia);
  EXPECT_EQ(table.find(a), Table::kNone);
  EXPECT_EQ(table.find(b), ib);
  EXPECT_EQ(table.size(), 2u);
}

TEST(HolderTable, ALayoutsNumberIsGivenBackWithItsLastEntry) {
  Table table;
  const BlockKey a{LayoutKey{1, 7}, hash_of(5)};
  const auto [ia, made] = table.try_emplace(a);
  ASSERT_TRUE(made);
  const uint32_t first_number = table.at(ia).layout;
  table.erase(ia);
  // Another layout takes the number; the first one's keys are not found under it.
  const BlockKey b{LayoutKey{3, 9}, hash_of(5)};
  const Table::Id ib = table.try_emplace(b).first;
  EXPECT_EQ(table.at(ib).layout, first_number);
  EXPECT_EQ(table.find(a), Table::kNone);
  EXPECT_EQ(table.layout_of(table.at(ib)), b.layout);
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
      const BlockKey key{layout_of(n), hash_of(n / 6, 8 + n % 25)};
      const bool erase = rng() % 100 < 45;
      const Table::Id found = table.find(key);
      ASSERT_EQ(found != Table::kNone, model.contains(n)) << "step " << step;
      if (found != Table::kNone) {
        const Model& m = model[n];
        ASSERT_EQ(found, m.id);
        ASSERT_EQ(&table.at(found), m.address);
        ASSERT_EQ(table.at(found).holders.payload, m.payload);
        ASSERT_EQ(table.key_of(found), key);
      }
      if (erase && found != Table::kNone) {
        table.erase(found);
        model.erase(n);
      } else if (!erase && found == Table::kNone) {
        auto [id, made] = table.try_emplace(key);
        ASSERT_TRUE(made);
        EXPECT_EQ(table.at(id).holders.payload, 0u) << "a reused Id keeps old facts";
        const uint64_t payload = rng();
        table.at(id).holders.payload = payload;
        model[n] = {payload, id, &table.at(id)};
      }
      ASSERT_EQ(table.size(), model.size());
    }
    for (const auto& [n, m] : model) {
      EXPECT_EQ(table.find({layout_of(n), hash_of(n / 6, 8 + n % 25)}), m.id);
    }
  }
}

}  // namespace
}  // namespace kvtier::policy
