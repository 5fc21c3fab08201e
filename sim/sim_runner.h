// The trace-driven policy simulator behind `kvtier-bench sim`: replays a multi-turn
// trace through the real policy::Planner and policy::SessionTable on a ManualClock,
// against a model of the tiers (SimStore), and reports what each turn would have
// cost.
//
// Each request is one turn of its conversation:
//  * arrival: the request is queued for the engines' prefill slots (`engines`), and a
//    follow-up turn sends BeginTurn at once (session-aware policies only): the engine
//    knows the conversation when it queues the request, not when it schedules it;
//  * when a slot takes it, the engine loads the leading blocks the daemon holds (read
//    where each is at that moment) and prefills the rest, holding the slot for
//    service = Σ loaded blocks' bytes / bandwidth of the tier each is read from +
//    (input tokens − loaded tokens) / prefill speed;
//  * modeled TTFT = the wait for a slot + service: hits shorten the queue too;
//  * the turn ends after the first token plus output tokens × decode time: the engine
//    saves the request's full blocks (end of turn) and the planner runs, as in kvtierd;
//  * the planner also runs every `plan_interval_ms` of virtual time.
//
// Thread-safety: simulate() is reentrant; distinct runs may go on distinct threads.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "policy/planner.h"
#include "sim/sim_trace.h"

namespace kvtier::bench {

// The policies compared (kvtier issue 4), and an infinite cache for reference.
enum class SimPolicy : uint8_t {
  kHbmOnlyLru = 1,     // no offload: the HBM budget alone, LRU
  kLruTiering = 2,     // HBM → RAM → NVMe, block LRU by watermarks, request-scoped
  kSessionAware = 3,   // idle demotion + BeginTurn prefetch
  kPredictive = 4,     // 3 + return prediction + cost model + predictive prefetch
  kInfiniteCache = 5,  // every block kept in HBM forever: the trace's ideal
  kInfiniteRam = 6,    // every block kept forever, but read from RAM (a bound)
  kInfiniteNvme = 7,   // every block kept forever, but read from NVMe (a bound)
  kClairvoyant = 8,    // knows every future request: the offline optimum at the budget
  // What peers ship (policy/peer_policy.h), on the tiers as LRU tiering runs them:
  kS3Fifo = 9,
  kSlru = 10,
  kArc = 11,
  kTinyLfuLru = 12,
  kWorkloadAware = 13,  // reuse probability by category and turn, learned online
  kWTinyLfu = 14,
};
std::string sim_policy_label(SimPolicy policy);  // "1 hbm-only lru", ...
// Its name in result keys and --policies: "p0" .. "p4", "s3fifo", "slru", "arc",
// "tinylfu", "wtinylfu", "workload".
std::string sim_policy_key(SimPolicy policy);
// The baselines kvtier's policies are measured against: LRU tiering and the peers'.
bool sim_policy_is_baseline(SimPolicy policy);

struct SimBudget {
  std::string name;                               // "b1"
  std::array<uint64_t, kLocalTierCount> bytes{};  // HBM, RAM, NVMe
};

struct SimConfig {
  uint64_t kv_bytes_per_token = 128 << 10;
  std::array<double, kLocalTierCount> read_bytes_per_s = {1000e9, 25e9, 5e9};
  double prefill_tokens_per_s = 8000;
  double decode_ms_per_token = 20;
  // Prefill slots of the engines serving the trace: a request waits for one (FIFO)
  // and holds it for its load and prefill (decode overlaps, as in continuous
  // batching). 0: unlimited, every request starts on arrival.
  uint32_t engines = 0;
  uint64_t plan_interval_ms = 1000;
  // Whether the engine's Saves carry the retention priorities the trace gives
  // (TraceRequest::priorities; the clairvoyant policy needs none).
  bool priorities = true;
  // NVMe keeps a copy of what is promoted out of it (kvtierd's design; SimStore); false
  // runs the old exclusive tier, where a promotion gives the NVMe slot up.
  bool inclusive_nvme = true;
  // Thresholds and watermarks; mode, costs and plan interval are set per run.
  policy::PlannerConfig planner;
};

struct SimResult {
  SimPolicy policy = SimPolicy::kHbmOnlyLru;
  std::string budget;
  uint64_t turns = 0;
  double ttft_mean_ms = 0, ttft_p50_ms = 0, ttft_p90_ms = 0, ttft_p99_ms = 0;
  double follow_up_ttft_mean_ms = 0;
  double wait_mean_ms = 0;        // arrival → an engine takes it (part of the TTFT)
  uint64_t blocks_requested = 0;  // Σ hash_ids over the trace
  std::array<uint64_t, kLocalTierCount> hit_blocks{};  // loaded, by the tier read from
  uint64_t bytes_saved = 0;                            // engine → daemon at ends of turns
  uint64_t bytes_promoted = 0, bytes_demoted = 0;      // copied (a demotion onto a copy is not)
  uint64_t bytes_demoted_onto_copy = 0;                // demotions onto an NVMe copy: no write
  uint64_t nvme_written_bytes = 0;                     // demotions and new blocks written to NVMe
  uint64_t bytes_prefetched = 0;  // promotions for predicted returns (part of promoted)
  uint64_t blocks_evicted = 0, blocks_dropped = 0;
  uint64_t saves_refused = 0;  // Saves that waited for room longer than save-room-wait-ms
  double wall_seconds = 0;

  double hit_rate() const;
  double hit_rate(Tier tier) const;
  uint64_t bytes_moved() const { return bytes_promoted + bytes_demoted; }
  double nvme_written_bytes_per_turn() const {
    return turns ? static_cast<double>(nvme_written_bytes) / static_cast<double>(turns) : 0;
  }
};

// Engines for a trace: enough prefill slots that, with no cache at all, they would be
// busy 80 % of the trace's span (Σ input tokens ÷ prefill speed ÷ span ÷ 0.8, at
// least 1). A fixed rule, so that every workload queues about as much.
uint32_t derived_engines(const Trace& trace, const SimConfig& config);

SimResult simulate(const Trace& trace, const SimConfig& config, const SimBudget& budget,
                   SimPolicy policy);

}  // namespace kvtier::bench
