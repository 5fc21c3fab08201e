// AdminService: kvtierctl's requests — Stats, ListSessions and GetSession (read-only
// views for operators and engines), and the admin ones that refuse non-admins: Evict,
// Pin, Drain, GetConfig.
//
// Admin requests act through the same mechanisms as the data path: an evicted session
// is closed like CloseSession and its unshared blocks leave the BlockStore like the
// planner's evictions; a pin is a BlockStore pin per block (PinnedBlock), which the
// planner already treats as "not movable", so a pinned session is never demoted or
// evicted.
//
// Thread-safety: control thread only (daemon_context.h).
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "daemon/daemon_context.h"
#include "daemon/requests.h"

namespace kvtier::daemon {

class SessionJournal;  // session_journal.h
class StartupGate;     // startup_gate.h
class RemotePath;      // remote_path.h

class AdminService final : public Part, public policy::SessionObserver {
 public:
  // What Stats reports and Drain uses of the NVMe tier (`journal`), the memory fill
  // (`startup`) and the remote tier (`remote`).
  AdminService(DaemonContext& ctx, Replies& replies, SessionJournal& journal, StartupGate& startup,
               RemotePath& remote)
      : Part(ctx, replies), journal_(journal), startup_(startup), remote_(remote) {}
  // The session's end: an admin's pins on it go (SessionObserver).
  void session_closed(uint32_t namespace_id, const std::string& session_id) override
      KVTIER_REQUIRES(control_thread) {
    admin_pins_.erase({namespace_id, session_id});
  }
  // A pinned session's new blocks are pinned as they join it (SessionObserver; a
  // session's blocks are written before they join it, so each can be pinned).
  void session_grew(const policy::Session& session, std::span<const BlockHash> added) override
      KVTIER_REQUIRES(control_thread);
  // A pinned session's pins on the blocks past its cut go (SessionObserver).
  void session_cut(const policy::Session& session) override KVTIER_REQUIRES(control_thread);

  // introspection.cpp
  Status handle_stats(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                      bool all_namespaces) KVTIER_REQUIRES(control_thread);
  // One page of the listing (ListSessionsRequest), served a slice at a time: the walk
  // for the page takes kListingWalkSlice sessions per turn of the event loop and the
  // page is described kListingDescribeSlice sessions per turn, so the requests of
  // engines run between slices instead of waiting for the whole page.
  Status handle_list_sessions(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                              const ListSessionsRequest& request) KVTIER_REQUIRES(control_thread);
  static constexpr size_t kListingWalkSlice = 128;
  static constexpr size_t kListingDescribeSlice = 4;
  // admin.cpp
  Status handle_get_session(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                            const SessionTarget& request) KVTIER_REQUIRES(control_thread);
  Status handle_evict(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                      const EvictRequest& request) KVTIER_REQUIRES(control_thread);
  Status handle_pin(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                    const PinRequest& request) KVTIER_REQUIRES(control_thread);
  Status handle_drain(const ConnectionPtr& c, EngineContext& engine, uint64_t id)
      KVTIER_REQUIRES(control_thread);
  Status handle_get_config(const ConnectionPtr& c, EngineContext& engine, uint64_t id)
      KVTIER_REQUIRES(control_thread);

  uint64_t pinned_sessions() const KVTIER_REQUIRES(control_thread) { return admin_pins_.size(); }
  uint64_t admin_pinned_blocks() const KVTIER_REQUIRES(control_thread);
  // Blocks pinned by copies in flight only (admin pins left out).
  uint64_t copy_pinned_blocks() const KVTIER_REQUIRES(control_thread);

 private:
  // The session an admin request names: in `namespace_name`, or wherever the id is
  // when that is empty (NotFound / InvalidArgument when absent or ambiguous).
  Result<policy::Session*> find_session_for_admin(const std::string& session_id,
                                                  const std::string& namespace_name)
      KVTIER_REQUIRES(control_thread);
  // Pins each of `blocks` of `session` into `held`.
  void pin_blocks(const policy::Session& session, std::span<const BlockHash> blocks,
                  std::vector<PinnedBlock>& held) KVTIER_REQUIRES(control_thread);
  struct Listing;  // a page being listed (introspection.cpp)
  // One slice of `listing`'s walk or description; posts the next, or replies.
  void continue_listing(const std::shared_ptr<Listing>& listing) KVTIER_REQUIRES(control_thread);
  void fill_session_info(const policy::Session& session, wire::SessionInfo::Builder out) const
      KVTIER_REQUIRES(control_thread);
  // The same with a return-predictor snapshot taken once for a whole listing.
  void fill_session_info(const policy::Session& session, wire::SessionInfo::Builder out,
                         const policy::ReturnPredictor& predictor) const
      KVTIER_REQUIRES(control_thread);

  // Admin-pinned sessions → one pin on each of their blocks. Released before the store
  // is destroyed (the Service's order).
  std::map<std::pair<uint32_t, std::string>, std::vector<PinnedBlock>> admin_pins_
      KVTIER_GUARDED_BY(control_thread);
  SessionJournal& journal_;
  StartupGate& startup_;
  RemotePath& remote_;
};

}  // namespace kvtier::daemon
