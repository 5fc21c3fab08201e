// kvtierd: wiring. Parse the config, pick the Device, reserve the tiers (their memory
// fills in the background), listen (or take the socket systemd passed), serve
// /metrics, tell systemd we are ready once the memory is filled, and run the control
// thread until SIGINT/SIGTERM. SIGHUP reloads the configuration. Exit
// codes: 0 stopped, 1 could not start, 2 bad configuration or device, 3 the device was
// lost (a sticky GPU error; systemd restarts the daemon).
#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "common/control_thread.h"
#include "common/log.h"
#include "common/units.h"
#ifdef KVTIER_HAVE_CUDA
#include "cuda/cuda_device.h"
#endif
#include "daemon/config.h"
#include "daemon/metrics_server.h"
#include "daemon/service.h"
#include "daemon/systemd.h"
#include "device/device.h"
#include "ipc/server.h"

namespace {

using namespace kvtier;

Result<std::unique_ptr<Device>> make_device(const daemon::DaemonConfig& config) {
#ifdef KVTIER_HAVE_CUDA
  if (config.device != "host") {
    CudaDeviceOptions options;
    options.gpu_uuids = daemon::gpu_uuid_list(config);
    auto cuda = make_cuda_device(options);
    // auto falls back only where there is no GPU at all; a GPU named in --gpus that is
    // not here is a configuration error either way.
    if (cuda.is_ok() || config.device == "cuda" ||
        cuda.status().code() != StatusCode::kUnavailable) {
      return cuda;
    }
    KVTIER_LOG_INFO("device auto: {}; using the host backend (memfd regions)",
                    cuda.status().message());
  }
#else
  if (config.device == "cuda") {
    return invalid_argument(
        "--device cuda: this kvtierd was built without the CUDA toolkit; use --device host");
  }
  if (config.device == "auto")
    KVTIER_LOG_INFO("device auto: built without CUDA; using the host backend");
#endif
  return make_host_device(config.copy_threads);
}

// A CUDA VMM region arrives as one descriptor per chunk (up to 1024 in one request), so
// the soft limit of 1024 that many services start with is too tight.
void raise_descriptor_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  limit.rlim_cur = limit.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    KVTIER_LOG_WARN("cannot raise the open-file limit to {}: {}", limit.rlim_max,
                    std::strerror(errno));
  }
}

// SIGHUP: re-read the same --config file and flags. Reloadable settings take effect
// now; every other change is logged as needing a restart. A bad file keeps the
// running configuration.
void reload(int argc, char** argv, daemon::Service& service, daemon::ServiceNotifier& notifier)
    KVTIER_REQUIRES(control_thread) {
  notifier.reloading();
  auto fresh = daemon::parse_command_line(argc, argv);
  if (!fresh.is_ok()) {
    KVTIER_LOG_ERROR("SIGHUP: configuration not reloaded (the running one stays): {}",
                     fresh.status().message());
    service.count_config_reload(false);
    notifier.reloaded();
    return;
  }
  const daemon::DaemonConfig before = service.config();
  service.apply_reloaded_config(fresh->config);
  set_log_level(service.config().log_level);
  const auto changed = daemon::changed_keys(before, fresh->config);
  for (const std::string& key : changed) {
    const daemon::Setting& setting = *daemon::find_setting(key);
    if (setting.reloadable) {
      KVTIER_LOG_INFO("SIGHUP: {} = {} (was {})", key, setting.get(fresh->config),
                      setting.get(before));
    } else {
      KVTIER_LOG_WARN("SIGHUP: {} = {} needs a restart to take effect (running with {})", key,
                      setting.get(fresh->config), setting.get(before));
    }
  }
  if (changed.empty()) KVTIER_LOG_INFO("SIGHUP: configuration re-read; nothing changed");
  service.count_config_reload(true);
  notifier.reloaded();
}

// Binds /metrics unless metrics-addr is "off". False when the configured address
// cannot be served: the daemon then exits before any engine could connect to it.
bool start_metrics(daemon::MetricsServer& metrics, const daemon::DaemonConfig& config) {
  if (config.metrics_addr == "off") return true;
  if (Status bound = metrics.listen(config.metrics_addr); bound.is_ok()) {
    KVTIER_LOG_INFO("metrics at http://{}/metrics", metrics.address());
  } else if (config.metrics_addr == daemon::kDefaultMetricsAddr) {
    // Only the default may be taken (another kvtierd, a test): say so and go on.
    KVTIER_LOG_WARN("metrics: {}; running without /metrics (set metrics-addr)", bound.message());
  } else {
    KVTIER_LOG_ERROR("metrics-addr {}: {}", config.metrics_addr, bound.message());
    return false;
  }
  return true;
}

