// Building blocks for the settings table in config.cpp: one maker per kind of value
// (size, duration, fraction, integer, text), each parsing text, printing an exact TOML
// value that parses back, and copying its field; plus the checks shared by settings.
// Internal to the daemon's config; nothing else should need it.
#pragma once

#include <charconv>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "daemon/config.h"
#include "tiers/remote_cluster.h"

namespace kvtier::daemon {

inline constexpr bool kLive = true;      // SIGHUP applies it
inline constexpr bool kRestart = false;  // a change needs a restart

// Exact, re-parseable text: "1GiB", "96MiB", "4097"; "30s", "10m", "250ms".
std::string exact_bytes(uint64_t bytes);
std::string exact_duration(uint64_t millis);

template <typename Field>
std::function<void(DaemonConfig&, const DaemonConfig&)> copy_field(Field DaemonConfig::*field) {
  return [field](DaemonConfig& to, const DaemonConfig& from) { to.*field = from.*field; };
}

Setting size_setting(std::string_view key, uint64_t DaemonConfig::*field, bool reload,
                     std::string_view help);
Setting duration_setting(std::string_view key, uint64_t DaemonConfig::*field, bool reload,
                         std::string_view help);
Setting fraction_setting(std::string_view key, double DaemonConfig::*field, double min, double max,
                         bool reload, std::string_view help);
// `check`, when given, vets the text first (its error becomes the setting's).
Setting text_setting(std::string_view key, std::string DaemonConfig::*field, bool reload,
                     std::string_view help,
                     std::function<Status(std::string_view)> check = nullptr);

template <typename Int>
Setting integer_setting(std::string_view key, Int DaemonConfig::*field, int64_t min, int64_t max,
                        bool reload, std::string_view help) {
  return {key,
          Setting::Kind::kInteger,
          reload,
          help,
          [=](DaemonConfig& config, std::string_view text) -> Status {
            int64_t value = 0;
            auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
            if (ec != std::errc() || end != text.data() + text.size()) {
              return invalid_argument("'{}' is not an integer", text);
            }
            if (value < min || value > max) {
              return invalid_argument("{} is outside {}..{}", value, min, max);
            }
            config.*field = static_cast<Int>(value);
            return Status::ok();
          },
          [field](const DaemonConfig& config) { return std::to_string(config.*field); },
          copy_field(field),
          {}};
}

Status check_device(std::string_view text);        // host | cuda | auto
Status check_gpus(std::string_view text);          // all | GPU-xxxxxxxx-xxxx-…[,GPU-…]
Status check_socket_path(std::string_view text);   // non-empty, fits sockaddr_un
Status check_directory(std::string_view text);     // non-empty, not an existing non-directory
Status check_metrics_addr(std::string_view text);  // IP:PORT or "off"
// "host:port,host:port" (empty: none): the remote tier's seed nodes.
Result<std::vector<remote::Endpoint>> parse_remote_nodes(std::string_view text);
Status check_remote_nodes(std::string_view text);

}  // namespace kvtier::daemon
