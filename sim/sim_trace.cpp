#include "sim/sim_trace.h"

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

TraceBuilder::TraceBuilder(uint32_t tokens_per_block) {
  trace_.tokens_per_block = tokens_per_block;
}

Status TraceBuilder::add(uint64_t arrival_ms, uint32_t input_tokens, uint32_t output_tokens,
                         std::span<const uint64_t> hash_ids, RequestPriorities priorities) {
  if (!trace_.requests.empty() && arrival_ms < trace_.requests.back().arrival_ms) {
    return invalid_argument("timestamp goes backwards");
  }
  TraceRequest request;
  request.arrival_ms = arrival_ms;
  request.input_tokens = input_tokens;
  request.output_tokens = output_tokens;
  // Checked before anything is renumbered: a refused request changes nothing.
  const uint32_t full_blocks = std::min<uint32_t>(input_tokens / trace_.tokens_per_block,
                                                  static_cast<uint32_t>(hash_ids.size()));
  if (priorities.session > 100) {
    return invalid_argument("session priority {} is outside 1..100", priorities.session);
  }
  for (const PriorityRange& range : priorities.blocks) {
    if (range.priority == 0 || range.priority > 100 || range.count == 0 ||
        uint64_t{range.first} + range.count > full_blocks) {
      return invalid_argument("priority range {}+{} (priority {}) is not within the {} full blocks",
                              range.first, range.count, range.priority, full_blocks);
    }
  }
  for (uint64_t id : hash_ids) {
    auto [it, inserted] = dense_ids_.try_emplace(id, dense_ids_.size());
    request.hash_ids.push_back(it->second);
  }
  request.full_blocks = full_blocks;
  trace_.has_priorities |= priorities.session != 0 || !priorities.blocks.empty();
  request.priorities = std::move(priorities);
  // A turn continues the latest request whose whole prefix it extends (the longest
  // match), unless another request continued that one already: then it is a fork,
  // and a prefix many requests extend (a system prompt) is not one conversation.
  std::optional<uint32_t> session;
  for (uint32_t k = request.full_blocks; k-- > 0;) {
    if (auto it = last_full_block_.find(request.hash_ids[k]); it != last_full_block_.end()) {
      if (!it->second.continued) session = it->second.session;
      if (it->second.continued) ++trace_.forks;
      it->second.continued = true;
      break;
    }
  }
  request.follow_up = session.has_value();
  request.session = session ? *session : trace_.sessions++;
  trace_.follow_ups += request.follow_up ? 1 : 0;
  trace_.blocks_requested += request.hash_ids.size();
  if (request.full_blocks > 0) {
    last_full_block_[request.hash_ids[request.full_blocks - 1]] = Turn{request.session, false};
  }
  trace_.requests.push_back(std::move(request));
  return Status::ok();
}

Result<Trace> TraceBuilder::finish() && {
  if (trace_.requests.empty()) return invalid_argument("the trace holds no requests");
  trace_.distinct_blocks = dense_ids_.size();
  return std::move(trace_);
}

Result<Trace> load_trace(const std::string& path, uint32_t tokens_per_block) {
  if (tokens_per_block == 0) return invalid_argument("tokens per block must be positive");
  std::ifstream in(path);
  if (!in) return not_found("cannot open trace '{}'", path);
  TraceBuilder builder(tokens_per_block);
  std::string line;
  uint64_t line_number = 0;
  std::vector<uint64_t> ids;
  while (std::getline(in, line)) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
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
    ids.clear();
    std::string_view list = *hashes;
    while (!list.empty()) {
      const size_t comma = list.find(',');
      auto id = number(list.substr(0, comma));
      if (!id) return invalid_argument("{}:{}: hash_ids holds a non-number", path, line_number);
      ids.push_back(*id);
      if (comma == std::string_view::npos) break;
      list.remove_prefix(comma + 1);
    }
    Status added =
        builder.add(*number(*timestamp), static_cast<uint32_t>(*number(*input)),
                    output ? static_cast<uint32_t>(number(*output).value_or(0)) : 0, ids);
    if (!added.is_ok()) return invalid_argument("{}:{}: {}", path, line_number, added.message());
  }
  auto trace = std::move(builder).finish();
  if (!trace.is_ok()) return invalid_argument("trace '{}': {}", path, trace.status().message());
  return trace;
}

}  // namespace kvtier::bench
