// kvtierd: wiring. Parse the config, pick the Device, allocate the tiers, listen, and
// run the control thread until SIGINT/SIGTERM.
#include <signal.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include <cstdio>

#include "common/log.h"
#include "common/units.h"
#include "cuda/device.h"
#include "daemon/config.h"
#include "daemon/service.h"
#include "ipc/server.h"

namespace {

using namespace kvtier;

Result<std::unique_ptr<Device>> make_device(const daemon::DaemonConfig& config) {
  if (config.device == "cuda") {
    return invalid_argument("--device cuda: this build has no CUDA backend yet; use --device host");
  }
  if (config.device == "auto")
    KVTIER_LOG_INFO("device auto: using the host backend (memfd regions)");
  return make_host_device(config.copy_threads);
}

int run(int argc, char** argv) {
  auto config = daemon::parse_command_line(argc, argv);
  if (!config.is_ok()) {
    if (config.status().code() == StatusCode::kNotFound && config.status().message().empty())
      return 0;
    std::fprintf(stderr, "kvtierd: %s\n", config.status().message().c_str());
    return 2;
  }
  set_log_level(config->log_level);
  ::signal(SIGPIPE, SIG_IGN);

  auto device = make_device(*config);
  if (!device.is_ok()) {
    KVTIER_LOG_ERROR("{}", device.status().message());
    return 2;
  }
  boost::asio::io_context io(1);
  daemon::Service service(io, *config, std::move(*device));
  if (Status started = service.start(); !started.is_ok()) {
    KVTIER_LOG_ERROR("cannot allocate tiers: {}", started.to_string());
    return 1;
  }
  ipc::ConnectionLimits limits;
  limits.max_in_flight = config->max_in_flight_per_connection;
  ipc::Server server(io, service, limits);
  service.set_connection_count_source([&server] { return server.connection_count(); });
  if (Status listening = server.listen(config->socket_path); !listening.is_ok()) {
    KVTIER_LOG_ERROR("cannot listen on {}: {}", config->socket_path, listening.message());
    return 1;
  }

  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& ec, int signal_number) {
    if (ec) return;
    KVTIER_LOG_INFO("signal {}: shutting down", signal_number);
    // Closing the acceptor and connections and stopping the timer leaves only
    // in-flight copies as work; run() returns when they are done.
    server.stop();
    service.stop();
  });

  KVTIER_LOG_INFO("kvtierd listening on {} (hbm {}, ram {}, device {})", config->socket_path,
                  format_bytes(config->hbm_bytes), format_bytes(config->ram_bytes), "host");
  io.run();
  KVTIER_LOG_INFO("kvtierd stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run(argc, argv);
}
