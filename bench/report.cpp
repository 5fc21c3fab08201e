#include "bench/report.h"

#include "common/json.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace kvtier::bench {
namespace {

// JSON has no NaN or infinity; a figure that could not be measured is null.
std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  return fmt::format("{}", value);
}

std::string json_value(const ConfigValue& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return json_quote(v);
        } else if constexpr (std::is_same_v<T, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, double>) {
          return json_number(v);
        } else {
          return fmt::format("{}", v);
        }
      },
      value);
}

std::string table_value(const ConfigValue& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return v;
        } else if constexpr (std::is_same_v<T, bool>) {
          return v ? "yes" : "no";
        } else {
          return fmt::format("{}", v);
        }
      },
      value);
}

// Four significant figures for small values (0.8123, 15.34); whole numbers and
// anything from 1000 up without an exponent (38510.2, 3355443200).
std::string table_number(double value) {
  if (!std::isfinite(value)) return "n/a";
  if (value == std::floor(value) && std::fabs(value) < 1e15) return fmt::format("{:.0f}", value);
  if (std::fabs(value) >= 1000) return fmt::format("{:.1f}", value);
  return fmt::format("{:.4g}", value);
}

}  // namespace

void BenchReport::target(const std::string& metric, const std::string& op, double target) {
  double value = NAN;
  for (const auto& [name, v] : results_) {
    if (name == metric) value = v;
  }
  targets_.push_back({metric, value, op, target});
}

bool BenchReport::all_targets_met() const {
  return std::all_of(targets_.begin(), targets_.end(), [](const Target& t) { return t.met(); });
}

std::string BenchReport::to_json() const {
  std::string out = "{\"bench\": " + json_quote(bench_) + ", \"config\": {";
  for (size_t i = 0; i < config_.size(); ++i) {
    out += fmt::format("{}{}: {}", i ? ", " : "", json_quote(config_[i].first),
                       json_value(config_[i].second));
  }
  out += "}, \"results\": {";
  for (size_t i = 0; i < results_.size(); ++i) {
    out += fmt::format("{}{}: {}", i ? ", " : "", json_quote(results_[i].first),
                       json_number(results_[i].second));
  }
  out += "}, \"targets\": [";
  for (size_t i = 0; i < targets_.size(); ++i) {
    const Target& t = targets_[i];
    out +=
        fmt::format("{}{{\"metric\": {}, \"value\": {}, \"op\": {}, \"target\": {}, \"met\": {}}}",
                    i ? ", " : "", json_quote(t.metric), json_number(t.value), json_quote(t.op),
                    json_number(t.target), t.met() ? "true" : "false");
  }
  return out + "]}\n";
}

void BenchReport::print_table(std::FILE* out) const {
  size_t width = 8;
  for (const auto& [key, value] : config_) width = std::max(width, key.size());
  for (const auto& [metric, value] : results_) width = std::max(width, metric.size());
  for (const Target& t : targets_) width = std::max(width, t.metric.size());
  const int w = static_cast<int>(width);

  std::fprintf(out, "kvtier-bench %s\n\nconfig\n", bench_.c_str());
  for (const auto& [key, value] : config_) {
    std::fprintf(out, "  %-*s  %s\n", w, key.c_str(), table_value(value).c_str());
  }
  if (!notes_.empty()) std::fputc('\n', out);
  for (const std::string& line : notes_) std::fprintf(out, "%s\n", line.c_str());
  std::fprintf(out, "\nresults\n");
  for (const auto& [metric, value] : results_) {
    std::fprintf(out, "  %-*s  %12s\n", w, metric.c_str(), table_number(value).c_str());
  }
  if (targets_.empty()) return;
  std::fprintf(out, "\ntargets\n");
  for (const Target& t : targets_) {
    std::fprintf(out, "  %-*s  %12s %s %-8s %s\n", w, t.metric.c_str(),
                 table_number(t.value).c_str(), t.op.c_str(), table_number(t.target).c_str(),
                 t.met() ? "met" : "MISSED");
  }
}

}  // namespace kvtier::bench
