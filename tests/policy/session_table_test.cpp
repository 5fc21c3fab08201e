#include "policy/session_table.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include <gtest/gtest.h>

#include "policy/clock.h"
#include "tests/policy/fake_placement_view.h"

namespace kvtier::policy {
namespace {

using fake::hash_of;
using fake::hashes_of;
using fake::kLayout;

std::vector<std::string> ids(const std::vector<const Session*>& sessions) {
  std::vector<std::string> out;
  for (const Session* s : sessions) out.push_back(s->id);
  return out;
}

class SessionTableTest : public ::testing::Test {
 protected:
  ManualClock clock_{1'000};
  SessionTable table_{clock_};
};

// The walk a listing takes a slice at a time: every session once, whatever the budget;
// sessions closed between steps are simply not visited; a table that grew says so.
TEST_F(SessionTableTest, APausedWalkVisitsEverySessionOnceAndSaysWhenTheTableGrew) {
  for (int i = 0; i < 300; ++i) {
    ASSERT_TRUE(table_.get_or_create(7, "s" + std::to_string(i), kLayout).is_ok());
  }
  for (size_t budget : {1u, 7u, 64u, 1000u}) {
    std::unordered_map<std::string, int> seen;
    SessionTable::WalkCursor cursor = table_.walk_start();
    size_t steps = 0;
    while (!table_.walk_done(cursor)) {
      ASSERT_FALSE(table_.walk_stale(cursor));
      size_t visited = 0;
      cursor = table_.walk_some(cursor, budget, [&](const Session& s) {
        ++seen[s.id];
        ++visited;
      });
      ++steps;
      // Whole buckets: at least the budget, unless the walk ended.
      if (!table_.walk_done(cursor)) {
        EXPECT_GE(visited, budget);
      }
    }
    EXPECT_EQ(seen.size(), 300u) << budget;
    for (const auto& [id, count] : seen) EXPECT_EQ(count, 1) << id;
    if (budget == 1) {
      EXPECT_GT(steps, 100u);
    }
  }
  // Closing sessions mid-walk: the rest are visited once, the closed ones not at all.
  SessionTable::WalkCursor cursor = table_.walk_start();
  std::unordered_map<std::string, int> seen;
  cursor = table_.walk_some(cursor, 50, [&](const Session& s) { ++seen[s.id]; });
  std::vector<std::string> closed;
  for (int i = 0; i < 300 && closed.size() < 20; ++i) {
    const std::string id = "s" + std::to_string(i);
    if (seen.contains(id)) continue;
    ASSERT_TRUE(table_.close(7, id).is_ok());
    closed.push_back(id);
  }
  ASSERT_FALSE(table_.walk_stale(cursor));
  while (!table_.walk_done(cursor)) {
    cursor = table_.walk_some(cursor, 50, [&](const Session& s) { ++seen[s.id]; });
  }
  EXPECT_EQ(seen.size(), 280u);
  for (const std::string& id : closed) EXPECT_FALSE(seen.contains(id)) << id;
  // Enough new sessions to make the table grow: the cursor is stale.
  const SessionTable::WalkCursor old = table_.walk_start();
  for (int i = 0; i < 5000; ++i) {
    ASSERT_TRUE(table_.get_or_create(8, "t" + std::to_string(i), kLayout).is_ok());
  }
  EXPECT_TRUE(table_.walk_stale(old));
}

// Every part that keeps something per session hears of each close once, after the
// session left the table, whichever path closed it, and of each cut; a close that found
// nothing, or a cut that cut nothing, is heard by nobody.
TEST_F(SessionTableTest, EveryObserverHearsEachCloseOnceAfterTheSessionLeftAndEachCut) {
  struct Recorder : SessionObserver {
    const SessionTable* table = nullptr;
    std::vector<std::string> heard;
    void session_closed(uint32_t namespace_id, const std::string& session_id) override {
      EXPECT_EQ(table->find(namespace_id, session_id), nullptr) << "told before it left";
      heard.push_back(std::to_string(namespace_id) + "/" + session_id);
    }
    void session_cut(const Session& session) override {
      heard.push_back("cut " + session.id + " to " + std::to_string(session.blocks.size()));
    }
  };
  Recorder first, second;
  first.table = second.table = &table_;
  table_.subscribe(first);
  table_.subscribe(second);
  for (const char* id : {"a", "b"}) ASSERT_TRUE(table_.get_or_create(7, id, kLayout).is_ok());
  ASSERT_TRUE(table_.get_or_create(8, "a", kLayout).is_ok());
  Session* b = table_.find(7, "b");
  ASSERT_NE(b, nullptr);
  table_.record_save(*b, hashes_of({1, 2, 3}), /*end_of_turn=*/true);
  EXPECT_EQ(table_.truncate(*b, 1), hashes_of({2, 3}));
  EXPECT_TRUE(table_.truncate(*b, 1).empty());  // nothing past 1: no cut
  ASSERT_TRUE(table_.close(7, "a").is_ok());
  ASSERT_TRUE(table_.close(7, b->id).is_ok());  // the id the closed session itself holds
  EXPECT_FALSE(table_.close(7, "a").is_ok());
  EXPECT_FALSE(table_.close(9, "missing").is_ok());
  const std::vector<std::string> expected = {"cut b to 1", "7/a", "7/b"};
  EXPECT_EQ(first.heard, expected);
  EXPECT_EQ(second.heard, expected);
  EXPECT_NE(table_.find(8, "a"), nullptr);
}

TEST_F(SessionTableTest, CreateStartsActiveAndStampsNow) {
  auto created = table_.get_or_create(7, "s1", kLayout);
  ASSERT_TRUE(created.is_ok()) << created.status().to_string();
  Session* session = created.value();
  EXPECT_EQ(session->namespace_id, 7u);
  EXPECT_EQ(session->id, "s1");
  EXPECT_EQ(session->layout, kLayout);
  EXPECT_EQ(session->state, SessionState::kActive);
  EXPECT_EQ(session->created_ms, 1'000u);
  EXPECT_EQ(session->last_active_ms, 1'000u);
  EXPECT_EQ(session->turns, 0u);
  EXPECT_TRUE(session->blocks.empty());

  clock_.advance_ms(500);
  auto again = table_.get_or_create(7, "s1", kLayout);
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again.value(), session);
  EXPECT_EQ(session->created_ms, 1'000u);  // a lookup is not activity
  EXPECT_EQ(session->last_active_ms, 1'000u);
  EXPECT_EQ(table_.size(), 1u);
  EXPECT_EQ(table_.find(7, "s1"), session);
  EXPECT_EQ(table_.find(8, "s1"), nullptr);
  EXPECT_EQ(table_.find(7, "s2"), nullptr);
}

TEST_F(SessionTableTest, LayoutMismatchIsInvalidArgumentNamingTheSession) {
  ASSERT_TRUE(table_.get_or_create(7, "chat-9", kLayout).is_ok());
  LayoutKey other{7, kLayout.layout_digest + 1};
  auto r = table_.get_or_create(7, "chat-9", other);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "session 'chat-9' belongs to another layout");
  EXPECT_EQ(table_.find(7, "chat-9")->layout, kLayout);  // unchanged

  // The same id in another namespace is another session.
  auto elsewhere = table_.get_or_create(8, "chat-9", other);
  ASSERT_TRUE(elsewhere.is_ok());
  EXPECT_EQ(table_.size(), 2u);
}

TEST_F(SessionTableTest, SaveAppendsOnlyNewHashesInOrder) {
  Session& s = *table_.get_or_create(7, "s", kLayout).value();
  EXPECT_EQ(table_.record_save(s, hashes_of({1, 2, 3}), false), hashes_of({1, 2, 3}));
  // Known hashes and repeats within one save are skipped; order is kept.
  EXPECT_EQ(table_.record_save(s, hashes_of({2, 4, 4, 1, 5}), false), hashes_of({4, 5}));
  EXPECT_EQ(s.blocks, hashes_of({1, 2, 3, 4, 5}));
  EXPECT_TRUE(table_.record_save(s, hashes_of({5, 1}), false).empty());
  EXPECT_EQ(s.blocks.size(), 5u);
}

TEST_F(SessionTableTest, EndOfTurnMakesIdleAndCountsTurns) {
  Session& s = *table_.get_or_create(7, "s", kLayout).value();
  clock_.set_ms(2'000);
  (void)table_.record_save(s, hashes_of({1}), true);
  EXPECT_EQ(s.state, SessionState::kIdle);
  EXPECT_EQ(s.turns, 1u);
  EXPECT_EQ(s.last_active_ms, 2'000u);
  EXPECT_EQ(table_.count(SessionState::kIdle), 1u);
  EXPECT_EQ(table_.count(SessionState::kActive), 0u);

  clock_.set_ms(3'000);
  table_.record_activity(s);
  EXPECT_EQ(s.state, SessionState::kActive);
  EXPECT_EQ(s.last_active_ms, 3'000u);
  EXPECT_EQ(s.turns, 1u);

  clock_.set_ms(4'000);
  (void)table_.record_save(s, hashes_of({2}), false);  // mid-turn save
  EXPECT_EQ(s.state, SessionState::kActive);
  EXPECT_EQ(s.turns, 1u);
  EXPECT_EQ(s.last_active_ms, 4'000u);

  clock_.set_ms(5'000);
  (void)table_.record_save(s, {}, true);  // a turn may end with nothing new
  EXPECT_EQ(s.state, SessionState::kIdle);
  EXPECT_EQ(s.turns, 2u);
  EXPECT_EQ(s.last_active_ms, 5'000u);
  EXPECT_EQ(s.created_ms, 1'000u);
  EXPECT_EQ(table_.count(SessionState::kActive), 0u);
}

// Sessions that went idle together cross an idle-time bin edge together; the census
// is recounted, not walked session by session, so it is whole after the crossing. It
// is at most kCensusRefreshMs old, and exact for that time as sessions come and go.
TEST_F(SessionTableTest, IdleCensusCountsACrowdCrossingABinEdgeAtOnce) {
  constexpr int kSessions = 300;
  clock_.set_ms(10'000);
  for (int i = 0; i < kSessions; ++i) {
    Session& s = *table_.get_or_create(7, "s" + std::to_string(i), kLayout).value();
    (void)table_.record_save(s, hashes_of({static_cast<uint8_t>(i % 200)}), true);
  }
  auto in_bin = [](const SessionTable::Census& census, int bin) {
    double n = 0;
    for (const auto& row : census) n += row[bin];
    return n;
  };
  EXPECT_EQ(in_bin(table_.idle_census(clock_.now_ms()), 0), kSessions);
  // Past the start of bin 1 (1 s idle): every session is counted there at once.
  clock_.advance_ms(1'200);
  ASSERT_EQ(GapModel::bin_of(1'200), 1);
  const SessionTable::Census& crossed = table_.idle_census(clock_.now_ms());
  EXPECT_EQ(table_.census_ms(), clock_.now_ms());
  EXPECT_EQ(in_bin(crossed, 0), 0);
  EXPECT_EQ(in_bin(crossed, 1), kSessions);
  // Within the refresh time the census keeps its time, and follows the idle set: one
  // session comes back (out of bin 1), and a new one goes idle (idle 0 ms: bin 0).
  clock_.advance_ms(SessionTable::kCensusRefreshMs / 2);
  table_.record_activity(*table_.find(7, "s0"));
  Session& late = *table_.get_or_create(7, "late", kLayout).value();
  (void)table_.record_save(late, hashes_of({250}), true);
  const SessionTable::Census& kept = table_.idle_census(clock_.now_ms());
  EXPECT_EQ(table_.census_ms(), clock_.now_ms() - SessionTable::kCensusRefreshMs / 2);
  EXPECT_EQ(in_bin(kept, 0), 1);
  EXPECT_EQ(in_bin(kept, 1), kSessions - 1);
  // A recount at a time far past every bin start puts all of them in the last bin.
  clock_.advance_ms(400ull * 24 * 3600 * 1000);
  EXPECT_EQ(in_bin(table_.idle_census(clock_.now_ms()), GapModel::kBins - 1), kSessions);
}

// The counts Stats reads are kept as sessions change state, not computed by walking.
TEST_F(SessionTableTest, CountsFollowEveryStateChangePerNamespace) {
  auto walk = [&](uint32_t namespace_id, SessionState state) {
    size_t n = 0;
    table_.for_each([&](const Session& s) {
      if (s.namespace_id == namespace_id && s.state == state) ++n;
    });
    return n;
  };
  auto check = [&] {
    for (uint32_t ns : {1u, 2u}) {
      for (SessionState state : {SessionState::kActive, SessionState::kIdle}) {
        EXPECT_EQ(table_.count(ns, state), walk(ns, state)) << "namespace " << ns;
      }
    }
    EXPECT_EQ(table_.count(SessionState::kActive) + table_.count(SessionState::kIdle),
              table_.size());
  };
  Session* a = table_.get_or_create(1, "a", kLayout).value();
  Session* b = table_.get_or_create(1, "b", kLayout).value();
  Session* c = table_.get_or_create(2, "c", kLayout).value();
  check();
  table_.record_save(*a, hashes_of({1, 2}), true);
  table_.record_save(*c, hashes_of({3}), true);
  check();
  EXPECT_EQ(table_.count(1, SessionState::kIdle), 1u);
  EXPECT_EQ(table_.count(2, SessionState::kIdle), 1u);
  table_.record_activity(*a);
  table_.record_save(*b, hashes_of({4}), false);
  check();
  table_.restore_state(*b, SessionState::kIdle);
  check();
  ASSERT_TRUE(table_.close(1, "b").is_ok());
  ASSERT_TRUE(table_.close(2, "c").is_ok());
  check();
  EXPECT_EQ(table_.count(2, SessionState::kIdle), 0u);
  EXPECT_EQ(table_.count(SessionState::kActive), 1u);
  EXPECT_EQ(table_.count(SessionState::kIdle), 0u);
}

TEST_F(SessionTableTest, ForgetBlockKeepsPrefixOrder) {
  Session& s = *table_.get_or_create(7, "s", kLayout).value();
  (void)table_.record_save(s, hashes_of({1, 2, 3}), false);
  EXPECT_TRUE(table_.forget_block(s, hash_of(2)));
  EXPECT_EQ(s.blocks, hashes_of({1, 3}));
  EXPECT_FALSE(table_.forget_block(s, hash_of(2)));
  // A forgotten block may be saved again.
  EXPECT_EQ(table_.record_save(s, hashes_of({2}), false), hashes_of({2}));
}

TEST_F(SessionTableTest, CloseReturnsBlocksAndNotFoundNamesTheSession) {
  Session& s = *table_.get_or_create(7, "s", kLayout).value();
  (void)table_.record_save(s, hashes_of({1, 2}), true);
  auto closed = table_.close(7, "s");
  ASSERT_TRUE(closed.is_ok());
  EXPECT_EQ(closed.value(), hashes_of({1, 2}));
  EXPECT_EQ(table_.size(), 0u);
  EXPECT_EQ(table_.find(7, "s"), nullptr);

  auto again = table_.close(7, "s");
  ASSERT_FALSE(again.is_ok());
  EXPECT_EQ(again.status().code(), StatusCode::kNotFound);
  EXPECT_NE(again.status().message().find("'s'"), std::string::npos);
}

TEST_F(SessionTableTest, ByLastActiveIsLeastRecentFirstWithTiesById) {
  for (const char* id : {"zeta", "beta", "alpha", "gamma"}) {
    ASSERT_TRUE(table_.get_or_create(7, id, kLayout).is_ok());
  }
  clock_.set_ms(3'000);
  table_.record_activity(*table_.find(7, "alpha"));
  clock_.set_ms(2'000);
  table_.record_activity(*table_.find(7, "zeta"));
  // beta and gamma tie at 1000: by id.
  EXPECT_EQ(ids(table_.by_last_active()),
            (std::vector<std::string>{"beta", "gamma", "zeta", "alpha"}));

  clock_.set_ms(4'000);
  (void)table_.record_save(*table_.find(7, "beta"), hashes_of({1}), true);
  EXPECT_EQ(ids(table_.by_last_active()),
            (std::vector<std::string>{"gamma", "zeta", "alpha", "beta"}));
}

}  // namespace
}  // namespace kvtier::policy

namespace kvtier::policy {
namespace {

// The indexes the table keeps as sessions change (the reverse index with its per-block
// facts, the idle order, the idle census) must equal what a walk over every session
// computes, after any sequence of saves, returns, priority changes, cuts and closes.
class SessionTableIndexTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(SessionTableIndexTest, IndexesMatchAWalkOverEverySession) {
  ManualClock clock(1'000);
  SessionTable table(clock);
  uint64_t rng = 0x9E3779B97F4A7C15ull * (GetParam() + 1);
  auto next = [&](uint64_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng % n;
  };
  std::vector<std::string> names;
  for (int i = 0; i < 40; ++i) names.push_back("s" + std::to_string(i));
  // Block priorities as the table should have them: (priority, until; 0: untimed).
  std::unordered_map<BlockKey, std::pair<uint8_t, uint64_t>, BlockKeyHasher> block_priorities;
  const uint8_t kPriorities[] = {10, kDefaultPriority, kDefaultPriority, 90, kMaxPriority};
  for (int step = 0; step < 3'000; ++step) {
    clock.advance_ms(next(4) == 0 ? next(20'000) : next(50));
    table.expire_priorities(clock.now_ms());
    std::erase_if(block_priorities, [&](const auto& kv) {
      return kv.second.second != 0 && kv.second.second <= clock.now_ms();
    });
    const std::string& name = names[next(names.size())];
    const uint32_t ns = 1 + static_cast<uint32_t>(next(2));
    const LayoutKey layout{ns, kLayout.layout_digest};
    switch (next(9)) {
      case 0:
      case 1:
      case 2: {  // a save of a few blocks from a small shared pool (shared prefixes)
        Session* s = table.get_or_create(ns, name, layout).value();
        std::vector<BlockHash> hashes;
        for (uint64_t k = next(5); k > 0; --k)
          hashes.push_back(hash_of(static_cast<uint8_t>(next(60))));
        for (const BlockHash& hash : table.record_save(*s, hashes, next(2) == 0)) {
          // A block lowered by a range goes back to its holders' when a session that
          // wants it more takes it up.
          auto own = block_priorities.find(BlockKey{layout, hash});
          if (own != block_priorities.end() && own->second.first < s->priority) {
            block_priorities.erase(own);
          }
        }
        break;
      }
      case 3:
        if (Session* s = table.find(ns, name)) table.record_activity(*s);
        break;
      case 4:
        (void)table.close(ns, name);
        break;
      case 5:
        if (Session* s = table.find(ns, name)) {
          const uint64_t until = next(2) == 0 ? 0 : clock.now_ms() + 1 + next(30'000);
          table.set_priority(*s, kPriorities[next(std::size(kPriorities))], until);
        }
        break;
      case 7:
        if (Session* s = table.find(ns, name); s != nullptr && !s->blocks.empty()) {
          const BlockKey key{s->layout, s->blocks[next(s->blocks.size())]};
          const uint8_t priority = next(3) == 0 ? 0 : kPriorities[next(std::size(kPriorities))];
          const uint64_t until = next(2) == 0 ? 0 : clock.now_ms() + 1 + next(30'000);
          const BlockHolders* h = table.holders(key);
          const bool lowers_shared = priority != 0 && priority < h->priority() && h->count() > 1;
          ASSERT_TRUE(table.set_block_priority(key, priority, until));
          if (lowers_shared) {
            // Never lowered while other sessions hold it.
          } else if (priority == 0) {
            block_priorities.erase(key);
          } else {
            block_priorities[key] = {priority, until};
          }
        }
        break;
      case 6:
        if (Session* s = table.find(ns, name); s != nullptr && !s->blocks.empty()) {
          if (next(2) == 0) {
            (void)table.truncate(*s, next(s->blocks.size()));
          } else {
            (void)table.forget_block(*s, s->blocks[next(s->blocks.size())]);
          }
        }
        break;
      default:
        break;
    }
    // A block no session holds any more has no priority of its own.
    std::erase_if(block_priorities,
                  [&](const auto& kv) { return table.holders(kv.first) == nullptr; });
    if (step % 97 != 0) continue;
    // The walk.
    struct Facts {
      uint32_t count = 0, active = 0, at_max = 0;
      uint8_t max_priority = 0;
    };
    std::unordered_map<BlockKey, Facts, BlockKeyHasher> facts;
    SessionTable::Census census{};
    size_t idle = 0;
    const SessionTable::Census counted = table.idle_census(clock.now_ms());
    table.for_each([&](const Session& s) {
      // A priority given for a time has ended (back to the default) once it was up.
      if (s.priority_until_ms != 0) {
        EXPECT_GT(s.priority_until_ms, clock.now_ms());
      }
      for (const BlockHash& h : s.blocks) {
        Facts& f = facts[BlockKey{s.layout, h}];
        ++f.count;
        f.active += s.state == SessionState::kActive;
        if (s.priority > f.max_priority) {
          f.max_priority = s.priority;
          f.at_max = 0;
        }
        f.at_max += s.priority == f.max_priority;
      }
      if (s.state == SessionState::kIdle) {
        ++idle;
        // The census counts at census_ms(), at most kCensusRefreshMs ago.
        const uint64_t at = table.census_ms();
        const uint64_t idle_ms = at > s.last_active_ms ? at - s.last_active_ms : 0;
        census[GapModel::stratum_of(s.returns)][GapModel::bin_of(static_cast<double>(idle_ms))] +=
            1;
      }
    });
    for (const auto& [key, f] : facts) {
      const BlockHolders* h = table.holders(key);
      ASSERT_NE(h, nullptr) << "step " << step;
      EXPECT_EQ(h->count(), f.count) << "step " << step;
      EXPECT_EQ(h->active, f.active) << "step " << step;
      EXPECT_EQ(h->at_max, f.at_max) << "step " << step;
      EXPECT_EQ(h->max_priority, f.max_priority) << "step " << step;
      auto own = block_priorities.find(key);
      const uint8_t block_priority = own == block_priorities.end() ? 0 : own->second.first;
      EXPECT_EQ(h->block_priority, block_priority) << "step " << step;
      EXPECT_EQ(h->priority(), block_priority != 0 ? block_priority : f.max_priority);
    }
    for (uint8_t n = 0; n < 60; ++n) {
      for (uint32_t ns2 : {1u, 2u}) {
        const BlockKey key{{ns2, kLayout.layout_digest}, hash_of(n)};
        EXPECT_EQ(table.holders(key) != nullptr, facts.contains(key)) << "step " << step;
      }
    }
    ASSERT_EQ(table.idle_sessions().size(), idle) << "step " << step;
    uint64_t last = 0;
    for (const SessionTable::IdleKey& k : table.idle_sessions()) {
      EXPECT_EQ(k.session->state, SessionState::kIdle);
      EXPECT_EQ(k.last_active_ms, k.session->last_active_ms);
      EXPECT_GE(k.last_active_ms, last);
      last = k.last_active_ms;
    }
    EXPECT_LT(clock.now_ms() - table.census_ms(), SessionTable::kCensusRefreshMs);
    EXPECT_EQ(counted, census) << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, SessionTableIndexTest, ::testing::Values(1u, 2u, 3u, 4u));

}  // namespace
}  // namespace kvtier::policy
