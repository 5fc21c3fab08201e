// A multi-turn request trace for the policy simulator (kvtier-bench sim), in the
// Mooncake trace format (../shared/traces/README.md): one JSON object per line with
// `timestamp` (ms), `input_length`, `output_length` and `hash_ids` (chained prefix
// block hashes, `tokens_per_block` tokens each).
//
// Hash ids are renumbered densely in first-seen order (equal ids stay equal). The
// trace has no session ids; load_trace() recovers conversations as chains of turns: a
// request whose hash_ids begin with all of an earlier request's full blocks continues
// that request's conversation (the longest such match wins), if no other request
// continued it first. A second request extending the same turn is a fork and starts a
// conversation of its own, so a prefix that many requests share (a system prompt, a
// document) does not merge them into one "session".
//
// Thread-safety: a Trace is immutable after loading; share it between threads freely.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace kvtier::bench {

// A retention priority the engine gives blocks [first, first + count) of a request's
// full blocks when it saves them (policy/session_table.h: 1..100, 35 the default).
struct PriorityRange {
  uint32_t first = 0;
  uint32_t count = 0;
  uint8_t priority = 0;
};
// What an engine that knows its requests says with a turn's Save (0 / none: nothing).
struct RequestPriorities {
  uint8_t session = 0;
  std::vector<PriorityRange> blocks;
};

struct TraceRequest {
  uint64_t arrival_ms = 0;
  uint32_t input_tokens = 0;
  uint32_t output_tokens = 0;
  std::vector<uint64_t> hash_ids;  // dense ids (0, 1, ... in first-seen order); the last
                                   // one may cover a partial block
  uint32_t session = 0;            // conversation index, 0-based
  bool follow_up = false;          // continues an earlier request's conversation
  uint32_t full_blocks = 0;        // leading hash_ids that cover tokens_per_block tokens
  RequestPriorities priorities;    // generated workloads only: trace files carry none
};

struct Trace {
  std::vector<TraceRequest> requests;  // in arrival order
  uint32_t sessions = 0;
  uint32_t follow_ups = 0;
  uint32_t forks = 0;  // requests that extended a turn another request had continued
  uint32_t tokens_per_block = 0;
  uint64_t blocks_requested = 0;  // Σ hash_ids over all requests
  uint64_t distinct_blocks = 0;   // hash ids run 0 .. distinct_blocks - 1
  bool has_priorities = false;    // some request gives retention priorities
};

// Builds a Trace from requests given in arrival order: renumbers hash ids densely and
// derives conversations (above). load_trace() and the workload generators use it.
class TraceBuilder {
 public:
  explicit TraceBuilder(uint32_t tokens_per_block);  // REQUIRES: > 0
  // InvalidArgument when `arrival_ms` is before the previous request's.
  // InvalidArgument when `arrival_ms` is before the previous request's, or a priority
  // is outside 1..100 or a range outside the request's full blocks.
  Status add(uint64_t arrival_ms, uint32_t input_tokens, uint32_t output_tokens,
             std::span<const uint64_t> hash_ids, RequestPriorities priorities = {});
  // InvalidArgument when no request was added.
  Result<Trace> finish() &&;

 private:
  struct Turn {
    uint32_t session;
    bool continued;  // a later request continued this turn already
  };
  Trace trace_;
  std::unordered_map<uint64_t, Turn> last_full_block_;  // dense id of a last full block → its turn
  std::unordered_map<uint64_t, uint64_t> dense_ids_;    // raw hash id → dense id
};

// Reads and validates `path`; InvalidArgument names the line and field at fault,
// NotFound when the file cannot be opened.
Result<Trace> load_trace(const std::string& path, uint32_t tokens_per_block);

// Where the shared trace is when no --trace is given: $KVTIER_TRACE, else
// ../shared/traces/mooncake_synthetic_trace.jsonl from the working directory or from
// the repository that holds `executable`.
std::string default_trace_path(const std::string& executable);

}  // namespace kvtier::bench
