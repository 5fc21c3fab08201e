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

#include <algorithm>
#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <ext/pb_ds/assoc_container.hpp>
#include <ext/pb_ds/tree_policy.hpp>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/block_key.h"
#include "common/status.h"
#include "policy/block_reuse.h"
#include "policy/clock.h"
#include "policy/gap_model.h"
#include "policy/holder_table.h"

namespace kvtier::policy {

enum class SessionState : uint8_t { kActive = 0, kIdle = 1 };

// Retention priorities, as engines give them with a Save (TensorRT-LLM's scale): 1..100,
// higher is kept longer. Under pressure every policy gives blocks up lowest priority
// first (its own order among equals); above the default a session is durable: no idle
// demotion, and the predictive policy counts it as certain to return. A block's own
// priority (from a Save's block range) overrides its holders'; a priority given for a
// time returns to the default (a block's: to its holders') when the time is up.
inline constexpr uint8_t kMinPriority = 1;
inline constexpr uint8_t kMaxPriority = 100;
inline constexpr uint8_t kDefaultPriority = 35;

struct Session;

// The sessions holding one block, in no particular order, in 8 bytes: most blocks have
// one holder, kept inline (no allocation); a block held by more keeps them in a vector
// of its own (the word is then that vector's address, tagged by its low bit).
class HolderSet {
 public:
  HolderSet() = default;
  HolderSet(HolderSet&& other) noexcept : bits_(std::exchange(other.bits_, 0)) {}
  HolderSet& operator=(HolderSet&& other) noexcept {
    if (this != &other) {
      clear();
      bits_ = std::exchange(other.bits_, 0);
    }
    return *this;
  }
  HolderSet(const HolderSet&) = delete;
  HolderSet& operator=(const HolderSet&) = delete;
  ~HolderSet() { clear(); }

  bool empty() const { return bits_ == 0; }
  uint32_t size() const {
    if (is_list()) return static_cast<uint32_t>(list()->size());
    return bits_ == 0 ? 0 : 1;
  }
  const Session& operator[](size_t i) const {
    return is_list() ? *(*list())[i] : *reinterpret_cast<const Session*>(bits_);
  }
  void add(const Session* session) {
    if (bits_ == 0) {
      bits_ = reinterpret_cast<uintptr_t>(session);
      return;
    }
    if (!is_list()) {
      auto* more = new List{reinterpret_cast<const Session*>(bits_)};
      bits_ = reinterpret_cast<uintptr_t>(more) | 1;
    }
    list()->push_back(session);
  }
  // Whether `session` was a holder (a scan: O(holders)).
  bool remove(const Session* session) {
    if (!is_list()) {
      if (bits_ != reinterpret_cast<uintptr_t>(session)) return false;
      bits_ = 0;
      return true;
    }
    List& more = *list();
    auto at = std::find(more.begin(), more.end(), session);
    if (at == more.end()) return false;
    *at = more.back();
    more.pop_back();
    if (more.size() == 1) {
      const Session* last = more.front();
      delete &more;
      bits_ = reinterpret_cast<uintptr_t>(last);
    }
    return true;
  }

 private:
  using List = std::vector<const Session*>;
  bool is_list() const { return (bits_ & 1) != 0; }
  List* list() const { return reinterpret_cast<List*>(bits_ & ~uintptr_t{1}); }
  void clear() {
    if (is_list()) delete list();
    bits_ = 0;
  }
  uintptr_t bits_ = 0;
};

// Who holds one block, kept by the table as sessions change: the reverse index from a
// block to its sessions, and the facts the planner orders blocks by, so that a plan
// reads them per block instead of walking every session.
struct BlockHolders {
  uint32_t count() const { return sessions.size(); }
  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (uint32_t i = 0, n = sessions.size(); i < n; ++i) fn(sessions[i]);
  }
  // The first `limit` holders only: a prefix shared by every conversation has as many
  // holders as there are sessions, and a plan must not walk them all per block.
  template <typename Fn>
  void for_first(uint32_t limit, Fn&& fn) const {
    for (uint32_t i = 0, n = std::min(limit, sessions.size()); i < n; ++i) fn(sessions[i]);
  }
  // Whether `pred` holds for some holder; stops at the first that does.
  template <typename Pred>
  bool any_of(Pred&& pred) const {
    for (uint32_t i = 0, n = sessions.size(); i < n; ++i) {
      if (pred(sessions[i])) return true;
    }
    return false;
  }
  HolderSet sessions;
  // The latest touch_seq (and its time) of any holder. A holder leaving does not lower
  // it: it says when the block was last part of an active conversation.
  uint64_t hot_seq = 0;
  uint64_t hot_ms = 0;
  uint32_t active = 0;         // holders in a turn
  uint32_t at_max = 0;         // holders whose priority is max_priority
  uint32_t depth = 0;          // the largest index of the block in a holder's prefix
  uint8_t max_priority = 0;    // the highest priority among holders
  uint8_t block_priority = 0;  // the block's own (a Save's block range); 0: none
  // The priority the block is kept by: its own, else its holders' highest.
  uint8_t priority() const { return block_priority != 0 ? block_priority : max_priority; }
  bool durable() const { return priority() > kDefaultPriority; }
};

