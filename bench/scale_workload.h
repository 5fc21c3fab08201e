// ScaleDaemon: one kvtierd that kvtier-bench scale grows session by session, and the
// requests it times against it (scale_bench.h says what is measured and why).
//
// The engine side is one connection with one memfd region of 2 KiB blocks (one layer's
// K and V planes of 1 KiB). A grown session is one finished turn: the shared
// system-prompt prefix (kPrefixBlocks, stored once, referenced by every session) and
// ScaleDaemonSpec::own_blocks blocks of its own, saved with endOfTurn. A measured turn appends
// kSaveBlocks new blocks to a session.
//
// The daemon reads its policy settings from a config file this class writes: while
// growing (unless `grow_as_measured`) `policy = "lru"` with the HBM watermarks at 1.0,
// so the planner has nothing to do and growing stays linear; before measuring, the
// file names `policy = "predictive"` and nothing else (the daemon's defaults), and
// SIGHUP applies it.
//
// Every reply is checked: a Save must store what it sent, a Lookup must hit every
// hash, a Load must restore every block bit-exact, a BeginTurn must know the whole
// session. A check that fails is an error, never a latency.
//
// Ownership: owns the daemon process, its config file and the client.
// Thread-safety: none; one owner.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/benchmarks.h"
#include "client/client.h"
#include "client/paged_cache.h"
#include "common/status.h"

namespace kvtier::bench {

inline constexpr uint32_t kPrefixBlocks = 2;     // shared system prompt
inline constexpr uint32_t kMaxOwnBlocks = 1024;  // per grown session (ScaleDaemonSpec)
inline constexpr uint32_t kSaveBlocks = 16;      // per measured Save
inline constexpr uint32_t kLookupHashes = 32;    // per measured Lookup
inline constexpr uint32_t kLoadBlocks = 16;      // per measured Load

// The measured requests, in the order one round sends them. kSaveUntilIdle is the same
// Save timed until the daemon answers the next request: its reply plus the round trip
// of a 1-hash Lookup sent after it, which waits for whatever the daemon does after
// replying (today: the planner).
enum class ScaleOp : uint8_t { kBeginTurn, kLookup, kLoad, kSave, kSaveUntilIdle, kStats };
inline constexpr size_t kScaleOps = 6;
const char* scale_op_name(ScaleOp op);  // "begin_turn", "lookup", ...

// Microseconds per op of one or more rounds, indexed by ScaleOp.
using ScaleSamples = std::array<std::vector<double>, kScaleOps>;

struct ScaleDaemonSpec {
  std::string mode;  // "nopressure" or "pressure": names the config file
  uint64_t hbm_bytes = 0;
  uint64_t ram_bytes = 0;
  uint64_t slab_bytes = 0;
  bool grow_as_measured = false;
  uint32_t own_blocks = 4;  // per grown session, 1..kMaxOwnBlocks
};

class ScaleDaemon {
 public:
  // Starts kvtierd, says Hello and registers the region. `config_dir` must outlive it.
  static Result<std::unique_ptr<ScaleDaemon>> start(const CommonOptions& common,
                                                    const ScaleDaemonSpec& spec,
                                                    const std::string& config_dir);
  ~ScaleDaemon();

  // Saves sessions [sessions(), target) with up to kPipelineDepth Saves in flight,
  // under the growing settings.
  Status grow_to(uint64_t target);
  // Applies the measured settings, then waits until the daemon's copies have settled.
  Status prepare_to_measure();
  // One round: BeginTurn(s), Lookup, Load (once some session has a measured turn),
  // Save(s, 16 new blocks, endOfTurn), Stats — each timed alone and appended to `out`
  // (nothing is kept when `out` is null). Each starts after an untimed 1-hash Lookup
  // has come back, so no request is timed behind work an earlier one left queued.
  Status run_round(ScaleSamples* out);

  // `count` Lookups of kLookupHashes held hashes, each timed alone (after a barrier),
  // appended to `out` (microseconds).
  Status time_lookups(uint32_t count, std::vector<double>& out);
  const std::string& socket_path() const { return daemon_.socket_path(); }
  // The engine's layout: another connection saying Hello with it sees the same blocks.
  const LayoutSpec& layout() const { return cache_.layout(); }

  uint64_t sessions() const { return turns_.size(); }
  // Σ over sessions of the blocks each references.
  uint64_t session_refs() const;
  // The daemon's resident set (/proc/<pid>/status VmRSS), in bytes.
  Result<uint64_t> rss_bytes() const;
  Result<StatsInfo> stats() { return client_->stats(); }
  Status stop() { return daemon_.stop_cleanly(kDaemonStopTimeout); }

 private:
  static constexpr uint32_t kPipelineDepth = 32;  // Saves in flight while growing

  ScaleDaemon(support::DaemonProcess daemon, PagedCache cache, std::unique_ptr<Client> client,
              ScaleDaemonSpec spec, std::string config_path);
  // Rewrites the config file for growing or measuring and, unless the daemon already
  // runs it, SIGHUPs the daemon and waits until Stats reports the policy.
  Status use_settings(bool measuring);
  Status wait_until_settled();
  // A 1-hash Lookup: answered once the daemon's control thread has done what was
  // queued before it.
  Status barrier();
  // The first `count` blocks of session `s`'s chain.
  std::vector<BlockHash> chain_prefix(uint64_t s, uint32_t count) const;
  // The region: the growing Saves' blocks (one group per Save in flight), then the
  // measured Save's sources, then the measured Load's targets.
  uint32_t grow_blocks() const { return kPrefixBlocks + spec_.own_blocks; }
  uint64_t save_base() const { return uint64_t{kPipelineDepth} * grow_blocks(); }
  uint64_t load_base() const { return save_base() + kSaveBlocks; }

  support::DaemonProcess daemon_;
  PagedCache cache_;
  std::unique_ptr<Client> client_;
  ScaleDaemonSpec spec_;
  std::string config_path_;
  bool measuring_ = true;            // which settings the daemon runs (it starts measuring)
  std::vector<uint32_t> turns_;      // measured turns per grown session
  std::vector<uint64_t> extended_;   // sessions with at least one measured turn
  std::vector<BlockHash> prefix_;    // the shared system prompt
  std::mt19937_64 random_{0x5ca1e};  // fixed seed: runs pick the same sessions
};

}  // namespace kvtier::bench
