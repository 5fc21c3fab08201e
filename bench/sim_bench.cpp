#include "bench/sim_bench.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <thread>

#include "common/units.h"
#include "sim/sim_runner.h"
#include "sim/sim_trace.h"
#include "sim/sim_workloads.h"

namespace kvtier::bench {
namespace {

// Issue 13: the predictive policy closes at least half the mean-TTFT gap from LRU
// tiering to the offline optimum, and is never more than 1 % slower than LRU tiering.
constexpr double kGapClosedTarget = 0.5;
constexpr double kVsLruTarget = 1.01;
// A workload whose requests carry retention priorities: each policy is at least 1 %
// faster (mean TTFT) with them than on the same requests without them.
constexpr double kPriorityGainTarget = 1.01;
// Issue 31: kvtier's policy (kOurs) against the best baseline of each cell (LRU tiering
// and the peers' policies): mean TTFT at most the best's in every cell, and at most
// 0.97 x it on average over the cells of the run.
constexpr SimPolicy kOurs = SimPolicy::kPredictive;
constexpr double kVsBestBaselineTarget = 1.0;
constexpr double kVsBestBaselineAverageTarget = 0.97;

// (LRU − policy) ÷ (LRU − optimum) on mean TTFT; 0 when the optimum is no better.
double gap_closed(const SimResult& policy, const SimResult& lru, const SimResult& optimum) {
  const double gap = lru.ttft_mean_ms - optimum.ttft_mean_ms;
  return gap > 0 ? (lru.ttft_mean_ms - policy.ttft_mean_ms) / gap : 0;
}

Result<SimBudget> parse_budget(const std::string& text, size_t index) {
  SimBudget budget;
  budget.name = fmt::format("b{}", index + 1);
  size_t start = 0;
  for (int tier = 0; tier < kLocalTierCount; ++tier) {
    const size_t slash = text.find('/', start);
    if ((slash == std::string::npos) != (tier == kLocalTierCount - 1)) {
      return invalid_argument("--budget '{}': expected HBM/RAM/NVME, e.g. 10GiB/64GiB/1TiB", text);
    }
    auto bytes =
        parse_bytes(text.substr(start, slash == std::string::npos ? slash : slash - start));
    if (!bytes.is_ok())
      return invalid_argument("--budget '{}': {}", text, bytes.status().message());
    budget.bytes[tier] = *bytes;
    start = slash + 1;
  }
  if (budget.bytes[0] == 0) return invalid_argument("--budget '{}': HBM must not be 0", text);
  return budget;
}

Result<SimConfig> make_config(const SimOptions& options) {
  SimConfig config;
  auto kv = parse_bytes(options.kv_bytes_per_token);
  if (!kv.is_ok() || *kv == 0) return invalid_argument("--kv-bytes-per-token must be a size > 0");
  config.kv_bytes_per_token = *kv;
  for (double gbps : {options.hbm_gbps, options.ram_gbps, options.nvme_gbps}) {
    if (!(gbps > 0)) return invalid_argument("tier bandwidths must be positive");
  }
  config.read_bytes_per_s = {options.hbm_gbps * 1e9, options.ram_gbps * 1e9,
                             options.nvme_gbps * 1e9};
  if (!(options.prefill_tokens_per_s > 0)) {
    return invalid_argument("--prefill-tokens-per-s must be positive");
  }
  config.prefill_tokens_per_s = options.prefill_tokens_per_s;
  config.decode_ms_per_token = options.decode_ms_per_token;
  auto interval = parse_duration_ms(options.plan_interval);
  auto hbm_idle = parse_duration_ms(options.hbm_idle);
  auto ram_idle = parse_duration_ms(options.ram_idle);
  if (!interval.is_ok() || !hbm_idle.is_ok() || !ram_idle.is_ok()) {
    return invalid_argument("durations take ms, s, m or h (e.g. 30s)");
  }
  if (*interval == 0) return invalid_argument("--plan-interval must be positive");
  config.plan_interval_ms = *interval;
  config.inclusive_nvme = !options.exclusive_nvme;
  config.planner.hbm_idle_ms = *hbm_idle;
  config.planner.ram_idle_ms = *ram_idle;
  return config;
}

std::string percent(double fraction) {
  return fmt::format("{:.1f}", 100 * fraction);
}
std::string gib(uint64_t bytes) {
  return fmt::format("{:.0f}", bytes / double(1ull << 30));
}
std::string mib(double bytes) {
  return fmt::format("{:.0f}", bytes / double(1ull << 20));
}

void add_table(BenchReport& report, const SimBudget& budget, const std::vector<SimResult>& rows,
               const std::vector<const SimResult*>& bounds, const SimResult* lru,
               const SimResult* optimum) {
  report.note(fmt::format("{}: HBM {}, RAM {}, NVMe {}", budget.name, format_bytes(budget.bytes[0]),
                          format_bytes(budget.bytes[1]), format_bytes(budget.bytes[2])));
  report.note(fmt::format(
      "  {:<17} {:>8} {:>7} {:>7} {:>7} {:>6} {:>6} {:>6} {:>6} {:>8} {:>8} {:>9} {:>6} {:>6}",
      "policy", "mean ms", "p50", "p90", "p99", "hit%", "hbm%", "ram%", "nvme%", "moved",
      "prefetch", "nvme w/t", "vs 2", "gap"));
  auto line = [&](const SimResult& r) {
    const std::string ratio = lru && lru->ttft_mean_ms > 0
                                  ? fmt::format("{:.2f}", r.ttft_mean_ms / lru->ttft_mean_ms)
                                  : "-";
    const std::string gap =
        lru && optimum ? fmt::format("{:.2f}", gap_closed(r, *lru, *optimum)) : "-";
    report.note(fmt::format(
        "  {:<17} {:>8.0f} {:>7.0f} {:>7.0f} {:>7.0f} {:>6} {:>6} {:>6} {:>6} {:>8} "
        "{:>8} {:>9} {:>6} {:>6}",
        sim_policy_label(r.policy), r.ttft_mean_ms, r.ttft_p50_ms, r.ttft_p90_ms, r.ttft_p99_ms,
        percent(r.hit_rate()), percent(r.hit_rate(Tier::kHbm)), percent(r.hit_rate(Tier::kRam)),
        percent(r.hit_rate(Tier::kNvme)), gib(r.bytes_moved()) + "G", gib(r.bytes_prefetched) + "G",
        mib(r.nvme_written_bytes_per_turn()) + "M", ratio, gap));
  };
  for (const SimResult& r : rows) line(r);
  for (const SimResult* bound : bounds) line(*bound);
  report.note("");
}

void add_results(BenchReport& report, const std::string& prefix, const SimResult& r) {
  report.result(prefix + "ttft_mean_ms", r.ttft_mean_ms);
  report.result(prefix + "wait_mean_ms", r.wait_mean_ms);
  report.result(prefix + "ttft_p50_ms", r.ttft_p50_ms);
  report.result(prefix + "ttft_p90_ms", r.ttft_p90_ms);
  report.result(prefix + "ttft_p99_ms", r.ttft_p99_ms);
  report.result(prefix + "follow_up_ttft_mean_ms", r.follow_up_ttft_mean_ms);
  report.result(prefix + "hit_rate", r.hit_rate());
  report.result(prefix + "hit_rate_hbm", r.hit_rate(Tier::kHbm));
  report.result(prefix + "hit_rate_ram", r.hit_rate(Tier::kRam));
  report.result(prefix + "hit_rate_nvme", r.hit_rate(Tier::kNvme));
  report.result(prefix + "bytes_moved", static_cast<double>(r.bytes_moved()));
  report.result(prefix + "bytes_prefetched", static_cast<double>(r.bytes_prefetched));
  report.result(prefix + "blocks_evicted", static_cast<double>(r.blocks_evicted));
  report.result(prefix + "blocks_dropped", static_cast<double>(r.blocks_dropped));
  report.result(prefix + "saves_refused", static_cast<double>(r.saves_refused));
  report.result(prefix + "nvme_written_bytes_per_turn", r.nvme_written_bytes_per_turn());
  report.result(prefix + "bytes_demoted_onto_copy", static_cast<double>(r.bytes_demoted_onto_copy));
}

}  // namespace

namespace {

struct Workload {
  std::string name;    // "trace" or a generated workload's name
  std::string source;  // the trace's path, or how it was generated
  Trace trace;
};

// Every (budget, policy) run of one workload, plus the bounds, on a few threads; its
// table, its results (keys prefixed with `prefix`) and its targets.
void run_workload(BenchReport& report, const Workload& workload, const std::string& prefix,
                  const SimConfig& config, const std::vector<SimBudget>& budgets,
                  const std::vector<SimPolicy>& policies, int jobs,
                  std::vector<double>& best_baseline_ratios) {
  struct Task {
    SimBudget budget;
    SimPolicy policy;
    SimResult result;
    bool priorities = true;  // false: the same requests with their priorities ignored
  };
  std::vector<Task> tasks;
  // The infinite cache, and two bounds: the same hits, every one read from RAM / NVMe.
  for (SimPolicy bound :
       {SimPolicy::kInfiniteCache, SimPolicy::kInfiniteRam, SimPolicy::kInfiniteNvme}) {
    tasks.push_back({SimBudget{"ideal", {}}, bound, {}});
  }
  // The offline optimum at every budget, beside the policies.
  for (const SimBudget& budget : budgets) {
    tasks.push_back({budget, SimPolicy::kClairvoyant, {}});
    for (SimPolicy policy : policies) tasks.push_back({budget, policy, {}});
    if (!workload.trace.has_priorities) continue;
    // (The peers' policies honour priorities as every mode does; whether they gain by
    // them is not what they are here for.)
    for (SimPolicy policy : policies) {
      if (sim_policy_is_baseline(policy) && policy != SimPolicy::kLruTiering) continue;
      tasks.push_back({budget, policy, {}, false});
    }
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> workers;
  for (int j = 0; j < std::min<int>(jobs, static_cast<int>(tasks.size())); ++j) {
    workers.emplace_back([&] {
      for (size_t i = next++; i < tasks.size(); i = next++) {
        SimConfig run_config = config;
        run_config.priorities = tasks[i].priorities;
        tasks[i].result = simulate(workload.trace, run_config, tasks[i].budget, tasks[i].policy);
      }
    });
  }
  for (std::thread& worker : workers) worker.join();

  const Trace& trace = workload.trace;
  report.note(fmt::format(
      "== workload {}: {} ({} requests, {} conversations, {} follow-up turns, {} forks)",
      workload.name, workload.source, trace.requests.size(), trace.sessions, trace.follow_ups,
      trace.forks));
  report.note("");
  report.config(prefix + "requests", static_cast<int64_t>(trace.requests.size()));
  report.config(prefix + "sessions", static_cast<int64_t>(trace.sessions));
  report.config(prefix + "follow_up_turns", static_cast<int64_t>(trace.follow_ups));
  report.config(prefix + "forks", static_cast<int64_t>(trace.forks));
  const SimResult& ideal = tasks[0].result;
  const std::vector<const SimResult*> bounds = {&tasks[0].result, &tasks[1].result,
                                                &tasks[2].result};
  report.result(prefix + "ideal_hit_rate", ideal.hit_rate());
  report.result(prefix + "ideal_ttft_mean_ms", ideal.ttft_mean_ms);
  report.result(prefix + "ideal_from_ram_ttft_mean_ms", tasks[1].result.ttft_mean_ms);
  report.result(prefix + "ideal_from_nvme_ttft_mean_ms", tasks[2].result.ttft_mean_ms);
  for (const SimBudget& budget : budgets) {
    std::map<SimPolicy, const SimResult*> by_policy;
    std::map<SimPolicy, const SimResult*> without_priorities;
    std::vector<SimResult> rows;
    for (const Task& task : tasks) {
      if (task.budget.name != budget.name) continue;
      if (!task.priorities) {
        without_priorities[task.policy] = &task.result;
        continue;
      }
      rows.push_back(task.result);
      by_policy[task.policy] = &task.result;
      add_results(report, fmt::format("{}{}_{}_", prefix, budget.name, sim_policy_key(task.policy)),
                  task.result);
    }
    auto find = [&](SimPolicy p) { return by_policy.count(p) != 0 ? by_policy[p] : nullptr; };
    const SimResult* lru = find(SimPolicy::kLruTiering);
    const SimResult* optimum = find(SimPolicy::kClairvoyant);
    add_table(report, budget, rows, bounds, lru, optimum);
    if (!without_priorities.empty()) {
      std::string line = "  without priorities (mean ms, and x faster with them):";
      for (const auto& [policy, plain] : without_priorities) {
        const SimResult* with = find(policy);
        const double gain = with->ttft_mean_ms > 0 ? plain->ttft_mean_ms / with->ttft_mean_ms : 0;
        line +=
            fmt::format("  {} {:.0f} ({:.2f}x)", sim_policy_key(policy), plain->ttft_mean_ms, gain);
        const std::string name =
            fmt::format("{}{}_{}_", prefix, budget.name, sim_policy_key(policy));
        add_results(report, name + "no_priorities_", *plain);
        report.result(name + "priority_gain", gain);
      }
      report.note(line);
      report.note("");
    }
    if (lru == nullptr || optimum == nullptr) continue;
    for (SimPolicy p : policies) {
      const SimResult* r = find(p);
      if (r == nullptr) continue;
      const std::string name = fmt::format("{}{}_{}_", prefix, budget.name, sim_policy_key(p));
      report.result(name + "vs_p2_ttft_mean_ratio", r->ttft_mean_ms / lru->ttft_mean_ms);
      report.result(name + "gap_closed", gap_closed(*r, *lru, *optimum));
    }
    // The best baseline of the cell, and how kvtier's policy stands against it.
    const SimResult* best = nullptr;
    for (SimPolicy p : policies) {
      const SimResult* r = find(p);
      if (r != nullptr && sim_policy_is_baseline(p) &&
          (best == nullptr || r->ttft_mean_ms < best->ttft_mean_ms)) {
        best = r;
      }
    }
    const SimResult* ours = find(kOurs);
    if (best == nullptr || ours == nullptr) continue;
    const std::string cell = fmt::format("{}{}_", prefix, budget.name);
    const double ratio = ours->ttft_mean_ms / best->ttft_mean_ms;
    report.config(cell + "best_baseline", sim_policy_key(best->policy));
    report.result(cell + sim_policy_key(kOurs) + "_vs_best_baseline_ttft_mean_ratio", ratio);
    report.result(cell + sim_policy_key(kOurs) + "_gap_closed_from_best_baseline",
                  gap_closed(*ours, *best, *optimum));
    best_baseline_ratios.push_back(ratio);
    report.note(
        fmt::format("  best baseline: {} ({:.0f} ms); {} is {:.3f} x it, closing {:.2f} of "
                    "its gap to the optimum",
                    sim_policy_label(best->policy), best->ttft_mean_ms, sim_policy_label(kOurs),
                    ratio, gap_closed(*ours, *best, *optimum)));
    report.note("");
  }
  if (std::find(policies.begin(), policies.end(), SimPolicy::kPredictive) == policies.end() ||
      std::find(policies.begin(), policies.end(), SimPolicy::kLruTiering) == policies.end()) {
    return;
  }
  for (const SimBudget& budget : budgets) {
    const std::string cell = fmt::format("{}{}_{}_", prefix, budget.name, sim_policy_key(kOurs));
    report.target(cell + "vs_best_baseline_ttft_mean_ratio", "<=", kVsBestBaselineTarget);
    report.target(prefix + budget.name + "_p4_gap_closed", ">=", kGapClosedTarget);
    report.target(prefix + budget.name + "_p4_vs_p2_ttft_mean_ratio", "<=", kVsLruTarget);
    if (!workload.trace.has_priorities) continue;
    for (SimPolicy p : policies) {
      if (sim_policy_is_baseline(p) && p != SimPolicy::kLruTiering) continue;  // not run
      report.target(fmt::format("{}{}_{}_priority_gain", prefix, budget.name, sim_policy_key(p)),
                    ">=", kPriorityGainTarget);
    }
  }
}

}  // namespace

Result<BenchReport> run_sim_bench(const SimOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  auto config = make_config(options);
  if (!config.is_ok()) return config.status();
  std::vector<SimBudget> budgets;
  for (size_t i = 0; i < options.budgets.size(); ++i) {
    auto budget = parse_budget(options.budgets[i], i);
    if (!budget.is_ok()) return budget.status();
    budgets.push_back(*budget);
  }
  std::vector<SimPolicy> policies;
  for (const std::string& name : options.policies) {
    std::optional<SimPolicy> found;
    for (SimPolicy p :
         {SimPolicy::kHbmOnlyLru, SimPolicy::kLruTiering, SimPolicy::kSessionAware,
          SimPolicy::kPredictive, SimPolicy::kS3Fifo, SimPolicy::kSlru, SimPolicy::kArc,
          SimPolicy::kTinyLfuLru, SimPolicy::kWTinyLfu, SimPolicy::kWorkloadAware}) {
      if (name == sim_policy_key(p) || name == std::to_string(static_cast<int>(p))) found = p;
    }
    if (!found) {
      return invalid_argument(
          "--policies: '{}' is not one of 1..4, s3fifo, slru, arc, tinylfu, wtinylfu, workload",
          name);
    }
    if (std::find(policies.begin(), policies.end(), *found) == policies.end()) {
      policies.push_back(*found);
    }
  }
  // The workloads: the trace, then the generated ones ("all": every one).
  std::vector<std::string> names;
  for (const std::string& name : options.workloads) {
    if (name == "all") {
      names.push_back("trace");
      for (const std::string& generated : workload_names()) names.push_back(generated);
    } else if (std::find(names.begin(), names.end(), name) == names.end()) {
      names.push_back(name);
    }
  }
  std::vector<Workload> workloads;
  for (const std::string& name : names) {
    if (name == "trace") {
      const std::string path =
          options.trace.empty() ? default_trace_path(options.executable) : options.trace;
      auto trace = load_trace(path, options.tokens_per_block);
      if (!trace.is_ok()) return trace.status();
      workloads.push_back({name, path, std::move(*trace)});
    } else {
      auto trace = generate_workload(name, options.seed, options.tokens_per_block);
      if (!trace.is_ok()) return trace.status();
      workloads.push_back(
          {name, fmt::format("generated, seed {}", options.seed), std::move(*trace)});
    }
  }
  const int jobs = options.jobs > 0
                       ? options.jobs
                       : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));

