// BenchReport: what one kvtier-bench subcommand measured, printed either as a table
// for people or as one JSON object for machines (docs/benchmarks.md):
//   {"bench": SUB, "config": {...}, "results": {metric: value, ...},
//    "targets": [{"metric", "value", "op", "target", "met"}, ...]}
//
// Entries keep the order they were added in. Metric names carry their unit
// ("daemon_save_gbps", "lookup_p99_us"). Notes are for the table only (per-round
// details, how a figure was aggregated); the JSON carries no prose.
//
// Thread-safety: none; a value built and printed by one thread.
#pragma once

#include <cstdio>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/sample_stats.h"  // percentile_of_sorted, median: what the reports take

namespace kvtier::bench {

using ConfigValue = std::variant<std::string, int64_t, double, bool>;

struct Target {
  std::string metric;
  double value = 0;
  std::string op;  // ">=" or "<="
  double target = 0;
  bool met() const { return op == ">=" ? value >= target : value <= target; }
};

class BenchReport {
 public:
  explicit BenchReport(std::string bench) : bench_(std::move(bench)) {}

  void config(std::string key, ConfigValue value) {
    config_.emplace_back(std::move(key), std::move(value));
  }
  void result(std::string metric, double value) { results_.emplace_back(std::move(metric), value); }
  // Adds a target on a metric already added with result(); op is ">=" or "<=".
  void target(const std::string& metric, const std::string& op, double target);
  void note(std::string line) { notes_.push_back(std::move(line)); }

  bool all_targets_met() const;
  // Exactly one JSON object and a newline.
  std::string to_json() const;
  // The human table.
  void print_table(std::FILE* out) const;

 private:
  std::string bench_;
  std::vector<std::pair<std::string, ConfigValue>> config_;
  std::vector<std::pair<std::string, double>> results_;
  std::vector<Target> targets_;
  std::vector<std::string> notes_;
};

}  // namespace kvtier::bench