using HolderIndex = HolderTable<BlockHolders>;

// A session's blocks in prefix order, read as BlockHashes. Each is 4 bytes: the Id of
// the block's entry in the SessionTable's reverse index for the session's layout
// (HolderTable), which lives while some session holds the block. Only the SessionTable
// changes it.
class BlockList {
 public:
  class const_iterator {
   public:
    using iterator_category = std::random_access_iterator_tag;
    using value_type = BlockHash;
    using difference_type = std::ptrdiff_t;
    using pointer = const BlockHash*;
    using reference = const BlockHash&;
    const_iterator() = default;
    const_iterator(const HolderIndex* index, const HolderIndex::Id* at) : index_(index), at_(at) {}
    reference operator*() const { return index_->at(*at_).hash; }
    pointer operator->() const { return &index_->at(*at_).hash; }
    reference operator[](difference_type n) const { return index_->at(at_[n]).hash; }
    const_iterator& operator++() {
      ++at_;
      return *this;
    }
    const_iterator operator++(int) { return {index_, at_++}; }
    const_iterator& operator--() {
      --at_;
      return *this;
    }
    const_iterator operator--(int) { return {index_, at_--}; }
    const_iterator& operator+=(difference_type n) {
      at_ += n;
      return *this;
    }
    const_iterator& operator-=(difference_type n) {
      at_ -= n;
      return *this;
    }
    friend const_iterator operator+(const_iterator i, difference_type n) { return i += n; }
    friend const_iterator operator+(difference_type n, const_iterator i) { return i += n; }
    friend const_iterator operator-(const_iterator i, difference_type n) { return i -= n; }
    friend difference_type operator-(const_iterator a, const_iterator b) { return a.at_ - b.at_; }
    friend bool operator==(const_iterator a, const_iterator b) { return a.at_ == b.at_; }
    friend auto operator<=>(const_iterator a, const_iterator b) { return a.at_ <=> b.at_; }

   private:
    const HolderIndex* index_ = nullptr;
    const HolderIndex::Id* at_ = nullptr;
  };
  using iterator = const_iterator;
  using value_type = BlockHash;

  size_t size() const { return ids_.size(); }
  bool empty() const { return ids_.empty(); }
  const BlockHash& operator[](size_t i) const { return index_->at(ids_[i]).hash; }
  const BlockHash& front() const { return index_->at(ids_.front()).hash; }
  const BlockHash& back() const { return index_->at(ids_.back()).hash; }
  const_iterator begin() const { return {index_, ids_.data()}; }
  const_iterator end() const { return {index_, ids_.data() + ids_.size()}; }
  std::reverse_iterator<const_iterator> rbegin() const {
    return std::reverse_iterator<const_iterator>(end());
  }
  std::reverse_iterator<const_iterator> rend() const {
    return std::reverse_iterator<const_iterator>(begin());
  }
  // The hashes, copied.
  std::vector<BlockHash> hashes() const { return {begin(), end()}; }
  friend bool operator==(const BlockList& list, const std::vector<BlockHash>& hashes) {
    return std::equal(list.begin(), list.end(), hashes.begin(), hashes.end());
  }

 private:
  friend class SessionTable;
  const HolderIndex* index_ = nullptr;  // the table's
  std::vector<HolderIndex::Id> ids_;
};

