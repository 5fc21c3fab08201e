#include "tests/support/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "common/unique_fd.h"

extern char** environ;

namespace kvtier::support {
namespace {

using Clock = std::chrono::steady_clock;

// wait_for_exit falls back to polling at this interval where pidfd_open is missing.
constexpr milliseconds kPollInterval{2};

std::string_view variable_name(std::string_view entry) {
  return entry.substr(0, entry.find('='));
}

// This process's environment with `extra` added, each replacing a variable of the same
// name, plus (for socket activation) LISTEN_FDS and a LISTEN_PID entry the child fills in.
std::vector<std::string> child_environment(const SpawnOptions& options) {
  std::vector<std::string> extra = options.env;
  if (options.activation_fd >= 0) {
    extra.push_back("LISTEN_FDS=1");
    extra.push_back("LISTEN_PID=" + std::string(20, '\0'));  // room for any pid
  }
  std::vector<std::string> out;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    bool replaced = false;
    for (const std::string& added : extra) {
      replaced = replaced || variable_name(added) == variable_name(*entry);
    }
    if (!replaced) out.emplace_back(*entry);
  }
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

// Async-signal-safe: writes `value` in decimal at `out` (which has room), NUL-terminated.
void write_decimal(char* out, long value) {
  char digits[24];
  int count = 0;
  do {
    digits[count++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value > 0);
  while (count > 0) *out++ = digits[--count];
  *out = '\0';
}

// The child between fork and exec: only async-signal-safe calls. On failure it
// reports errno through `report` (close-on-exec, so a successful exec closes it).
[[noreturn]] void exec_child(const SpawnOptions& options, char* const* argv, char* const* envp,
                             char* listen_pid_digits, int null_fd, int report, pid_t parent) {
  const int out = options.stdout_fd >= 0 ? options.stdout_fd : null_fd;
  const int err = options.stderr_fd >= 0 ? options.stderr_fd : null_fd;
  bool ok = ::dup2(null_fd, STDIN_FILENO) >= 0 && ::dup2(out, STDOUT_FILENO) >= 0 &&
            ::dup2(err, STDERR_FILENO) >= 0;
  if (ok && options.die_with_parent) {
    // A parent that died before prctl would never send the signal.
    ok = ::prctl(PR_SET_PDEATHSIG, SIGTERM) == 0;
    if (ok && ::getppid() != parent) {
      errno = ESRCH;
      ok = false;
    }
  }
  if (ok && options.activation_fd >= 0) {
    ok = options.activation_fd == 3 ? ::fcntl(3, F_SETFD, 0) == 0  // keep it across exec
                                    : ::dup2(options.activation_fd, 3) == 3;
    write_decimal(listen_pid_digits, ::getpid());
  }
  if (ok) ::execve(argv[0], argv, envp);
  const int error = errno;
  (void)!::write(report, &error, sizeof(error));
  ::_exit(127);
}

}  // namespace

std::string ExitStatus::describe() const {
  if (timed_out) return "timed out (killed by the waiter)";
  if (exited) return fmt::format("exited with code {}", code);
  if (signal != 0) return fmt::format("killed by signal {} ({})", signal, ::strsignal(signal));
  return "did not finish";
}

ExitStatus decode_wait_status(int wait_status) {
  ExitStatus out;
  if (WIFEXITED(wait_status)) {
    out.exited = true;
    out.code = WEXITSTATUS(wait_status);
  } else if (WIFSIGNALED(wait_status)) {
    out.signal = WTERMSIG(wait_status);
  }
  return out;
}

Result<pid_t> spawn(const SpawnOptions& options) {
  if (options.argv.empty()) return invalid_argument("spawn: no program given");
  // Everything the child needs is built here: after fork it may not allocate.
  std::vector<std::string> args = options.argv;
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::vector<std::string> environment = child_environment(options);
  std::vector<char*> envp;
  char* listen_pid_digits = nullptr;
  for (std::string& entry : environment) {
    envp.push_back(entry.data());
    if (options.activation_fd >= 0 && entry.starts_with("LISTEN_PID=")) {
      listen_pid_digits = entry.data() + std::strlen("LISTEN_PID=");
    }
  }
  envp.push_back(nullptr);
  UniqueFd null_fd(::open("/dev/null", O_RDWR | O_CLOEXEC));
  if (!null_fd.valid()) return errno_status(errno, "open /dev/null");
  int report_pipe[2];
  if (::pipe2(report_pipe, O_CLOEXEC) != 0) return errno_status(errno, "pipe2");
  UniqueFd report_read(report_pipe[0]);
  UniqueFd report_write(report_pipe[1]);

  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return errno_status(errno, "fork for " + options.argv[0]);
  if (pid == 0) {
    exec_child(options, argv.data(), envp.data(), listen_pid_digits, null_fd.get(),
               report_write.get(), parent);
  }
  report_write.reset();
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(report_read.get(), &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof(child_errno))) {
    int ignored = 0;
    while (::waitpid(pid, &ignored, 0) < 0 && errno == EINTR) {
    }
    return errno_status(child_errno, "execute " + options.argv[0]);
  }
  return pid;
}

Result<pid_t> spawn(const std::vector<std::string>& argv, int stdout_fd, int stderr_fd) {
  SpawnOptions options;
  options.argv = argv;
  options.stdout_fd = stdout_fd;
  options.stderr_fd = stderr_fd;
  return spawn(options);
}

bool try_reap(pid_t pid, ExitStatus* status) {
  int wait_status = 0;
  pid_t reaped;
  do {
    reaped = ::waitpid(pid, &wait_status, WNOHANG);
  } while (reaped < 0 && errno == EINTR);
  if (reaped == pid) {
    *status = decode_wait_status(wait_status);
    return true;
  }
  if (reaped < 0) {  // not our child (any more)
    *status = ExitStatus{};
    return true;
  }
  return false;
}

ExitStatus wait_for_exit(pid_t pid, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  ExitStatus status;
  while (true) {
    if (try_reap(pid, &status)) return status;
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    if (pidfd.valid()) {
      pollfd fd{pidfd.get(), POLLIN, 0};
      (void)::poll(&fd, 1, static_cast<int>(left.count()));
    } else {
      std::this_thread::sleep_for(kPollInterval);
    }
  }
  ::kill(pid, SIGKILL);
  int ignored = 0;
  while (::waitpid(pid, &ignored, 0) < 0 && errno == EINTR) {
  }
  ExitStatus out;
  out.timed_out = true;
  return out;
}

std::string read_all(int fd) {
  std::string text;
  char buffer[8192];
  off_t offset = 0;
  while (true) {
    ssize_t n = ::pread(fd, buffer, sizeof(buffer), offset);
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
    offset += n;
  }
  return text;
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

}  // namespace kvtier::support
