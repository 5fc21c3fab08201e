// Leveled logging to stderr, one line per event: "I 12:34:56.789 kvtierd: message".
// Thread-safe: each line is written with a single write(2).
#pragma once

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

}  // namespace kvtier
