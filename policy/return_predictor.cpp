#include "policy/return_predictor.h"

#include <algorithm>
#include <cmath>

namespace kvtier::policy {
namespace {

constexpr int kBins = GapModel::kBins;
constexpr int kStrata = GapModel::kStrata;
// Pseudo-observations: how strongly the pooled curve is pulled toward the prior, and a
// stratum toward the pooled curve, in each bin. Small on purpose: they only matter
// until the daemon has seen a few dozen idle periods in that bin.
constexpr double kPriorStrength = 1.0;
constexpr double kPoolStrength = 4.0;
// The prior: half of all idle periods end in a return, spread evenly in log time over
// 1 s .. 1 h (the gaps between a conversation's turns run from tens of seconds to many minutes).
// Only a starting point.
constexpr double kPriorReturnShare = 0.5;
constexpr double kPriorLastMs = 3'600'000.0;

using Counts = std::array<double, kBins>;

// Life-table hazards: a period censored inside a bin was at risk for half of it.
Counts hazards(const Counts& events, const Counts& censored, const Counts& prior, double strength) {
  Counts out{};
  double at_risk = 0;
  for (int b = kBins - 1; b >= 0; --b) {
    at_risk += events[b] + censored[b];
    const double exposed = at_risk - censored[b] / 2;
    out[b] = (events[b] + strength * prior[b]) / (exposed + strength);
    out[b] = std::clamp(out[b], 0.0, 1.0);
  }
  return out;
}

Counts prior_hazards() {
  const int last = GapModel::bin_of(kPriorLastMs);
  const double mass = kPriorReturnShare / last;  // bins 1..last
  Counts out{};
  double survival = 1;
  for (int b = 1; b <= last && b < kBins; ++b) {
    out[b] = mass / survival;
    survival -= mass;
  }
  return out;
}

const double kLogBinRatio = std::log(GapModel::kBinRatio);

}  // namespace

ReturnPredictor::ReturnPredictor(const SessionTable& sessions, uint64_t now_ms) : now_ms_(now_ms) {
  const GapModel& model = sessions.gap_model();
  std::array<Counts, kStrata> events{}, censored{};
  for (int s = 0; s < kStrata; ++s) {
    for (int b = 0; b < kBins; ++b) {
      events[s][b] = model.returns_in(s, b);
      censored[s][b] = model.censored_in(s, b);
    }
  }
  // Sessions idle right now are censored at their current idle time: they have stayed
  // away at least that long. Without them the curve would only know about returners
  // and would overstate every return probability. The table keeps their counts.
  const SessionTable::Census& census = sessions.idle_census(now_ms);
  for (int s = 0; s < kStrata; ++s) {
    for (int b = 0; b < kBins; ++b) censored[s][b] += census[s][b];
  }
  Counts pooled_events{}, pooled_censored{};
  for (int s = 0; s < kStrata; ++s) {
    for (int b = 0; b < kBins; ++b) {
      pooled_events[b] += events[s][b];
      pooled_censored[b] += censored[s][b];
    }
  }
  const Counts pooled = hazards(pooled_events, pooled_censored, prior_hazards(), kPriorStrength);
  for (int s = 0; s < kStrata; ++s) {
    Curve& curve = curves_[s];
    curve.hazard = hazards(events[s], censored[s], pooled, kPoolStrength);
    curve.start[0] = 1;
    for (int b = 0; b < kBins; ++b) {
      curve.start[b + 1] = curve.start[b] * (1 - curve.hazard[b]);
      curve.log_stay[b] = curve.hazard[b] < 1 ? std::log1p(-curve.hazard[b]) : -INFINITY;
    }
  }
  population_known_ = model.total_returns() > 0;
  informed_ = model.total_returns() >= kMinReturnsToAct;
  population_mean_log_gap_ = model.mean_log_gap();
}

double ReturnPredictor::idle_ms(const Session& session) const {
  return now_ms_ > session.last_active_ms ? static_cast<double>(now_ms_ - session.last_active_ms)
                                          : 0.0;
}

double ReturnPredictor::survival(int stratum, double t_ms) const {
  const Curve& curve = curves_[std::clamp(stratum, 0, kStrata - 1)];
  // The bin (GapModel::bin_of) and where t_ms lies inside it, 0..1 in the bin's own
  // (log) scale, from one logarithm.
  int bin = 0;
  double fraction;
  if (!(t_ms >= GapModel::kFirstBinMs)) {
    fraction = std::clamp(t_ms / GapModel::kFirstBinMs, 0.0, 1.0);
  } else {
    const double steps = std::log(t_ms / GapModel::kFirstBinMs) / kLogBinRatio;
    bin = std::min(1 + static_cast<int>(std::floor(steps + 1e-9)), kBins - 1);
    fraction = bin == kBins - 1 ? 0 : std::clamp(steps - (bin - 1), 0.0, 1.0);
  }
  if (fraction <= 0) return curve.start[bin];
  return curve.start[bin] * std::exp(curve.log_stay[bin] * fraction);
}

double ReturnPredictor::within_on_curve(int stratum, double from_ms, double horizon_ms) const {
  const double now = survival(stratum, from_ms);
  if (now <= 0) return 0;
  return std::clamp(1 - survival(stratum, from_ms + horizon_ms) / now, 0.0, 1.0);
}

void ReturnPredictor::rhythm(const Session& session, double* scale, double* weight) const {
  *scale = 1;
  *weight = 0;
  if (session.returns == 0 || !population_known_) return;
  const double own = session.sum_log_gap / session.returns;
  // A session that usually answers in 10 s when the population takes 60 s is at idle
  // time t where a typical session is at 6·t.
  *scale = std::clamp(std::exp(population_mean_log_gap_ - own), 0.01, 100.0);
  *weight = session.returns / (session.returns + 2.0);
}

double ReturnPredictor::probability_within(const Session& session, uint64_t horizon_ms) const {
  if (session.state == SessionState::kActive) return 1;
  const int stratum = GapModel::stratum_of(session.returns);
  const double t = idle_ms(session);
  const double h = static_cast<double>(horizon_ms);
  double scale, weight;
  rhythm(session, &scale, &weight);
  const double plain = within_on_curve(stratum, t, h);
  if (weight == 0) return plain;
  return (1 - weight) * plain + weight * within_on_curve(stratum, t * scale, h * scale);
}

double ReturnPredictor::probability_ever(const Session& session) const {
  if (session.state == SessionState::kActive) return 1;
  const int stratum = GapModel::stratum_of(session.returns);
  const double now = survival(stratum, idle_ms(session));
  if (now <= 0) return 0;
  return std::clamp(1 - curves_[stratum].start[kBins - 1] / now, 0.0, 1.0);
}

double ReturnPredictor::median_on_curve(int stratum, double from_ms) const {
  const Curve& curve = curves_[stratum];
  const double now = survival(stratum, from_ms);
  const double floor = curve.start[kBins - 1];
  if (now <= floor) return INFINITY;
  const double target = now - (now - floor) / 2;
  for (int b = GapModel::bin_of(from_ms); b < kBins - 1; ++b) {
    if (curve.start[b + 1] > target) continue;
    // The crossing is inside bin b: solve start[b]·(1-h)^f = target for f.
    const double h = curve.hazard[b];
    double f = h <= 0 || h >= 1 ? 1 : std::log(target / curve.start[b]) / std::log(1 - h);
    f = std::clamp(f, 0.0, 1.0);
    const double at = b == 0 ? f * GapModel::kFirstBinMs
                             : GapModel::bin_start_ms(b) * std::pow(GapModel::kBinRatio, f);
    return std::max(0.0, at - from_ms);
  }
  return GapModel::bin_start_ms(kBins - 1) - from_ms;
}

double ReturnPredictor::median_return_in_ms(const Session& session) const {
  if (session.state == SessionState::kActive) return 0;
  const int stratum = GapModel::stratum_of(session.returns);
  const double t = idle_ms(session);
  double scale, weight;
  rhythm(session, &scale, &weight);
  const double plain = median_on_curve(stratum, t);
  if (weight == 0 || !std::isfinite(plain)) return plain;
  const double own = median_on_curve(stratum, t * scale) / scale;
  if (!std::isfinite(own)) return plain;
  // Geometric blend: the two estimates can differ by orders of magnitude.
  return std::exp((1 - weight) * std::log(plain + 1) + weight * std::log(own + 1)) - 1;
}

}  // namespace kvtier::policy
