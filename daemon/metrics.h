// What kvtierd measures about its requests, and the Prometheus text format it is
// published in (served by MetricsServer in metrics_server.h).
//
// RequestMetrics counts per request kind (the `Request` union member, named from the
// schema): a latency histogram from frame arrival to reply, and replies that were
// errors by code; plus lookup hits by the tier that held the block. Nothing here is
// keyed by session, namespace or block: the endpoint exposes no session content.
//
// Thread-safety: none; the control thread owns RequestMetrics and renders the text.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/block_key.h"
#include "common/status.h"

namespace kvtier::daemon {

// Cumulative histogram of durations with fixed buckets (25 µs … 10 s).
class LatencyHistogram {
 public:
  static constexpr std::array<double, 18> kBucketSeconds = {
      25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3,
      25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0,  2.5,    5.0,  10.0};

  void observe(double seconds);
  uint64_t count() const { return count_; }
  double sum_seconds() const { return sum_seconds_; }
  // Observations ≤ kBucketSeconds[i] (not cumulative).
  uint64_t bucket(size_t i) const { return buckets_[i]; }

 private:
  std::array<uint64_t, kBucketSeconds.size()> buckets_{};
  uint64_t count_ = 0;
  double sum_seconds_ = 0;
};

// Builds a Prometheus text exposition: families in order, each with HELP and TYPE.
class PrometheusText {
 public:
  // Starts a family; `type` is "counter", "gauge" or "histogram".
  void family(std::string_view name, std::string_view type, std::string_view help);
  // One sample; `labels` is already formatted (`tier="hbm"`) or empty.
  void sample(std::string_view name, std::string_view labels, double value);
  void sample(std::string_view name, std::string_view labels, uint64_t value);
  void histogram(std::string_view name, std::string_view labels, const LatencyHistogram& h);
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

class RequestMetrics {
 public:
  static constexpr size_t kMaxKinds = 64;  // request union members (ordinals) tracked
  static constexpr size_t kUnknownKind = kMaxKinds - 1;
  static constexpr size_t kCodes = 9;  // StatusCode values

  // `kind` is the Request union discriminant (kUnknownKind when unparsable).
  void observe(size_t kind, std::chrono::nanoseconds latency, StatusCode code);
  void count_hit(Tier tier) {
    if (tier != Tier::kNone) ++hits_by_tier_[static_cast<size_t>(tier)];
  }
  void count_reload(bool ok) { ++(ok ? reloads_ : reload_failures_); }

  // Appends every family this class owns to `out` (Prometheus text format 0.0.4).
  void render(PrometheusText& out) const;

 private:
  std::array<LatencyHistogram, kMaxKinds> latency_;
  std::array<std::array<uint64_t, kCodes>, kMaxKinds> errors_{};
  std::array<uint64_t, kTierCount> hits_by_tier_{};  // by Tier
  uint64_t reloads_ = 0;
  uint64_t reload_failures_ = 0;
};

// The request kind's name as the schema spells it ("save", "listSessions").
std::string_view request_kind_name(size_t kind);

}  // namespace kvtier::daemon
