#include "tests/integration/daemon_harness.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <capnp/message.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/unique_fd.h"
#include "ipc/framing.h"
#include "ipc/unix_socket.h"

extern char** environ;

namespace kvtier::integration {
namespace {

using Clock = std::chrono::steady_clock;

// The poll loops below re-check a condition at this interval until their deadline;
// nothing is synchronised by the interval itself.
constexpr milliseconds kPollInterval{2};

ExitStatus decode_wait_status(int status) {
  ExitStatus out;
  if (WIFEXITED(status)) {
    out.exited = true;
    out.code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    out.signal = WTERMSIG(status);
  }
  return out;
}

milliseconds remaining(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? left : milliseconds{0};
}

std::string describe_stats(const StatsInfo& stats) {
  std::string text;
  for (const TierStatsInfo& tier : stats.tiers) {
    text += fmt::format("{}: {}/{} bytes, {} blocks; ", tier_name(tier.tier), tier.used_bytes,
                        tier.capacity_bytes, tier.blocks);
  }
  return text + fmt::format(
                    "copies_in_flight {}, pinned_blocks {}, demoted {} bytes, evicted {} blocks, "
                    "connections {}",
                    stats.copies_in_flight, stats.pinned_blocks, stats.bytes_demoted,
                    stats.blocks_evicted, stats.connections);
}

}  // namespace

std::string read_all(int fd) {
  std::string text;
  char buffer[4096];
  off_t offset = 0;
  while (true) {
    ssize_t n = ::pread(fd, buffer, sizeof(buffer), offset);
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
    offset += n;
  }
  return text;
}

Result<pid_t> spawn(const std::vector<std::string>& argv, int stdout_fd, int stderr_fd) {
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, stdout_fd, 1);
  posix_spawn_file_actions_adddup2(&actions, stderr_fd, 2);
  pid_t pid = -1;
  int error = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) return errno_status(error, "posix_spawn " + argv[0]);
  return pid;
}

bool names_flag(const std::vector<std::string>& flags, std::string_view name) {
  for (const std::string& flag : flags) {
    if (flag == name ||
        (flag.starts_with(name) && flag.size() > name.size() && flag[name.size()] == '=')) {
      return true;
    }
  }
  return false;
}

std::string binary_path(const std::string& name) {
  // KVTIER_TEST_BIN_DIR runs the suite against binaries built elsewhere.
  const char* dir = std::getenv("KVTIER_TEST_BIN_DIR");
  return std::string(dir != nullptr && *dir != '\0' ? dir : KVTIER_BIN_DIR) + "/" + name;
}

std::string ExitStatus::describe() const {
  if (timed_out) return "timed out (killed by the harness)";
  if (exited) return fmt::format("exited with code {}", code);
  if (signal != 0) return fmt::format("killed by signal {} ({})", signal, ::strsignal(signal));
  return "did not finish";
}

