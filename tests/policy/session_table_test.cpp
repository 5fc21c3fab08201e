#include "policy/session_table.h"

#include <string>
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
