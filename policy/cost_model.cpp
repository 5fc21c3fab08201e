#include "policy/cost_model.h"

#include <cmath>

namespace kvtier::policy {

double CostModel::reload_ms(Tier tier, uint64_t bytes) const {
  if (tier == Tier::kNone) return INFINITY;
  const double bandwidth = config_.read_bytes_per_s[static_cast<size_t>(tier)];
  if (!(bandwidth > 0)) return INFINITY;
  return static_cast<double>(bytes) / bandwidth * 1000.0;
}

double CostModel::recompute_ms(const LayoutKey& layout) const {
  uint32_t tokens = config_.tokens_per_block;
  double speed = config_.prefill_tokens_per_s;
  if (auto it = layouts_.find(layout); it != layouts_.end()) {
    if (it->second.tokens_per_block > 0) tokens = it->second.tokens_per_block;
    if (it->second.prefill_tokens_per_s > 0) speed = it->second.prefill_tokens_per_s;
  }
  if (!(speed > 0)) return INFINITY;  // no prefill speed known: recomputing is "never"
  return tokens / speed * 1000.0;
}

double CostModel::saving_ms(Tier tier, const LayoutKey& layout, uint64_t bytes) const {
  const double reload = reload_ms(tier, bytes);
  const double recompute = recompute_ms(layout);
  if (!std::isfinite(reload)) return 0;
  if (!std::isfinite(recompute)) return 1e12;  // unknown prefill speed: keep everything
  return recompute > reload ? recompute - reload : 0;
}

}  // namespace kvtier::policy
