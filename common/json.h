// Minimal JSON output helpers for the tools' --json modes (they only write JSON).
#pragma once

#include <string>
#include <string_view>

namespace kvtier {

// `text` as a JSON string literal, quotes included.
std::string json_quote(std::string_view text);

}  // namespace kvtier
