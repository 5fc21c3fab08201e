#include "policy/session_table.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

namespace kvtier::policy {

Result<Session*> SessionTable::get_or_create(uint32_t namespace_id, const std::string& id,
                                             const LayoutKey& layout) {
  auto [it, inserted] = sessions_.try_emplace(SessionKey{namespace_id, id});
  Session& session = it->second;
  if (inserted) {
    const uint64_t now = clock_.now_ms();
    session.namespace_id = namespace_id;
    session.id = id;
    session.layout = layout;
    session.state = SessionState::kActive;
    session.created_ms = now;
    session.last_active_ms = now;
    count_in(session, +1);
    return &session;
  }
  // Blocks are interchangeable only within one layout, so a session id reused by an
  // engine with another layout must not silently mix blocks of both.
  if (!(session.layout == layout)) {
    return invalid_argument("session '{}' belongs to another layout", id);
  }
  return &session;
}

Session* SessionTable::find(uint32_t namespace_id, const std::string& id) {
  auto it = sessions_.find(SessionKey{namespace_id, id});
  return it == sessions_.end() ? nullptr : &it->second;
}

const Session* SessionTable::find(uint32_t namespace_id, const std::string& id) const {
  auto it = sessions_.find(SessionKey{namespace_id, id});
  return it == sessions_.end() ? nullptr : &it->second;
}

std::vector<BlockHash> SessionTable::record_save(Session& session,
                                                 const std::vector<BlockHash>& hashes,
                                                 bool end_of_turn) {
  // A per-call set keeps a save of n hashes into a session of m blocks O(n + m)
  // without storing an index per session (memory target: 8 B per block ref).
  std::unordered_set<BlockHash, BlockHashHasher> present(session.blocks.begin(),
                                                         session.blocks.end());
  std::vector<BlockHash> appended;
  for (const BlockHash& hash : hashes) {
    if (present.insert(hash).second) {
      session.blocks.push_back(hash);
      appended.push_back(hash);
    }
  }
  end_idle_period(session);
  session.last_active_ms = clock_.now_ms();
  if (end_of_turn) {
    set_state(session, SessionState::kIdle);
    ++session.turns;
  } else {
    set_state(session, SessionState::kActive);
  }
  return appended;
}

void SessionTable::record_activity(Session& session) {
  end_idle_period(session);
  set_state(session, SessionState::kActive);
  session.last_active_ms = clock_.now_ms();
}

bool SessionTable::forget_block(Session& session, const BlockHash& hash) {
  auto it = std::find(session.blocks.begin(), session.blocks.end(), hash);
  if (it == session.blocks.end()) return false;
  session.blocks.erase(it);
  return true;
}

Result<std::vector<BlockHash>> SessionTable::close(uint32_t namespace_id, const std::string& id) {
  auto it = sessions_.find(SessionKey{namespace_id, id});
  if (it == sessions_.end()) return not_found("session '{}' not found", id);
  const Session& session = it->second;
  if (session.state == SessionState::kIdle) {
    const uint64_t now = clock_.now_ms();
    gap_model_.record_censored(session.returns,
                               now > session.last_active_ms ? now - session.last_active_ms : 0);
  }
  count_in(session, -1);
  std::vector<BlockHash> blocks = std::move(it->second.blocks);
  sessions_.erase(it);
  return blocks;
}

void SessionTable::end_idle_period(Session& session) {
  if (session.state != SessionState::kIdle) return;
  const uint64_t now = clock_.now_ms();
  const uint64_t gap = now > session.last_active_ms ? now - session.last_active_ms : 0;
  gap_model_.record_return(session.returns, gap);
  ++session.returns;
  session.sum_log_gap += std::log(static_cast<double>(gap) + 1.0);
}

std::vector<const Session*> SessionTable::by_last_active() const {
  std::vector<const Session*> out;
  out.reserve(sessions_.size());
  for (const auto& [key, session] : sessions_) out.push_back(&session);
  // Ties are broken by id (then namespace) so that plans do not depend on hash-map
  // iteration order: the simulator and tests must be reproducible.
  std::sort(out.begin(), out.end(), [](const Session* a, const Session* b) {
    if (a->last_active_ms != b->last_active_ms) return a->last_active_ms < b->last_active_ms;
    if (a->id != b->id) return a->id < b->id;
    return a->namespace_id < b->namespace_id;
  });
  return out;
}

size_t SessionTable::count(uint32_t namespace_id, SessionState state) const {
  auto it = by_namespace_.find(namespace_id);
  return it == by_namespace_.end() ? 0 : it->second[static_cast<size_t>(state)];
}

void SessionTable::set_state(Session& session, SessionState state) {
  if (session.state == state) return;
  count_in(session, -1);
  session.state = state;
  count_in(session, +1);
}

void SessionTable::count_in(const Session& session, int delta) {
  const auto state = static_cast<size_t>(session.state);
  totals_[state] += delta;
  auto& counts = by_namespace_[session.namespace_id];
  counts[state] += delta;
  if (counts[0] == 0 && counts[1] == 0) by_namespace_.erase(session.namespace_id);
}

}  // namespace kvtier::policy
