#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>

namespace kvtier {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
}  // namespace

Result<LogLevel> parse_log_level(std::string_view text) {
  if (text == "debug") return LogLevel::kDebug;
  if (text == "info") return LogLevel::kInfo;
  if (text == "warn" || text == "warning") return LogLevel::kWarn;
  if (text == "error") return LogLevel::kError;
  return invalid_argument("log level '{}' is not one of debug, info, warn, error", text);
}

void set_log_level(LogLevel level) {
  g_level.store(static_cast<int>(level));
}

bool log_enabled(LogLevel level) {
  return static_cast<int>(level) >= g_level.load();
}

void log_line(LogLevel level, std::string_view message) {
  static constexpr char kLetters[] = {'D', 'I', 'W', 'E'};
  auto now = std::chrono::system_clock::now();
  std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()) % 1000;
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  std::string line =
      fmt::format("{} {:02}:{:02}:{:02}.{:03} {}\n", kLetters[static_cast<int>(level)], tm.tm_hour,
                  tm.tm_min, tm.tm_sec, millis.count(), message);
  // One write per line keeps lines from different threads whole.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace kvtier
