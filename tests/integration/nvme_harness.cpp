#include "tests/integration/nvme_harness.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

namespace kvtier::integration {
namespace {

using Clock = std::chrono::steady_clock;
constexpr milliseconds kPollInterval{2};  // re-check interval of the polls below

}  // namespace

ScratchDir::ScratchDir() {
  char pattern[] = "/tmp/kvtier-nvme-it-XXXXXX";
  if (::mkdtemp(pattern) != nullptr) path_ = pattern;
}

ScratchDir::~ScratchDir() {
  if (::testing::Test::HasFailure()) {
    std::fprintf(stderr, "(scratch directory %s removed)\n", path_.c_str());
  }
  std::error_code ignored;
  if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
}

std::vector<std::string> nvme_tier_flags(const std::string& nvme_bytes) {
  return {"--hbm-bytes",        "4MiB", "--ram-bytes",    "8MiB", "--nvme-bytes",   nvme_bytes,
          "--slab-bytes",       "1MiB", "--hbm-idle-ms",  "0",    "--ram-idle-ms",  "0",
          "--plan-interval-ms", "10ms", "--copy-threads", "2",    "--metrics-addr", "off",
          "--drain-timeout",    "20s"};
}

std::vector<std::string> with_flag(std::vector<std::string> flags, const std::string& name,
                                   const std::string& value) {
  for (size_t i = 0; i + 1 < flags.size(); ++i) {
    if (flags[i] == name) {
      flags[i + 1] = value;
      return flags;
    }
  }
  flags.push_back(name);
  flags.push_back(value);
  return flags;
}

Result<std::unique_ptr<PersistentDaemon>> PersistentDaemon::start(
    const std::string& run_dir, const std::string& data_dir,
    const std::vector<std::string>& flags) {
  support::DaemonProcessOptions options;
  options.binary = binary_path("kvtierd");
  options.dir = run_dir;  // socket and log; the data directory lives elsewhere
  options.data_dir = data_dir;
  options.flags = flags;
  auto process = support::DaemonProcess::start(std::move(options));
  if (!process.is_ok()) return process.status();
  return std::unique_ptr<PersistentDaemon>(new PersistentDaemon(std::move(*process)));
}

PersistentDaemon::~PersistentDaemon() {
  process_.kill();
  if (::testing::Test::HasFailure()) {
    std::fprintf(stderr, "---- kvtierd log (%s) ----\n%s---- end of kvtierd log ----\n",
                 process_.dir().c_str(), log().c_str());
  }
}

Result<StatsInfo> PersistentDaemon::wait_for_stats(
    const std::function<bool(const StatsInfo&)>& done, milliseconds timeout) const {
  auto client = Client::connect(socket_path());
  if (!client.is_ok()) return client.status();
  const auto deadline = Clock::now() + timeout;
  while (true) {
    auto stats = (*client)->stats();
    if (!stats.is_ok()) return stats.status();
    if (done(*stats)) return stats;
    if (Clock::now() >= deadline) {
      std::string tiers;
      for (const TierStatsInfo& tier : stats->tiers) {
        tiers += fmt::format("{} {} blocks; ", tier_name(tier.tier), tier.blocks);
      }
      return internal_error("condition not reached within {} ms; last stats: {}", timeout.count(),
                            tiers);
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

ProcessResult PersistentDaemon::run_kvtierctl(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {binary_path("kvtierctl"), "--socket", socket_path()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv);
}

std::string LoadCheck::describe() const {
  return fmt::format("loaded {}, bit-exact {}, stop reason {}", loaded, bit_exact,
                     stop_reason.to_string());
}

Status save_session(Engine& engine, const std::string& session, size_t blocks) {
  const auto refs = Engine::refs(PagedCache::chain_hashes(session, blocks), 0);
  engine.fill(refs);
  auto saved = engine.client->save(session, refs, /*end_of_turn=*/true);
  return saved.status();
}

Result<LoadCheck> load_session(Engine& engine, const std::string& session, size_t blocks,
                               uint64_t first_block_id) {
  const auto refs = Engine::refs(PagedCache::chain_hashes(session, blocks), first_block_id);
  engine.cache.wipe();  // whatever comes back must come from the daemon
  auto loaded = engine.client->load(session, refs);
  if (!loaded.is_ok()) return loaded.status();
  LoadCheck check;
  check.loaded = loaded->loaded_count;
  check.bit_exact = engine.count_verified(refs, loaded->loaded_count);
  check.stop_reason = loaded->stop_reason;
  return check;
}

uint64_t tier_blocks(const StatsInfo& stats, Tier tier) {
  const TierStatsInfo* info = find_tier(stats, tier);
  return info == nullptr ? 0 : info->blocks;
}

}  // namespace kvtier::integration
