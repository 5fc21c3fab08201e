#include "daemon/setting_kinds.h"

#include <sys/stat.h>
#include <sys/un.h>

#include <boost/asio/ip/address.hpp>

#include <algorithm>
#include <cctype>
#include <vector>

#include "common/json.h"
#include "common/units.h"

namespace kvtier::daemon {

using Kind = Setting::Kind;

// Exact, re-parseable text: "1GiB", "96MiB", "4097".
std::string exact_bytes(uint64_t bytes) {
  static constexpr std::pair<uint64_t, const char*> kUnits[] = {
      {1ull << 40, "TiB"}, {1ull << 30, "GiB"}, {1ull << 20, "MiB"}, {1ull << 10, "KiB"}};
  for (auto [factor, name] : kUnits) {
    if (bytes != 0 && bytes % factor == 0) return fmt::format("{}{}", bytes / factor, name);
  }
  return std::to_string(bytes);
}

std::string exact_duration(uint64_t millis) {
  if (millis != 0 && millis % 3'600'000 == 0) return fmt::format("{}h", millis / 3'600'000);
  if (millis != 0 && millis % 60'000 == 0) return fmt::format("{}m", millis / 60'000);
  if (millis != 0 && millis % 1000 == 0) return fmt::format("{}s", millis / 1000);
  return fmt::format("{}ms", millis);
}

Setting size_setting(std::string_view key, uint64_t DaemonConfig::*field, bool reload,
                     std::string_view help) {
  return {key,
          Kind::kSize,
          reload,
          help,
          [field](DaemonConfig& config, std::string_view text) -> Status {
            auto bytes = parse_bytes(text);
            if (!bytes.is_ok()) return bytes.status();
            config.*field = *bytes;
            return Status::ok();
          },
          [field](const DaemonConfig& config) { return json_quote(exact_bytes(config.*field)); },
          copy_field(field),
          {}};
}

Setting duration_setting(std::string_view key, uint64_t DaemonConfig::*field, bool reload,
                         std::string_view help) {
  return {key,
          Kind::kDuration,
          reload,
          help,
          [field](DaemonConfig& config, std::string_view text) -> Status {
            auto millis = parse_duration_ms(text);
            if (!millis.is_ok()) return millis.status();
            config.*field = *millis;
            return Status::ok();
          },
          [field](const DaemonConfig& config) { return json_quote(exact_duration(config.*field)); },
          copy_field(field),
          {}};
}

Setting fraction_setting(std::string_view key, double DaemonConfig::*field, double min, double max,
                         bool reload, std::string_view help) {
  return {key,
          Kind::kNumber,
          reload,
          help,
          [=](DaemonConfig& config, std::string_view text) -> Status {
            double value = 0;
            auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
            if (ec != std::errc() || end != text.data() + text.size()) {
              return invalid_argument("'{}' is not a number", text);
            }
            if (value < min || value > max) {
              return invalid_argument("{} is outside {}..{}", value, min, max);
            }
            config.*field = value;
            return Status::ok();
          },
          [field](const DaemonConfig& config) { return fmt::format("{}", config.*field); },
          copy_field(field),
          {}};
}

Setting text_setting(std::string_view key, std::string DaemonConfig::*field, bool reload,
                     std::string_view help, std::function<Status(std::string_view)> check) {
  return {key,
          Kind::kText,
          reload,
          help,
          [field, check](DaemonConfig& config, std::string_view text) -> Status {
            if (check) KVTIER_RETURN_IF_ERROR(check(text));
            config.*field = std::string(text);
            return Status::ok();
          },
          [field](const DaemonConfig& config) { return json_quote(config.*field); },
          copy_field(field),
          {}};
}

Status check_device(std::string_view text) {
  if (text == "host" || text == "cuda" || text == "auto") return Status::ok();
  return invalid_argument("'{}' is not one of host, cuda, auto", text);
}

namespace {

// "GPU-" and 8-4-4-4-12 hex digits, as nvidia-smi -L and the CUDA driver print it.
bool is_gpu_uuid(std::string_view text) {
  static constexpr std::string_view kShape = "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
  if (text.size() != kShape.size() || text.substr(0, 4) != "GPU-") return false;
  for (size_t i = 4; i < text.size(); ++i) {
    if (kShape[i] == '-' ? text[i] != '-' : !std::isxdigit(static_cast<unsigned char>(text[i])))
      return false;
  }
  return true;
}

}  // namespace

Result<std::vector<remote::Endpoint>> parse_remote_nodes(std::string_view text) {
  std::vector<remote::Endpoint> out;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    auto endpoint = remote::parse_endpoint(text.substr(0, comma));
    if (!endpoint.is_ok()) return endpoint.status();
    out.push_back(std::move(*endpoint));
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return out;
}

Status check_remote_nodes(std::string_view text) {
  return parse_remote_nodes(text).status();
}

Status check_gpus(std::string_view text) {
  if (text == "all") return Status::ok();
  if (text.empty())
    return invalid_argument("empty: use \"all\" or a comma-separated list of GPU UUIDs");
  std::vector<std::string> seen;
  while (true) {
    const size_t comma = text.find(',');
    std::string_view uuid = text.substr(0, comma);
    if (!is_gpu_uuid(uuid)) {
      return invalid_argument(
          "'{}' is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as nvidia-smi -L "
          "prints it) or \"all\"",
          uuid);
    }
    std::string lower(uuid);
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (std::find(seen.begin(), seen.end(), lower) != seen.end()) {
      return invalid_argument("{} is listed twice", uuid);
    }
    seen.push_back(std::move(lower));
    if (comma == std::string_view::npos) return Status::ok();
    text.remove_prefix(comma + 1);
  }
}

Status check_socket_path(std::string_view text) {
  if (text.empty()) return invalid_argument("the path is empty");
  if (text.size() >= sizeof(sockaddr_un::sun_path)) {
    return invalid_argument("'{}' is {} bytes; a Unix socket path may have at most {}", text,
                            text.size(), sizeof(sockaddr_un::sun_path) - 1);
  }
  return Status::ok();
}

Status check_directory(std::string_view text) {
  if (text.empty()) return invalid_argument("the path is empty");
  struct stat info {};
  if (::stat(std::string(text).c_str(), &info) == 0 && !S_ISDIR(info.st_mode)) {
    return invalid_argument("'{}' exists and is not a directory", text);
  }
  return Status::ok();
}

Status check_metrics_addr(std::string_view text) {
  if (text == "off") return Status::ok();
  size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) {
    return invalid_argument("'{}' is not HOST:PORT (or \"off\")", text);
  }
  std::string host(text.substr(0, colon));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  boost::system::error_code error;
  boost::asio::ip::make_address(host, error);
  if (error) return invalid_argument("'{}': the host must be an IP address", text);
  std::string_view port_text = text.substr(colon + 1);
  unsigned port = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc() || end != port_text.data() + port_text.size() ||
      port > 65535) {
    return invalid_argument("'{}': port '{}' is not 0..65535", text, port_text);
  }
  return Status::ok();
}

}  // namespace kvtier::daemon
