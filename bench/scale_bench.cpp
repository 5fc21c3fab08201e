// kvtier-bench scale: the sizes, the two daemons, the percentiles and the report.
// The daemon and the requests are in scale_workload.cpp.
#include "bench/scale_bench.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "bench/scale_workload.h"

namespace kvtier::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kSlabBytes = 256 * 1024;
constexpr uint64_t kBlockBytes = 2048;

// HBM + RAM hold about a million 2 KiB blocks in both modes.
struct Mode {
  const char* name;
  uint64_t hbm_bytes;
  uint64_t ram_bytes;
};
constexpr Mode kModes[] = {{"nopressure", 1024 * kMiB, 1024 * kMiB},
                           {"pressure", 1 * kMiB, 2048 * kMiB}};

struct SizeResult {
  uint64_t sessions = 0;
  double grow_seconds = 0;
  ScaleSamples samples;
};

// Lookups on an idle daemon and while another connection lists every session, page after
// page (1000 a page), and what the pages took.
struct ListingResult {
  std::vector<double> idle_us;
  std::vector<double> listing_us;
  std::vector<double> page_ms;
  uint64_t listings = 0;  // full listings read meanwhile
  double listing_seconds = 0;
  uint32_t page_limit = 0;  // sessions per page asked for (0: the daemon's 1000)
};

// Tier notices at the largest size (scale_bench.h).
struct NoticeResult {
  std::vector<double> save_off_us;  // kSave samples without a subscriber, sorted
  std::vector<double> save_on_us;   // ... with one
  uint64_t changes = 0;             // blocks told to the subscriber
  uint64_t answers = 0;             // its WatchTiers answered
  uint64_t resyncs = 0;
  double watched_seconds = 0;  // time the subscriber was connected
};

