// The daemon's side of the NVMe tier: what the Service keeps about it between
// requests. The Service methods that use it live in persistence.cpp (start-up
// recovery, session records, slot releases, the SIGTERM drain) and nvme_moves.cpp
// (demotions to and promotions from NVMe, and the reads a Load waits for).
//
// Thread-safety: none; the control thread owns it, like everything in the Service.
// NvmeTier's workers only ever post results back.
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/block_key.h"
#include "policy/session_table.h"
#include "tiers/block_store.h"
#include "tiers/nvme_tier.h"

namespace kvtier::daemon {

// Called once when a block's NVMe read finished: OK (the block is now readable in
// RAM or HBM) or why not.
using NvmeReadWaiter = std::function<void(const Status&)>;

struct NvmeState {
  std::unique_ptr<NvmeTier> tier;

  // Blocks being read from NVMe, each with the Loads waiting for it.
  std::unordered_map<BlockKey, std::vector<NvmeReadWaiter>, BlockKeyHasher> reads;
  // After a read, blocks that must continue up to HBM (the planner asked for HBM but
  // the bytes had to come through RAM).
  std::unordered_set<BlockKey, BlockKeyHasher> continue_to_hbm;

  // Session records to rewrite / delete at the next flush.
  std::unordered_set<policy::SessionKey, policy::SessionKeyHasher> dirty_sessions;
  std::vector<std::pair<std::string, std::string>> closed_sessions;  // (namespace, id)

  // Releases whose index delete failed: retried with the next ones.
  std::vector<BlockStore::PendingRelease> failed_releases;

  uint64_t write_jobs = 0;    // write_blocks calls in flight
  uint64_t read_jobs = 0;     // read_blocks calls in flight
  uint64_t release_jobs = 0;  // release_blocks calls in flight
  uint64_t session_jobs = 0;  // write_sessions calls in flight
  uint64_t write_errors = 0;  // blocks whose demotion to NVMe failed
  uint64_t read_errors = 0;   // blocks whose read failed for a reason that may pass (EIO)

  // After a failed write, demotions to NVMe pause until this time (exponential backoff:
  // a full or failing disk is not hammered every planner tick).
  uint64_t write_paused_until_ms = 0;
  uint64_t write_backoff_ms = 0;

  // SIGTERM drain.
  enum class DrainPhase : uint8_t { kNone, kMoving, kFlushing, kDone };
  DrainPhase drain_phase = DrainPhase::kNone;
  std::function<void()> drained;  // called once, when the drain is over
  std::unique_ptr<boost::asio::steady_timer> drain_deadline;
  std::unordered_set<BlockKey, BlockKeyHasher> drain_failed;  // not retried in this drain
  uint64_t drain_started_ms = 0;
  uint64_t drained_bytes_before = 0;  // bytes_demoted when the drain began

  // What NvmeTier::open found; consumed by Service::recover_nvme.
  std::unique_ptr<NvmeRecovery> recovery;

  bool draining() const {
    return drain_phase == DrainPhase::kMoving || drain_phase == DrainPhase::kFlushing;
  }
  bool jobs_in_flight() const { return write_jobs + read_jobs + release_jobs + session_jobs > 0; }
};

// Wraps `fn` into the callback a worker calls: it posts `fn(result)` to the control
// thread, with a work guard so that io_context::run() waits for it.
template <typename Result, typename Fn>
std::function<void(Result)> on_control_thread(boost::asio::io_context& io, Fn fn) {
  auto guard = boost::asio::make_work_guard(io);
  return [&io, guard, fn = std::move(fn)](Result result) mutable {
    boost::asio::post(io, [guard, fn = std::move(fn), result = std::move(result)]() mutable {
      fn(std::move(result));
    });
  };
}

// Wall clock (persisted) ↔ steady clock (the policy's) conversions around `now`.
uint64_t wall_now_ms();
uint64_t steady_to_wall_ms(uint64_t steady_ms, uint64_t steady_now_ms, uint64_t wall_now);
uint64_t wall_to_steady_ms(uint64_t wall_ms, uint64_t steady_now_ms, uint64_t wall_now);

}  // namespace kvtier::daemon
