// RemotePath: the daemon's side of the remote tier (a Redis Cluster, tiers/remote_*.h):
// the worker that owns the cluster connections, and how far each session has been
// written there (remote_*.cpp).
//
// At the end of a turn the session's blocks not yet written there are written behind
// the turn, and then its record. The executor copies the blocks out
// (MoveExecutor::copy_out: in place from host memory, staged out of GPU memory into
// pinned slots this part reserves, read out of NVMe into a buffer); here is how far each
// session was written.
//
// Reading: a Lookup that misses here asks the cluster which of the rest exist there
// (they are reported as Tier::kRemote); a Load that misses here reads the rest of its
// prefix into RAM slots (fetch_remote) and scatters from there; a BeginTurn of a
// session this node does not know fetches its record, creates the session from the
// blocks it has, and prefetches the others. Every wait is bounded by remote-timeout.
//
// Spilling: the tier is the executor's spill tier (tiers/move_executor.h): blocks it
// evicts out of NVMe that the cluster lacks are read from NVMe and written there first,
// so a block leaving this node stays in the fleet.
//
// Without remote-nodes every method is a no-op and enabled() is false.
//
// Thread-safety: control thread only (daemon_context.h); the worker posts back.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "daemon/daemon_context.h"
#include "daemon/metrics.h"
#include "daemon/requests.h"
#include "policy/session_table.h"
#include "tiers/nvme_format.h"
#include "tiers/remote_tier.h"
#include "tiers/remote_worker.h"

namespace kvtier::daemon {

class SessionJournal;  // session_journal.h

class RemotePath final : public Part, public policy::SessionObserver {
 public:
  // `journal`: where a session resumed from its remote record is restored and recorded.
  RemotePath(DaemonContext& ctx, Replies& replies, SessionJournal& journal);
  ~RemotePath();

  // Starts the worker (remote-nodes set); it connects in the background.
  Status open_remote() KVTIER_REQUIRES(control_thread);
  bool enabled() const KVTIER_REQUIRES(control_thread) { return remote_ != nullptr; }

  // remote_write_behind.cpp
  void write_behind(const policy::Session& session, bool sweeping = false)
      KVTIER_REQUIRES(control_thread);
  // Writes behind again for sessions left with blocks to write (at most once a second).
  void sweep_write_behind() KVTIER_REQUIRES(control_thread);
  // The session was cut: its blocks from the cut on are written behind again.
  void session_cut(const policy::Session& session) override KVTIER_REQUIRES(control_thread);
  // A Save ended its turn: its blocks not in the cluster yet are written behind.
  void turn_ended(const policy::Session& session) override KVTIER_REQUIRES(control_thread) {
    write_behind(session);
  }
  // The session's end: its remote record is deleted (SessionObserver).
  void session_closed(uint32_t namespace_id, const std::string& session_id) override
      KVTIER_REQUIRES(control_thread);

  // remote_read_path.cpp
  // Reads `keys` from the remote tier into RAM (host HBM when there is no RAM tier),
  // joining reads already running: the executor's copy_in (tiers/move_executor.h), whose
  // contract `done` has.
  void fetch_remote(const std::vector<BlockKey>& keys,
                    std::function<void(size_t, const Status&)> done)
      KVTIER_REQUIRES(control_thread);
  // Lookup's tail: how many of `hashes` from `tiers.size()` on the cluster holds, in a
  // row; `answer` gets `tiers` with a kRemote for each (at once when not connected; at
  // the remote-timeout with none).
  using Found = std::function<void(const std::vector<Tier>& tiers)>;
  void lookup_remote(const EngineContext& engine, std::vector<BlockHash> hashes,
                     std::vector<Tier> tiers, Found answer) KVTIER_REQUIRES(control_thread);
  // BeginTurn of a session not known here: its record from the remote tier, then
  // `begin_turn` with the session and the blocks being read for it (BeginTurn of a
  // session known by then: with 0). Answers the request with an error itself when there
  // is no record to resume from.
  using Resumed = std::function<void(policy::Session& session, uint32_t fetching)>;
  void resume_from_remote(const ConnectionPtr& c, const EngineContext& engine, uint64_t id,
                          const std::string& session_id, Resumed begin_turn)
      KVTIER_REQUIRES(control_thread);

