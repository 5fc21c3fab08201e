#include "daemon/metrics.h"

#include <capnp/schema.h>

#include <string>

#include "common/tier_topology.h"
#include "schema/kvtier.capnp.h"

namespace kvtier::daemon {
namespace {

constexpr std::string_view kCodeLabels[RequestMetrics::kCodes] = {
    "ok",          "invalid_argument", "not_found", "resource_exhausted", "permission_denied",
    "unavailable", "data_loss",        "internal",  "not_supported"};

std::string with_label(std::string_view labels, std::string_view extra) {
  if (labels.empty()) return std::string(extra);
  return fmt::format("{},{}", labels, extra);
}

}  // namespace

void LatencyHistogram::observe(double seconds) {
  for (size_t i = 0; i < kBucketSeconds.size(); ++i) {
    if (seconds <= kBucketSeconds[i]) {
      ++buckets_[i];
      break;
    }
  }
  ++count_;
  sum_seconds_ += seconds;
}

std::string_view request_kind_name(size_t kind) {
  // Names come from the schema, so a request added there is named here without an edit.
  static const auto names = [] {
    std::array<std::string, RequestMetrics::kMaxKinds> out;
    for (auto field : capnp::Schema::from<wire::Request>().getUnionFields()) {
      const size_t discriminant = field.getProto().getDiscriminantValue();
      if (discriminant < out.size()) out[discriminant] = field.getProto().getName().cStr();
    }
    return out;
  }();
  if (kind >= names.size() || names[kind].empty()) return "unknown";
  return names[kind];
}

void RequestMetrics::observe(size_t kind, std::chrono::nanoseconds latency, StatusCode code) {
  if (kind >= kMaxKinds) kind = kUnknownKind;
  latency_[kind].observe(std::chrono::duration<double>(latency).count());
  const size_t code_index = static_cast<size_t>(code);
  if (code != StatusCode::kOk && code_index < kCodes) ++errors_[kind][code_index];
}

void RequestMetrics::render(PrometheusText& out) const {
  out.family("kvtier_request_duration_seconds", "histogram",
             "Time from a request's arrival to its reply, by request kind.");
  for (size_t kind = 0; kind < kMaxKinds; ++kind) {
    if (latency_[kind].count() == 0) continue;
    out.histogram("kvtier_request_duration_seconds",
                  fmt::format("op=\"{}\"", request_kind_name(kind)), latency_[kind]);
  }
  out.family("kvtier_request_errors_total", "counter",
             "Requests answered with an error, by request kind and error code.");
  for (size_t kind = 0; kind < kMaxKinds; ++kind) {
    for (size_t code = 1; code < kCodes; ++code) {
      if (errors_[kind][code] == 0) continue;
      out.sample("kvtier_request_errors_total",
                 fmt::format("op=\"{}\",code=\"{}\"", request_kind_name(kind), kCodeLabels[code]),
                 errors_[kind][code]);
    }
  }
  out.family("kvtier_lookup_hits_by_tier_total", "counter",
             "Blocks found by Lookup and Load, by the tier that held them.");
  for (Tier tier : TierTopology::kOrder) {
    out.sample("kvtier_lookup_hits_by_tier_total", fmt::format("tier=\"{}\"", tier_name(tier)),
               hits_by_tier_[static_cast<size_t>(tier)]);
  }
  out.family("kvtier_config_reloads_total", "counter", "SIGHUP configuration reloads, by result.");
  out.sample("kvtier_config_reloads_total", "result=\"ok\"", reloads_);
  out.sample("kvtier_config_reloads_total", "result=\"failed\"", reload_failures_);
}

void PrometheusText::family(std::string_view name, std::string_view type, std::string_view help) {
  text_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void PrometheusText::sample(std::string_view name, std::string_view labels, double value) {
  if (labels.empty()) {
    text_ += fmt::format("{} {}\n", name, value);
  } else {
    text_ += fmt::format("{}{{{}}} {}\n", name, labels, value);
  }
}

void PrometheusText::sample(std::string_view name, std::string_view labels, uint64_t value) {
  if (labels.empty()) {
    text_ += fmt::format("{} {}\n", name, value);
  } else {
    text_ += fmt::format("{}{{{}}} {}\n", name, labels, value);
  }
}

void PrometheusText::histogram(std::string_view name, std::string_view labels,
                               const LatencyHistogram& h) {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < LatencyHistogram::kBucketSeconds.size(); ++i) {
    cumulative += h.bucket(i);
    text_ += fmt::format(
        "{}_bucket{{{}}} {}\n", name,
        with_label(labels, fmt::format("le=\"{}\"", LatencyHistogram::kBucketSeconds[i])),
        cumulative);
  }
  text_ += fmt::format("{}_bucket{{{}}} {}\n", name, with_label(labels, "le=\"+Inf\""), h.count());
  sample(fmt::format("{}_sum", name), labels, h.sum_seconds());
  sample(fmt::format("{}_count", name), labels, h.count());
}

}  // namespace kvtier::daemon
