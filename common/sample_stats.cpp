#include "common/sample_stats.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace kvtier {

double percentile_of_sorted(const std::vector<double>& sorted, double fraction) {
  if (sorted.empty()) return NAN;
  // Nearest rank: the smallest value with at least `fraction` of the sample at or below it.
  auto rank = static_cast<size_t>(std::ceil(fraction * static_cast<double>(sorted.size())));
  rank = std::clamp<size_t>(rank, 1, sorted.size());
  return sorted[rank - 1];
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace kvtier
