// CostModel: what it costs, in milliseconds of the next turn's time to first token, to
// have a block in a given place — read back from a tier into the engine, or recomputed
// by prefill when it is not held at all. The planner compares these: a block whose
// reload from a tier would take longer than recomputing it is not worth keeping there
// ("transfer cost < recompute cost"), and P(return) × cost is the expected price of a
// placement.
//
// Bandwidths are configured (or measured by the daemon at start-up and passed in);
// prefill speed and tokens per block come per layout from the engine's Hello, with
// configured defaults for engines that do not say.
//
// Thread-safety: none; a value owned by the planner.
#pragma once

#include <array>
#include <cstdint>
#include <unordered_map>

#include "common/block_key.h"

namespace kvtier::policy {

struct CostConfig {
  // Read bandwidth from each tier into engine memory, bytes per second (index: Tier).
  // HBM: a device-local copy; RAM: PCIe; NVMe: the drive (then PCIe).
  std::array<double, kTierCount> read_bytes_per_s = {1000e9, 25e9, 5e9};
  double prefill_tokens_per_s = 8000;  // used for layouts whose engine did not report one
  uint32_t tokens_per_block = 16;      // used for layouts whose engine did not report one
};

// What an engine told us about one layout.
struct LayoutCost {
  uint32_t tokens_per_block = 0;    // 0: use the configured default
  double prefill_tokens_per_s = 0;  // 0: use the configured default
};

class CostModel {
 public:
  explicit CostModel(CostConfig config = {}) : config_(config) {}

  const CostConfig& config() const { return config_; }
  void set_config(const CostConfig& config) { config_ = config; }
  void set_layout(const LayoutKey& layout, LayoutCost cost) { layouts_[layout] = cost; }

  // Milliseconds to read `bytes` from `tier` into the engine; +inf for kNone or a tier
  // with no bandwidth configured.
  double reload_ms(Tier tier, uint64_t bytes) const;
  // Milliseconds of prefill to recompute one block of `layout`.
  double recompute_ms(const LayoutKey& layout) const;
  // What holding the block in `tier` saves against recomputing it; 0 when reloading
  // is no faster ("drop instead of keeping it there").
  double saving_ms(Tier tier, const LayoutKey& layout, uint64_t bytes) const;
  bool worth_keeping(Tier tier, const LayoutKey& layout, uint64_t bytes) const {
    return saving_ms(tier, layout, bytes) > 0;
  }

 private:
  CostConfig config_;
  std::unordered_map<LayoutKey, LayoutCost, LayoutKeyHasher> layouts_;
};

}  // namespace kvtier::policy
