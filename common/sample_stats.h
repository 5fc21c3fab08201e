// Order statistics of a measured sample: what the benchmarks report (bench/report.h)
// and the simulator's TTFT percentiles (sim/sim_runner.h) both take.
//
// Thread-safety: pure functions.
#pragma once

#include <vector>

namespace kvtier {

// Percentile by nearest rank of an ascending-sorted sample; `fraction` in [0, 1]. NaN
// when the sample is empty.
double percentile_of_sorted(const std::vector<double>& sorted, double fraction);
// Median of an unsorted sample (mean of the middle two for even sizes); 0 when empty.
double median(std::vector<double> values);

}  // namespace kvtier