struct ModeResult {
  std::optional<ListingResult> listing;  // at the largest size, when asked for
  std::optional<NoticeResult> notices;   // likewise
  std::vector<SizeResult> sizes;
  // At the largest size, once grown (before its measured rounds).
  uint64_t rss_start_bytes = 0;
  uint64_t rss_largest_bytes = 0;
  uint64_t session_refs = 0;
  uint64_t blocks = 0;
  // Over the whole run: evidence of the planner's work (and that nothing was evicted).
  uint64_t bytes_demoted = 0;
  uint64_t bytes_promoted = 0;
  uint64_t blocks_evicted = 0;
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

Result<ListingResult> measure_listing(ScaleDaemon& d, uint32_t lookups, uint32_t page_limit) {
  ListingResult result;
  result.page_limit = page_limit;
  KVTIER_RETURN_IF_ERROR(d.time_lookups(lookups, result.idle_us));
  auto lister = Client::connect(d.socket_path());
  if (!lister.is_ok()) return lister.status();
  std::atomic<bool> stop{false};
  Status lister_status;
  std::vector<double> page_ms;
  uint64_t listings = 0;
  const auto listing_start = Clock::now();
  std::thread thread([&] {
    ListSessionsOptions options;
    options.limit = page_limit;
    while (!stop.load()) {
      const auto t0 = Clock::now();
      auto page = (*lister)->list_sessions_page(options);
      if (!page.is_ok()) {
        lister_status = page.status();
        return;
      }
      page_ms.push_back(seconds_since(t0) * 1000.0);
      options.after = page->next;
      if (options.after.empty()) ++listings;
    }
  });
  Status timed = d.time_lookups(lookups, result.listing_us);
  stop = true;
  thread.join();
  result.listing_seconds = seconds_since(listing_start);
  KVTIER_RETURN_IF_ERROR(timed);
  KVTIER_RETURN_IF_ERROR(lister_status);
  result.page_ms = std::move(page_ms);
  result.listings = listings;
  for (auto* v : {&result.idle_us, &result.listing_us, &result.page_ms}) {
    std::sort(v->begin(), v->end());
  }
  return result;
}

// Wire bytes of a WatchTiersReply of `changes` 32-byte hashes: per change a list element
// (one data word, one pointer) and its hash (4 words); per answer the Response, the
// reply struct, the list's tag and the frame header (about 8 words).
constexpr uint64_t kNoticeChangeBytes = 48;
constexpr uint64_t kNoticeAnswerBytes = 64;

Result<NoticeResult> measure_tier_notices(ScaleDaemon& d, uint32_t rounds, uint32_t phases) {
  NoticeResult result;
  for (uint32_t phase = 0; phase < phases; ++phase) {
    const bool watched = phase % 2 == 1;
    std::unique_ptr<Client> watcher;
    std::atomic<bool> stop{false};
    Status watcher_status;
    std::thread thread;
    const auto start = Clock::now();
    if (watched) {
      auto client = Client::connect(d.socket_path());
      if (!client.is_ok()) return client.status();
      watcher = std::move(*client);
      auto hello = watcher->hello(d.layout(), "kvtier-bench-watcher");
      if (!hello.is_ok()) return hello.status();
      thread = std::thread([&] {
        while (!stop.load()) {
          auto notices = watcher->watch_tiers_async(100).wait();
          if (!notices.is_ok()) {
            watcher_status = notices.status();
            return;
          }
          result.changes += notices->changes.size();
          result.resyncs += notices->resync ? 1 : 0;
          ++result.answers;
        }
      });
    }
    ScaleSamples samples;
    Status ran;
    for (uint32_t i = 0; i < rounds && ran.is_ok(); ++i) ran = d.run_round(&samples);
    stop = true;
    if (thread.joinable()) thread.join();
    if (watched) result.watched_seconds += seconds_since(start);
    KVTIER_RETURN_IF_ERROR(ran);
    KVTIER_RETURN_IF_ERROR(watcher_status);
    auto& saves = samples[static_cast<size_t>(ScaleOp::kSave)];
    auto& into = watched ? result.save_on_us : result.save_off_us;
    into.insert(into.end(), saves.begin(), saves.end());
  }
  std::sort(result.save_off_us.begin(), result.save_off_us.end());
  std::sort(result.save_on_us.begin(), result.save_on_us.end());
  return result;
}

Result<ModeResult> run_mode(const CommonOptions& common, const ScaleBenchOptions& options,
                            const Mode& mode, const std::string& config_dir) {
  ScaleDaemonSpec spec;
  spec.mode = mode.name;
  spec.hbm_bytes = mode.hbm_bytes;
  spec.ram_bytes = mode.ram_bytes;
  spec.slab_bytes = kSlabBytes;
  spec.grow_as_measured = options.grow_as_measured;
  spec.own_blocks = options.own_blocks;
  auto daemon = ScaleDaemon::start(common, spec, config_dir);
  if (!daemon.is_ok()) return daemon.status();
  ScaleDaemon& d = **daemon;
  ModeResult result;
  // The daemon answers while it still fills its memory pools: the baseline is taken
  // once they are filled, so the growth measured is what the sessions cost.
  for (const auto deadline = Clock::now() + std::chrono::minutes(2);;) {
    auto stats = d.stats();
    if (!stats.is_ok()) return stats.status();
    if (!stats->starting) break;
    if (Clock::now() > deadline) return unavailable("kvtierd still filling its pools after 2 min");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto rss = d.rss_bytes();
  if (!rss.is_ok()) return rss.status();
  result.rss_start_bytes = *rss;

  for (uint64_t size : options.sizes) {
    SizeResult at;
    at.sessions = size;
    const auto grow_start = Clock::now();
    KVTIER_RETURN_IF_ERROR(d.grow_to(size));
    at.grow_seconds = seconds_since(grow_start);
    KVTIER_RETURN_IF_ERROR(d.prepare_to_measure());
    std::fprintf(stderr, "kvtier-bench scale: %s: %llu sessions grown in %.1f s; measuring\n",
                 mode.name, static_cast<unsigned long long>(size), at.grow_seconds);
    if (size == options.sizes.back()) {
      rss = d.rss_bytes();
      if (!rss.is_ok()) return rss.status();
      result.rss_largest_bytes = *rss;
      result.session_refs = d.session_refs();
      auto stats = d.stats();
      if (!stats.is_ok()) return stats.status();
      for (const TierStatsInfo& tier : stats->tiers) result.blocks += tier.blocks;
    }
    for (uint32_t i = 0; i < options.warmup_per_size; ++i) {
      KVTIER_RETURN_IF_ERROR(d.run_round(nullptr));
    }
    for (uint32_t i = 0; i < options.ops_per_size; ++i) {
      KVTIER_RETURN_IF_ERROR(d.run_round(&at.samples));
    }
    for (auto& samples : at.samples) std::sort(samples.begin(), samples.end());
    if (size == options.sizes.back() && options.notice_rounds > 0) {
      auto notices = measure_tier_notices(d, options.notice_rounds, options.notice_phases);
      if (!notices.is_ok()) return notices.status();
      result.notices = std::move(*notices);
    }
    if (size == options.sizes.back() && options.listing_lookups > 0) {
      auto listing = measure_listing(d, options.listing_lookups, options.listing_page);
      if (!listing.is_ok()) return listing.status();
      result.listing = std::move(*listing);
    }
    result.sizes.push_back(std::move(at));
  }
  auto stats = d.stats();
  if (!stats.is_ok()) return stats.status();
  result.bytes_demoted = stats->bytes_demoted;
  result.bytes_promoted = stats->bytes_promoted;
  result.blocks_evicted = stats->blocks_evicted;
  KVTIER_RETURN_IF_ERROR(d.stop());
  return result;
}

double p(const std::vector<double>& sorted, double fraction) {
  return percentile_of_sorted(sorted, fraction);
}

void report_mode(BenchReport& report, const std::string& name, const ModeResult& mode) {
  const SizeResult& first = mode.sizes.front();
  const SizeResult& last = mode.sizes.back();
  for (const SizeResult& at : mode.sizes) {
    report.result(fmt::format("{}_{}_grow_s", name, at.sessions), at.grow_seconds);
  }
  // The matrix for people: p50 / p99 per op and size, and the ratio of the ends.
  std::string header = fmt::format("{} (p50 / p99 us)", name);
  std::string line = fmt::format("  {:<26}", header);
  for (const SizeResult& at : mode.sizes) line += fmt::format("{:>16}", at.sessions);
  line += fmt::format("{:>16}", fmt::format("{}/{}", last.sessions, first.sessions));
  report.note(line);
  for (size_t op = 0; op < kScaleOps; ++op) {
    const char* op_name = scale_op_name(static_cast<ScaleOp>(op));
    line = fmt::format("  {:<26}", op_name);
    for (const SizeResult& at : mode.sizes) {
      const auto& s = at.samples[op];
      report.result(fmt::format("{}_{}_{}_p50_us", name, op_name, at.sessions), p(s, 0.5));
      report.result(fmt::format("{}_{}_{}_p99_us", name, op_name, at.sessions), p(s, 0.99));
      line += fmt::format("{:>16}", fmt::format("{:.0f} / {:.0f}", p(s, 0.5), p(s, 0.99)));
    }
    if (mode.sizes.size() > 1) {
      const double p50_ratio = p(last.samples[op], 0.5) / p(first.samples[op], 0.5);
      const double p99_ratio = p(last.samples[op], 0.99) / p(first.samples[op], 0.99);
      line += fmt::format("{:>16}", fmt::format("{:.1f} / {:.1f}", p50_ratio, p99_ratio));
      for (const auto& [pct, ratio] : {std::pair{"p50", p50_ratio}, std::pair{"p99", p99_ratio}}) {
        const std::string metric = fmt::format("{}_{}_{}_ratio_{}_over_{}", name, op_name, pct,
                                               last.sessions, first.sessions);
        report.result(metric, ratio);
        report.target(metric, "<=", 2.0);
      }
    }
    report.note(line);
  }

  if (mode.listing) {
    const ListingResult& l = *mode.listing;
    const std::string at = fmt::format("{}_listing_{}", name, last.sessions);
    report.result(at + "_lookup_idle_p50_us", p(l.idle_us, 0.5));
    report.result(at + "_lookup_idle_p99_us", p(l.idle_us, 0.99));
    report.result(at + "_lookup_during_p50_us", p(l.listing_us, 0.5));
    report.result(at + "_lookup_during_p99_us", p(l.listing_us, 0.99));
    report.result(at + "_page_p50_ms", p(l.page_ms, 0.5));
    report.result(at + "_page_p99_ms", p(l.page_ms, 0.99));
    report.result(at + "_full_listings", static_cast<double>(l.listings));
    report.result(at + "_lookup_p99_during_over_idle", p(l.listing_us, 0.99) / p(l.idle_us, 0.99));
    report.target(at + "_lookup_p99_during_over_idle", "<=", 2.0);
    report.note(fmt::format(
        "  {}: Lookup p50/p99 {:.0f}/{:.0f} us idle, {:.0f}/{:.0f} us while another "
        "connection lists all {} sessions page after page (page of {}: p50 {:.2f} ms, p99 "
        "{:.2f} ms; {} full listings in {:.1f} s)",
        name, p(l.idle_us, 0.5), p(l.idle_us, 0.99), p(l.listing_us, 0.5), p(l.listing_us, 0.99),
        last.sessions, l.page_limit == 0 ? 1000 : l.page_limit, p(l.page_ms, 0.5),
        p(l.page_ms, 0.99), l.listings, l.listing_seconds));
  }
  if (mode.notices) {
    const NoticeResult& n = *mode.notices;
    const double per_s = static_cast<double>(n.changes) / n.watched_seconds;
    const double bytes_per_s =
        static_cast<double>(n.changes * kNoticeChangeBytes + n.answers * kNoticeAnswerBytes) /
        n.watched_seconds;
    const double off50 = p(n.save_off_us, 0.5), on50 = p(n.save_on_us, 0.5);
    const double off99 = p(n.save_off_us, 0.99), on99 = p(n.save_on_us, 0.99);
    report.result(name + "_tier_notices_per_s", per_s);
    report.result(name + "_tier_notice_bytes_per_s", bytes_per_s);
    report.result(name + "_tier_notice_answers_per_s",
                  static_cast<double>(n.answers) / n.watched_seconds);
    report.result(name + "_tier_notice_resyncs", static_cast<double>(n.resyncs));
    report.result(name + "_save_p50_us_unwatched", off50);
    report.result(name + "_save_p50_us_watched", on50);
    report.result(name + "_save_p99_us_unwatched", off99);
    report.result(name + "_save_p99_us_watched", on99);
    report.result(name + "_save_p50_watched_over_unwatched", on50 / off50);
    report.result(name + "_save_p99_watched_over_unwatched", on99 / off99);
    report.note(fmt::format(
        "  {}: a subscriber of the engine's layout was told {:.0f} blocks/s ({:.0f} B/s on "
        "the wire, {:.1f} answers/s, {} resyncs); Save p50 {:.1f} us unwatched, {:.1f} us "
        "watched ({:.2f}x), p99 {:.1f} / {:.1f} us ({:.2f}x)",
        name, per_s, bytes_per_s, static_cast<double>(n.answers) / n.watched_seconds, n.resyncs,
        off50, on50, on50 / off50, off99, on99, on99 / off99));
  }
  report.result(name + "_blocks_demoted", static_cast<double>(mode.bytes_demoted / kBlockBytes));
  report.result(name + "_blocks_promoted", static_cast<double>(mode.bytes_promoted / kBlockBytes));
  report.result(name + "_blocks_evicted", static_cast<double>(mode.blocks_evicted));

  const double sessions = static_cast<double>(last.sessions);
  const double growth =
      static_cast<double>(mode.rss_largest_bytes) - static_cast<double>(mode.rss_start_bytes);
  const double budget = 1024.0 * sessions + 8.0 * static_cast<double>(mode.session_refs) +
                        128.0 * static_cast<double>(mode.blocks);
  const std::string at = std::to_string(last.sessions);
  report.result(name + "_session_refs_at_" + at, static_cast<double>(mode.session_refs));
  report.result(name + "_blocks_at_" + at, static_cast<double>(mode.blocks));
  report.result(name + "_rss_start_mib", static_cast<double>(mode.rss_start_bytes) / kMiB);
  report.result(name + "_rss_at_" + at + "_mib",
                static_cast<double>(mode.rss_largest_bytes) / kMiB);
  report.result(name + "_rss_growth_bytes_per_session", growth / sessions);
  // Everything the daemon keeps for its sessions and blocks, per block held.
  report.result(name + "_rss_growth_bytes_per_block", growth / static_cast<double>(mode.blocks));
  report.target(name + "_rss_growth_bytes_per_block", "<=", 200.0);
  report.result(name + "_memory_budget_mib", budget / kMiB);
  report.result(name + "_rss_growth_over_budget", growth / budget);
  report.target(name + "_rss_growth_over_budget", "<=", 1.0);
  report.note(fmt::format(
      "  {}: RSS grew {:.1f} MiB for {} sessions, {} references, {} blocks: {:.0f} B/session "
      "or {:.0f} B/block; budget {:.1f} MiB",
      name, growth / kMiB, last.sessions, mode.session_refs, mode.blocks, growth / sessions,
      growth / static_cast<double>(mode.blocks), budget / kMiB));
}

std::string join(const std::vector<uint64_t>& values) {
  std::string out;
  for (uint64_t v : values) out += (out.empty() ? "" : ",") + std::to_string(v);
  return out;
}

}  // namespace

CLI::App* add_scale_subcommand(CLI::App& app, ScaleBenchOptions& options) {
  CLI::App* scale = app.add_subcommand(
      "scale", "per-request latency and daemon memory as kvtierd grows to 50k sessions");
  scale->add_option("--sizes", options.sizes, "session counts to measure at, ascending")
      ->delimiter(',')
      ->check(CLI::Range(uint64_t{1}, uint64_t{400'000}));
  scale->add_option("--ops-per-size", options.ops_per_size, "timed rounds per size")
      ->check(CLI::Range(10u, 100'000u));
  scale->add_option("--warmup-per-size", options.warmup_per_size, "untimed rounds per size first")
      ->check(CLI::Range(0u, 100'000u));
  scale->add_option("--modes", options.modes, "nopressure, pressure or both")
      ->delimiter(',')
      ->check(CLI::IsMember({"nopressure", "pressure"}));
  scale
      ->add_option("--listing-lookups", options.listing_lookups,
                   "at the largest size, Lookups timed idle and while another connection "
                   "lists every session page by page (0: skip)")
      ->check(CLI::Range(0u, 1'000'000u));
  scale
      ->add_option("--listing-page", options.listing_page,
                   "sessions per page the listing asks for (0: the daemon's default, 1000)")
      ->check(CLI::Range(0u, 10'000u));
  scale
      ->add_option("--notice-rounds", options.notice_rounds,
                   "at the largest size, rounds per phase without and with a tier-notice "
                   "subscriber (0: skip)")
      ->check(CLI::Range(0u, 1'000'000u));
  scale
      ->add_option("--notice-phases", options.notice_phases, "phases, alternating, unwatched first")
      ->check(CLI::Range(2u, 100u));
  scale
      ->add_option("--own-blocks", options.own_blocks,
                   "blocks of its own per grown session, after the shared prefix of 2")
      ->check(CLI::Range(1u, kMaxOwnBlocks));
  scale->add_flag("--grow-as-measured", options.grow_as_measured,
                  "grow under the measured policy settings too (slow before issue 11)");
  return scale;
}

Result<BenchReport> run_scale_bench(const CommonOptions& common, const ScaleBenchOptions& options) {
  if (!common.socket.empty()) {
    return invalid_argument("scale starts its own daemons (two, sized for it): drop --socket");
  }
  if (options.sizes.empty() || !std::is_sorted(options.sizes.begin(), options.sizes.end()) ||
      std::adjacent_find(options.sizes.begin(), options.sizes.end()) != options.sizes.end()) {
    return invalid_argument("--sizes must be ascending session counts");
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string config_dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/kvtier-scale-XXXXXX";
  if (::mkdtemp(config_dir.data()) == nullptr) return errno_status(errno, "mkdtemp " + config_dir);
  struct RemoveDir {
    std::string path;
    ~RemoveDir() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  } remove_config_dir{config_dir};

  BenchReport report("scale");
  report.config("sizes", join(options.sizes));
  report.config("ops_per_size", int64_t{options.ops_per_size});
  report.config("warmup_per_size", int64_t{options.warmup_per_size});
  report.config("block_bytes", static_cast<int64_t>(kBlockBytes));
  report.config("session_blocks",
                fmt::format("{} shared prefix + {} own", kPrefixBlocks, options.own_blocks));
  report.config("round", fmt::format("begin_turn, lookup {}, load {}, save {} new, stats",
                                     kLookupHashes, kLoadBlocks, kSaveBlocks));
  report.config("copy_threads", int64_t{common.threads});
  report.config("slab_bytes", static_cast<int64_t>(kSlabBytes));
  report.config("measured_settings", std::string("policy predictive, hbm-idle-ms 1h, "
                                                 "defaults otherwise (HBM watermarks 0.9/0.75)"));
  report.config("growing", std::string(options.grow_as_measured
                                           ? "under the measured settings"
                                           : "policy lru, HBM watermarks 1.0; SIGHUP to measure"));
  for (const Mode& mode : kModes) {
    if (std::find(options.modes.begin(), options.modes.end(), mode.name) == options.modes.end())
      continue;
    report.config(fmt::format("{}_hbm_bytes", mode.name), static_cast<int64_t>(mode.hbm_bytes));
    report.config(fmt::format("{}_ram_bytes", mode.name), static_cast<int64_t>(mode.ram_bytes));
  }
  for (const Mode& mode : kModes) {
    if (std::find(options.modes.begin(), options.modes.end(), mode.name) == options.modes.end())
      continue;
    auto result = run_mode(common, options, mode, config_dir);
    if (!result.is_ok()) {
      return result.status().with_context(mode.name);
    }
    report_mode(report, mode.name, *result);
  }
  return report;
}

}  // namespace kvtier::bench
