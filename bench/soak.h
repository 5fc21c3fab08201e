// The crash-and-restart soak (kvtier-bench soak, and a short run in the tests).
//
// One kvtierd with every tier, small and demoting aggressively (idle sessions leave HBM
// and RAM within tens of milliseconds, so blocks keep moving down to NVMe and back),
// serves `engines` engine processes forked from the caller. Each engine runs random
// multi-turn sessions (Save of a turn's new blocks, Lookup, Load into wiped engine
// blocks, BeginTurn, CloseSession) and reconnects when the daemon goes away. Block
// contents are a function of the block hash, so every Load is checked against what an
// acknowledged Save wrote: each loaded block is bit-exact, or it was reported missing;
// a block reported loaded whose bytes differ is a wrong block, and the soak fails.
//
// Meanwhile the controller, `cycles` times: lets the daemon run for a random uptime,
// then kills it (SIGKILL, or SIGTERM for `sigterm_percent` of the cycles) and restarts it
// on the same socket and data directory; every `engine_kill_every`th cycle it also
// SIGKILLs a random engine, mid-request, and forks a new one in its place. Where the
// machine lets it mount a tmpfs (root), the data directory lives on a small one, and
// during `disk_full_cycles` cycles a filler file takes every free byte of it while the
// daemon runs, and stays through the restart that ends the cycle: the daemon restarts
// on a full disk. During `disk_fault_cycles` cycles the NVMe tier's disk fails and then
// works again while the daemon runs: alternately the daemon runs with injected EIO on a
// range of slab writes and index writes, and (with the tmpfs) the disk fills and is
// emptied again mid-cycle. The tier must degrade and heal without a restart: at the end
// of such a cycle the controller waits (up to 30 s) for Stats to say it takes writes
// again; one that does not counts in not_healed. The daemon exiting by itself,
// failing to restart, or an engine meeting an error other than the daemon being away
// or busy fails the soak.
//
// Thread-safety: run_soak() forks; call it from a process with one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace kvtier::bench {

struct SoakOptions {
  std::string kvtierd;  // the binary
  uint32_t engines = 4;
  uint32_t cycles = 40;
  std::chrono::milliseconds min_uptime{300};
  std::chrono::milliseconds max_uptime{1500};
  uint32_t sigterm_percent = 25;
  uint32_t engine_kill_every = 3;  // 0: never
  uint32_t disk_full_cycles = 4;   // needs a mountable tmpfs; 0: none
  uint32_t disk_fault_cycles = 4;  // the disk fails and recovers mid-cycle; 0: none
  uint32_t sessions_per_engine = 6;
  uint64_t seed = 1;
  std::string temp_parent;  // where the soak's directory goes (empty: $TMPDIR or /tmp)
  bool keep_dir = false;    // keep the directory (daemon logs) afterwards
};

struct SoakReport {
  uint32_t cycles = 0;
  uint32_t sigkill_restarts = 0;
  uint32_t sigterm_restarts = 0;
  uint32_t engine_kills = 0;
  uint32_t disk_full_cycles = 0;
  std::string disk_full;  // "tmpfs NNMiB" or why there was no full disk
  // Disk-fault cycles run, by kind, and what the daemons' Stats said at their ends.
  uint32_t injected_fault_cycles = 0;  // EIO injected on slab and index writes
  uint32_t fill_and_free_cycles = 0;   // the tmpfs filled, then emptied
  uint64_t nvme_degradations = 0;
  uint64_t nvme_heals = 0;
  uint32_t not_healed = 0;       // still degraded 30 s after the fault ended: must be 0
  std::string first_not_healed;  // its Stats reason and the daemon's log
  // Engines' operations that got a reply (any reply).
  uint64_t saves = 0, lookups = 0, loads = 0, begin_turns = 0, closes = 0;
  uint64_t blocks_saved = 0;     // acknowledged as stored
  uint64_t blocks_verified = 0;  // loaded and bit-exact
  uint64_t bytes_verified = 0;
  uint64_t blocks_verified_after_restart = 0;  // by engines that reconnected at least once
  uint64_t blocks_missing = 0;                 // asked for by a Load and reported not restored
  uint64_t wrong_blocks = 0;                   // reported loaded, bytes differ: must be 0
  uint64_t unavailable = 0;                    // calls failed because the daemon was away
  uint64_t busy = 0;                           // retryable refusals (resource exhausted)
  uint64_t reconnects = 0;
  uint64_t unexpected_errors = 0;  // any other error: must be 0
  std::string first_unexpected;    // the first such error, with its engine
  std::string first_wrong;         // the first wrong block, with its session
  uint32_t daemon_self_exits = 0;  // the daemon ended without being killed: must be 0
  double seconds = 0;
};

// Runs the soak. An error when the soak could not run or the daemon would not restart
// (with its log); otherwise the report, whose wrong_blocks, unexpected_errors,
// daemon_self_exits and not_healed say whether it passed.
Result<SoakReport> run_soak(const SoakOptions& options);

}  // namespace kvtier::bench
