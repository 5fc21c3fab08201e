// ReturnPredictor: how likely an idle session is to start its next turn within a
// horizon, taken as a snapshot at one instant from the SessionTable (its GapModel and
// the sessions idle right now). Planning builds one per plan; kvtierctl one per listing.
//
// The model (contracts here; reasons in the .cpp):
//  * Population: a life-table (Kaplan–Meier in bins) estimate of the survival S(t) =
//    P(still away t after the turn ended) per stratum (never returned / once / more),
//    from returns, closes while idle and the idle periods still running. Sessions that
//    never come back are part of it: S(t) levels off above 0, and 1 − S(∞)/S(t) is the
//    chance of coming back at all.
//  * Small strata borrow strength from the pooled curve, and the pooled curve from a
//    weak prior (half of sessions return, spread log-uniformly over 1 s..1 h) until the
//    daemon has seen data; a few hundred observations wash the prior out.
//  * Per session: a session that has returned before has its own rhythm. Its mean log
//    gap against the population's stretches or shrinks the time axis of its stratum's
//    curve, blended with the plain curve by weight n / (n + 2) after n returns.
//
// Thread-safety: an immutable value once built; it borrows nothing after construction.
#pragma once

#include <array>
#include <cstdint>

#include "policy/gap_model.h"
#include "policy/session_table.h"

namespace kvtier::policy {

class ReturnPredictor {
 public:
  ReturnPredictor(const SessionTable& sessions, uint64_t now_ms);

  // P(the session's next turn starts within `horizon_ms` from now). 1 when active.
  double probability_within(const Session& session, uint64_t horizon_ms) const;
  // P(it comes back at all, i.e. within the day the model spans). 1 when active.
  double probability_ever(const Session& session) const;
  // Median time from now until it comes back, given that it does; 0 when active.
  double median_return_in_ms(const Session& session) const;

  // Whether the daemon has seen enough returns (kMinReturnsToAct) for predictions to
  // be acted on; before that they are the prior's, good for ranking, not for moving
  // blocks on a guess.
  static constexpr uint64_t kMinReturnsToAct = 10;
  bool informed() const { return informed_; }

  // The survival curve of a stratum at idle time `idle_ms` (tests and diagnostics).
  double survival(int stratum, double idle_ms) const;

 private:
  struct Curve {
    std::array<double, GapModel::kBins> hazard{};     // P(return in bin b | away at its start)
    std::array<double, GapModel::kBins> log_stay{};   // ln(1 - hazard)
    std::array<double, GapModel::kBins + 1> start{};  // S at the start of each bin
  };
  double idle_ms(const Session& session) const;
  // How much faster (> 1) or slower than the population this session returns, and how
  // much its own history is trusted (0..1).
  void rhythm(const Session& session, double* scale, double* weight) const;
  double within_on_curve(int stratum, double from_ms, double horizon_ms) const;
  double median_on_curve(int stratum, double from_ms) const;

  std::array<Curve, GapModel::kStrata> curves_;
  double population_mean_log_gap_ = 0;
  bool population_known_ = false;
  bool informed_ = false;
  uint64_t now_ms_ = 0;
};

}  // namespace kvtier::policy
