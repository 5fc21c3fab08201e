// The settings table and what works on whole configs (validate, print, diff).
// Parsing files and flags is in config_loader.cpp.
#include "daemon/config.h"

#include <grp.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <initializer_list>

#include "common/json.h"
#include "common/units.h"
#include "daemon/setting_kinds.h"
#include "policy/planner.h"

namespace kvtier::daemon {
namespace {

using Kind = Setting::Kind;

Setting log_level_setting() {
  return {"log-level",
          Kind::kText,
          kLive,
          "debug, info, warn or error",
          [](DaemonConfig& config, std::string_view text) -> Status {
            auto level = parse_log_level(text);
            if (!level.is_ok()) return level.status();
            config.log_level = *level;
            return Status::ok();
          },
          [](const DaemonConfig& config) -> std::string {
            static constexpr const char* kNames[] = {"debug", "info", "warn", "error"};
            return json_quote(kNames[static_cast<int>(config.log_level)]);
          },
          copy_field(&DaemonConfig::log_level),
          {}};
}

Setting admin_group_setting() {
  return {"admin-group",
          Kind::kText,
          kRestart,
          "group whose members may use admin requests (uid 0 always may); empty: none",
          // The name is looked up once the file and flags are both applied
          // (resolve_names), so a flag can override a group this host lacks.
          [](DaemonConfig& config, std::string_view text) -> Status {
            config.admin_group = std::string(text);
            config.admin_gid.reset();
            return Status::ok();
          },
          [](const DaemonConfig& config) { return json_quote(config.admin_group); },
          [](DaemonConfig& to, const DaemonConfig& from) {
            to.admin_group = from.admin_group;
            to.admin_gid = from.admin_gid;
          },
          {}};
}

Setting shared_namespace_setting() {
  return {
      "shared-namespace",
      Kind::kTextList,
      kRestart,
      "NAME=UID[,UID...]: put these uids' blocks in one namespace (repeatable)",
      [](DaemonConfig& config, std::string_view spec) -> Status {
        auto eq = spec.find('=');
        if (eq == std::string_view::npos || eq == 0 || eq + 1 == spec.size()) {
          return invalid_argument("'{}': expected NAME=UID[,UID...]", spec);
        }
        std::string name(spec.substr(0, eq));
        std::string_view uids = spec.substr(eq + 1);
        while (true) {
          size_t comma = uids.find(',');
          std::string_view uid_text = uids.substr(0, comma);
          uid_t uid = 0;
          auto [end, ec] = std::from_chars(uid_text.data(), uid_text.data() + uid_text.size(), uid);
          if (uid_text.empty() || ec != std::errc() || end != uid_text.data() + uid_text.size()) {
            return invalid_argument("'{}': '{}' is not a uid", spec, uid_text);
          }
          config.shared_namespaces[uid] = name;
          if (comma == std::string_view::npos) break;
          uids.remove_prefix(comma + 1);
        }
        return Status::ok();
      },
      [](const DaemonConfig& config) {
        std::map<std::string, std::string> by_name;
        for (const auto& [uid, name] : config.shared_namespaces) {
          std::string& uids = by_name[name];
          uids += (uids.empty() ? "" : ",") + std::to_string(uid);
        }
        std::string out = "[";
        for (const auto& [name, uids] : by_name) {
          out += (out.size() > 1 ? ", " : "") + json_quote(name + "=" + uids);
        }
        return out + "]";
      },
      copy_field(&DaemonConfig::shared_namespaces),
      [](DaemonConfig& config) { config.shared_namespaces.clear(); }};
}

Setting tenant_quota_setting() {
  return {"tenant-quota",
          Kind::kTextList,
          kLive,
          "TENANT TIER=SIZE[ TIER=SIZE...]: what a tenant (a namespace: uid:1000 or a "
          "shared-namespace name; * for every tenant not named) keeps of a tier (hbm, ram, "
          "nvme) when it is full, in bytes or a share (25%); tenants over theirs lose blocks "
          "first (repeatable; default: no quotas)",
          [](DaemonConfig& config, std::string_view spec) -> Status {
            auto quota = parse_tenant_quota(spec);
            if (!quota.is_ok()) return quota.status();
            for (const TenantQuota& other : config.tenant_quotas) {
              if (other.tenant == quota->tenant) {
                return invalid_argument("'{}': tenant {} already has a quota ('{}')", spec,
                                        quota->tenant, other.spec);
              }
            }
            config.tenant_quotas.push_back(std::move(*quota));
            return Status::ok();
          },
          [](const DaemonConfig& config) {
            std::string out = "[";
            for (const TenantQuota& quota : config.tenant_quotas) {
              out += (out.size() > 1 ? ", " : "") + json_quote(quota.spec);
            }
            return out + "]";
          },
          copy_field(&DaemonConfig::tenant_quotas),
          [](DaemonConfig& config) { config.tenant_quotas.clear(); }};
}

// Hidden in intent, not in --help: a test-only switch, named as such.
Setting fault_nvme_setting() {
  return {"fault-nvme",
          Kind::kTextList,
          kRestart,
          "TESTS ONLY: inject NVMe faults, KIND:N[+|-M][:ERRNO] (write, read, shortread, "
          "flip, sync, index; repeatable)",
          [](DaemonConfig& config, std::string_view spec) -> Status {
            config.fault_nvme.emplace_back(spec);
            return Status::ok();
          },
          [](const DaemonConfig& config) {
            std::string out = "[";
            for (const std::string& spec : config.fault_nvme) {
              out += (out.size() > 1 ? ", " : "") + json_quote(spec);
            }
            return out + "]";
          },
          copy_field(&DaemonConfig::fault_nvme),
          [](DaemonConfig& config) { config.fault_nvme.clear(); }};
}

Status check_policy(std::string_view text) {
  if (policy::parse_policy_mode(text)) return Status::ok();
  return invalid_argument(
      "'{}' is not a policy: lru, session, predictive, s3fifo, slru, arc, tinylfu-lru, "
      "w-tinylfu or workload",
      text);
}

// THE SETTINGS TABLE. One line per setting; --help, --check-config, `kvtierctl config`
// and SIGHUP all follow it. The table is the groups below, in the order settings() lists
// them.

// Where kvtierd listens and keeps its data, and the copy backend with its GPUs.
std::vector<Setting> socket_and_device_settings() {
  using C = DaemonConfig;
  return {
      text_setting("socket", &C::socket_path, kRestart,
                   "Unix socket path (ignored when systemd "
                   "passes a listening socket)",
                   check_socket_path),
      text_setting("data-dir", &C::data_dir, kRestart, "directory for persistent tier data",
                   check_directory),
      text_setting("device", &C::device, kRestart, "copy backend: host, cuda or auto",
                   check_device),
      text_setting("gpus", &C::gpus, kRestart,
                   "cuda backend: GPUs to serve, \"all\" or comma-separated UUIDs "
                   "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as nvidia-smi -L prints them)",
                   check_gpus),
  };
}

// The local tiers' sizes, the NVMe tier's I/O, and how long requests wait on the tiers.
std::vector<Setting> tier_settings() {
  using C = DaemonConfig;
  return {
      size_setting("hbm-bytes", &C::hbm_bytes, kRestart,
                   "daemon HBM arena size per GPU (e.g. 8GiB; every GPU served gets this much)"),
      size_setting("ram-bytes", &C::ram_bytes, kRestart, "pinned RAM pool size (e.g. 64GiB)"),
      size_setting("nvme-bytes", &C::nvme_bytes, kRestart, "NVMe tier capacity (0: no NVMe tier)"),
      integer_setting("nvme-queue-depth", &C::nvme_queue_depth, 1, 4096, kRestart,
                      "NVMe tier: payload I/Os in flight per io_uring ring"),
      duration_setting("save-room-wait-ms", &C::save_room_wait_ms, kLive,
                       "how long a Save waits for room (blocks going down to NVMe, or being "
                       "copied or read); then it keeps the prefix that fits (0: at once)"),
      duration_setting("nvme-copy-after-ms", &C::nvme_copy_after_ms, kLive,
                       "how long after a Save the blocks it left in HBM/RAM get a copy on "
                       "NVMe, so that a crash loses none (0: only demotions write NVMe)"),
      duration_setting("nvme-load-wait-ms", &C::nvme_load_wait_ms, kLive,
                       "how long a Load waits for blocks being read from NVMe (e.g. 10s)"),
      duration_setting("drain-timeout", &C::drain_timeout_ms, kLive,
                       "on SIGTERM, time allowed to drain RAM/HBM blocks to NVMe (e.g. 30s)"),
  };
}

// The remote tier (a Redis Cluster).
std::vector<Setting> remote_tier_settings() {
  using C = DaemonConfig;
  return {
      text_setting("remote-nodes", &C::remote_nodes, kRestart,
                   "remote tier: seed nodes of the Redis Cluster, host:port,host:port "
                   "(empty: no remote tier)",
                   check_remote_nodes),
      text_setting("remote-user", &C::remote_user, kRestart,
                   "remote tier: Redis ACL user (empty: no AUTH)"),
      text_setting("remote-password-file", &C::remote_password_file, kRestart,
                   "remote tier: file whose first line is the ACL user's password"),
      duration_setting("remote-ttl", &C::remote_ttl_ms, kRestart,
                       "remote tier: every value expires this long after it was written"),
      size_setting("remote-bytes", &C::remote_bytes, kRestart,
                   "remote tier: the most this node keeps stored in the cluster"),
      duration_setting("remote-timeout", &C::remote_timeout_ms, kRestart,
                       "remote tier: connect and command timeout per Redis node"),
      size_setting("remote-max-in-flight", &C::remote_max_in_flight_bytes, kRestart,
                   "remote tier: payload bytes being read (and, separately, written) at "
                   "once; a longer prefix is read in turn"),
  };
}

// How long data requests wait for the memory fill, and the faults tests inject.
std::vector<Setting> startup_and_fault_settings() {
  using C = DaemonConfig;
  return {
      fault_nvme_setting(),
      duration_setting("startup-wait-ms", &C::startup_wait_ms, kLive,
                       "how long a Save/Load/BeginTurn/Drain that arrives while the memory "
                       "pools are still being filled waits for them (e.g. 10s)"),
      duration_setting("fault-fill-delay-ms", &C::fault_fill_delay_ms, kRestart,
                       "TESTS ONLY: report the memory pools filled this much later"),
      duration_setting("fault-region-open-delay-ms", &C::fault_region_open_delay_ms, kRestart,
                       "TESTS ONLY: open each engine region this much later"),
      duration_setting("fault-start-delay-ms", &C::fault_start_delay_ms, kRestart,
                       "TESTS ONLY: listen on the socket this much later"),
      duration_setting("fault-copy-delay-ms", &C::fault_copy_delay_ms, kRestart,
                       "TESTS ONLY: complete each Save/Load copy this much later, one at a "
                       "time in submission order (the copy itself runs as usual)"),
  };
}

// How slots are carved and what the planner keeps where: idle times, watermarks, the
// policy and its cost model.
std::vector<Setting> placement_settings() {
  using C = DaemonConfig;
  return {
      size_setting("slab-bytes", &C::slab_bytes, kRestart,
                   "slot carving unit; the largest block a layout may have"),
      duration_setting("hbm-idle-ms", &C::hbm_idle_ms, kLive,
                       "idle time after which a session leaves HBM (e.g. 30s)"),
      duration_setting("ram-idle-ms", &C::ram_idle_ms, kLive,
                       "idle time after which a session leaves RAM for NVMe (e.g. 10m)"),
      fraction_setting("hbm-high-watermark", &C::hbm_high_watermark, 0.05, 1.0, kLive,
                       "HBM fill fraction that starts demotion"),
      fraction_setting("hbm-low-watermark", &C::hbm_low_watermark, 0.0, 1.0, kLive,
                       "HBM fill fraction demotion stops at"),
      duration_setting("plan-interval-ms", &C::plan_interval_ms, kLive,
                       "how often the planner runs (e.g. 100ms)"),
      text_setting("policy", &C::policy, kLive,
                   "placement policy: lru, session or predictive; or a peer's, as a baseline: "
                   "s3fifo, slru, arc, tinylfu-lru, w-tinylfu, workload (docs/policy.md)",
                   check_policy),
      fraction_setting("ram-high-watermark", &C::ram_high_watermark, 0.05, 1.0, kLive,
                       "RAM fill fraction that starts demotion to NVMe (or eviction)"),
      fraction_setting("ram-low-watermark", &C::ram_low_watermark, 0.0, 1.0, kLive,
                       "RAM fill fraction demotion stops at"),
      fraction_setting("nvme-high-watermark", &C::nvme_high_watermark, 0.05, 1.0, kLive,
                       "NVMe fill fraction that starts eviction"),
      fraction_setting("nvme-low-watermark", &C::nvme_low_watermark, 0.0, 1.0, kLive,
                       "NVMe fill fraction eviction stops at"),
      fraction_setting("hbm-read-gbps", &C::hbm_read_gbps, 0.001, 1e6, kLive,
                       "cost model: GB/s from the HBM arena into an engine"),
      fraction_setting("ram-read-gbps", &C::ram_read_gbps, 0.001, 1e6, kLive,
                       "cost model: GB/s from the RAM pool into an engine (PCIe)"),
      fraction_setting("nvme-read-gbps", &C::nvme_read_gbps, 0.001, 1e6, kLive,
                       "cost model: GB/s from NVMe into an engine"),
      fraction_setting("prefill-tokens-per-s", &C::prefill_tokens_per_s, 1, 1e9, kLive,
                       "cost model: prefill speed of engines that do not report one in Hello"),
      fraction_setting("prefetch-probability", &C::prefetch_probability, 0.0, 1.0, kLive,
                       "predictive policy: P(return within a tier's idle time) that keeps a "
                       "session in, or prefetches it into, that tier"),
  };
}

// Copy threads, and what one request, one connection and all of them may take.
std::vector<Setting> resource_limit_settings() {
  using C = DaemonConfig;
  return {
      integer_setting("copy-threads", &C::copy_threads, 1, 64, kRestart,
                      "host backend copy threads"),
      integer_setting("max-blocks-per-request", &C::max_blocks_per_request, 1, 1 << 20, kRestart,
                      "largest Save/Load/Lookup block list accepted"),
      integer_setting("max-regions-per-connection", &C::max_regions_per_connection, 1, 4096,
                      kRestart, "KV regions one connection may register"),
      integer_setting("max-in-flight-per-connection", &C::max_in_flight_per_connection, 1, 4096,
                      kRestart, "requests one connection may have in flight"),
      integer_setting("max-tier-notices-per-connection", &C::max_tier_notices_per_connection, 1,
                      1 << 24, kRestart,
                      "blocks noted for a connection's tier notices (WatchTiers) until it asks; "
                      "past it they are dropped and it is told to look its blocks up again"),
      size_setting("max-request-bytes-per-connection", &C::max_request_bytes_per_connection,
                   kRestart,
                   "received requests one connection may have being handled, in bytes; reading "
                   "from it pauses at this"),
      size_setting("max-reply-bytes-per-connection", &C::max_reply_bytes_per_connection, kRestart,
                   "replies waiting for one connection to read them, in bytes; reading from it "
                   "pauses at this"),
      integer_setting("max-connections", &C::max_connections, 1, 1 << 20, kRestart,
                      "open connections; more are refused (resource exhausted, retryable)"),
      integer_setting("max-connections-per-tenant", &C::max_connections_per_tenant, 1, 1 << 20,
                      kRestart,
                      "open connections one peer uid may hold; more from it are refused "
                      "(root and the admin group are not held to it)"),
      integer_setting("admin-reserved-connections", &C::admin_reserved_connections, 0, 1 << 20,
                      kRestart,
                      "the last this many of max-connections (at most half of them) only root "
                      "and the admin group may take, so kvtierctl answers however many others "
                      "hold"),
      duration_setting("hello-timeout", &C::hello_timeout_ms, kRestart,
                       "a connection must send its first request (Hello, or an operator "
                       "request) within this or it is closed (0: no deadline)"),
  };
}

// Who may use admin requests and which uids share a namespace; /metrics and the log
// level.
std::vector<Setting> access_and_monitoring_settings() {
  using C = DaemonConfig;
  return {
      admin_group_setting(),
      shared_namespace_setting(),
      text_setting("metrics-addr", &C::metrics_addr, kRestart,
                   "HOST:PORT for Prometheus /metrics (an IP address; \"off\" disables)",
                   check_metrics_addr),
      log_level_setting(),
  };
}

// The groups' settings, in the groups' order.
std::vector<Setting> concatenate(std::initializer_list<std::vector<Setting>> groups) {
  std::vector<Setting> table;
  for (const std::vector<Setting>& group : groups) {
    table.insert(table.end(), group.begin(), group.end());
  }
  return table;
}

}  // namespace

const std::vector<Setting>& settings() {
  static const std::vector<Setting> table = concatenate({
      socket_and_device_settings(),
      tier_settings(),
      remote_tier_settings(),
      {tenant_quota_setting()},
      startup_and_fault_settings(),
      placement_settings(),
      resource_limit_settings(),
      access_and_monitoring_settings(),
  });
  return table;
}

const Setting* find_setting(std::string_view key) {
  for (const Setting& setting : settings()) {
    if (setting.key == key) return &setting;
  }
  return nullptr;
}

Status resolve_names(DaemonConfig& config) {
  config.admin_gid.reset();
  if (config.admin_group.empty()) return Status::ok();
  group* entry = ::getgrnam(config.admin_group.c_str());
  if (entry == nullptr) {
    return invalid_argument(
        "admin-group: no group named '{}' (create it, or set admin-group = \"\")",
        config.admin_group);
  }
  config.admin_gid = entry->gr_gid;
  return Status::ok();
}

Status validate(const DaemonConfig& config) {
  if (config.nvme_bytes != 0 && config.ram_bytes == 0) {
    return invalid_argument(
        "nvme-bytes: the NVMe tier reads and writes through the RAM pool; "
        "ram-bytes must not be 0");
  }
  if (config.hbm_bytes == 0 && config.ram_bytes == 0) {
    return invalid_argument("hbm-bytes and ram-bytes are both 0: there is nowhere to keep blocks");
  }
  if (config.slab_bytes < 4096) return invalid_argument("slab-bytes must be at least 4KiB");
  // Below one frame's worth a connection would pause after every request.
  if (config.max_request_bytes_per_connection < (64 << 10)) {
    return invalid_argument("max-request-bytes-per-connection must be at least 64KiB");
  }
  if (config.max_reply_bytes_per_connection < (64 << 10)) {
    return invalid_argument("max-reply-bytes-per-connection must be at least 64KiB");
  }
  if (config.hbm_low_watermark > config.hbm_high_watermark) {
    return invalid_argument("hbm-low-watermark ({}) is above hbm-high-watermark ({})",
                            config.hbm_low_watermark, config.hbm_high_watermark);
  }
  if (config.plan_interval_ms == 0) return invalid_argument("plan-interval-ms must be positive");
  if (config.ram_low_watermark > config.ram_high_watermark) {
    return invalid_argument("ram-low-watermark ({}) is above ram-high-watermark ({})",
                            config.ram_low_watermark, config.ram_high_watermark);
  }
  if (config.nvme_low_watermark > config.nvme_high_watermark) {
    return invalid_argument("nvme-low-watermark ({}) is above nvme-high-watermark ({})",
                            config.nvme_low_watermark, config.nvme_high_watermark);
  }
  if (!config.remote_nodes.empty()) {
    if (config.remote_bytes == 0) return invalid_argument("remote-bytes must be positive");
    if (config.remote_timeout_ms == 0) return invalid_argument("remote-timeout must be positive");
    if (config.remote_max_in_flight_bytes == 0) {
      return invalid_argument("remote-max-in-flight must be positive");
    }
    if (config.remote_ttl_ms == 0) return invalid_argument("remote-ttl must be positive");
  }
  return Status::ok();
}

std::vector<std::string> gpu_uuid_list(const DaemonConfig& config) {
  std::vector<std::string> uuids;
  if (config.gpus == "all") return uuids;
  std::string_view text = config.gpus;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    std::string uuid(text.substr(0, comma));
    // The hex digits in lower case, as the CUDA device prints them; "GPU-" stays.
    for (size_t i = 4; i < uuid.size(); ++i) {
      uuid[i] = static_cast<char>(std::tolower(static_cast<unsigned char>(uuid[i])));
    }
    uuids.push_back(std::move(uuid));
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return uuids;
}

std::string default_socket_path() {
  if (const char* runtime = std::getenv("XDG_RUNTIME_DIR"); runtime && *runtime) {
    return std::string(runtime) + "/kvtier/kvtierd.sock";
  }
  return "./var/kvtierd.sock";
}

DaemonConfig default_config() {
  DaemonConfig config;
  config.socket_path = default_socket_path();
  return config;
}

std::string to_toml(const DaemonConfig& config) {
  std::string out = "# kvtierd effective configuration\n";
  for (const Setting& setting : settings()) {
    out += fmt::format("\n# {}{}\n{} = {}\n", setting.help,
                       setting.reloadable ? " [SIGHUP reloads]" : "", setting.key,
                       setting.get(config));
  }
  return out;
}

std::vector<ConfigEntry> describe(const DaemonConfig& config) {
  std::vector<ConfigEntry> entries;
  for (const Setting& setting : settings()) {
    entries.push_back({std::string(setting.key), setting.get(config), setting.reloadable});
  }
  return entries;
}

std::vector<std::string> changed_keys(const DaemonConfig& a, const DaemonConfig& b) {
  std::vector<std::string> keys;
  for (const Setting& setting : settings()) {
    if (setting.get(a) != setting.get(b)) keys.emplace_back(setting.key);
  }
  return keys;
}

DaemonConfig with_reloadable_settings(const DaemonConfig& running, const DaemonConfig& fresh) {
  DaemonConfig out = running;
  for (const Setting& setting : settings()) {
    if (setting.reloadable) setting.copy(out, fresh);
  }
  return out;
}

}  // namespace kvtier::daemon