struct Session {
  uint32_t namespace_id = 0;
  std::string id;
  LayoutKey layout;  // all of a session's blocks share one layout
  BlockList blocks;  // prefix order, no duplicates
  SessionState state = SessionState::kActive;
  uint64_t created_ms = 0;
  uint64_t last_active_ms = 0;          // last Save/Load/BeginTurn
  uint32_t turns = 0;                   // turns ended (Save with endOfTurn)
  uint32_t returns = 0;                 // idle periods that ended with the session coming back
  double sum_log_gap = 0;               // Σ ln(gap ms + 1) over those returns (its turn rhythm)
  uint8_t priority = kDefaultPriority;  // retention priority, 1..100 (kDefaultPriority)
  uint64_t priority_until_ms = 0;       // when it returns to the default; 0: never
  // A BeginTurn not yet followed by a Load, and when it came: the daemon measures the
  // turn lead from it (Planner::observe_turn_lead).
  bool turn_begun = false;
  uint64_t turn_begun_ms = 0;
  // The order of its last activity among all sessions' (a daemon-wide counter): orders
  // sessions touched in the same millisecond. Set by the table.
  uint64_t touch_seq = 0;
};

struct SessionKey {
  uint32_t namespace_id;
  std::string id;
  friend bool operator==(const SessionKey&, const SessionKey&) = default;
};

struct SessionKeyHasher {
  size_t operator()(const SessionKey& key) const noexcept {  // noexcept: no hash kept per node
    return std::hash<std::string>()(key.id) ^ (static_cast<size_t>(key.namespace_id) << 1);
  }
};

// Told of every block a session takes up and of every block it lets go of (a Save, a
// cut, a close), so that whoever counts session references per block (the daemon's
// BlockStore) is never told by hand. Called synchronously, from the table's methods.
class BlockReferences {
 public:
  virtual ~BlockReferences() = default;
  virtual void add_reference(const BlockKey& key) = 0;
  virtual void drop_reference(const BlockKey& key) = 0;
};

// Told what happens to sessions, by the table, as it happens: each part that keeps
// something per session (its NVMe and remote records, admin pins, a Save's cut mark)
// subscribes here instead of being told by every path that changes one. Called
// synchronously, from the table's methods, after the change (a subscriber may read the
// table, never change it from inside a notice).
class SessionObserver {
 public:
  virtual ~SessionObserver() = default;
  // The session has ended (CloseSession, an admin's Evict, idle expiry, a Save of another
  // layout replacing it), once, after it left the table.
  virtual void session_closed(uint32_t namespace_id, const std::string& session_id) = 0;
  // The session was cut short (a block it held was evicted or lost: truncate); it is
  // still in the table, holding the blocks before the cut.
  virtual void session_cut(const Session& session) { (void)session; }
  // Blocks were appended to the session (a Save, blocks read for it from elsewhere, a
  // recovery): `added`, now the last of session.blocks. Never empty.
  virtual void session_grew(const Session& session, std::span<const BlockHash> added) {
    (void)session;
    (void)added;
  }
  // A Save ended the session's turn: it is idle, with that turn's blocks.
  virtual void turn_ended(const Session& session) { (void)session; }
};

class SessionTable {
 public:
  explicit SessionTable(const Clock& clock) : clock_(clock) {}
  // `observer` (borrowed: it outlives the table's last notice) hears of every change.
  void subscribe(SessionObserver& observer) { observers_.push_back(&observer); }
  // From now on `references` (borrowed; nullptr: none) is told of every block a session
  // takes up or lets go of. Set it before the first session exists.
  void set_references(BlockReferences* references) { references_ = references; }
  // Its indexes point into itself.
  SessionTable(const SessionTable&) = delete;
  SessionTable& operator=(const SessionTable&) = delete;

  // Returns the session, creating it (active, no blocks) when absent. A session's
  // layout is fixed by its first use: InvalidArgument when `layout` differs.
  Result<Session*> get_or_create(uint32_t namespace_id, const std::string& id,
                                 const LayoutKey& layout);
  Session* find(uint32_t namespace_id, const std::string& id);
  const Session* find(uint32_t namespace_id, const std::string& id) const;

