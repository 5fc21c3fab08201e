// TierTopology: the tiers a daemon runs, top (closest to the engine) to bottom, and what
// each can do. Code that needs "the tier below", "where a Save may land" or "where a
// block read out of NVMe lands" asks here instead of naming tiers.
//
// The order is fixed (Tier's numbering); which tiers run is the configuration's:
//
//   tier    engine-facing  durable  key-addressed  slots kept by
//   HBM     yes            no       no             BlockStore (the device arena)
//   RAM     yes            no       no             BlockStore (the pinned pool)
//   NVMe    no             yes      no             BlockStore (slab files; RocksDB index)
//   remote  no             yes      yes            the cluster (found by key, any node)
//
//  - engine-facing: a Save stores into it and a Load copies out of it (Device copies).
//    Sessions leave these after an idle threshold (hbm-idle, ram-idle). A block in a
//    tier that is not engine-facing is read up into the lowest engine-facing tier
//    (landing(): RAM) before a Load can use it.
//  - durable: what it holds survives a daemon restart.
//  - key-addressed: blocks are found by key, written by any node; the planner does not
//    place blocks there (evictions spill into it; tiers/move_executor.h).
//
// Values only; thread-safety is the holder's concern.
#pragma once

#include <array>
#include <cstddef>
#include <span>

#include "common/block_key.h"

namespace kvtier {

struct TierTraits {
  bool engine_facing = false;
  bool durable = false;
  bool key_addressed = false;
};

class TierTopology {
 public:
  // Every tier, top to bottom.
  static constexpr std::array<Tier, kTierCount> kOrder = {Tier::kHbm, Tier::kRam, Tier::kNvme,
                                                          Tier::kRemote};

  static constexpr TierTraits traits(Tier tier) {
    switch (tier) {
      case Tier::kHbm:
      case Tier::kRam:
        return {.engine_facing = true};
      case Tier::kNvme:
        return {.durable = true};
      case Tier::kRemote:
        return {.durable = true, .key_addressed = true};
      case Tier::kNone:
        break;
    }
    return {};
  }

  TierTopology() = default;  // no tiers
  // `configured(tier)` for each tier of kOrder says whether it runs.
  template <typename Configured>
  static TierTopology of(Configured&& configured) {
    TierTopology topology;
    for (Tier tier : kOrder) {
      if (configured(tier)) topology.add(tier);
    }
    return topology;
  }

  bool configured(Tier tier) const { return tier != Tier::kNone && on_[static_cast<size_t>(tier)]; }
  // The configured tiers, top to bottom.
  std::span<const Tier> tiers() const { return {all_.data(), all_count_}; }
  // The configured tiers whose slots this node keeps (not key-addressed), top to bottom:
  // the tiers the planner places blocks in.
  std::span<const Tier> local() const { return {local_.data(), local_count_}; }
  // The configured engine-facing tiers, top to bottom: where a Save may store a block.
  std::span<const Tier> engine_facing() const { return {facing_.data(), facing_count_}; }

  // The topmost engine-facing tier (where BeginTurn brings a session); kNone when none.
  Tier top() const { return facing_count_ > 0 ? facing_[0] : Tier::kNone; }
  // The lowest engine-facing tier: where blocks read out of a tier below land, and where
  // a Save makes room by demoting. kNone when none.
  Tier landing() const { return facing_count_ > 0 ? facing_[facing_count_ - 1] : Tier::kNone; }
  // The next configured node-local tier below / above `tier`; kNone when there is none.
  Tier below(Tier tier) const {
    for (size_t i = 0; i + 1 < local_count_; ++i) {
      if (local_[i] == tier) return local_[i + 1];
    }
    return Tier::kNone;
  }
  Tier above(Tier tier) const {
    for (size_t i = 1; i < local_count_; ++i) {
      if (local_[i] == tier) return local_[i - 1];
    }
    return Tier::kNone;
  }
  // The first configured durable node-local tier (NVMe): where a drain or a journal
  // writes. kNone when none.
  Tier durable() const {
    for (size_t i = 0; i < local_count_; ++i) {
      if (traits(local_[i]).durable) return local_[i];
    }
    return Tier::kNone;
  }
  // The configured key-addressed tier evictions spill into (remote); kNone when none.
  Tier spill() const {
    for (size_t i = 0; i < all_count_; ++i) {
      if (traits(all_[i]).key_addressed) return all_[i];
    }
    return Tier::kNone;
  }

 private:
  void add(Tier tier) {
    on_[static_cast<size_t>(tier)] = true;
    all_[all_count_++] = tier;
    if (!traits(tier).key_addressed) local_[local_count_++] = tier;
    if (traits(tier).engine_facing) facing_[facing_count_++] = tier;
  }

  std::array<bool, kTierCount> on_{};
  std::array<Tier, kTierCount> all_{};
  std::array<Tier, kTierCount> local_{};
  std::array<Tier, kTierCount> facing_{};
  size_t all_count_ = 0;
  size_t local_count_ = 0;
  size_t facing_count_ = 0;
};

}  // namespace kvtier
