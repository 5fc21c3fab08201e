#include "common/units.h"

#include <cctype>
#include <charconv>
#include <cmath>

namespace kvtier {
namespace {

struct Number {
  double value;
  std::string_view suffix;
};

Result<Number> split_number(std::string_view text, std::string_view what) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) return invalid_argument("{} '{}' does not start with a number", what, text);
  double value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + i, value);
  if (ec != std::errc() || ptr != text.data() + i) {
    return invalid_argument("{} '{}' has a malformed number", what, text);
  }
  std::string_view suffix = text.substr(i);
  while (!suffix.empty() && suffix.front() == ' ') suffix.remove_prefix(1);
  return Number{value, suffix};
}

}  // namespace

Result<uint64_t> parse_bytes(std::string_view text) {
  auto number = split_number(text, "size");
  if (!number.is_ok()) return number.status();
  struct Unit {
    std::string_view name;
    double factor;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},
      {"B", 1},
      {"K", 1024.0},
      {"KiB", 1024.0},
      {"kB", 1e3},
      {"KB", 1e3},
      {"M", 1048576.0},
      {"MiB", 1048576.0},
      {"MB", 1e6},
      {"G", 1073741824.0},
      {"GiB", 1073741824.0},
      {"GB", 1e9},
      {"T", 1099511627776.0},
      {"TiB", 1099511627776.0},
      {"TB", 1e12},
  };
  for (const Unit& unit : kUnits) {
    if (unit.name == number->suffix) {
      double bytes = number->value * unit.factor;
      if (bytes > 9.0e18) return invalid_argument("size '{}' is too large", text);
      return static_cast<uint64_t>(std::llround(bytes));
    }
  }
  return invalid_argument("size '{}' has an unknown unit '{}' (use B, KiB, MiB, GiB, TiB)", text,
                          number->suffix);
}

Result<uint64_t> parse_duration_ms(std::string_view text) {
  auto number = split_number(text, "duration");
  if (!number.is_ok()) return number.status();
  struct Unit {
    std::string_view name;
    double factor;
  };
  static constexpr Unit kUnits[] = {
      {"", 1}, {"ms", 1}, {"s", 1e3}, {"m", 60e3}, {"min", 60e3}, {"h", 3600e3},
  };
  for (const Unit& unit : kUnits) {
    if (unit.name == number->suffix) {
      double millis = number->value * unit.factor;
      if (millis > 9.0e18) return invalid_argument("duration '{}' is too large", text);
      return static_cast<uint64_t>(std::llround(millis));
    }
  }
  return invalid_argument("duration '{}' has an unknown unit '{}' (use ms, s, m, h)", text,
                          number->suffix);
}

std::string format_bytes(uint64_t bytes) {
  static constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.1f} {}", value, kNames[unit]);
}

std::string format_duration_ms(uint64_t millis) {
  if (millis < 1000) return fmt::format("{}ms", millis);
  uint64_t seconds = millis / 1000;
  if (seconds < 60) return fmt::format("{}.{}s", seconds, (millis % 1000) / 100);
  if (seconds < 3600) return fmt::format("{}m{:02}s", seconds / 60, seconds % 60);
  return fmt::format("{}h{:02}m", seconds / 3600, (seconds % 3600) / 60);
}

}  // namespace kvtier