  // Appends the hashes not yet in the session, in order; returns those appended (each
  // a new reference: set_references). Marks the session active, or
  // idle with turns+1 when `end_of_turn` (which also forgets a BeginTurn no Load
  // followed: see Session::turn_begun).
  std::vector<BlockHash> record_save(Session& session, const std::vector<BlockHash>& hashes,
                                     bool end_of_turn);
  // The same appending, leaving the session's state and activity alone (blocks that
  // arrive for it from elsewhere, e.g. read from the remote tier after its turn).
  std::vector<BlockHash> append_blocks(Session& session, const std::vector<BlockHash>& hashes);
  // A turn started (BeginTurn) or the session read its blocks (Load): active, touched.
  // An idle session becoming active is a return: its gap feeds the GapModel.
  void record_activity(Session& session);
  // Sets a session's state and last activity as recovered from disk (the counts and
  // indexes below follow). Every other state change goes through record_save /
  // record_activity.
  void restore(Session& session, SessionState state, uint64_t last_active_ms);
  void restore_state(Session& session, SessionState state) {
    restore(session, state, session.last_active_ms);
  }
  // A session's retention priority (kMinPriority..kMaxPriority), until `until_ms` (0:
  // until changed), when expire_priorities() returns it to kDefaultPriority. O(its blocks).
  void set_priority(Session& session, uint8_t priority, uint64_t until_ms = 0);
  // A block's own priority, overriding its holders' (0 clears it), until `until_ms` (0:
  // while some session holds the block). False (nothing set) when no session holds it:
  // a block's priority lives with its holders. A block other sessions hold too is never
  // lowered this way (one conversation's "one-off" must not demote another's prompt),
  // and a block lowered while one session held it returns to its holders' priority when
  // a session of higher priority takes it up.
  bool set_block_priority(const BlockKey& key, uint8_t priority, uint64_t until_ms = 0);
  // Priorities whose time is up by `now_ms` end. O(those, log of the timed ones).
  void expire_priorities(uint64_t now_ms);
  // Drops a block from a session (it was evicted or lost); returns whether it was there.
  bool forget_block(Session& session, const BlockHash& hash);
  // Cuts a session's prefix to its first `length` blocks; returns the blocks it no
  // longer holds (each a reference dropped: set_references). When it held more, every
  // SessionObserver hears of the cut.
  std::vector<BlockHash> truncate(Session& session, size_t length);

  // One use of each of `hashes` (a Save naming them: its turn's prompt held them),
  // counted by the block reuse signal whether or not a session holds the block.
  void record_uses(const LayoutKey& layout, const std::vector<BlockHash>& hashes);
  const BlockReuse& reuse() const { return reuse_; }

  // Who holds `key`; nullptr when no session does. O(1).
  const BlockHolders* holders(const BlockKey& key) const;

  // An idle session's place in the idle order: least recently active first.
  struct IdleKey {
    uint64_t last_active_ms;
    uint64_t touch_seq;
    Session* session;
    friend bool operator<(const IdleKey& a, const IdleKey& b) {
      return a.last_active_ms != b.last_active_ms ? a.last_active_ms < b.last_active_ms
                                                  : a.touch_seq < b.touch_seq;
    }
  };
  // Every idle session, least recently active first.
  const std::set<IdleKey>& idle_sessions() const { return idle_; }
  static IdleKey idle_key(const Session& s) {
    return IdleKey{s.last_active_ms, s.touch_seq, const_cast<Session*>(&s)};
  }
  // The sessions idle right now, counted by GapModel stratum and by the bin of their
  // idle time at census_ms() (the return predictor's censored observations), a time
  // at most kCensusRefreshMs before `now_ms`: every idle session is counted, at its
  // idle time then. Recounted from per-stratum order-statistics trees in
  // O(strata × bins × log idle sessions) — however many sessions crossed a bin edge
  // since the last count (sessions that went idle together cross together) — and kept
  // exact between recounts as sessions go idle and come back.
  using Census = std::array<std::array<double, GapModel::kBins>, GapModel::kStrata>;
  static constexpr uint64_t kCensusRefreshMs = 100;
  const Census& idle_census(uint64_t now_ms) const;
  uint64_t census_ms() const { return census_ms_; }

  // Removes the session; returns its blocks (each a reference dropped: set_references);
  // then tells every SessionObserver. Closing an idle session tells the GapModel it
  // stayed away at least that long.
  // NotFound when absent.
  Result<std::vector<BlockHash>> close(uint32_t namespace_id, const std::string& id);

