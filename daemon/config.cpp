#include "daemon/config.h"

#include <grp.h>

#include <CLI/CLI.hpp>

#include <cstdlib>

#include "common/units.h"

namespace kvtier::daemon {

std::string default_socket_path() {
  if (const char* runtime = std::getenv("XDG_RUNTIME_DIR"); runtime && *runtime) {
    return std::string(runtime) + "/kvtier/kvtierd.sock";
  }
  return "./var/kvtierd.sock";
}

Result<DaemonConfig> parse_command_line(int argc, char** argv) {
  DaemonConfig config;
  config.socket_path = default_socket_path();
  std::string hbm = "1GiB", ram = "2GiB", nvme = "0", slab = "64MiB";
  std::string hbm_idle = "30s", ram_idle = "10m", plan_interval = "100ms";
  std::string log_level = "info", admin_group;
  std::vector<std::string> shared;

  CLI::App app{"kvtierd: keeps LLM KV caches alive between the turns of a conversation"};
  app.set_config("--config", "", "read options from a TOML file (flags override it)");
  app.add_option("--socket", config.socket_path, "Unix socket path");
  app.add_option("--data-dir", config.data_dir, "directory for persistent tier data");
  app.add_option("--device", config.device, "copy backend: host, cuda or auto")
      ->check(CLI::IsMember({"host", "cuda", "auto"}));
  app.add_option("--hbm-bytes", hbm, "daemon HBM arena size (e.g. 1GiB)");
  app.add_option("--ram-bytes", ram, "pinned RAM pool size (e.g. 8GiB)");
  app.add_option("--nvme-bytes", nvme,
                 "NVMe tier capacity (the NVMe tier is not built yet: must be 0)");
  app.add_option("--slab-bytes", slab, "slot carving unit; the largest block a layout may have");
  app.add_option("--hbm-idle-ms", hbm_idle,
                 "idle time after which a session leaves HBM (e.g. 30s)");
  app.add_option("--ram-idle-ms", ram_idle, "idle time after which a session leaves RAM for NVMe");
  app.add_option("--hbm-high-watermark", config.hbm_high_watermark,
                 "HBM fill fraction that starts demotion")
      ->check(CLI::Range(0.05, 1.0));
  app.add_option("--hbm-low-watermark", config.hbm_low_watermark,
                 "HBM fill fraction demotion stops at")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--plan-interval-ms", plan_interval, "how often the planner runs");
  app.add_option("--copy-threads", config.copy_threads, "host backend copy threads")
      ->check(CLI::Range(1, 64));
  app.add_option("--admin-group", admin_group, "group whose members may use admin requests");
  app.add_option("--shared-namespace", shared,
                 "NAME=UID[,UID...]: put these uids' blocks in one namespace (repeatable)");
  app.add_option("--log-level", log_level, "debug, info, warn or error");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return Status(StatusCode::kNotFound, "");
  } catch (const CLI::ParseError& e) {
    return invalid_argument("{}", e.what());
  }

  auto size_flag = [](const std::string& flag, const std::string& text) -> Result<uint64_t> {
    auto bytes = parse_bytes(text);
    if (!bytes.is_ok()) return invalid_argument("{}: {}", flag, bytes.status().message());
    return bytes;
  };
  auto duration_flag = [](const std::string& flag, const std::string& text) -> Result<uint64_t> {
    auto millis = parse_duration_ms(text);
    if (!millis.is_ok()) return invalid_argument("{}: {}", flag, millis.status().message());
    return millis;
  };
  auto hbm_bytes = size_flag("--hbm-bytes", hbm);
  if (!hbm_bytes.is_ok()) return hbm_bytes.status();
  auto ram_bytes = size_flag("--ram-bytes", ram);
  if (!ram_bytes.is_ok()) return ram_bytes.status();
  auto nvme_bytes = size_flag("--nvme-bytes", nvme);
  if (!nvme_bytes.is_ok()) return nvme_bytes.status();
  auto slab_bytes = size_flag("--slab-bytes", slab);
  if (!slab_bytes.is_ok()) return slab_bytes.status();
  auto idle = duration_flag("--hbm-idle-ms", hbm_idle);
  if (!idle.is_ok()) return idle.status();
  auto ram_idle_ms = duration_flag("--ram-idle-ms", ram_idle);
  if (!ram_idle_ms.is_ok()) return ram_idle_ms.status();
  auto interval = duration_flag("--plan-interval-ms", plan_interval);
  if (!interval.is_ok()) return interval.status();
  auto level = parse_log_level(log_level);
  if (!level.is_ok()) return invalid_argument("--log-level: {}", level.status().message());

  if (*nvme_bytes != 0) {
    return invalid_argument("--nvme-bytes: the NVMe tier is not available in this version; use 0");
  }
  if (*hbm_bytes == 0 && *ram_bytes == 0) {
    return invalid_argument(
        "--hbm-bytes and --ram-bytes are both 0: there is nowhere to keep blocks");
  }
  if (*slab_bytes < 4096) return invalid_argument("--slab-bytes must be at least 4KiB");
  if (config.hbm_low_watermark > config.hbm_high_watermark) {
    return invalid_argument("--hbm-low-watermark ({}) is above --hbm-high-watermark ({})",
                            config.hbm_low_watermark, config.hbm_high_watermark);
  }
  if (*interval == 0) return invalid_argument("--plan-interval-ms must be positive");
  config.hbm_bytes = *hbm_bytes;
  config.ram_bytes = *ram_bytes;
  config.slab_bytes = *slab_bytes;
  config.hbm_idle_ms = *idle;
  config.ram_idle_ms = *ram_idle_ms;
  config.plan_interval_ms = *interval;
  config.log_level = *level;

  if (!admin_group.empty()) {
    group* entry = ::getgrnam(admin_group.c_str());
    if (entry == nullptr)
      return invalid_argument("--admin-group: no group named '{}'", admin_group);
    config.admin_gid = entry->gr_gid;
  }
  for (const std::string& spec : shared) {
    auto eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
      return invalid_argument("--shared-namespace '{}': expected NAME=UID[,UID...]", spec);
    }
    std::string name = spec.substr(0, eq);
    std::string uids = spec.substr(eq + 1);
    size_t start = 0;
    while (start <= uids.size()) {
      size_t comma = uids.find(',', start);
      std::string uid_text =
          uids.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      char* end = nullptr;
      unsigned long uid = std::strtoul(uid_text.c_str(), &end, 10);
      if (uid_text.empty() || *end != '\0') {
        return invalid_argument("--shared-namespace '{}': '{}' is not a uid", spec, uid_text);
      }
      config.shared_namespaces[static_cast<uid_t>(uid)] = name;
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  return config;
}

}  // namespace kvtier::daemon