// Adopts the socket systemd passed, or listens on the configured path. Where the daemon
// listens, for the start-up log line; nothing (the error logged) when it cannot.
std::optional<std::string> start_listening(ipc::Server& server, UniqueFd& activation_socket,
                                           const daemon::DaemonConfig& config) {
  std::string listening_on = config.socket_path;
  if (activation_socket.valid()) {
    listening_on = "the socket systemd passed (socket activation)";
    if (Status adopted = server.adopt(std::move(activation_socket)); !adopted.is_ok()) {
      KVTIER_LOG_ERROR("cannot use the socket systemd passed: {}", adopted.message());
      return std::nullopt;
    }
  } else if (Status listening = server.listen(config.socket_path); !listening.is_ok()) {
    KVTIER_LOG_ERROR("cannot listen on {}: {}", config.socket_path, listening.message());
    return std::nullopt;
  }
  return listening_on;
}

// The loop's signal handling: SIGINT/SIGTERM shut the daemon down (a second one gives up
// the drain), SIGHUP reloads the configuration, and a lost device closes everything that
// serves. It borrows all it names, which run() keeps alive until the loop has returned.
class SignalHandlers {
 public:
  SignalHandlers(int argc, char** argv, boost::asio::signal_set& stop_signals,
                 boost::asio::signal_set& reload_signals, daemon::Service& service,
                 daemon::ServiceNotifier& notifier, daemon::MetricsServer& metrics,
                 ipc::Server& server)
      : argc_(argc),
        argv_(argv),
        stop_signals_(stop_signals),
        reload_signals_(reload_signals),
        service_(service),
        notifier_(notifier),
        metrics_(metrics),
        server_(server) {}

  // Waits for the stop and reload signals, and sets what the service does when the
  // device is lost.
  void arm() KVTIER_REQUIRES(control_thread) {
    wait_for_stop();
    wait_for_hangup();
    // A lost GPU context: the service wrote what it can and stops the loop; close
    // everything else so that nothing is served until systemd starts a fresh daemon.
    service_.set_fatal_exit([this](int) {
      assert_control_thread();
      ending_ = true;
      notifier_.stopping();
      stop_signals_.cancel();
      reload_signals_.cancel();
      metrics_.stop();
      server_.stop();
    });
  }

 private:
  void shut_down(int signal_number) KVTIER_REQUIRES(control_thread) {
    KVTIER_LOG_INFO("signal {}: shutting down", signal_number);
    ending_ = true;
    notifier_.stopping();
    reload_signals_.cancel();
    metrics_.stop();
    // Closing the acceptor and connections and stopping the timers leaves only
    // in-flight copies as work; run() returns when they are done.
    server_.stop();
    // With an NVMe tier the service first drains RAM/HBM to it (up to drain-timeout);
    // the signal set stays armed until then so that a second signal can cut it short.
    service_.stop([&stop_signals = stop_signals_] { stop_signals.cancel(); });
  }

  void wait_for_stop() KVTIER_REQUIRES(control_thread) {
    stop_signals_.async_wait([this](const boost::system::error_code& ec, int signal_number) {
      assert_control_thread();
      if (ec || (ending_ && stop_requests_ == 0)) return;  // the device was lost meanwhile
      if (++stop_requests_ > 1) {
        KVTIER_LOG_WARN("signal {} again: exiting now", signal_number);
        service_.stop();  // a second stop gives up the drain
        return;
      }
      wait_for_stop();  // armed before stop(), which may cancel it at once
      shut_down(signal_number);
    });
  }

  void wait_for_hangup() KVTIER_REQUIRES(control_thread) {
    reload_signals_.async_wait([this](const boost::system::error_code& ec, int) {
      assert_control_thread();
      if (ec || ending_) return;
      reload(argc_, argv_, service_, notifier_);
      wait_for_hangup();
    });
  }

  int argc_;
  char** argv_;
  boost::asio::signal_set& stop_signals_;
  boost::asio::signal_set& reload_signals_;
  daemon::Service& service_;
  daemon::ServiceNotifier& notifier_;
  daemon::MetricsServer& metrics_;
  ipc::Server& server_;
  // Set once the loop is winding down (a stop signal or a lost device). A signal whose
  // wait completed in the same turn of the loop is handled after that: cancel() cannot
  // take back a completed wait, so the handlers look here and do not re-arm.
  bool ending_ KVTIER_GUARDED_BY(control_thread) = false;
  int stop_requests_ KVTIER_GUARDED_BY(control_thread) = 0;
};

// The signal handlers are gone with the loop: a late SIGTERM while the daemon winds
// down must not turn a clean exit into death by signal. The sets are emptied first:
// Asio puts back the default action (death) when a signal's last set lets it go,
// which would otherwise happen when they are destroyed, before ~Service (joining
// the fill and region threads, draining the device) has run.
void ignore_signals_after_loop(boost::asio::signal_set& stop_signals,
                               boost::asio::signal_set& reload_signals) {
  boost::system::error_code ignored;
  stop_signals.clear(ignored);
  reload_signals.clear(ignored);
  ::signal(SIGTERM, SIG_IGN);
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGHUP, SIG_IGN);
}

