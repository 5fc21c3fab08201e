// Harness for the NVMe tier's integration tests: a kvtierd that can be stopped, killed
// with SIGKILL and started again on the same data directory, plus helpers to save
// sessions, wait for them to reach NVMe and check what loads back.
//
// The general harness (daemon_harness.h) gives every daemon a fresh directory; these
// tests need the data directory to outlive the process, so a PersistentDaemon takes
// it as an argument. Everything else (Engine, Stats polling, deadlines) is shared.
//
// Thread-safety: none; one test thread, no other threads (fork_child rules apply).
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tests/integration/daemon_harness.h"

namespace kvtier::integration {

// A temporary directory removed (recursively) on destruction.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Small tiers that push idle sessions to NVMe within tens of milliseconds.
std::vector<std::string> nvme_tier_flags(const std::string& nvme_bytes = "64MiB");
// `flags` with flag `name` set to `value` (replaced when present, else appended):
// kvtierd refuses a flag given twice.
std::vector<std::string> with_flag(std::vector<std::string> flags, const std::string& name,
                                   const std::string& value);

class PersistentDaemon {
 public:
  // Starts kvtierd with --data-dir `data_dir`, its socket and log in `run_dir`, plus
  // `flags` (and --device host unless they name a device); waits until the socket accepts
  // connections. Unavailable with the log when it exits first (e.g. refuses the data directory) or
  // never listens.
  static Result<std::unique_ptr<PersistentDaemon>> start(const std::string& run_dir,
                                                         const std::string& data_dir,
                                                         const std::vector<std::string>& flags);
  ~PersistentDaemon();  // SIGKILLs a daemon still running

  const std::string& socket_path() const { return process_.socket_path(); }
  pid_t pid() const { return process_.pid(); }
  bool running() { return process_.running(); }
  // SIGTERM, wait (SIGKILL after `timeout`).
  ExitStatus stop(milliseconds timeout = kDeadline) { return process_.stop(timeout); }
  ExitStatus kill9() { return process_.kill(); }  // SIGKILL, wait
  // After stop() or kill9(): a new kvtierd on the same socket and data directory, with
  // the same flags or `flags` (support::DaemonProcess::restart).
  Status restart(std::optional<std::vector<std::string>> flags = std::nullopt) {
    return process_.restart(std::move(flags));
  }
  // Everything every daemon in run_dir wrote (they append to one log).
  std::string log() const { return process_.log(); }

  Result<StatsInfo> wait_for_stats(const std::function<bool(const StatsInfo&)>& done,
                                   milliseconds timeout = kDeadline) const;
  ProcessResult run_kvtierctl(const std::vector<std::string>& args) const;

 private:
  explicit PersistentDaemon(support::DaemonProcess process) : process_(std::move(process)) {}
  support::DaemonProcess process_;
};

// Result of loading a prefix back into an engine: how many leading blocks came back,
// how many of those are bit-exact, and why the prefix ended.
struct LoadCheck {
  size_t loaded = 0;
  size_t bit_exact = 0;
  Status stop_reason;
  std::string describe() const;
};

// Saves `blocks` blocks of session `session` (content derived from the hashes) into
// engine blocks starting at 0, one Save with endOfTurn.
Status save_session(Engine& engine, const std::string& session, size_t blocks);
// Loads the session's `blocks` hashes into engine blocks starting at `first_block_id`.
Result<LoadCheck> load_session(Engine& engine, const std::string& session, size_t blocks,
                               uint64_t first_block_id);

uint64_t tier_blocks(const StatsInfo& stats, Tier tier);

}  // namespace kvtier::integration
