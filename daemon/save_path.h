// SavePath: a Save, from the request to its reply.
//
// Every block gets a slot on the control thread (Placement::reserve_block: a
// PendingWrite handle), the engine's planes are copied in as one batch (Copies), and
// each block is published by PendingWrite::commit once its bytes landed, so no reader
// ever sees a half-written block. A block another Save is writing is not written twice:
// this Save waits for that copy and answers only once it landed. A Save that finds
// every tier full of blocks being copied or read parks (save-room-wait-ms) and starts,
// in arrival order, when a copy or move makes room; once save-room-wait-ms is over it
// keeps the prefix that fits then (perhaps none) and is answered, never refused for room. When the
// Save is answered its blocks are the session's (the session table, the NVMe session record, and at
// the end of a turn the remote tier's write-behind).
//
// Thread-safety: control thread only (daemon_context.h).
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <unordered_map>
#include <vector>

#include "daemon/daemon_context.h"
#include "daemon/requests.h"

namespace kvtier::daemon {

class Placement;       // placement.h
class Copies;          // copies.h
class SessionJournal;  // session_journal.h

class SavePath final : public Part, public policy::SessionObserver {
 public:
  // `placement` finds room for new blocks, `copies` carries their bytes, `journal`
  // records a session's retention priority.
  SavePath(DaemonContext& ctx, Replies& replies, Placement& placement, Copies& copies,
           SessionJournal& journal)
      : Part(ctx, replies), placement_(placement), copies_(copies), journal_(journal) {}

  // Starts the Save, or parks it (behind the Saves already parked) while every tier is
  // full of blocks being copied or read: a copy finishing makes room.
  Status handle_save(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                     BlockListRequest request) KVTIER_REQUIRES(control_thread);
  // Starts the parked Saves that fit now, in arrival order; answers those whose wait
  // (save-room-wait-ms) is over, and all of them once the daemon is stopping.
  void resume_parked_saves() KVTIER_REQUIRES(control_thread);
  // A Save's copy, or a read from the remote tier, of `key` ended: Saves that found it
  // being written go on.
  void wake_write_waiters(const BlockKey& key, bool landed) KVTIER_REQUIRES(control_thread);
  // The connection closed: its parked Saves are dropped unanswered.
  void forget(const ConnectionPtr& connection) KVTIER_REQUIRES(control_thread);
  // A new turn (BeginTurn) or the session's end: a Save cut short in it no longer
  // refuses the blocks that would follow the cut.
  void forget_cut(uint32_t namespace_id, const std::string& session_id)
      KVTIER_REQUIRES(control_thread);
  // The session's end: its cut mark goes (SessionObserver).
  void session_closed(uint32_t namespace_id, const std::string& session_id) override
      KVTIER_REQUIRES(control_thread) {
    forget_cut(namespace_id, session_id);
  }

 private:
  struct SaveInProgress;  // save_path.cpp
  // Reserves the Save's slots and starts its copy; false when no room could be made
  // (nothing reserved then; `request` is left as it was). On the `last_try` a Save that
  // finds no room keeps the prefix that fits instead (a partial Save, perhaps empty).
  Result<bool> start_save(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                          BlockListRequest& request, bool last_try) KVTIER_REQUIRES(control_thread);
  // No room for blocks[fit] on, and no more waiting: the Save keeps the prefix before it
  // (`request` is cut there), counts the rest as not saved, and marks the session cut
  // for the turn's later pieces (cut_sessions_).
  void keep_prefix_that_fits(const EngineContext& engine, BlockListRequest& request, size_t fit,
                             const Status& no_room) KVTIER_REQUIRES(control_thread);
  // A Save under the id of `session`, which holds another layout's blocks: closes it
  // when it is between turns (the conversation goes on with another model), else
  // InvalidArgument.
  Status replace_session_of_another_layout(const EngineContext& engine,
                                           const policy::Session& session)
      KVTIER_REQUIRES(control_thread);
  // Replies once the Save's copy and the blocks it waited for (written by another
  // Save) are done; records the session's blocks when every one landed.
  void finish_save(const ConnectionPtr& c, uint64_t id, const EngineContext& engine,
                   SaveInProgress& save) KVTIER_REQUIRES(control_thread);
  // A Save's retention priorities, for its session and ranges of its blocks.
  void apply_retention(policy::Session& session, const BlockListRequest& request)
      KVTIER_REQUIRES(control_thread);

  // Blocks a Save is writing that other Saves also named: those wait for the bytes.
  std::unordered_map<BlockKey, std::vector<std::function<void(bool landed)>>, BlockKeyHasher>
      write_waiters_ KVTIER_GUARDED_BY(control_thread);
  // Saves waiting for room, oldest first (handle_save).
  struct ParkedSave {
    ConnectionPtr connection;
    uint64_t request_id;
    BlockListRequest request;
    std::chrono::steady_clock::time_point deadline;
  };
  std::deque<ParkedSave> parked_saves_ KVTIER_GUARDED_BY(control_thread);
  // Sessions whose Save was cut short this turn, and the first block of their prefix.
  // An engine that sends a turn's Save in several pieces (pipelined) has later pieces on
  // their way when an earlier one is cut: their blocks would follow a hole, never be
  // loaded, and hold room. Until the turn ends (a Save with endOfTurn, which still ends
  // it; BeginTurn; CloseSession) or a Save starts again from the session's first block,
  // such a Save keeps nothing.
  std::unordered_map<policy::SessionKey, BlockHash, policy::SessionKeyHasher> cut_sessions_
      KVTIER_GUARDED_BY(control_thread);
  // resume_parked_saves() is running (no re-entry).
  bool resuming_saves_ KVTIER_GUARDED_BY(control_thread) = false;
  Placement& placement_;
  Copies& copies_;
  SessionJournal& journal_;
};

}  // namespace kvtier::daemon
