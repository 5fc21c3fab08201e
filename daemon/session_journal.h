// SessionJournal: the daemon's side of the NVMe tier — opening it, recovering the block
// index and the session table at start-up, keeping each session's stored record
// current (appended to while it only grows, rewritten after a cut), and the SIGTERM
// drain of RAM/HBM blocks to NVMe. Moving blocks in and out of the tier, and releasing
// its slots, is the move executor's (tiers/move_executor.h); what a record holds is
// tiers/nvme_format.h's.
//
// Without an NVMe tier (nvme-bytes 0) every method is a no-op and enabled() is false.
//
// Thread-safety: the control thread owns it, like every part (daemon_context.h).
// NvmeTier's workers only ever post results back.
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include <utility>
#include <vector>
#include "common/block_key.h"
#include "common/log.h"
#include "daemon/daemon_context.h"
#include "policy/session_table.h"
#include "tiers/block_store.h"
#include "tiers/nvme_tier.h"

namespace kvtier::daemon {

// What the journal keeps between requests (null without an NVMe tier).
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

  // Sessions whose blocks get their NVMe copy at the time given (note_saved), in the
  // order saved; each at most once in the queue.
  std::deque<std::pair<uint64_t, policy::SessionKey>> copies_due;
  std::unordered_set<policy::SessionKey, policy::SessionKeyHasher> copy_queued;

  // What NvmeTier::open found; consumed by SessionJournal::recover_nvme.
  std::unique_ptr<NvmeRecovery> recovery;

  bool draining() const {
    return drain_phase == DrainPhase::kMoving || drain_phase == DrainPhase::kFlushing;
  }
  bool jobs_in_flight() const { return release_jobs + session_jobs > 0; }
};

class SessionJournal final : public Part, public policy::SessionObserver {
 public:
  SessionJournal(DaemonContext& ctx, Replies& replies) : Part(ctx, replies) {}

  bool enabled() const KVTIER_REQUIRES(control_thread) { return nvme_ != nullptr; }
  // The tier; nullptr without one.
  NvmeTier* tier() const KVTIER_REQUIRES(control_thread) {
    return nvme_ ? nvme_->tier.get() : nullptr;
  }
  // Opens the tier (nvme-bytes > 0) and adds it to `tiers`, below RAM.
  Status open_nvme(std::vector<BlockStore::TierMemory>& tiers) KVTIER_REQUIRES(control_thread);
  // Puts what the tier held at start-up into the store and the session table.
  Status recover_nvme() KVTIER_REQUIRES(control_thread);
  // The key of `key`'s block on NVMe (namespaces are stored by name).
  NvmeBlockKey nvme_key(const BlockKey& key) const KVTIER_REQUIRES(control_thread);
  // The session's record is rewritten (or appended to) at the next flush.
  void note_session_changed(const policy::Session& session) KVTIER_REQUIRES(control_thread);
  // The session lost blocks (cut at an evicted or lost one): its record is rewritten
  // whole at the next flush instead of appended to (SessionObserver; recovery calls it
  // for a restored session that lost blocks).
  void session_cut(const policy::Session& session) override KVTIER_REQUIRES(control_thread);
  // The session's end: its NVMe record is deleted at the next flush (SessionObserver).
  void session_closed(uint32_t namespace_id, const std::string& session_id) override
      KVTIER_REQUIRES(control_thread);
  // Blocks were added to the session (a Save, the remote tier): its record is written
  // at the next flush and, nvme-copy-after-ms later, those of its blocks still in HBM or
  // RAM get a copy on NVMe (write_due_copies), so that a kill -9 loses none of them —
  // also a session a priority keeps in the fast tiers (SessionObserver).
  void session_grew(const policy::Session& session, std::span<const BlockHash> added) override
      KVTIER_REQUIRES(control_thread);
  // Writes the copies that are due (the planner's runs call it): the sessions of the
  // highest retention priority first, while NVMe has room to spare.
  void write_due_copies() KVTIER_REQUIRES(control_thread);
  // A session's statistics and state as a stored record has them (NVMe recovery and
  // remote resume).
  void restore_from_record(policy::Session& session, const NvmeSessionRecord& record,
                           uint64_t steady_now, uint64_t wall_now) KVTIER_REQUIRES(control_thread);
  // Writes the changed session records (`sync`: durably before the callback).
  void flush_sessions(bool sync) KVTIER_REQUIRES(control_thread);
  // SIGTERM: moves the live sessions' RAM/HBM blocks to NVMe and writes the session
  // table, for at most drain-timeout; `stopped` runs once, when that is over. A second
  // stop gives up (give_up_drain).
  void start_drain(std::function<void()> stopped) KVTIER_REQUIRES(control_thread);
  bool draining() const KVTIER_REQUIRES(control_thread) { return nvme_ && nvme_->draining(); }
  bool drained() const KVTIER_REQUIRES(control_thread) {
    return !nvme_ || nvme_->drain_phase == NvmeState::DrainPhase::kDone;
  }
  void give_up_drain() KVTIER_REQUIRES(control_thread);
  // Runs after every move and journal write settles: the drain's next step.
  void check_drain() KVTIER_REQUIRES(control_thread);
  // The device was lost: the drain ends, and the session table is written durably with
  // what NVMe holds (blocks elsewhere cannot be trusted).
  void write_before_exit() KVTIER_REQUIRES(control_thread);

 private:
  // recover_nvme's steps. Puts the recovered blocks into the store (their layouts
  // registered, room reserved per layout) and releases the index entries this
  // configuration cannot use; returns the bytes recovered.
  uint64_t recover_blocks(NvmeRecovery& recovery, uint64_t steady_now, uint64_t wall_now)
      KVTIER_REQUIRES(control_thread);
  // Restores the recovered sessions, each up to its first block that did not survive;
  // returns how many were cut short.
  size_t recover_sessions(const NvmeRecovery& recovery, uint64_t steady_now, uint64_t wall_now)
      KVTIER_REQUIRES(control_thread);
  // Queues the session's copies for `due_ms` (once: a queued session keeps its turn).
  void queue_copies(const policy::Session& session, uint64_t due_ms)
      KVTIER_REQUIRES(control_thread);
  // recover_nvme is putting a stored session back: its growth is what NVMe holds.
  bool recovering_ KVTIER_GUARDED_BY(control_thread) = false;

  std::unique_ptr<NvmeState> nvme_ KVTIER_GUARDED_BY(control_thread);
};

// Wraps `fn` into the callback a worker calls: it posts `fn(result)` to the control
// thread, with a work guard so that io_context::run() waits for it.
template <typename Result, typename Fn>
std::function<void(Result)> on_control_thread(boost::asio::io_context& io, Fn fn) {
  auto guard = boost::asio::make_work_guard(io);
  return [&io, guard, fn = std::move(fn)](Result result) mutable {
    boost::asio::post(io, [guard, fn = std::move(fn), result = std::move(result)]() mutable {
      assert_control_thread();
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
