// TurnPath: BeginTurn and CloseSession (turn_path.h).
#include "daemon/turn_path.h"

#include <algorithm>
#include <memory>

#include "daemon/remote_path.h"
#include "daemon/save_path.h"

namespace kvtier::daemon {

Status TurnPath::handle_begin_turn(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                                   const std::string& session_id) {
  saves_.forget_cut(engine.namespace_id, session_id);  // a new turn
  policy::Session* session = ctx_.sessions.find(engine.namespace_id, session_id);
  if (session != nullptr && !(session->layout == engine.layout_key)) {
    // Another layout's (save_path.cpp): nothing of it is this engine's to load, and it
    // stays between turns, so that this engine's Save may replace it.
    return not_found("unknown session '{}' for this layout (it holds another layout's blocks)",
                     session_id);
  }
  if (session == nullptr) {
    if (!remote_.enabled()) return not_found("unknown session '{}'", session_id);
    // Answered when the record came (or not).
    remote_.resume_from_remote(
        c, engine, id, session_id,
        [this, c, id, engine_ref = std::static_pointer_cast<const EngineContext>(c->user_state)](
            policy::Session& session, uint32_t fetching) {
          assert_control_thread();
          begin_turn(c, *engine_ref, id, session, fetching);
        });
    return Status::ok();
  }
  begin_turn(c, engine, id, *session, 0);
  return Status::ok();
}

void TurnPath::begin_turn(const ConnectionPtr& c, const EngineContext& engine, uint64_t id,
                          policy::Session& session, uint32_t fetching) {
  ctx_.sessions.record_activity(session);
  session.turn_begun = true;
  session.turn_begun_ms = now_ms();
  ctx_.sessions.expire_priorities(ctx_.sessions.now_ms());
  auto moves = ctx_.planner.plan_turn_start(session, ctx_.sessions, *ctx_.view);
  ctx_.mover->apply(moves, engine.gpu_part);  // toward the GPU of the engine that will load them
  const auto known = static_cast<uint32_t>(session.blocks.size()) + fetching;
  // The plan may also demote other sessions' blocks to make room: count promotions.
  const auto promoted = std::count_if(moves.begin(), moves.end(), [](const policy::Move& move) {
    return move.kind == policy::MoveKind::kPromote;
  });
  reply(c, id, [&](wire::Response::Builder response) {
    auto out = response.initBeginTurn();
    out.setKnownBlocks(known);
    out.setPromotedBlocks(static_cast<uint32_t>(promoted) + fetching);
  });
}

Status TurnPath::handle_close_session(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                                      const std::string& session_id) {
  const policy::Session* session = ctx_.sessions.find(engine.namespace_id, session_id);
  if (session == nullptr) return not_found("unknown session '{}'", session_id);
  // Drops its references; the parts that keep something per session hear of it.
  auto closed = ctx_.sessions.close(engine.namespace_id, session_id);
  if (!closed.is_ok()) return closed.status();
  reply(c, id, [&](wire::Response::Builder response) {
    response.initCloseSession().setReleasedBlocks(static_cast<uint32_t>(closed->size()));
  });
  return Status::ok();
}

}  // namespace kvtier::daemon
