// DaemonProcess: one kvtierd child process, for the integration tests and the
// benchmarks alike. It starts kvtierd with the caller's flags on a socket, data
// directory and log file (in a fresh temporary directory unless the caller names
// them), always on the host backend unless the flags name another device, waits until
// the socket accepts connections, and stops it with SIGTERM — SIGKILL when that takes
// longer than the caller allows. kvtierd's stdout and stderr go to the log file, which
// failure messages quote.
//
// Ownership: move-only. The destructor SIGKILLs a daemon still running (stop it first
// for a clean exit) and removes the temporary directory it made, unless keep_dir.
// Thread-safety: none; one owner thread.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tests/support/process.h"

namespace kvtier::support {

struct DaemonProcessOptions {
  std::string binary;  // kvtierd's path
  // Where socket_path, data_dir and log_path default to: dir/kvtierd.sock, dir/data and
  // dir/kvtierd.log. Empty: a fresh `temp_prefix`-XXXXXX directory in `temp_parent`
  // (empty: $TMPDIR, else /tmp), removed with the DaemonProcess unless keep_dir.
  std::string dir;
  std::string temp_parent;
  std::string temp_prefix = "kvtierd";
  bool keep_dir = false;
  std::string socket_path;  // --socket
  std::string data_dir;     // --data-dir
  std::string log_path;     // stdout and stderr, appended
  // Further flags. "--device host" comes first unless they name --device: on a GPU
  // machine `auto` would pick the CUDA backend, which takes no memfd regions.
  std::vector<std::string> flags;
  std::vector<std::string> env;  // added to the environment (SpawnOptions::env)
  // >= 0: socket activation (SpawnOptions::activation_fd). That socket accepted before
  // kvtierd ran, so start() then returns without waiting for it.
  int activation_fd = -1;
  bool die_with_parent = false;  // SpawnOptions::die_with_parent
  milliseconds ready_timeout{20'000};
};

class DaemonProcess {
 public:
  // Spawns kvtierd and waits until the socket accepts a connection. Unavailable, with
  // the end of the log, when it exits first or does not listen within ready_timeout
  // (then it is SIGKILLed); NotFound when the binary is not executable.
  static Result<DaemonProcess> start(DaemonProcessOptions options);

  DaemonProcess(DaemonProcess&& other) noexcept;
  DaemonProcess& operator=(DaemonProcess&&) = delete;
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;
  ~DaemonProcess();

  pid_t pid() const { return pid_; }
  const std::string& dir() const { return options_.dir; }
  const std::string& socket_path() const { return options_.socket_path; }
  const std::string& data_dir() const { return options_.data_dir; }
  const std::string& log_path() const { return options_.log_path; }

  // Whether the process is still alive (reaps it when it has ended).
  bool running();
  // How it ended; nullopt while it runs.
  std::optional<ExitStatus> exit_status() const { return exit_; }
  // SIGTERM, then waits up to `timeout`; SIGKILL after that (the result says
  // timed_out). Returns the earlier result when it already ended.
  ExitStatus stop(milliseconds timeout = kProcessDeadline);
  // stop(), and OK only for a clean exit (code 0); else Unavailable with the log's end.
  Status stop_cleanly(milliseconds timeout = kProcessDeadline);
  // SIGKILL (a crash, as the NVMe tests want one), then reaps it.
  ExitStatus kill();
  // Waits for an exit the daemon makes by itself; SIGKILL after `timeout`.
  ExitStatus wait(milliseconds timeout = kProcessDeadline);
  // Starts kvtierd again after it ended (stop(), kill() or a crash): the same socket,
  // data directory and log (appended to), and the same flags unless `flags` gives new
  // ones (a changed configuration); waits as start() does. Engines connected to the old
  // process see it come back on the same path. InvalidArgument while it still runs.
  Status restart(std::optional<std::vector<std::string>> flags = std::nullopt);

  std::string log() const;
  std::string log_tail(size_t max_bytes = 4096) const;

 private:
  explicit DaemonProcess(DaemonProcessOptions options, bool owns_dir)
      : options_(std::move(options)), owns_dir_(owns_dir) {}
  // Spawns kvtierd with options_ and waits until it listens (unless socket-activated).
  Status spawn_and_wait();
  Status wait_until_listening();

  DaemonProcessOptions options_;
  bool owns_dir_ = false;  // made by start(): removed with this object unless keep_dir
  pid_t pid_ = -1;
  std::optional<ExitStatus> exit_;  // set once reaped
};

// Whether `flags` set `name` ("--device cuda" or "--device=cuda").
bool names_flag(const std::vector<std::string>& flags, std::string_view name);
// "kvtierd" in the directory of the running executable (/proc/self/exe): where the
// build puts it next to kvtier-bench.
std::string kvtierd_next_to_this_executable();

}  // namespace kvtier::support
