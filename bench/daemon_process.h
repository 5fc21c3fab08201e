// DaemonProcess: a kvtierd the benchmark starts for itself, in a fresh temp directory
// (socket, data dir and log file live there), and stops with SIGTERM when done.
//
// Its stdout and stderr go to <temp dir>/kvtierd.log, never to the benchmark's stdout.
// The child gets PR_SET_PDEATHSIG(SIGTERM), so a benchmark killed mid-run does not
// leave a daemon behind.
//
// Ownership: move-only; the destructor stops the daemon (if still running) and removes
// the temp directory unless keep_temp_dir was set.
// Thread-safety: none; one owner.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/status.h"

namespace kvtier::bench {

struct DaemonOptions {
  std::string kvtierd_path;       // empty: "kvtierd" next to this executable
  std::vector<std::string> args;  // extra flags (sizes, copy threads, ...)
  bool keep_temp_dir = false;     // leave the log and data dir for inspection
  int ready_timeout_ms = 15'000;  // until the socket accepts connections
};

class DaemonProcess {
 public:
  // Creates the temp dir, spawns kvtierd with --socket/--data-dir/--device host plus
  // options.args, and waits until its socket accepts a connection. Fails with
  // Unavailable (quoting the end of the log) when it exits or does not come up.
  static Result<DaemonProcess> start(const DaemonOptions& options);

  DaemonProcess(DaemonProcess&& other) noexcept;
  DaemonProcess& operator=(DaemonProcess&&) = delete;
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;
  ~DaemonProcess();

  pid_t pid() const { return pid_; }  // -1 once stopped
  const std::string& socket_path() const { return socket_path_; }
  const std::string& log_path() const { return log_path_; }
  const std::string& temp_dir() const { return temp_dir_; }

  // SIGTERM, then wait up to `timeout_ms` for exit (SIGKILL after that). Returns an
  // error when the daemon did not exit cleanly with status 0. Idempotent.
  Status stop(int timeout_ms = 10'000);

  // The last `max_bytes` of the daemon's log, for error messages.
  std::string log_tail(size_t max_bytes = 2048) const;

 private:
  DaemonProcess(pid_t pid, std::string temp_dir, bool keep_temp_dir);

  pid_t pid_ = -1;  // -1 once reaped
  std::string temp_dir_;
  std::string socket_path_;
  std::string log_path_;
  bool keep_temp_dir_ = false;
};

// "kvtierd" in the directory of /proc/self/exe.
std::string kvtierd_next_to_this_executable();

}  // namespace kvtier::bench