  BenchReport report("sim");
  std::vector<double> best_baseline_ratios;  // kOurs ÷ the cell's best baseline, every cell
  for (const Workload& w : workloads) {
    if (w.name == "trace") report.config("trace", w.source);
  }
  report.config("workloads", fmt::format("{}", fmt::join(names, ",")));
  report.config("seed", static_cast<int64_t>(options.seed));
  report.config("tokens_per_block", static_cast<int64_t>(options.tokens_per_block));
  report.config("kv_bytes_per_token", static_cast<int64_t>(config->kv_bytes_per_token));
  report.config("hbm_gbps", options.hbm_gbps);
  report.config("ram_gbps", options.ram_gbps);
  report.config("nvme_gbps", options.nvme_gbps);
  report.config("prefill_tokens_per_s", options.prefill_tokens_per_s);
  report.config("decode_ms_per_token", options.decode_ms_per_token);
  report.config("engines", options.engines < 0 ? std::string("derived per workload")
                                               : std::to_string(options.engines));
  report.config("plan_interval_ms", static_cast<int64_t>(config->plan_interval_ms));
  report.config("nvme", std::string(config->inclusive_nvme ? "inclusive" : "exclusive"));
  report.config("hbm_idle_ms", static_cast<int64_t>(config->planner.hbm_idle_ms));
  report.config("ram_idle_ms", static_cast<int64_t>(config->planner.ram_idle_ms));
  for (const SimBudget& budget : budgets) {
    report.config(budget.name,
                  fmt::format("{}/{}/{}", format_bytes(budget.bytes[0]),
                              format_bytes(budget.bytes[1]), format_bytes(budget.bytes[2])));
  }
  for (const Workload& w : workloads) {
    // The shared trace keeps unprefixed keys; generated workloads are prefixed.
    const std::string prefix = w.name == "trace" ? "" : w.name + "_";
    SimConfig workload_config = *config;
    workload_config.engines = options.engines >= 0 ? static_cast<uint32_t>(options.engines)
                                                   : derived_engines(w.trace, *config);
    report.config(prefix + "engines", static_cast<int64_t>(workload_config.engines));
    run_workload(report, w, prefix, workload_config, budgets, policies, jobs, best_baseline_ratios);
  }
  if (!best_baseline_ratios.empty()) {
    double sum = 0;
    for (double r : best_baseline_ratios) sum += r;
    const std::string name = sim_policy_key(kOurs) + "_vs_best_baseline_ttft_mean_ratio_average";
    report.result(name, sum / static_cast<double>(best_baseline_ratios.size()));
    report.result(sim_policy_key(kOurs) + "_vs_best_baseline_ttft_mean_ratio_max",
                  *std::max_element(best_baseline_ratios.begin(), best_baseline_ratios.end()));
    report.target(name, "<=", kVsBestBaselineAverageTarget);
  }
  report.result("sim_wall_seconds",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  return report;
}

CLI::App* add_sim_subcommand(CLI::App& app, SimOptions& options) {
  CLI::App* sim = app.add_subcommand(
      "sim", "trace-driven policy simulator: the four policies at identical budgets");
  sim->add_option("--trace", options.trace,
                  "Mooncake-format JSONL trace (default: ../shared/traces/"
                  "mooncake_synthetic_trace.jsonl, or $KVTIER_TRACE)");
  sim->add_option("--budget", options.budgets,
                  "HBM/RAM/NVME bytes, repeatable (default: 10GiB/64GiB/1TiB, "
                  "10GiB/16GiB/256GiB, 5GiB/4GiB/64GiB)");
  sim->add_option("--kv-bytes-per-token", options.kv_bytes_per_token, "KV bytes per token");
  sim->add_option("--tokens-per-block", options.tokens_per_block, "tokens per trace hash")
      ->check(CLI::Range(1u, 1u << 20));
  sim->add_option("--hbm-gbps", options.hbm_gbps, "daemon HBM arena → engine, GB/s");
  sim->add_option("--ram-gbps", options.ram_gbps, "RAM → engine (PCIe), GB/s");
  sim->add_option("--nvme-gbps", options.nvme_gbps, "NVMe read, GB/s");
  sim->add_option("--prefill-tokens-per-s", options.prefill_tokens_per_s, "prefill speed");
  sim->add_option("--decode-ms-per-token", options.decode_ms_per_token,
                  "decode time per output token (when the turn ends)");
  sim->add_option("--engines", options.engines,
                  "engine prefill slots requests queue for (-1: enough for 80 % utilization "
                  "with no cache, per workload; 0: unlimited, no queueing)")
      ->check(CLI::Range(-1, 100000));
  sim->add_option("--plan-interval", options.plan_interval, "planner period in virtual time");
  sim->add_option("--hbm-idle", options.hbm_idle, "idle sessions leave HBM after this");
  sim->add_option("--ram-idle", options.ram_idle, "idle sessions leave RAM after this");
  sim->add_option("--policies", options.policies,
                  "policies to run: 1..4 (hbm-only lru, lru tiering, session-aware, predictive), "
                  "s3fifo, slru, arc, tinylfu, wtinylfu, workload")
      ->delimiter(',');
  sim->add_option(
         "--workload", options.workloads,
         "trace (the --trace file), long-chats, one-shot, doc-qa, agents, or all; repeatable")
      ->delimiter(',');
  sim->add_option("--seed", options.seed, "seed of the generated workloads");
  sim->add_flag("--exclusive-nvme", options.exclusive_nvme,
                "NVMe exclusive below RAM (the old tier): a promotion out of NVMe gives its copy "
                "up, so the next demotion writes the block again");
  sim->add_option("--jobs", options.jobs, "simulation threads (default: one per CPU)")
      ->check(CLI::Range(0, 256));
  return sim;
}

}  // namespace kvtier::bench
