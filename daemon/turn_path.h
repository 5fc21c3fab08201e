// TurnPath: a session's turns. BeginTurn marks the session active and has the planner
// promote its blocks toward the engine's GPU ahead of the Load (a session this node does
// not know is first looked for in the remote tier); CloseSession ends a session and
// drops its references to its blocks, which stay as prefix cache.
//
// Thread-safety: control thread only (daemon_context.h).
#pragma once

#include <string>

#include "daemon/daemon_context.h"

namespace kvtier::daemon {

class SavePath;    // save_path.h
class RemotePath;  // remote_path.h

class TurnPath final : public Part {
 public:
  // `saves`: a new turn forgets the last one's cut; `remote`: a session not known here
  // resumes from its remote record.
  TurnPath(DaemonContext& ctx, Replies& replies, SavePath& saves, RemotePath& remote)
      : Part(ctx, replies), saves_(saves), remote_(remote) {}

  Status handle_begin_turn(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                           const std::string& session_id) KVTIER_REQUIRES(control_thread);
  // BeginTurn of a known session: active, promotions planned, answered. `fetching`:
  // blocks being read from the remote tier for it (reported as known and promoted).
  void begin_turn(const ConnectionPtr& c, const EngineContext& engine, uint64_t id,
                  policy::Session& session, uint32_t fetching) KVTIER_REQUIRES(control_thread);
  Status handle_close_session(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                              const std::string& session_id) KVTIER_REQUIRES(control_thread);

 private:
  SavePath& saves_;
  RemotePath& remote_;
};

}  // namespace kvtier::daemon
