// Human units for sizes and durations, parsed from flags and printed in tables.
// parse_bytes accepts "4096", "512KiB", "4GiB", "1.5GiB", "10GB" (powers of 1000 for
// kB/MB/GB/TB, of 1024 for KiB/MiB/GiB/TiB, "K/M/G/T" alone mean the binary ones).
// parse_duration_ms accepts "250", "250ms", "30s", "5m", "2h" (a bare number is ms).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace kvtier {

Result<uint64_t> parse_bytes(std::string_view text);
Result<uint64_t> parse_duration_ms(std::string_view text);
std::string format_bytes(uint64_t bytes);         // "1.5 GiB"
std::string format_duration_ms(uint64_t millis);  // "2m05s", "340ms"

}  // namespace kvtier
