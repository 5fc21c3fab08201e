// Child processes for the tests and the benchmarks: start one (posix-style argv, chosen
// stdout/stderr, extra environment, an inherited listening socket as systemd passes
// it), wait for it with a deadline, and run one to completion capturing its output.
// kvtierd itself is started through DaemonProcess (daemon_process.h), built on these.
//
// Thread-safety: the functions may be called from any thread; a pid belongs to the
// caller that started it (waiting on it from two threads races for its exit status).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvtier::support {

using std::chrono::milliseconds;
inline constexpr milliseconds kProcessDeadline{60'000};

// How a child process ended.
struct ExitStatus {
  bool exited = false;     // exited normally (code is valid)
  int code = -1;           // exit code
  int signal = 0;          // terminating signal, when killed
  bool timed_out = false;  // overstayed its deadline and was SIGKILLed by the waiter
  bool ok() const { return exited && code == 0; }
  std::string describe() const;  // "exited with code 1", "killed by signal 9 (Killed)", ...
};

// A raw waitpid() status as an ExitStatus.
ExitStatus decode_wait_status(int wait_status);

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[0] is the program's path (no PATH search)
  int stdout_fd = -1;             // -1: /dev/null (stdin is always /dev/null)
  int stderr_fd = -1;             // -1: /dev/null
  std::vector<std::string> env;   // "NAME=value", added to this process's environment
                                  // (replacing a variable of the same name)
  // >= 0: socket activation as systemd does it — this descriptor becomes the child's
  // fd 3, with LISTEN_FDS=1 and LISTEN_PID set to the child's pid.
  int activation_fd = -1;
  bool die_with_parent = false;  // the child gets SIGTERM when the spawning thread exits
};

// Starts a child. Fails (with the reason) when the program cannot be executed; every
// other descriptor of this process is closed in the child when it was opened with
// O_CLOEXEC. Safe in a multi-threaded process: the child only makes async-signal-safe
// calls before it execs.
Result<pid_t> spawn(const SpawnOptions& options);
// The same with only argv and the output descriptors.
Result<pid_t> spawn(const std::vector<std::string>& argv, int stdout_fd, int stderr_fd);

// Waits until child `pid` ends or `timeout` passes (then SIGKILLs and reaps it, and
// the result says timed_out).
ExitStatus wait_for_exit(pid_t pid, milliseconds timeout = kProcessDeadline);
// Reaps `pid` without blocking: true, with `*status` filled, once it has ended (or is
// no child of this process: then `*status` says it did not finish).
bool try_reap(pid_t pid, ExitStatus* status);

// Everything written to `fd` (a memfd or file), from its start.
std::string read_all(int fd);

struct ProcessResult {
  ExitStatus status;
  std::string stdout_text;
  std::string stderr_text;
  std::string describe() const;  // status plus both outputs, for failure messages
};

// Runs `argv` to completion (SIGKILL after `timeout`), capturing stdout and stderr.
ProcessResult run_process(const std::vector<std::string>& argv,
                          milliseconds timeout = kProcessDeadline);

}  // namespace kvtier::support
