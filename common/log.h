// Leveled logging to stderr, one line per event: "I 12:34:56.789 kvtierd: message".
// Thread-safe: each line is written with a single write(2).
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

#include <fmt/format.h>

#include "common/status.h"

namespace kvtier {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

Result<LogLevel> parse_log_level(std::string_view text);  // debug|info|warn|error
void set_log_level(LogLevel level);
bool log_enabled(LogLevel level);
void log_line(LogLevel level, std::string_view message);

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(level)) log_line(level, fmt::format(f, std::forward<Args>(args)...));
}
#define KVTIER_LOG_DEBUG(...) ::kvtier::log(::kvtier::LogLevel::kDebug, __VA_ARGS__)
#define KVTIER_LOG_INFO(...) ::kvtier::log(::kvtier::LogLevel::kInfo, __VA_ARGS__)
#define KVTIER_LOG_WARN(...) ::kvtier::log(::kvtier::LogLevel::kWarn, __VA_ARGS__)
#define KVTIER_LOG_ERROR(...) ::kvtier::log(::kvtier::LogLevel::kError, __VA_ARGS__)

// For a failure that repeats with every request (a full disk): lets one line through
// per interval and counts the ones held back, which the next line reports.
// Thread-safety: none; one owner thread.
class LogThrottle {
 public:
  explicit LogThrottle(std::chrono::milliseconds interval = std::chrono::seconds(10))
      : interval_(interval) {}
  // Whether to log now; when true, `*held_back` is how many were not logged since.
  bool allow(uint64_t* held_back) {
    const auto now = std::chrono::steady_clock::now();
    if (logged_once_ && now - last_ < interval_) {
      ++held_back_;
      return false;
    }
    logged_once_ = true;
    last_ = now;
    *held_back = held_back_;
    held_back_ = 0;
    return true;
  }

 private:
  std::chrono::milliseconds interval_;
  std::chrono::steady_clock::time_point last_{};
  bool logged_once_ = false;
  uint64_t held_back_ = 0;
};

}  // namespace kvtier