  // remote_path.cpp: what Stats and /metrics say of it.
  void render_remote_metrics(PrometheusText& out) const KVTIER_REQUIRES(control_thread);
  void fill_remote_stats(wire::RemoteStats::Builder out) const KVTIER_REQUIRES(control_thread);

 private:
  struct RemoteState {
    // The worker goes first: its thread may still be reading blocks' bytes.
    ~RemoteState() {
      tier.reset();
      worker.reset();
    }
    std::unique_ptr<remote::RemoteWorker> worker;
    // The cluster as a StorageTier: every block goes in and out through it (sessions'
    // records through the worker).
    std::unique_ptr<RemoteStorageTier> tier;
    // Per session: its first `synced` blocks were handed to the worker (lowered again to
    // the first that failed when a write-behind reports failures, and to a cut).
    std::unordered_map<policy::SessionKey, uint32_t, policy::SessionKeyHasher> synced;
    // Per session: blocks held here that its last end of turn could not write behind
    // (in GPU memory or on NVMe); `deferred_blocks` is their sum.
    std::unordered_map<policy::SessionKey, uint32_t, policy::SessionKeyHasher> deferred;
    uint64_t deferred_blocks = 0;
    // Sessions with blocks still to write behind (deferred, failed or declined): the
    // periodic sweep tries them again, a bounded number per second, so blocks saved into
    // GPU memory are written once the policy demoted them to RAM.
    // In order (oldest first; the set says which entries of the queue still count).
    std::unordered_set<policy::SessionKey, policy::SessionKeyHasher> unsynced;
    std::deque<policy::SessionKey> unsynced_order;
    void mark_unsynced(const policy::SessionKey& key) {
      if (unsynced.insert(key).second) unsynced_order.push_back(key);
    }
    uint64_t last_sweep_ms = 0;
    uint64_t written_blocks = 0;    // written behind, confirmed
    uint64_t failed_blocks = 0;     // written behind, refused or unreachable
    uint64_t declined_writes = 0;   // write-behinds the in-flight bound declined
    uint64_t lookup_hits = 0;       // blocks a Lookup found only in the remote tier
    uint64_t resumed_sessions = 0;  // sessions a BeginTurn created from a remote record
  };

  struct ResumedGrowth;  // remote_read_path.cpp
  // resume_from_remote's answer from the cluster: `value` is the session's record, or
  // why there is none. A session known by now begins its turn as it is; one the record
  // resumes is created and restored (restore_resumed_session); else the request is
  // answered with the error.
  void resume_from_record(const ConnectionPtr& c, const EngineContext& engine, uint64_t id,
                          const std::string& session_id, const Resumed& begin_turn,
                          Result<std::string> value) KVTIER_REQUIRES(control_thread);
  // Grows `session` by the record's blocks held here, restores its statistics, begins
  // its turn, and reads the rest of its blocks from the cluster.
  void restore_resumed_session(const EngineContext& engine, policy::Session& session,
                               const NvmeSessionRecord& record, const Resumed& begin_turn)
      KVTIER_REQUIRES(control_thread);
  // The read of the resumed session's block `i` of `growth.rest` ended: the session grows
  // by the leading blocks that landed.
  void grow_resumed_session(ResumedGrowth& growth, size_t i, const Status& status)
      KVTIER_REQUIRES(control_thread);

  // A write-behind of the session's blocks from `from` on (`taken` of them) ended:
  // counted, the session's mark lowered to the first not written (the sweep tries
  // again), its record written after its blocks, and the next batch started.
  void on_written_behind(const policy::SessionKey& key, const std::string& ns, uint32_t from,
                         size_t taken, MoveExecutor::CopyOutResult result)
      KVTIER_REQUIRES(control_thread);

  SessionJournal& journal_;
  std::unique_ptr<RemoteState> remote_
      KVTIER_GUARDED_BY(control_thread);  // null without remote-nodes
};

}  // namespace kvtier::daemon
