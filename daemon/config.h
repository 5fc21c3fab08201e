// DaemonConfig: everything kvtierd can be told, with its defaults, and where it comes
// from: a TOML file (`--config FILE`, e.g. /etc/kvtier/kvtierd.toml) and command-line
// flags, which override the file. Every setting has one name used in both places: the
// flag `--hbm-bytes` is the key `hbm-bytes` in the file.
//
// The settings themselves are one table in config.cpp (`settings()`): name, help,
// whether SIGHUP may change it, how to parse, print and copy it (the makers for each
// kind of value are in setting_kinds.h). Adding a setting is a field here plus one line
// in that table.
//
// Errors name the key (and the file line): "kvtierd.toml:3: hbm-bytes: size 'lots'
// does not start with a number"; unknown keys are errors, never ignored.
//
// Thread-safety: values and pure functions; parse on one thread, copy freely.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/log.h"
#include "common/status.h"
#include "daemon/tenant_quota.h"

namespace kvtier::daemon {

inline constexpr std::string_view kDefaultMetricsAddr = "127.0.0.1:9478";

struct DaemonConfig {
  std::string socket_path;  // default: $XDG_RUNTIME_DIR/kvtier/kvtierd.sock or ./var/kvtierd.sock
  std::string data_dir = "./var";       // NVMe tier data (used by the NVMe tier)
  std::string device = "auto";          // host | cuda | auto
  std::string gpus = "all";             // cuda: "all" or GPU UUIDs, comma-separated
  uint64_t hbm_bytes = 1ull << 30;      // daemon arena ("HBM") per GPU; host memory on the host
                                        // backend
  uint64_t ram_bytes = 2ull << 30;      // pinned RAM pool
  uint64_t nvme_bytes = 0;              // NVMe tier capacity; 0 = no NVMe tier
  uint32_t nvme_queue_depth = 32;       // NVMe tier: payload I/Os in flight per io_uring ring
  uint64_t nvme_load_wait_ms = 10'000;  // a Load waits this long for blocks read from NVMe
  // A Save's blocks still in HBM/RAM this long after it get an NVMe copy (0: never).
  uint64_t nvme_copy_after_ms = 1'000;
  // A Save that finds every tier full of blocks being copied or read waits this long for
  // room (0: refused at once with resource_exhausted).
  uint64_t save_room_wait_ms = 250;
  uint64_t drain_timeout_ms = 30'000;  // SIGTERM: time to drain RAM/HBM to NVMe before exit
  // The remote tier (tiers/remote_*.h): a Redis Cluster shared by a fleet. Empty
  // remote_nodes: none.
  std::string remote_nodes;                      // "host:port,host:port": seeds of the cluster
  std::string remote_user;                       // ACL user ("": none)
  std::string remote_password_file;              // its password, the file's first line
  uint64_t remote_ttl_ms = 24ull * 3600 * 1000;  // every value expires after this
  uint64_t remote_bytes = 8ull << 30;            // what this node keeps stored there
  uint64_t remote_timeout_ms = 1'000;            // connect and command timeout per node
  uint64_t remote_max_in_flight_bytes = 256ull << 20;  // reads (and writes) at once
  // TESTS ONLY: slab-file I/O faults to inject (tiers/nvme_io.h, "KIND:N[+][:ERRNO]").
  std::vector<std::string> fault_nvme;
  // A data request arriving while the tier memory is still being filled waits this
  // long for it, then gets Unavailable (daemon/startup_gate.h).
  uint64_t startup_wait_ms = 10'000;
  // TESTS ONLY: the fill reports done this much later (the start-up window, made wide).
  uint64_t fault_fill_delay_ms = 0;
  // TESTS ONLY: the region worker waits this long before opening each region.
  uint64_t fault_region_open_delay_ms = 0;
  // TESTS ONLY: kvtierd waits this long before it listens (signals sent while it starts).
  uint64_t fault_start_delay_ms = 0;
  // TESTS ONLY: an engine's copies (Save, Load) complete this much later, one at a time
  // in submission order (daemon/copy_delay.h). 0: off.
  uint64_t fault_copy_delay_ms = 0;
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
  // Blocks noted for one connection's tier notices (daemon/tier_watch.h) before they are
  // dropped and the engine told to resynchronise.
  uint32_t max_tier_notices_per_connection = 65536;
  uint64_t max_request_bytes_per_connection = 64ull << 20;  // received frames being handled
  uint64_t max_reply_bytes_per_connection = 32ull << 20;    // replies the engine has not read
  uint32_t max_connections = 512;
  // Per peer uid (a tenant); admins are not held to it.
  uint32_t max_connections_per_tenant = 128;
  // What each tenant keeps of a tier when the tier is full (daemon/tenant_quota.h);
  // empty: no quotas.
  std::vector<TenantQuota> tenant_quotas;
  // The last this many of max_connections are kept for root and the admin group.
  uint32_t admin_reserved_connections = 8;
  // A connection's first request (Hello, or an operator request) must come within this.
  uint64_t hello_timeout_ms = 5'000;
  std::string admin_group;         // name as configured (empty: none)
  std::optional<gid_t> admin_gid;  // members may use admin requests (besides uid 0)
  // uid → shared namespace name; unlisted uids get their own namespace "uid:N".
  std::map<uid_t, std::string> shared_namespaces;
  // HOST:PORT of the Prometheus endpoint (/metrics); "off" disables it. The host must
  // be an IP address; the default is loopback.
  std::string metrics_addr = std::string(kDefaultMetricsAddr);
  LogLevel log_level = LogLevel::kInfo;

