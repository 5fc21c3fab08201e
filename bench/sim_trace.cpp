#include "bench/sim_trace.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string_view>
#include <unordered_map>

namespace kvtier::bench {
namespace {

constexpr const char* kTraceName = "shared/traces/mooncake_synthetic_trace.jsonl";

// The value after "key": in a flat JSON object, as the text of a number or an array.
std::optional<std::string_view> field(std::string_view line, std::string_view key) {
  const std::string quoted = "\"" + std::string(key) + "\"";
  size_t at = line.find(quoted);
  if (at == std::string_view::npos) return std::nullopt;
  at = line.find(':', at + quoted.size());
  if (at == std::string_view::npos) return std::nullopt;
  ++at;
  while (at < line.size() && line[at] == ' ') ++at;
  size_t end = at;
  if (at < line.size() && line[at] == '[') {
    end = line.find(']', at);
    if (end == std::string_view::npos) return std::nullopt;
    return line.substr(at + 1, end - at - 1);
  }
  while (end < line.size() && line[end] != ',' && line[end] != '}') ++end;
  return line.substr(at, end - at);
}

std::optional<uint64_t> number(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  if (text.empty()) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    if (c == '.') break;  // timestamps may carry a fraction of a millisecond
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  return value;
}

}  // namespace

std::string default_trace_path(const std::string& executable) {
  if (const char* env = std::getenv("KVTIER_TRACE"); env && *env) return env;
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> candidates = {fs::path("..") / kTraceName};
  // The build directory sits in the repository; the shared folder beside the repository.
  for (fs::path dir = fs::absolute(executable, ec).parent_path(); !dir.empty();
       dir = dir.parent_path()) {
    candidates.push_back(dir.parent_path() / kTraceName);
    if (dir == dir.parent_path()) break;
  }
  for (const fs::path& path : candidates) {
    if (fs::exists(path, ec)) return path.string();
  }
  return candidates.front().string();
}

Result<Trace> load_trace(const std::string& path, uint32_t tokens_per_block) {
  if (tokens_per_block == 0) return invalid_argument("tokens per block must be positive");
  std::ifstream in(path);
  if (!in) return not_found("cannot open trace '{}'", path);
  Trace trace;
  trace.tokens_per_block = tokens_per_block;
  // The hash of a request's last full block → its conversation, and whether a later
  // request already continued it. Hashes are chained, so a later request holding that
  // hash begins with all of that request's full blocks.
  struct Turn {
    uint32_t session;
    bool continued;
  };
  std::unordered_map<uint64_t, Turn> last_full_block;
  std::unordered_map<uint64_t, uint64_t> dense_ids;
  std::string line;
  uint64_t line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    TraceRequest request;
    auto timestamp = field(line, "timestamp");
    auto input = field(line, "input_length");
    auto output = field(line, "output_length");
    auto hashes = field(line, "hash_ids");
    if (!timestamp || !number(*timestamp)) {
      return invalid_argument("{}:{}: timestamp is missing or not a number", path, line_number);
    }
    if (!input || !number(*input)) {
      return invalid_argument("{}:{}: input_length is missing or not a number", path, line_number);
    }
    if (!hashes) return invalid_argument("{}:{}: hash_ids is missing", path, line_number);
    request.arrival_ms = *number(*timestamp);
    request.input_tokens = static_cast<uint32_t>(*number(*input));
    request.output_tokens = output ? static_cast<uint32_t>(number(*output).value_or(0)) : 0;
    std::string_view list = *hashes;
    while (!list.empty()) {
      const size_t comma = list.find(',');
      auto id = number(list.substr(0, comma));
      if (!id) return invalid_argument("{}:{}: hash_ids holds a non-number", path, line_number);
      auto [it, inserted] = dense_ids.try_emplace(*id, dense_ids.size());
      request.hash_ids.push_back(it->second);
      if (comma == std::string_view::npos) break;
      list.remove_prefix(comma + 1);
    }
    if (!trace.requests.empty() && request.arrival_ms < trace.requests.back().arrival_ms) {
      return invalid_argument("{}:{}: timestamp goes backwards", path, line_number);
    }
    request.full_blocks = std::min<uint32_t>(request.input_tokens / tokens_per_block,
                                             static_cast<uint32_t>(request.hash_ids.size()));
    // A turn continues the latest request whose whole prefix it extends (the longest
    // match), unless another request continued that one already: then it is a fork,
    // and a prefix many requests extend (a system prompt) is not one conversation.
    std::optional<uint32_t> session;
    for (uint32_t k = request.full_blocks; k-- > 0;) {
      if (auto it = last_full_block.find(request.hash_ids[k]); it != last_full_block.end()) {
        if (!it->second.continued) session = it->second.session;
        it->second.continued = true;
        break;
      }
    }
    request.follow_up = session.has_value();
    request.session = session ? *session : trace.sessions++;
    trace.follow_ups += request.follow_up ? 1 : 0;
    trace.blocks_requested += request.hash_ids.size();
    if (request.full_blocks > 0) {
      last_full_block[request.hash_ids[request.full_blocks - 1]] = Turn{request.session, false};
    }
    trace.requests.push_back(std::move(request));
  }
  if (trace.requests.empty()) return invalid_argument("trace '{}' holds no requests", path);
  trace.distinct_blocks = dense_ids.size();
  return trace;
}

}  // namespace kvtier::bench