  // Sessions ordered by last activity, least recent first (demotion order).
  std::vector<const Session*> by_last_active() const;
  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (const auto& [key, session] : sessions_) fn(session);
  }
  // A walk over every session that can pause between steps (a listing served a slice at
  // a time, so other requests run between slices). walk_some visits whole hash buckets
  // from `cursor` until it has visited at least `budget` sessions, and returns where to
  // go on. Sessions added or closed between steps may be visited or not; a cursor from
  // before the table grew (walk_stale) would visit some twice: start over instead.
  struct WalkCursor {
    size_t bucket = 0;
    size_t buckets = 0;  // bucket_count when the walk started; 0: not started
  };
  WalkCursor walk_start() const { return {0, sessions_.bucket_count()}; }
  bool walk_stale(const WalkCursor& cursor) const {
    return cursor.buckets != sessions_.bucket_count();
  }
  bool walk_done(const WalkCursor& cursor) const { return cursor.bucket >= cursor.buckets; }
  template <typename Fn>
  WalkCursor walk_some(WalkCursor cursor, size_t budget, Fn&& fn) const {
    size_t visited = 0;
    while (cursor.bucket < cursor.buckets && visited < budget) {
      for (auto it = sessions_.begin(cursor.bucket); it != sessions_.end(cursor.bucket); ++it) {
        fn(it->second);
        ++visited;
      }
      ++cursor.bucket;
    }
    return cursor;
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
  // The session becomes `state`, touched at `now_ms` (its blocks' holders follow).
  void change(Session& session, SessionState state, uint64_t now_ms);
  // The block's entry in holders_, with `session` added to its holders.
  HolderIndex::Id add_holder(const Session& session, const BlockHash& hash, uint32_t depth);
  void drop_holder(const Session& session, const BlockHash& hash);
  // A holder of priority `priority` joined or left h's holders (already in or out of
  // its list): max_priority and at_max follow. remove_priority returns whether it
  // rescanned the holders (then every holder's current priority is counted).
  static void add_priority(BlockHolders& h, uint8_t priority);
  static bool remove_priority(BlockHolders& h, uint8_t priority);
  void clear_block_expiry(const BlockKey& key);
  void idle_insert(Session& session);
  void idle_erase(const Session& session);
  void recount_census(uint64_t now_ms) const;
  // The census bin a session idle since `last_active_ms` is counted in at census_ms_.
  int census_bin(uint64_t last_active_ms) const;

  const Clock& clock_;
  BlockReferences* references_ = nullptr;
  std::vector<SessionObserver*> observers_;
  GapModel gap_model_;
  BlockReuse reuse_;
  std::unordered_map<SessionKey, Session, SessionKeyHasher> sessions_;
  // Sessions per state, in total and per namespace: Stats reads them instead of
  // walking every session.
  std::array<size_t, 2> totals_{};
  std::unordered_map<uint32_t, std::array<size_t, 2>> by_namespace_;
  // The reverse index, one table per layout (a session's BlockList reads its layout's).
  std::unordered_map<LayoutKey, HolderIndex, LayoutKeyHasher> holders_;
  HolderIndex& index_of(const Session& session) {
    return const_cast<HolderIndex&>(*session.blocks.index_);  // the table's own
  }
  const HolderIndex* index_of(const LayoutKey& layout) const {
    auto it = holders_.find(layout);
    return it == holders_.end() ? nullptr : &it->second;
  }
  HolderIndex* index_of(const LayoutKey& layout) {
    return const_cast<HolderIndex*>(std::as_const(*this).index_of(layout));
  }
  // Priorities given for a time, soonest end first (sessions by pointer: nodes of
  // sessions_ stay put), and the end of each timed block priority.
  std::set<std::pair<uint64_t, Session*>> session_expiries_;
  std::multimap<uint64_t, BlockKey> block_expiries_;
  std::unordered_map<BlockKey, std::multimap<uint64_t, BlockKey>::iterator, BlockKeyHasher>
      block_priority_until_;
  uint64_t touch_seq_ = 0;
  std::set<IdleKey> idle_;
  // idle_ again per GapModel stratum (a session's stays put while it is idle), in
  // trees that count: how many sessions went idle before a time is O(log n).
  using CountingTree =
      __gnu_pbds::tree<IdleKey, __gnu_pbds::null_type, std::less<IdleKey>, __gnu_pbds::rb_tree_tag,
                       __gnu_pbds::tree_order_statistics_node_update>;
  std::array<CountingTree, GapModel::kStrata> idle_by_stratum_;
  // The census at census_ms_ (mutable: recounted by the const reader).
  mutable Census census_{};
  mutable uint64_t census_ms_ = 0;
  mutable bool census_counted_ = false;
};

}  // namespace kvtier::policy
