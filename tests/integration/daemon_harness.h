// Harness for the multi-process integration tests: start and stop a real kvtierd on a
// Unix socket in a fresh temporary directory, run the example engine and kvtierctl as
// processes, fork engine children, and poll the daemon's Stats with a deadline instead
// of sleeping. (Raw protocol access is in raw_connection.h.)
//
// Process rules the tests rely on:
//  * fork_child() must be called while the test process has no threads besides main
//    (the Client and PagedCache create none, so a test may hold them across a fork);
//    the child _exit()s with the body's return value, which the parent asserts.
//  * Every wait has a deadline; a child or daemon that overstays it is SIGKILLed and
//    reported as timed out, so a hung daemon fails a test instead of hanging it.
//
// Thread-safety: none; one test thread.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "client/client.h"
#include "client/paged_cache.h"
#include "schema/kvtier.capnp.h"

namespace kvtier::integration {

using std::chrono::milliseconds;
inline constexpr milliseconds kDeadline{60'000};

// A binary built next to the tests: kvtierd, kvtierctl, kvtier-example-engine
// ($KVTIER_TEST_BIN_DIR, when set, names another directory holding them).
std::string binary_path(const std::string& name);

// How a child process ended.
struct ExitStatus {
  bool exited = false;     // exited normally (code is valid)
  int code = -1;           // exit code
  int signal = 0;          // terminating signal, when killed
  bool timed_out = false;  // overstayed its deadline and was SIGKILLed by the harness
  bool ok() const { return exited && code == 0; }
  std::string describe() const;
};

// Waits until child `pid` ends or `timeout` passes (then SIGKILLs and reaps it).
ExitStatus wait_for_exit(pid_t pid, milliseconds timeout = kDeadline);

// Forks; the child runs `body` and _exit()s with its result (98 when it throws).
// REQUIRES: the calling process has only one thread.
pid_t fork_child(const std::function<int()>& body);

struct ProcessResult {
  ExitStatus status;
  std::string stdout_text;
  std::string stderr_text;
  std::string describe() const;  // status plus both outputs, for failure messages
};

// Starts `argv` (argv[0] a path) with posix_spawn, stdin from /dev/null and stdout and
// stderr on the given descriptors.
Result<pid_t> spawn(const std::vector<std::string>& argv, int stdout_fd, int stderr_fd);
// Everything written to `fd` (a memfd or file), from its start.
std::string read_all(int fd);

// Runs `argv` (argv[0] a path) with posix_spawn, capturing stdout and stderr.
ProcessResult run_process(const std::vector<std::string>& argv, milliseconds timeout = kDeadline);

// The flags every test starts from: small tiers, two copy threads.
std::vector<std::string> small_tier_flags();
// Whether `flags` set `name` ("--device cuda" or "--device=cuda").
bool names_flag(const std::vector<std::string>& flags, std::string_view name);

// One kvtierd process with its own temporary directory (socket and log inside).
class Daemon {
 public:
  // Starts kvtierd with `flags` (besides --socket and --data-dir; --device host unless
  // `flags` name a device) and waits until the socket accepts connections. Unavailable
  // when it exits or never listens; the message has its log.
  static Result<std::unique_ptr<Daemon>> start(
      const std::vector<std::string>& flags = small_tier_flags());
  ~Daemon();  // SIGKILLs a daemon still running; removes the directory; logs on failure

  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  const std::string& dir() const { return dir_; }
  const std::string& socket_path() const { return socket_path_; }
  pid_t pid() const { return pid_; }
  // Whether the process is still alive (reaps it if it died).
  bool running();
  // SIGTERM, then waits for the exit.
  ExitStatus stop(milliseconds timeout = kDeadline);
  std::string log() const;

  // Lets other uids reach the socket (directory 0755, socket 0666).
  Status open_to_all_users() const;

  Result<std::unique_ptr<Client>> connect() const { return Client::connect(socket_path_); }
  // Polls Stats on one connection until `done` holds; the last Stats, or an error
  // saying what was last seen when the deadline passes.
  Result<StatsInfo> wait_for_stats(const std::function<bool(const StatsInfo&)>& done,
                                   milliseconds timeout = kDeadline) const;
  // Waits until no copy is in flight and no block is pinned.
  Result<StatsInfo> wait_until_settled(milliseconds timeout = kDeadline) const;

  ProcessResult run_example_engine(const std::vector<std::string>& args) const;
  ProcessResult run_kvtierctl(const std::vector<std::string>& args) const;

 private:
  Daemon(std::string dir, pid_t pid)
      : dir_(std::move(dir)), socket_path_(dir_ + "/kvtierd.sock"), pid_(pid) {}
  std::string dir_;
  std::string socket_path_;
  pid_t pid_;
  std::optional<ExitStatus> exit_;  // set once reaped
};

// A fixture with one daemon per test, started with daemon_flags() and stopped with
// SIGTERM at the end (asserting exit code 0).
class DaemonTest : public ::testing::Test {
 protected:
  virtual std::vector<std::string> daemon_flags() const { return small_tier_flags(); }
  void SetUp() override;
  void TearDown() override;
  std::unique_ptr<Daemon> daemon_;
};

// An engine inside this process (or a forked child): a paged cache registered with
// its own connection.
struct Engine {
  std::unique_ptr<Client> client;
  PagedCache cache;
  HelloInfo hello;

  static Result<Engine> connect(const std::string& socket_path, const PagedCacheShape& shape,
                                const std::string& name = "integration-engine");
  // Refs naming engine blocks first_block_id, first_block_id + 1, ...
  static std::vector<BlockRef> refs(std::span<const BlockHash> hashes, uint64_t first_block_id);
  // Writes each ref's hash-derived content into its engine block.
  void fill(std::span<const BlockRef> refs);
  // How many leading refs hold exactly their hash-derived content.
  size_t count_verified(std::span<const BlockRef> refs, size_t count) const;
};

// A shape with small blocks (4 layers × 2 × 4 KiB = 32 KiB) for fast tests.
PagedCacheShape small_shape(uint64_t num_blocks = 16);
// The example engine's default shape (2 MiB blocks) with `num_blocks` blocks.
PagedCacheShape example_shape(uint64_t num_blocks);

const TierStatsInfo* find_tier(const StatsInfo& stats, Tier tier);
// Every tier's used_bytes equals its blocks × block_bytes: no slot is leaked.
::testing::AssertionResult NoLeakedSlots(const StatsInfo& stats, uint64_t block_bytes);
uint64_t total_blocks(const StatsInfo& stats);

// A fresh engine connection can read Stats, save `session` (4 blocks) and load it
// back bit-exact: the daemon still serves normal requests.
::testing::AssertionResult ServesSaveAndLoad(const Daemon& daemon, const std::string& session);

// `status` failed with `code` and its message contains `fragment`.
::testing::AssertionResult IsError(const Status& status, StatusCode code,
                                   std::string_view fragment);

// For forked children: prints what failed and returns a nonzero exit code.
int child_failure(int code, const std::string& what, const Status& status = Status::ok());

}  // namespace kvtier::integration
