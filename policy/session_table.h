// SessionTable: every open session (conversation) the daemon knows, keyed by
// (namespace, session id). A session is an ordered list of block hashes — the
// conversation's prefix — plus its timestamps, turn counts, the gaps between its
// turns and a priority. Pure bookkeeping on an injected clock: no I/O, no threads.
//
// Lifecycle: active (a turn in progress) → idle (the turn ended) → active again when
// it returns (BeginTurn, Load or Save) … → closed (removed). Each end of an idle
// period is reported to the table's GapModel: a return with its gap, or a close while
// idle as a censored observation. That is how the return predictor learns online.
//
// Thread-safety: none; the control thread owns it (the simulator owns its own).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/block_key.h"
#include "common/status.h"
#include "policy/clock.h"
#include "policy/gap_model.h"

namespace kvtier::policy {

enum class SessionState : uint8_t { kActive = 0, kIdle = 1 };

struct Session {
  uint32_t namespace_id = 0;
  std::string id;
  LayoutKey layout;               // all of a session's blocks share one layout
  std::vector<BlockHash> blocks;  // prefix order, no duplicates
  SessionState state = SessionState::kActive;
  uint64_t created_ms = 0;
  uint64_t last_active_ms = 0;  // last Save/Load/BeginTurn
  uint32_t turns = 0;           // turns ended (Save with endOfTurn)
  uint32_t returns = 0;         // idle periods that ended with the session coming back
  double sum_log_gap = 0;       // Σ ln(gap ms + 1) over those returns (its turn rhythm)
  uint8_t priority = 0;         // 0: normal; > 0: durable — kept above every normal session
};

struct SessionKey {
  uint32_t namespace_id;
  std::string id;
  friend bool operator==(const SessionKey&, const SessionKey&) = default;
};

struct SessionKeyHasher {
  size_t operator()(const SessionKey& key) const {
    return std::hash<std::string>()(key.id) ^ (static_cast<size_t>(key.namespace_id) << 1);
  }
};

class SessionTable {
 public:
  explicit SessionTable(const Clock& clock) : clock_(clock) {}

  // Returns the session, creating it (active, no blocks) when absent. A session's
  // layout is fixed by its first use: InvalidArgument when `layout` differs.
  Result<Session*> get_or_create(uint32_t namespace_id, const std::string& id,
                                 const LayoutKey& layout);
  Session* find(uint32_t namespace_id, const std::string& id);
  const Session* find(uint32_t namespace_id, const std::string& id) const;

  // Appends the hashes not yet in the session, in order; returns those appended (the
  // caller adds block references for exactly these). Marks the session active, or
  // idle with turns+1 when `end_of_turn`.
  std::vector<BlockHash> record_save(Session& session, const std::vector<BlockHash>& hashes,
                                     bool end_of_turn);
  // A turn started (BeginTurn) or the session read its blocks (Load): active, touched.
  // An idle session becoming active is a return: its gap feeds the GapModel.
  void record_activity(Session& session);
  // Sets a session's state as recovered from disk (the counts below follow it). Every
  // other state change goes through record_save / record_activity.
  void restore_state(Session& session, SessionState state) { set_state(session, state); }
  // Marks a session (e.g. one holding a shared system prompt) durable or not.
  void set_priority(Session& session, uint8_t priority) { session.priority = priority; }
  // Drops a block from a session (it was evicted or lost); returns whether it was there.
  bool forget_block(Session& session, const BlockHash& hash);

  // Removes the session; returns its blocks so the caller can drop references.
  // Closing an idle session tells the GapModel it stayed away at least that long.
  // NotFound when absent.
  Result<std::vector<BlockHash>> close(uint32_t namespace_id, const std::string& id);

  // Sessions ordered by last activity, least recent first (demotion order).
  std::vector<const Session*> by_last_active() const;
  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (const auto& [key, session] : sessions_) fn(session);
  }

  size_t size() const { return sessions_.size(); }
  // Sessions in `state`, in all namespaces or in one; kept as counts, so O(1).
  size_t count(SessionState state) const { return totals_[static_cast<size_t>(state)]; }
  size_t count(uint32_t namespace_id, SessionState state) const;
  uint64_t now_ms() const { return clock_.now_ms(); }
  const GapModel& gap_model() const { return gap_model_; }

 private:
  void end_idle_period(Session& session);
  void set_state(Session& session, SessionState state);
  void count_in(const Session& session, int delta);

  const Clock& clock_;
  GapModel gap_model_;
  std::unordered_map<SessionKey, Session, SessionKeyHasher> sessions_;
  // Sessions per state, in total and per namespace: Stats reads them instead of
  // walking every session.
  std::array<size_t, 2> totals_{};
  std::unordered_map<uint32_t, std::array<size_t, 2>> by_namespace_;
};

}  // namespace kvtier::policy
