// GapModel: what the daemon has learned, online, about how long sessions stay idle
// between turns — the population half of the return predictor (return_predictor.h).
//
// Every idle period ends one of two ways: the session comes back (a *return*, with
// its gap) or it is closed while idle (*censored*: we only learn it stayed away at
// least that long). Periods still running are the third kind of evidence; the
// predictor reads them from the session table when it takes a snapshot. Counts are
// kept per stratum — sessions that never returned yet, returned once, returned twice
// or more — because whether a conversation has come back before is the strongest
// sign of whether it will again, and in log-spaced bins of idle time (1 s to about a
// day) because human think times spread over orders of magnitude.
//
// Nothing here is fitted to a workload: the bins are fixed, the counts are what the
// daemon saw.
//
// Thread-safety: none; owned by the SessionTable, on the control thread.
#pragma once

#include <array>
#include <cstdint>

namespace kvtier::policy {

class GapModel {
 public:
  static constexpr int kStrata = 3;  // 0: never returned, 1: returned once, 2: twice or more
  static constexpr int kBins = 30;   // bin 0: [0, 1 s); bin i: [1 s·1.5^(i-1), 1 s·1.5^i)
  static constexpr double kBinRatio = 1.5;
  static constexpr double kFirstBinMs = 1000.0;

  // The stratum of a session that has returned `returns` times so far.
  static int stratum_of(uint32_t returns) { return returns >= 2 ? 2 : static_cast<int>(returns); }
  // The bin holding an idle duration; the last bin (≈ 24 h on) is open-ended.
  static int bin_of(double idle_ms);
  static double bin_start_ms(int bin);  // 0 for bin 0
  static double bin_end_ms(int bin);    // +inf for the last bin

  // An idle period of a session that had returned `returns_before` times ended with
  // the session coming back after `gap_ms`.
  void record_return(uint32_t returns_before, uint64_t gap_ms);
  // An idle period ended without a return (the session was closed) after `idle_ms`.
  void record_censored(uint32_t returns_before, uint64_t idle_ms);

  double returns_in(int stratum, int bin) const { return returns_[stratum][bin]; }
  double censored_in(int stratum, int bin) const { return censored_[stratum][bin]; }
  uint64_t total_returns() const { return total_returns_; }
  // Mean of ln(gap ms) over every return seen: the population's typical gap, against
  // which a session's own gaps are compared. 0 when nothing was seen.
  double mean_log_gap() const;

 private:
  std::array<std::array<double, kBins>, kStrata> returns_{};
  std::array<std::array<double, kBins>, kStrata> censored_{};
  uint64_t total_returns_ = 0;
  double sum_log_gap_ = 0;
};

}  // namespace kvtier::policy
