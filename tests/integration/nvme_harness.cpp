#include "tests/integration/nvme_harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/unique_fd.h"
#include "ipc/unix_socket.h"


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

PersistentDaemon::PersistentDaemon(std::string run_dir, pid_t pid)
    : run_dir_(std::move(run_dir)), socket_path_(run_dir_ + "/kvtierd.sock"), pid_(pid) {}

Result<std::unique_ptr<PersistentDaemon>> PersistentDaemon::start(
    const std::string& run_dir, const std::string& data_dir,
    const std::vector<std::string>& flags) {
  const std::string log_path = run_dir + "/kvtierd.log";
  UniqueFd log(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!log.valid()) return errno_status(errno, "open " + log_path);
  std::vector<std::string> argv = {binary_path("kvtierd"), "--socket", run_dir + "/kvtierd.sock",
                                   "--data-dir", data_dir};
  // --device host unless the caller picks a backend: on a machine with a GPU, auto
  // would pick the cuda backend, which takes no memfd regions.
  if (!names_flag(flags, "--device")) argv.insert(argv.end(), {"--device", "host"});
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto pid = spawn(argv, log.get(), log.get());
  if (!pid.is_ok()) return pid.status();

  std::unique_ptr<PersistentDaemon> daemon(new PersistentDaemon(run_dir, *pid));
  const auto deadline = Clock::now() + milliseconds{20'000};
  while (true) {
    if (!daemon->running()) {
      return unavailable("kvtierd {}; its log:\n{}", daemon->exit_->describe(), daemon->log());
    }
    if (ipc::connect_unix(daemon->socket_path()).is_ok()) return daemon;
    if (Clock::now() >= deadline) {
      return unavailable("kvtierd did not accept connections within 20 s; its log:\n{}",
                         daemon->log());
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

PersistentDaemon::~PersistentDaemon() {
  if (running()) kill9();
  if (::testing::Test::HasFailure()) {
    std::fprintf(stderr, "---- kvtierd log (%s) ----\n%s---- end of kvtierd log ----\n",
                 run_dir_.c_str(), log().c_str());
  }
}

bool PersistentDaemon::running() {
  if (exit_) return false;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) {
    ExitStatus out;
    if (WIFEXITED(status)) {
      out.exited = true;
      out.code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
      out.signal = WTERMSIG(status);
    }
    exit_ = out;
    return false;
  }
  return true;
}

ExitStatus PersistentDaemon::stop(milliseconds timeout) {
  if (!running()) return *exit_;
  ::kill(pid_, SIGTERM);
  exit_ = wait_for_exit(pid_, timeout);
  return *exit_;
}

ExitStatus PersistentDaemon::kill9() {
  if (!running()) return *exit_;
  ::kill(pid_, SIGKILL);
  exit_ = wait_for_exit(pid_);
  return *exit_;
}

std::string PersistentDaemon::log() const {
  std::ifstream in(run_dir_ + "/kvtierd.log");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Result<StatsInfo> PersistentDaemon::wait_for_stats(
    const std::function<bool(const StatsInfo&)>& done, milliseconds timeout) const {
  auto client = Client::connect(socket_path_);
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
  std::vector<std::string> argv = {binary_path("kvtierctl"), "--socket", socket_path_};
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
