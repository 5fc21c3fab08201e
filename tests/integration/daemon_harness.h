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
#include "tests/support/daemon_process.h"
#include "tests/support/process.h"

namespace kvtier::integration {

using std::chrono::milliseconds;
inline constexpr milliseconds kDeadline{60'000};

// A binary built next to the tests: kvtierd, kvtierctl, kvtier-example-engine
// ($KVTIER_TEST_BIN_DIR, when set, names another directory holding them).
std::string binary_path(const std::string& name);

// Child processes (tests/support/process.h): how one ended, waiting with a deadline,
// spawning one with its output on given descriptors; names_flag from daemon_process.h.
using support::ExitStatus;
using support::names_flag;
using support::ProcessResult;
using support::read_all;
using support::spawn;
using support::wait_for_exit;

// Forks; the child runs `body` and _exit()s with its result (98 when it throws).
// REQUIRES: the calling process has only one thread.
pid_t fork_child(const std::function<int()>& body);

// Reads `fd` (a pipe from a child) until `text` has appeared (empty: until end of file)
// or `timeout` passed; everything read.
std::string read_pipe_until(int fd, std::string_view text = {}, milliseconds timeout = kDeadline);

// Runs `argv` (argv[0] a path), capturing stdout and stderr; SIGKILL after `timeout`.
inline ProcessResult run_process(const std::vector<std::string>& argv,
                                 milliseconds timeout = kDeadline) {
  return support::run_process(argv, timeout);
}

// The flags every test starts from: small tiers, two copy threads.
std::vector<std::string> small_tier_flags();

// One kvtierd process (a support::DaemonProcess) with its own temporary directory
// (socket and log inside), that prints its log when the test failed.
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

  const std::string& dir() const { return process_.dir(); }
  const std::string& socket_path() const { return process_.socket_path(); }
  pid_t pid() const { return process_.pid(); }
  // Whether the process is still alive (reaps it if it died).
  bool running() { return process_.running(); }
  // SIGTERM, then waits for the exit (SIGKILL after `timeout`).
  ExitStatus stop(milliseconds timeout = kDeadline) { return process_.stop(timeout); }
  // After stop(): kvtierd again in the same directory, on the same socket.
  Status restart() { return process_.restart(); }
  std::string log() const { return process_.log(); }

  // Lets other uids reach the socket (directory 0755, socket 0666).
  Status open_to_all_users() const;

  Result<std::unique_ptr<Client>> connect() const { return Client::connect(socket_path()); }
  // Polls Stats on one connection until `done` holds; the last Stats, or an error
  // saying what was last seen when the deadline passes.
  Result<StatsInfo> wait_for_stats(const std::function<bool(const StatsInfo&)>& done,
                                   milliseconds timeout = kDeadline) const;
  // Waits until no copy is in flight and no block is pinned.
  Result<StatsInfo> wait_until_settled(milliseconds timeout = kDeadline) const;

  ProcessResult run_example_engine(const std::vector<std::string>& args) const;
  ProcessResult run_kvtierctl(const std::vector<std::string>& args) const;

 private:
  explicit Daemon(support::DaemonProcess process) : process_(std::move(process)) {}
  support::DaemonProcess process_;
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
  // The same over a client already connected (e.g. as another peer).
  static Result<Engine> start(std::unique_ptr<Client> client, const PagedCacheShape& shape,
                              const std::string& name);
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
// Every tier's used_bytes equals its blocks × block_bytes plus its copies: no slot is leaked.
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
