// The daemon's side of the NVMe tier: what the Service keeps about it between
// requests. The Service methods that use it live in persistence.cpp (start-up
// recovery, session records, the SIGTERM drain). Moving blocks in and out of it, and
// releasing its slots, is the move executor's (tiers/move_executor.h).
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
#include "common/log.h"

#include "common/block_key.h"
#include "policy/session_table.h"
#include "tiers/block_store.h"
#include "tiers/nvme_tier.h"

namespace kvtier::daemon {

struct NvmeState {
  std::unique_ptr<NvmeTier> tier;

  // Session records to rewrite / delete at the next flush.
  std::unordered_set<policy::SessionKey, policy::SessionKeyHasher> dirty_sessions;
  // How many blocks each session's stored record has, while those are the session's
  // first blocks (a session cut since is absent): its next write appends the rest as a
  // session delta instead of rewriting the whole conversation.
  std::unordered_map<policy::SessionKey, uint32_t, policy::SessionKeyHasher> stored_blocks;
  std::vector<std::pair<std::string, std::string>> closed_sessions;  // (namespace, id)

  // The tier's own jobs (moves, reads and slot releases are the executor's).
  uint64_t release_jobs = 0;           // recovery: entries this configuration cannot use
  uint64_t session_jobs = 0;           // write_sessions calls in flight
  LogThrottle session_write_warnings;  // a full disk fails every session write

  // SIGTERM drain.
  enum class DrainPhase : uint8_t { kNone, kMoving, kFlushing, kDone };
  DrainPhase drain_phase = DrainPhase::kNone;
  std::function<void()> drained;  // called once, when the drain is over
  std::unique_ptr<boost::asio::steady_timer> drain_deadline;
  uint64_t drain_started_ms = 0;
  uint64_t drained_bytes_before = 0;        // bytes_demoted when the drain began
  uint64_t drained_onto_copies_before = 0;  // bytes_demoted_onto_copy then

  // What NvmeTier::open found; consumed by Service::recover_nvme.
  std::unique_ptr<NvmeRecovery> recovery;

  bool draining() const {
    return drain_phase == DrainPhase::kMoving || drain_phase == DrainPhase::kFlushing;
  }
  bool jobs_in_flight() const { return release_jobs + session_jobs > 0; }
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

// A session as the NVMe tier (and the remote tier) store it.
NvmeSessionRecord to_record(const policy::Session& session, const std::string& namespace_name,
                            uint64_t steady_now, uint64_t wall_now);

// Wall clock (persisted) ↔ steady clock (the policy's) conversions around `now`.
uint64_t wall_now_ms();
uint64_t steady_to_wall_ms(uint64_t steady_ms, uint64_t steady_now_ms, uint64_t wall_now);
uint64_t wall_to_steady_ms(uint64_t wall_ms, uint64_t steady_now_ms, uint64_t wall_now);

}  // namespace kvtier::daemon
