// DaemonConfig: everything kvtierd can be told, with its defaults, and the command
// line that sets it (`--config FILE` loads a file of the same keys; flags override).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/log.h"
#include "common/status.h"

namespace kvtier::daemon {

struct DaemonConfig {
  std::string socket_path;  // default: $XDG_RUNTIME_DIR/kvtier/kvtierd.sock or ./var/kvtierd.sock
  std::string data_dir = "./var";     // NVMe tier data (used by the NVMe tier)
  std::string device = "auto";        // host | cuda | auto
  uint64_t hbm_bytes = 1ull << 30;    // daemon arena ("HBM"; host memory on the host backend)
  uint64_t ram_bytes = 2ull << 30;    // pinned RAM pool
  uint64_t slab_bytes = 64ull << 20;  // slot carving unit; also the largest block size
  uint64_t hbm_idle_ms = 30'000;      // idle sessions leave HBM after this long
  uint64_t ram_idle_ms = 600'000;     // idle sessions leave RAM (applies once the NVMe tier exists)
  double hbm_high_watermark = 0.90;
  double hbm_low_watermark = 0.75;
  uint64_t plan_interval_ms = 100;  // how often the planner runs
  int copy_threads = 2;             // host backend memcpy workers
  uint32_t max_blocks_per_request = 4096;
  uint32_t max_regions_per_connection = 64;
  uint32_t max_in_flight_per_connection = 64;
  std::optional<gid_t> admin_gid;  // members may use admin requests (besides uid 0)
  // uid → shared namespace name; unlisted uids get their own namespace "uid:N".
  std::map<uid_t, std::string> shared_namespaces;
  LogLevel log_level = LogLevel::kInfo;
};

// Parses argv. Returns the config, or an InvalidArgument naming the bad flag. On
// --help/--version prints and returns NotFound with an empty message (exit 0).
Result<DaemonConfig> parse_command_line(int argc, char** argv);

std::string default_socket_path();

}  // namespace kvtier::daemon
