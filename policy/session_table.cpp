#include "policy/session_table.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

namespace kvtier::policy {

// What a held block costs the table (holder_table.h): the hash sits in the holders'
// tail padding.
static_assert(sizeof(HolderIndex::Entry) == 72);

Result<Session*> SessionTable::get_or_create(uint32_t namespace_id, const std::string& id,
                                             const LayoutKey& layout) {
  auto [it, inserted] = sessions_.try_emplace(SessionKey{namespace_id, id});
  Session& session = it->second;
  if (inserted) {
    const uint64_t now = clock_.now_ms();
    session.namespace_id = namespace_id;
    session.id = id;
    session.layout = layout;
    session.blocks.index_ = &holders_[layout];  // made with the first session of a layout
    session.state = SessionState::kActive;
    session.created_ms = now;
    session.last_active_ms = now;
    session.touch_seq = ++touch_seq_;
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
  std::vector<BlockHash> appended = append_blocks(session, hashes);
  // Out of the idle order before the return is counted: the census files it by its
  // return count.
  if (session.state == SessionState::kIdle) idle_erase(session);
  end_idle_period(session);
  if (end_of_turn) {
    ++session.turns;
    // A turn that ended without a Load after its BeginTurn gives no turn lead: a Load
    // in some later turn must not be timed from it.
    session.turn_begun = false;
  }
  change(session, end_of_turn ? SessionState::kIdle : SessionState::kActive, clock_.now_ms());
  if (end_of_turn) {
    for (SessionObserver* observer : observers_) observer->turn_ended(session);
  }
  return appended;
}

void SessionTable::record_uses(const LayoutKey& layout, const std::vector<BlockHash>& hashes) {
  for (const BlockHash& hash : hashes) reuse_.record_use({layout, hash});
}

std::vector<BlockHash> SessionTable::append_blocks(Session& session,
                                                   const std::vector<BlockHash>& hashes) {
  // A per-call set keeps a save of n hashes into a session of m blocks O(n + m)
  // without storing an index per session (memory target: 8 B per block ref).
  std::unordered_set<BlockHash, BlockHashHasher> present(session.blocks.begin(),
                                                         session.blocks.end());
  std::vector<BlockHash> appended;
  for (const BlockHash& hash : hashes) {
    if (present.insert(hash).second) appended.push_back(hash);
  }
  // Grown by a quarter at least, not doubled: a session's list is most of what it
  // costs, and the slack of doubling was a third of it.
  std::vector<HolderIndex::Id>& entries = session.blocks.ids_;
  const size_t needed = entries.size() + appended.size();
  if (needed > entries.capacity()) {
    entries.reserve(std::max(needed, entries.size() + entries.size() / 4));
  }
  for (const BlockHash& hash : appended) {
    entries.push_back(add_holder(session, hash, static_cast<uint32_t>(entries.size())));
  }
  if (!appended.empty()) {
    for (SessionObserver* observer : observers_) observer->session_grew(session, appended);
  }
  return appended;
}

void SessionTable::record_activity(Session& session) {
  if (session.state == SessionState::kIdle) idle_erase(session);
  end_idle_period(session);
  change(session, SessionState::kActive, clock_.now_ms());
}

void SessionTable::restore(Session& session, SessionState state, uint64_t last_active_ms) {
  change(session, state, last_active_ms);
}

void SessionTable::change(Session& session, SessionState state, uint64_t now_ms) {
  if (session.state == SessionState::kIdle) idle_erase(session);
  const int active_delta =
      (state == SessionState::kActive ? 1 : 0) - (session.state == SessionState::kActive ? 1 : 0);
  set_state(session, state);
  session.last_active_ms = now_ms;
  session.touch_seq = ++touch_seq_;
  HolderIndex& index = index_of(session);
  for (HolderIndex::Id id : session.blocks.ids_) {
    BlockHolders& h = index.at(id).holders;
    h.active = static_cast<uint32_t>(static_cast<int64_t>(h.active) + active_delta);
    h.hot_seq = session.touch_seq;
    h.hot_ms = std::max(h.hot_ms, now_ms);
  }
  if (state == SessionState::kIdle) idle_insert(session);
}

void SessionTable::add_priority(BlockHolders& h, uint8_t priority) {
  if (priority > h.max_priority) {
    h.max_priority = priority;
    h.at_max = 1;
  } else if (priority == h.max_priority) {
    ++h.at_max;
  }
}

bool SessionTable::remove_priority(BlockHolders& h, uint8_t priority) {
  if (priority != h.max_priority || --h.at_max > 0) return false;
  // The last holder at the top left: a scan of the holders (O(sharing), and only when
  // the highest priority changes).
  h.max_priority = 0;
  h.for_each([&](const Session& s) { add_priority(h, s.priority); });
  return true;
}

void SessionTable::set_priority(Session& session, uint8_t priority, uint64_t until_ms) {
  if (session.priority_until_ms != 0) {
    session_expiries_.erase({session.priority_until_ms, &session});
  }
  session.priority_until_ms = until_ms;
  if (until_ms != 0) session_expiries_.insert({until_ms, &session});
  const uint8_t old = session.priority;
  if (old == priority) return;
  session.priority = priority;
  HolderIndex& index = index_of(session);
  for (HolderIndex::Id id : session.blocks.ids_) {
    BlockHolders& h = index.at(id).holders;
    // A scan (the session's old priority was the last at the top) finds it at its new
    // priority already.
    if (!remove_priority(h, old)) add_priority(h, priority);
  }
}

bool SessionTable::set_block_priority(const BlockKey& key, uint8_t priority, uint64_t until_ms) {
  HolderIndex* index = index_of(key.layout);
  const HolderIndex::Id id = index == nullptr ? HolderIndex::kNone : index->find(key.hash);
  if (id == HolderIndex::kNone) return false;
  BlockHolders& h = index->at(id).holders;
  if (priority != 0 && priority < h.priority() && h.count() > 1) return true;  // shared
  clear_block_expiry(key);
  h.block_priority = priority;
  if (priority != 0 && until_ms != 0) {
    block_priority_until_.emplace(key, block_expiries_.emplace(until_ms, key));
  }
  return true;
}

void SessionTable::clear_block_expiry(const BlockKey& key) {
  auto until = block_priority_until_.find(key);
  if (until == block_priority_until_.end()) return;
  block_expiries_.erase(until->second);
  block_priority_until_.erase(until);
}

void SessionTable::expire_priorities(uint64_t now_ms) {
  while (!session_expiries_.empty() && session_expiries_.begin()->first <= now_ms) {
    Session* session = session_expiries_.begin()->second;
    set_priority(*session, kDefaultPriority);  // erases its expiry
  }
  while (!block_expiries_.empty() && block_expiries_.begin()->first <= now_ms) {
    const BlockKey key = block_expiries_.begin()->second;
    clear_block_expiry(key);
    if (HolderIndex* index = index_of(key.layout)) {
      if (const HolderIndex::Id id = index->find(key.hash); id != HolderIndex::kNone) {
        index->at(id).holders.block_priority = 0;
      }
    }
  }
}

HolderIndex::Id SessionTable::add_holder(const Session& session, const BlockHash& hash,
                                         uint32_t depth) {
  if (references_ != nullptr) references_->add_reference({session.layout, hash});
  HolderIndex& index = index_of(session);
  const HolderIndex::Id id = index.try_emplace(hash).first;
  BlockHolders& h = index.at(id).holders;
  h.sessions.add(&session);
  if (session.state == SessionState::kActive) ++h.active;
  add_priority(h, session.priority);
  if (h.block_priority != 0 && h.block_priority < session.priority) {
    // Lowered while others did not hold it: a session that wants it more takes it up.
    clear_block_expiry({session.layout, hash});
    h.block_priority = 0;
  }
  h.depth = std::max(h.depth, depth);
  h.hot_seq = std::max(h.hot_seq, session.touch_seq);
  h.hot_ms = std::max(h.hot_ms, session.last_active_ms);
  return id;
}

void SessionTable::drop_holder(const Session& session, const BlockHash& hash) {
  if (references_ != nullptr) references_->drop_reference({session.layout, hash});
  HolderIndex& index = index_of(session);
  const HolderIndex::Id id = index.find(hash);
  if (id == HolderIndex::kNone) return;
  BlockHolders& h = index.at(id).holders;
  // Shared blocks: a scan of their holders (a block held by n sessions costs O(n) to
  // leave; n is the sharing, not the daemon's size).
  if (!h.sessions.remove(&session)) return;
  if (h.sessions.empty()) {
    if (h.block_priority != 0) clear_block_expiry({session.layout, hash});
    index.erase(id);
    return;
  }
  if (session.state == SessionState::kActive) --h.active;
  (void)remove_priority(h, session.priority);
}

const BlockHolders* SessionTable::holders(const BlockKey& key) const {
  const HolderIndex* index = index_of(key.layout);
  if (index == nullptr) return nullptr;
  const HolderIndex::Id id = index->find(key.hash);
  return id == HolderIndex::kNone ? nullptr : &index->at(id).holders;
}

void SessionTable::idle_insert(Session& session) {
  idle_.insert(idle_key(session));
  const int stratum = GapModel::stratum_of(session.returns);
  idle_by_stratum_[stratum].insert(idle_key(session));
  if (census_counted_) census_[stratum][census_bin(session.last_active_ms)] += 1;
}

void SessionTable::idle_erase(const Session& session) {
  auto it = idle_.find(idle_key(session));
  if (it == idle_.end()) return;
  idle_.erase(it);
  const int stratum = GapModel::stratum_of(session.returns);
  idle_by_stratum_[stratum].erase(idle_key(session));
  if (census_counted_) census_[stratum][census_bin(session.last_active_ms)] -= 1;
}

int SessionTable::census_bin(uint64_t last_active_ms) const {
  const uint64_t idle = census_ms_ > last_active_ms ? census_ms_ - last_active_ms : 0;
  return GapModel::bin_of(static_cast<double>(idle));
}

namespace {

// The least whole idle time (ms) in each bin: idle >= kBinFloor[b] <=> bin_of(idle) >= b.
const std::array<uint64_t, GapModel::kBins>& bin_floors() {
  static const std::array<uint64_t, GapModel::kBins> floors = [] {
    std::array<uint64_t, GapModel::kBins> out{};
    for (int b = 1; b < GapModel::kBins; ++b) {
      auto ms = static_cast<uint64_t>(GapModel::bin_start_ms(b));
      while (ms > 0 && GapModel::bin_of(static_cast<double>(ms - 1)) >= b) --ms;
      while (GapModel::bin_of(static_cast<double>(ms)) < b) ++ms;
      out[b] = ms;
    }
    return out;
  }();
  return floors;
}

}  // namespace

const SessionTable::Census& SessionTable::idle_census(uint64_t now_ms) const {
  if (!census_counted_ || now_ms < census_ms_ || now_ms - census_ms_ >= kCensusRefreshMs) {
    recount_census(now_ms);
  }
  return census_;
}

void SessionTable::recount_census(uint64_t now_ms) const {
  const std::array<uint64_t, GapModel::kBins>& floors = bin_floors();
  census_ = Census{};
  for (int s = 0; s < GapModel::kStrata; ++s) {
    const CountingTree& tree = idle_by_stratum_[s];
    // at_least: the sessions idle for at least the start of bin b, i.e. idle since
    // at most now - floor (sessions stamped after now count as idle 0 ms).
    auto at_least_prev = static_cast<double>(tree.size());
    for (int b = 1; b < GapModel::kBins && at_least_prev > 0; ++b) {
      double at_least = 0;
      if (now_ms >= floors[b]) {
        at_least =
            static_cast<double>(tree.order_of_key(IdleKey{now_ms - floors[b] + 1, 0, nullptr}));
      }
      census_[s][b - 1] = at_least_prev - at_least;
      at_least_prev = at_least;
    }
    if (at_least_prev > 0) census_[s][GapModel::kBins - 1] = at_least_prev;
  }
  census_ms_ = now_ms;
  census_counted_ = true;
}

bool SessionTable::forget_block(Session& session, const BlockHash& hash) {
  std::vector<HolderIndex::Id>& entries = session.blocks.ids_;
  auto it = std::find_if(entries.begin(), entries.end(),
                         [&](HolderIndex::Id id) { return session.blocks.index_->at(id).hash == hash; });
  if (it == entries.end()) return false;
  entries.erase(it);  // first: dropping the last holder frees the entry
  drop_holder(session, hash);
  return true;
}

std::vector<BlockHash> SessionTable::truncate(Session& session, size_t length) {
  if (length >= session.blocks.size()) return {};
  std::vector<BlockHash> dropped(session.blocks.begin() + static_cast<ptrdiff_t>(length),
                                 session.blocks.end());
  session.blocks.ids_.resize(length);  // first: dropping the last holder frees the entry
  for (const BlockHash& hash : dropped) drop_holder(session, hash);
  for (SessionObserver* observer : observers_) observer->session_cut(session);
  return dropped;
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
  if (session.state == SessionState::kIdle) idle_erase(session);
  if (session.priority_until_ms != 0) {
    session_expiries_.erase({session.priority_until_ms, const_cast<Session*>(&session)});
  }
  std::vector<BlockHash> blocks = session.blocks.hashes();
  it->second.blocks.ids_.clear();  // first: dropping the last holder frees the entry
  for (const BlockHash& hash : blocks) drop_holder(session, hash);
  count_in(session, -1);
  const std::string closed_id = id;  // before the erase: `id` may be the session's own
  sessions_.erase(it);
  for (SessionObserver* observer : observers_) observer->session_closed(namespace_id, closed_id);
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
