#include "tests/support/daemon_process.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "common/unique_fd.h"
#include "ipc/unix_socket.h"

namespace kvtier::support {
namespace {

using Clock = std::chrono::steady_clock;

// start() re-checks the socket at this interval until its deadline.
constexpr milliseconds kPollInterval{2};

Result<std::string> make_temp_dir(std::string parent, const std::string& prefix) {
  if (parent.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    parent = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  }
  std::string pattern = parent + "/" + prefix + "-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) return errno_status(errno, "mkdtemp " + pattern);
  return pattern;
}

}  // namespace

bool names_flag(const std::vector<std::string>& flags, std::string_view name) {
  for (const std::string& flag : flags) {
    if (flag == name ||
        (flag.starts_with(name) && flag.size() > name.size() && flag[name.size()] == '=')) {
      return true;
    }
  }
  return false;
}

std::string kvtierd_next_to_this_executable() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "kvtierd";
  return (self.parent_path() / "kvtierd").string();
}

Result<DaemonProcess> DaemonProcess::start(DaemonProcessOptions options) {
  if (::access(options.binary.c_str(), X_OK) != 0) {
    return not_found("kvtierd binary '{}' is not executable ({})", options.binary,
                     std::strerror(errno));
  }
  const bool owns_dir = options.dir.empty();
  if (owns_dir) {
    auto dir = make_temp_dir(options.temp_parent, options.temp_prefix);
    if (!dir.is_ok()) return dir.status();
    options.dir = std::move(*dir);
  }
  if (options.socket_path.empty()) options.socket_path = options.dir + "/kvtierd.sock";
  if (options.data_dir.empty()) options.data_dir = options.dir + "/data";
  if (options.log_path.empty()) options.log_path = options.dir + "/kvtierd.log";
  // From here the destructor of `daemon` cleans up on every error path.
  DaemonProcess daemon(std::move(options), owns_dir);
  KVTIER_RETURN_IF_ERROR(daemon.spawn_and_wait());
  return daemon;
}

Status DaemonProcess::restart(std::optional<std::vector<std::string>> flags) {
  if (running()) return invalid_argument("kvtierd (pid {}) is still running", pid_);
  if (flags.has_value()) options_.flags = std::move(*flags);
  exit_.reset();
  pid_ = -1;
  return spawn_and_wait();
}

Status DaemonProcess::spawn_and_wait() {
  const DaemonProcessOptions& o = options_;
  UniqueFd log(::open(o.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!log.valid()) return errno_status(errno, "open " + o.log_path);
  SpawnOptions spawn_options;
  spawn_options.argv = {o.binary, "--socket", o.socket_path, "--data-dir", o.data_dir};
  // kvtierd refuses a flag given twice, so the default device only when none is named.
  if (!names_flag(o.flags, "--device")) {
    spawn_options.argv.insert(spawn_options.argv.end(), {"--device", "host"});
  }
  spawn_options.argv.insert(spawn_options.argv.end(), o.flags.begin(), o.flags.end());
  spawn_options.stdout_fd = log.get();
  spawn_options.stderr_fd = log.get();
  spawn_options.env = o.env;
  spawn_options.activation_fd = o.activation_fd;
  spawn_options.die_with_parent = o.die_with_parent;
  auto pid = spawn(spawn_options);
  if (!pid.is_ok()) return pid.status();
  pid_ = *pid;
  if (o.activation_fd < 0) KVTIER_RETURN_IF_ERROR(wait_until_listening());
  return Status::ok();
}

Status DaemonProcess::wait_until_listening() {
  const auto deadline = Clock::now() + options_.ready_timeout;
  while (true) {
    if (!running()) {
      return unavailable("kvtierd {} before it listened on {}; end of {}:\n{}", exit_->describe(),
                         options_.socket_path, options_.log_path, log_tail());
    }
    if (ipc::connect_unix(options_.socket_path).is_ok()) return Status::ok();
    if (Clock::now() >= deadline) {
      (void)kill();
      return unavailable("kvtierd did not listen on {} within {} ms; end of {}:\n{}",
                         options_.socket_path, options_.ready_timeout.count(), options_.log_path,
                         log_tail());
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

DaemonProcess::DaemonProcess(DaemonProcess&& other) noexcept
    : options_(std::move(other.options_)),
      owns_dir_(std::exchange(other.owns_dir_, false)),
      pid_(std::exchange(other.pid_, -1)),
      exit_(std::move(other.exit_)) {}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) (void)kill();
  if (owns_dir_ && !options_.keep_dir) {
    std::error_code ignored;
    std::filesystem::remove_all(options_.dir, ignored);
  }
}

bool DaemonProcess::running() {
  if (pid_ <= 0 || exit_) return false;
  ExitStatus status;
  if (!try_reap(pid_, &status)) return true;
  exit_ = status;
  return false;
}

ExitStatus DaemonProcess::stop(milliseconds timeout) {
  if (!running()) return exit_.value_or(ExitStatus{});
  ::kill(pid_, SIGTERM);
  return wait(timeout);
}

Status DaemonProcess::stop_cleanly(milliseconds timeout) {
  const ExitStatus stopped = stop(timeout);
  if (stopped.ok()) return Status::ok();
  return unavailable("kvtierd {} after SIGTERM; end of {}:\n{}", stopped.describe(),
                     options_.log_path, log_tail());
}

ExitStatus DaemonProcess::kill() {
  if (!running()) return exit_.value_or(ExitStatus{});
  ::kill(pid_, SIGKILL);
  return wait(kProcessDeadline);
}

ExitStatus DaemonProcess::wait(milliseconds timeout) {
  if (!running()) return exit_.value_or(ExitStatus{});
  exit_ = wait_for_exit(pid_, timeout);
  return *exit_;
}

std::string DaemonProcess::log() const {
  std::ifstream in(options_.log_path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string DaemonProcess::log_tail(size_t max_bytes) const {
  std::string all = log();
  return all.size() > max_bytes ? "..." + all.substr(all.size() - max_bytes) : all;
}

}  // namespace kvtier::support