ExitStatus wait_for_exit(pid_t pid, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  int status = 0;
  while (true) {
    pid_t reaped = ::waitpid(pid, &status, WNOHANG);
    if (reaped == pid) return decode_wait_status(status);
    if (reaped < 0 && errno != EINTR) return ExitStatus{};  // not our child
    if (Clock::now() >= deadline) break;
    if (pidfd.valid()) {
      pollfd fd{pidfd.get(), POLLIN, 0};
      (void)::poll(&fd, 1, static_cast<int>(remaining(deadline).count()));
    } else {
      std::this_thread::sleep_for(kPollInterval);
    }
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  ExitStatus out;
  out.timed_out = true;
  return out;
}

pid_t fork_child(const std::function<int()>& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  int code = 98;
  try {
    code = body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[child %d] exception: %s\n", ::getpid(), e.what());
  } catch (...) {
    std::fprintf(stderr, "[child %d] unknown exception\n", ::getpid());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(code);
}

std::string ProcessResult::describe() const {
  return fmt::format("{}\n--- stdout ---\n{}--- stderr ---\n{}", status.describe(), stdout_text,
                     stderr_text);
}

ProcessResult run_process(const std::vector<std::string>& argv, milliseconds timeout) {
  ProcessResult result;
  UniqueFd out(::memfd_create("stdout", MFD_CLOEXEC));
  UniqueFd err(::memfd_create("stderr", MFD_CLOEXEC));
  auto pid = spawn(argv, out.get(), err.get());
  if (!pid.is_ok()) {
    result.stderr_text = pid.status().to_string();
    return result;
  }
  result.status = wait_for_exit(*pid, timeout);
  result.stdout_text = read_all(out.get());
  result.stderr_text = read_all(err.get());
  return result;
}

std::vector<std::string> small_tier_flags() {
  return {"--hbm-bytes", "32MiB", "--ram-bytes", "64MiB", "--copy-threads", "2"};
}

Result<std::unique_ptr<Daemon>> Daemon::start(const std::vector<std::string>& flags) {
  char dir_template[] = "/tmp/kvtier-it-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) return errno_status(errno, "mkdtemp");
  const std::string dir = dir_template;
  const std::string log_path = dir + "/kvtierd.log";
  UniqueFd log(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!log.valid()) return errno_status(errno, "open " + log_path);
  std::vector<std::string> argv = {binary_path("kvtierd"), "--socket", dir + "/kvtierd.sock",
                                   "--data-dir", dir + "/data"};
  // Engines share memfd regions unless the caller picks a backend: the host backend by
  // default, even on a GPU machine (kvtierd refuses a flag given twice).
  if (!names_flag(flags, "--device")) argv.insert(argv.end(), {"--device", "host"});
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto pid = spawn(argv, log.get(), log.get());
  if (!pid.is_ok()) {
    std::filesystem::remove_all(dir);
    return pid.status();
  }
  std::unique_ptr<Daemon> daemon(new Daemon(dir, *pid));
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

Daemon::~Daemon() {
  if (running()) {
    ::kill(pid_, SIGKILL);
    exit_ = wait_for_exit(pid_);
  }
  if (::testing::Test::HasFailure()) {
    std::fprintf(stderr, "---- kvtierd log (%s) ----\n%s---- end of kvtierd log ----\n",
                 dir_.c_str(), log().c_str());
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

bool Daemon::running() {
  if (exit_) return false;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) {
    exit_ = decode_wait_status(status);
    return false;
  }
  return true;
}

ExitStatus Daemon::stop(milliseconds timeout) {
  if (!running()) return *exit_;
  ::kill(pid_, SIGTERM);
  exit_ = wait_for_exit(pid_, timeout);
  return *exit_;
}

std::string Daemon::log() const {
  std::ifstream in(dir_ + "/kvtierd.log");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Status Daemon::open_to_all_users() const {
  if (::chmod(dir_.c_str(), 0755) != 0) return errno_status(errno, "chmod " + dir_);
  if (::chmod(socket_path_.c_str(), 0666) != 0) return errno_status(errno, "chmod " + socket_path_);
  return Status::ok();
}

Result<StatsInfo> Daemon::wait_for_stats(const std::function<bool(const StatsInfo&)>& done,
                                         milliseconds timeout) const {
  auto client = connect();
  if (!client.is_ok()) return client.status();
  const auto deadline = Clock::now() + timeout;
  while (true) {
    auto stats = (*client)->stats();
    if (!stats.is_ok()) return stats.status();
    if (done(*stats)) return stats;
    if (Clock::now() >= deadline) {
      return internal_error("condition not reached within {} ms; last stats: {}", timeout.count(),
                            describe_stats(*stats));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

Result<StatsInfo> Daemon::wait_until_settled(milliseconds timeout) const {
  return wait_for_stats(
      [](const StatsInfo& s) { return s.copies_in_flight == 0 && s.pinned_blocks == 0; }, timeout);
}

ProcessResult Daemon::run_example_engine(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {binary_path("kvtier-example-engine"), "--socket", socket_path_};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv);
}

ProcessResult Daemon::run_kvtierctl(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {binary_path("kvtierctl"), "--socket", socket_path_};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv);
}

void DaemonTest::SetUp() {
  auto daemon = Daemon::start(daemon_flags());
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  daemon_ = std::move(*daemon);
}

void DaemonTest::TearDown() {
  if (!daemon_) return;
  ExitStatus stopped = daemon_->stop();
  EXPECT_TRUE(stopped.ok()) << "kvtierd " << stopped.describe();
  daemon_.reset();
}

Result<Engine> Engine::connect(const std::string& socket_path, const PagedCacheShape& shape,
                               const std::string& name) {
  auto cache = PagedCache::create(shape);
  if (!cache.is_ok()) return cache.status();
  auto client = Client::connect(socket_path);
  if (!client.is_ok()) return client.status();
  auto hello = (*client)->hello(cache->layout(), name);
  if (!hello.is_ok()) return hello.status();
  KVTIER_RETURN_IF_ERROR((*client)->register_memfd_region(cache->region_id(), cache->region().fd(),
                                                          cache->region().size_bytes()));
  return Engine{std::move(*client), std::move(*cache), *hello};
}

std::vector<BlockRef> Engine::refs(std::span<const BlockHash> hashes, uint64_t first_block_id) {
  std::vector<BlockRef> out;
  for (size_t i = 0; i < hashes.size(); ++i) out.push_back({hashes[i], first_block_id + i});
  return out;
}

void Engine::fill(std::span<const BlockRef> refs) {
  for (const BlockRef& ref : refs) cache.fill(ref.engine_block_id, ref.hash);
}

size_t Engine::count_verified(std::span<const BlockRef> refs, size_t count) const {
  for (size_t i = 0; i < count && i < refs.size(); ++i) {
    if (!cache.verify(refs[i].engine_block_id, refs[i].hash)) return i;
  }
  return std::min(count, refs.size());
}

PagedCacheShape small_shape(uint64_t num_blocks) {
  PagedCacheShape shape;
  shape.model_id = "integration/small";
  shape.num_layers = 4;
  shape.num_kv_heads = 2;
  shape.head_dim = 64;
  shape.num_blocks = num_blocks;
  return shape;
}

PagedCacheShape example_shape(uint64_t num_blocks) {
  PagedCacheShape shape;  // the example engine's defaults: 2 MiB blocks
  shape.num_blocks = num_blocks;
  return shape;
}

const TierStatsInfo* find_tier(const StatsInfo& stats, Tier tier) {
  for (const TierStatsInfo& info : stats.tiers) {
    if (info.tier == tier) return &info;
  }
  return nullptr;
}

uint64_t total_blocks(const StatsInfo& stats) {
  uint64_t blocks = 0;
  for (const TierStatsInfo& info : stats.tiers) blocks += info.blocks;
  return blocks;
}

::testing::AssertionResult NoLeakedSlots(const StatsInfo& stats, uint64_t block_bytes) {
  for (const TierStatsInfo& info : stats.tiers) {
    if (info.used_bytes != info.blocks * block_bytes) {
      return ::testing::AssertionFailure()
             << "tier " << tier_name(info.tier) << " uses " << info.used_bytes << " bytes for "
             << info.blocks << " blocks of " << block_bytes << " bytes (expected "
             << info.blocks * block_bytes << "); stats: " << describe_stats(stats);
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult ServesSaveAndLoad(const Daemon& daemon, const std::string& session) {
  auto engine = Engine::connect(daemon.socket_path(), small_shape(8), "health-check");
  if (!engine.is_ok()) {
    return ::testing::AssertionFailure() << "connect: " << engine.status().to_string();
  }
  auto stats = engine->client->stats();
  if (!stats.is_ok()) {
    return ::testing::AssertionFailure() << "stats: " << stats.status().to_string();
  }
  const std::vector<BlockHash> hashes = PagedCache::chain_hashes(session, 4);
  const std::vector<BlockRef> saved = Engine::refs(hashes, 0);
  engine->fill(saved);
  auto save = engine->client->save(session, saved, true);
  if (!save.is_ok()) return ::testing::AssertionFailure() << "save: " << save.status().to_string();
  const std::vector<BlockRef> restored = Engine::refs(hashes, 4);
  auto load = engine->client->load(session, restored);
  if (!load.is_ok()) return ::testing::AssertionFailure() << "load: " << load.status().to_string();
  if (load->loaded_count != hashes.size() ||
      engine->count_verified(restored, hashes.size()) != hashes.size()) {
    return ::testing::AssertionFailure()
           << "loaded " << load->loaded_count << " of " << hashes.size() << " blocks ("
           << load->stop_reason.to_string() << "), "
           << engine->count_verified(restored, load->loaded_count) << " bit-exact";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult IsError(const Status& status, StatusCode code,
                                   std::string_view fragment) {
  if (status.is_ok()) {
    return ::testing::AssertionFailure()
           << "expected " << status_code_name(code) << " mentioning '" << fragment << "', got OK";
  }
  if (status.code() != code || status.message().find(fragment) == std::string::npos) {
    return ::testing::AssertionFailure() << "expected " << status_code_name(code) << " mentioning '"
                                         << fragment << "', got " << status.to_string();
  }
  return ::testing::AssertionSuccess() << status.to_string();
}

int child_failure(int code, const std::string& what, const Status& status) {
  std::fprintf(stderr, "[child %d] %s%s%s\n", ::getpid(), what.c_str(), status.is_ok() ? "" : ": ",
               status.is_ok() ? "" : status.to_string().c_str());
  return code;
}

}  // namespace kvtier::integration
