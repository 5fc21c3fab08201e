#include "bench/daemon_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "common/unique_fd.h"

namespace kvtier::bench {
namespace {

bool socket_accepts(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return false;
  return ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
}

// Returns true once the child has exited (and fills *wait_status).
bool reaped(pid_t pid, int* wait_status) {
  pid_t r;
  do {
    r = ::waitpid(pid, wait_status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  return r == pid || (r < 0 && errno == ECHILD);
}

std::string describe_exit(int wait_status) {
  if (WIFEXITED(wait_status)) return fmt::format("exited with status {}", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status))
    return fmt::format("was killed by signal {}", WTERMSIG(wait_status));
  return "stopped";
}

}  // namespace

std::string kvtierd_next_to_this_executable() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "kvtierd";
  return (self.parent_path() / "kvtierd").string();
}

DaemonProcess::DaemonProcess(pid_t pid, std::string temp_dir, bool keep_temp_dir)
    : pid_(pid),
      temp_dir_(std::move(temp_dir)),
      socket_path_(temp_dir_ + "/kvtierd.sock"),
      log_path_(temp_dir_ + "/kvtierd.log"),
      keep_temp_dir_(keep_temp_dir) {}

DaemonProcess::DaemonProcess(DaemonProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      temp_dir_(std::exchange(other.temp_dir_, {})),
      socket_path_(std::move(other.socket_path_)),
      log_path_(std::move(other.log_path_)),
      keep_temp_dir_(other.keep_temp_dir_) {}

DaemonProcess::~DaemonProcess() {
  (void)stop();
  if (!temp_dir_.empty() && !keep_temp_dir_) {
    std::error_code ignored;
    std::filesystem::remove_all(temp_dir_, ignored);
  }
}

Result<DaemonProcess> DaemonProcess::start(const DaemonOptions& options) {
  const std::string binary =
      options.kvtierd_path.empty() ? kvtierd_next_to_this_executable() : options.kvtierd_path;
  if (::access(binary.c_str(), X_OK) != 0) {
    return not_found("kvtierd binary {} is not executable ({}); build it or pass --kvtierd PATH",
                     binary, std::strerror(errno));
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/kvtier-bench-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) return errno_status(errno, "mkdtemp " + pattern);

  // From here the destructor of `daemon` removes the temp dir on every error path.
  DaemonProcess daemon(-1, pattern, options.keep_temp_dir);
  std::vector<std::string> args = {
      binary,     "--socket", daemon.socket_path_, "--data-dir", daemon.temp_dir_ + "/data",
      "--device", "host"};
  args.insert(args.end(), options.args.begin(), options.args.end());
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);

  UniqueFd log(::open(daemon.log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!log.valid()) return errno_status(errno, "open " + daemon.log_path_);
  UniqueFd null_input(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!null_input.valid()) return errno_status(errno, "open /dev/null");

  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return errno_status(errno, "fork kvtierd");
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    ::dup2(null_input.get(), STDIN_FILENO);
    ::dup2(log.get(), STDOUT_FILENO);
    ::dup2(log.get(), STDERR_FILENO);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(126);  // the benchmark died before prctl
    ::execv(argv[0], argv.data());
    static const char kExecFailed[] = "kvtier-bench: execv kvtierd failed\n";
    (void)!::write(STDERR_FILENO, kExecFailed, sizeof(kExecFailed) - 1);
    ::_exit(127);
  }
  daemon.pid_ = pid;

  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options.ready_timeout_ms);
  while (!socket_accepts(daemon.socket_path_)) {
    int wait_status = 0;
    if (reaped(pid, &wait_status)) {
      daemon.pid_ = -1;
      return unavailable("kvtierd {} before it listened; end of {}:\n{}",
                         describe_exit(wait_status), daemon.log_path_, daemon.log_tail());
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return unavailable("kvtierd did not listen on {} within {} ms; end of {}:\n{}",
                         daemon.socket_path_, options.ready_timeout_ms, daemon.log_path_,
                         daemon.log_tail());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return daemon;
}

Status DaemonProcess::stop(int timeout_ms) {
  if (pid_ <= 0) return Status::ok();
  const pid_t pid = std::exchange(pid_, -1);
  ::kill(pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  int wait_status = 0;
  while (!reaped(pid, &wait_status)) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
      }
      return unavailable("kvtierd did not exit within {} ms of SIGTERM; killed it", timeout_ms);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) return Status::ok();
  return unavailable("kvtierd {} after SIGTERM; end of {}:\n{}", describe_exit(wait_status),
                     log_path_, log_tail());
}

std::string DaemonProcess::log_tail(size_t max_bytes) const {
  std::ifstream in(log_path_);
  std::stringstream text;
  text << in.rdbuf();
  std::string all = text.str();
  return all.size() > max_bytes ? "..." + all.substr(all.size() - max_bytes) : all;
}

}  // namespace kvtier::bench
