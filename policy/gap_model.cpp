#include "policy/gap_model.h"

#include <cmath>
#include <limits>

namespace kvtier::policy {

int GapModel::bin_of(double idle_ms) {
  if (!(idle_ms >= kFirstBinMs)) return 0;  // also catches NaN
  // A small epsilon keeps exact bin boundaries (1000 ms, 1500 ms, ...) in the bin they
  // start, whatever the rounding of log().
  const double steps = std::log(idle_ms / kFirstBinMs) / std::log(kBinRatio) + 1e-9;
  const int bin = 1 + static_cast<int>(std::floor(steps));
  return bin >= kBins ? kBins - 1 : bin;
}

double GapModel::bin_start_ms(int bin) {
  if (bin <= 0) return 0;
  return kFirstBinMs * std::pow(kBinRatio, bin - 1);
}

double GapModel::bin_end_ms(int bin) {
  if (bin >= kBins - 1) return std::numeric_limits<double>::infinity();
  return kFirstBinMs * std::pow(kBinRatio, bin);
}

void GapModel::record_return(uint32_t returns_before, uint64_t gap_ms) {
  returns_[stratum_of(returns_before)][bin_of(static_cast<double>(gap_ms))] += 1;
  ++total_returns_;
  // +1 ms keeps a zero gap (a BeginTurn in the same millisecond) finite.
  sum_log_gap_ += std::log(static_cast<double>(gap_ms) + 1.0);
}

void GapModel::record_censored(uint32_t returns_before, uint64_t idle_ms) {
  censored_[stratum_of(returns_before)][bin_of(static_cast<double>(idle_ms))] += 1;
}

double GapModel::mean_log_gap() const {
  return total_returns_ == 0 ? 0 : sum_log_gap_ / static_cast<double>(total_returns_);
}

}  // namespace kvtier::policy
