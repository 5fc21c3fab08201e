// Test doubles for the policy: a PlacementView over a plain map, and helpers that build
// block hashes and sessions on a ManualClock. Single-threaded, like the planner.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/block_key.h"
#include "policy/planner.h"
#include "policy/session_table.h"

namespace kvtier::policy::fake {

inline constexpr LayoutKey kLayout{7, 0xABCDEF};

inline BlockHash hash_of(uint8_t n) {
  std::array<uint8_t, 2> bytes{0x42, n};
  return BlockHash(bytes);
}
inline BlockKey key_of(uint8_t n) {
  return BlockKey{kLayout, hash_of(n)};
}

inline std::vector<BlockHash> hashes_of(std::initializer_list<uint8_t> ns) {
  std::vector<BlockHash> out;
  for (uint8_t n : ns) out.push_back(hash_of(n));
  return out;
}

class FakePlacementView final : public PlacementView {
 public:
  struct Options {
    uint64_t bytes = 100;
    uint32_t session_refs = 1;
    bool movable = true;
    uint64_t last_access_ms = 0;
  };

  void set_capacity(Tier tier, uint64_t bytes) { spaces_[index(tier)].capacity_bytes = bytes; }
  void set_used(Tier tier, uint64_t bytes) { spaces_[index(tier)].used_bytes = bytes; }

  // Places block `n` in `tier`, adding its bytes to that tier's usage.
  void put(uint8_t n, Tier tier, Options options) {
    blocks_[key_of(n)] = BlockPlacement{tier, options.movable, options.bytes, options.session_refs,
                                        options.last_access_ms};
    spaces_[index(tier)].used_bytes += options.bytes;
  }
  void put(uint8_t n, Tier tier) { put(n, tier, Options{}); }
  // The same for a block of any key (another namespace's).
  void put_key(const BlockKey& key, Tier tier, Options options) {
    blocks_[key] = BlockPlacement{tier, options.movable, options.bytes, options.session_refs,
                                  options.last_access_ms};
    spaces_[index(tier)].used_bytes += options.bytes;
  }
  // What quota_standing(tier) answers.
  void set_quota_standing(Tier tier, std::vector<QuotaStanding> standing) {
    standing_[index(tier)] = std::move(standing);
  }

  BlockPlacement placement(const BlockKey& key) const override {
    auto it = blocks_.find(key);
    if (it == blocks_.end()) return BlockPlacement{Tier::kNone, false, 0, 0, 0};
    return it->second;
  }
  TierSpace space(Tier tier) const override { return spaces_[index(tier)]; }
  void for_each_in_tier(
      Tier tier,
      const std::function<void(const BlockKey&, const BlockPlacement&)>& fn) const override {
    for (const auto& [key, placement] : blocks_) {
      if (placement.tier == tier) fn(key, placement);
    }
  }
  std::vector<QuotaStanding> quota_standing(Tier tier) const override {
    return standing_[index(tier)];
  }

 private:
  static size_t index(Tier tier) { return static_cast<size_t>(tier); }

  std::unordered_map<BlockKey, BlockPlacement, BlockKeyHasher> blocks_;
  std::array<TierSpace, kTierCount> spaces_{};
  std::array<std::vector<QuotaStanding>, kTierCount> standing_{};
};

// "D 3 hbm->ram", "E 5 ram->none", "P 2 nvme->hbm": one move in a form gtest prints well.
inline std::string describe(const Move& move) {
  char kind = move.kind == MoveKind::kDemote ? 'D' : move.kind == MoveKind::kPromote ? 'P' : 'E';
  int n = move.block.hash.size() == 2 ? move.block.hash.bytes()[1] : -1;
  return std::string(1, kind) + " " + std::to_string(n) + " " + std::string(tier_name(move.from)) +
         "->" + std::string(tier_name(move.to));
}
inline std::vector<std::string> describe(const std::vector<Move>& moves) {
  std::vector<std::string> out;
  for (const Move& move : moves) out.push_back(describe(move));
  return out;
}

// Creates (or reuses) session `id` at `at_ms` and saves `blocks` into it.
inline Session& save_session(ManualClock& clock, SessionTable& table, const std::string& id,
                             std::initializer_list<uint8_t> blocks, bool end_of_turn,
                             uint64_t at_ms) {
  clock.set_ms(at_ms);
  Session* session = table.get_or_create(kLayout.namespace_id, id, kLayout).value();
  (void)table.record_save(*session, hashes_of(blocks), end_of_turn);
  return *session;
}

// Teaches `table`'s GapModel a population: `regulars` sessions that end a turn and
// come back `gap_ms` later, `returns` times in a row (closed during their last turn),
// and `one_shots` sessions that end one turn and are closed `one_shot_idle_ms` later
// without coming back. All are closed, so only what the GapModel learned remains.
// Starts at `at_ms`; returns the time it ends at.
inline uint64_t teach_population(ManualClock& clock, SessionTable& table, int regulars, int returns,
                                 uint64_t gap_ms, int one_shots, uint64_t one_shot_idle_ms,
                                 uint64_t at_ms) {
  for (int i = 0; i < regulars; ++i) {
    clock.set_ms(at_ms);
    const std::string id = "teach-regular-" + std::to_string(i);
    Session* s = table.get_or_create(kLayout.namespace_id, id, kLayout).value();
    (void)table.record_save(*s, {}, true);
    for (int r = 0; r < returns; ++r) {
      clock.advance_ms(gap_ms);
      table.record_activity(*s);
      if (r + 1 < returns) (void)table.record_save(*s, {}, true);
    }
    (void)table.close(kLayout.namespace_id, id);  // mid-turn: nothing censored
  }
  for (int i = 0; i < one_shots; ++i) {
    clock.set_ms(at_ms);
    const std::string id = "teach-one-shot-" + std::to_string(i);
    Session* s = table.get_or_create(kLayout.namespace_id, id, kLayout).value();
    (void)table.record_save(*s, {}, true);
    clock.advance_ms(one_shot_idle_ms);
    (void)table.close(kLayout.namespace_id, id);
  }
  return std::max(clock.now_ms(), at_ms + static_cast<uint64_t>(returns) * gap_ms);
}

}  // namespace kvtier::policy::fake