  // Placement policy (policy/planner.h) and its inputs.
  std::string policy = "predictive";  // lru | session | predictive
  double ram_high_watermark = 0.90;   // RAM fill that starts demotion to NVMe (or eviction)
  double ram_low_watermark = 0.75;
  double nvme_high_watermark = 0.98;  // NVMe fill that starts eviction
  double nvme_low_watermark = 0.95;
  double hbm_read_gbps = 1000;         // cost model: arena → engine, GB/s
  double ram_read_gbps = 25;           // cost model: RAM pool → engine (PCIe), GB/s
  double nvme_read_gbps = 5;           // cost model: NVMe → engine, GB/s
  double prefill_tokens_per_s = 8000;  // engines whose Hello reports no prefill speed
  double prefetch_probability = 0.5;   // P(return within a tier's idle threshold) that keeps
                                       // a session in, or prefetches it into, that tier
};

// One setting: its key (the flag is "--" + key), help, whether SIGHUP applies it, and
// how to set it from text, print it as a TOML value, and copy it between configs.
struct Setting {
  enum class Kind {
    kSize,      // "4GiB" or an integer number of bytes
    kDuration,  // "30s" or an integer number of milliseconds
    kNumber,    // a float (or integer)
    kInteger,   // an integer
    kText,      // a string
    kTextList,  // an array of strings (a repeatable flag)
  };
  std::string_view key;
  Kind kind;
  bool reloadable;  // SIGHUP applies a new value; otherwise a change needs a restart
  std::string_view help;
  // Parses `text` into the config; InvalidArgument without the key (the caller adds it).
  // For kTextList, called once per element after clear().
  std::function<Status(DaemonConfig&, std::string_view text)> set;
  std::function<std::string(const DaemonConfig&)> get;  // a TOML value: "\"4GiB\"", "0.9"
  std::function<void(DaemonConfig& to, const DaemonConfig& from)> copy;
  std::function<void(DaemonConfig&)> clear;  // kTextList only: before a new list
};

// Every setting, in the order --help and --check-config print them.
const std::vector<Setting>& settings();
const Setting* find_setting(std::string_view key);

// Looks up names the system must know (admin-group → gid). Errors name the key.
Status resolve_names(DaemonConfig& config);
// Checks what no single setting can: combinations and cross-field limits.
Status validate(const DaemonConfig& config);

// The GPUs `gpus` names, lower case, in the order given; empty for "all".
std::vector<std::string> gpu_uuid_list(const DaemonConfig& config);

// The config a fresh daemon starts from (socket path from the environment).
DaemonConfig default_config();
std::string default_socket_path();

// Reads a TOML file of settings into `config` (later flags override it). Errors name
// the file, line and key; unknown keys and wrong value types are errors.
Status apply_config_file(const std::string& path, DaemonConfig& config);
// The same for TOML text; errors name `source` (a file name) and the line.
Status apply_config_text(std::string_view text, const std::string& source, DaemonConfig& config);

// The effective config as a TOML document (what --check-config prints).
std::string to_toml(const DaemonConfig& config);

struct ConfigEntry {
  std::string key;
  std::string value;  // as a TOML value
  bool reloadable;
};
std::vector<ConfigEntry> describe(const DaemonConfig& config);

// Keys whose values differ between `a` and `b`, in table order.
std::vector<std::string> changed_keys(const DaemonConfig& a, const DaemonConfig& b);
// `running` with every reloadable setting taken from `fresh`.
DaemonConfig with_reloadable_settings(const DaemonConfig& running, const DaemonConfig& fresh);

struct CommandLine {
  DaemonConfig config;
  std::string config_file;    // --config FILE, empty when none
  bool check_config = false;  // --check-config: validate, print the effective config, exit
};

// Parses argv: defaults, then --config FILE, then flags. Returns InvalidArgument naming
// the bad flag or key. On --help/--version prints and returns NotFound with an empty
// message (exit 0).
Result<CommandLine> parse_command_line(int argc, const char* const* argv);

}  // namespace kvtier::daemon