// Logs why the loop ended and returns kvtierd's exit code.
int stopped_exit_code(const daemon::Service& service) {
  if (service.exit_code() == daemon::Service::kExitCannotStart) {
    KVTIER_LOG_ERROR("kvtierd stopped: it could not fill its tier memory (exit code {})",
                     service.exit_code());
    return service.exit_code();
  }
  if (service.exit_code() != 0) {
    KVTIER_LOG_ERROR("kvtierd stopped after a fatal device error (exit code {})",
                     service.exit_code());
    return service.exit_code();
  }
  KVTIER_LOG_INFO("kvtierd stopped");
  return 0;
}

int run(int argc, char** argv) {
  auto command_line = daemon::parse_command_line(argc, argv);
  if (!command_line.is_ok()) {
    if (command_line.status().code() == StatusCode::kNotFound &&
        command_line.status().message().empty())
      return 0;
    std::fprintf(stderr, "kvtierd: %s\n", command_line.status().message().c_str());
    return 2;
  }
  if (command_line->check_config) {
    std::fputs(daemon::to_toml(command_line->config).c_str(), stdout);
    return 0;
  }
  const daemon::DaemonConfig& config = command_line->config;
  set_log_level(config.log_level);
  ::signal(SIGPIPE, SIG_IGN);
  raise_descriptor_limit();
  // Taken before any thread starts: sd_listen_fds() edits the environment.
  auto activation_socket = daemon::take_activation_socket();
  if (!activation_socket.is_ok()) {
    KVTIER_LOG_ERROR("{}", activation_socket.status().message());
    return 1;
  }

  auto device = make_device(config);
  if (!device.is_ok()) {
    KVTIER_LOG_ERROR("{}", device.status().message());
    return 2;
  }
  boost::asio::io_context io(1);
  // This thread runs the loop (io.run() below): it is the control thread from here on.
  assert_control_thread();
  // Signals are caught from here on, before anything could connect: a SIGTERM that
  // arrives while kvtierd starts (a test or systemd stopping it as soon as the socket
  // answers) is queued and handled by the loop, never the default death by signal.
  boost::asio::signal_set stop_signals(io, SIGINT, SIGTERM);
  boost::asio::signal_set reload_signals(io, SIGHUP);
  const std::string device_name((*device)->name());
  daemon::Service service(io, config, std::move(*device));
  // Reserves the tier memory and starts filling it in the background: the socket
  // answers while it fills, and READY=1 waits until data requests are served.
  if (Status started = service.start(); !started.is_ok()) {
    KVTIER_LOG_ERROR("cannot allocate tiers: {}", started.to_string());
    return 1;
  }
  // /metrics on the control thread: rendering reads the Service's state directly. Bound
  // before the socket listens, so a daemon that cannot serve its configured metrics
  // address exits before any engine could connect to it.
  daemon::MetricsServer metrics(io, [&service] {
    assert_control_thread();  // a scrape's handler
    return service.render_metrics();
  });
  if (!start_metrics(metrics, config)) return 1;

  if (config.fault_start_delay_ms > 0) {  // fault-start-delay-ms (tests only)
    KVTIER_LOG_INFO("holding the start for {} ms before listening", config.fault_start_delay_ms);
    std::this_thread::sleep_for(std::chrono::milliseconds(config.fault_start_delay_ms));
  }
  ipc::Server server(io, service, connection_limits(config));
  service.attach_server(&server);
  const std::optional<std::string> listening_on =
      start_listening(server, *activation_socket, config);
  if (!listening_on) return 1;

  daemon::ServiceNotifier notifier(io, [&service] { return service.status_line(); });
  SignalHandlers signal_handlers(argc, argv, stop_signals, reload_signals, service, notifier,
                                 metrics, server);
  signal_handlers.arm();

  KVTIER_LOG_INFO("kvtierd listening on {} (hbm {}, ram {}, device {})", *listening_on,
                  format_bytes(config.hbm_bytes), format_bytes(config.ram_bytes), device_name);
  // systemd's READY=1 means "serving data": sent once the tier memory is filled (a
  // filled service calls this from its first run of the loop).
  service.set_ready_callback([&notifier] {
    assert_control_thread();
    notifier.ready();
  });
  notifier.starting();
  io.run();
  ignore_signals_after_loop(stop_signals, reload_signals);
  return stopped_exit_code(service);
}

}  // namespace

int main(int argc, char** argv) {
  // Allocations of 4 MiB and more are mapped on their own and unmapped when freed. A
  // plan over a large tier builds lists of its blocks (tens of MiB at a million blocks)
  // and frees them when it is done; glibc's default threshold rises to 32 MiB after the
  // first such free, and from then on those lists come from the heap and their pages
  // stay resident after the plan. The daemon's lasting structures grow in chunks below
  // it (HolderTable, BlockTable) or are allocated once. At 1 MiB the daemon was 3 %
  // smaller at 800k blocks, but lists a plan makes every period under pressure were
  // mapped and faulted in anew each time (p99 spikes in kvtier-bench scale).
  mallopt(M_MMAP_THRESHOLD, 4 << 20);
  return run(argc, argv);
}
