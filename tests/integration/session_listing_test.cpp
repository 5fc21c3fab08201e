// ListSessions one page at a time, against the real kvtierd: pages of `limit` in idle or
// bytes order cover every session exactly once, `total` counts them all, a cursor from
// another order or not from the daemon at all is a clear error, and the client's whole
// listing reads every page.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/integration/daemon_harness.h"

namespace kvtier::integration {
namespace {

constexpr int kSessions = 25;

class SessionListing : public DaemonTest {
 protected:
  // Session i (named s00..s24) saved with i % 4 + 1 blocks, one after another: the
  // earlier ones have been idle longer or, saved in the same millisecond, come first by id.
  void SetUp() override {
    DaemonTest::SetUp();
    if (!daemon_) return;
    auto engine = Engine::connect(daemon_->socket_path(), small_shape(kSessions * 4));
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    uint64_t next_block = 0;
    for (int i = 0; i < kSessions; ++i) {
      const std::string id = fmt::format("s{:02}", i);
      const auto hashes = PagedCache::chain_hashes(id, i % 4 + 1);
      const auto refs = Engine::refs(hashes, next_block);
      next_block += refs.size();
      engine->fill(refs);
      auto saved = engine->client->save(id, refs, /*end_of_turn=*/true);
      ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
      blocks_[id] = static_cast<uint32_t>(refs.size());
    }
    client_ = std::move(engine->client);
  }

  // Every page in `order`, `limit` at a time.
  std::vector<SessionPage> all_pages(SessionOrder order, uint32_t limit) {
    std::vector<SessionPage> pages;
    ListSessionsOptions options;
    options.limit = limit;
    options.order = order;
    do {
      auto page = client_->list_sessions_page(options);
      EXPECT_TRUE(page.is_ok()) << page.status().to_string();
      if (!page.is_ok() || pages.size() > kSessions) break;
      options.after = page->next;
      pages.push_back(std::move(*page));
    } while (!options.after.empty());
    return pages;
  }

  std::map<std::string, uint32_t> blocks_;
  std::unique_ptr<Client> client_;
};

TEST_F(SessionListing, IdlePagesCoverEverySessionOnceLongestIdleFirst) {
  const auto pages = all_pages(SessionOrder::kIdle, 10);
  ASSERT_EQ(pages.size(), 3u);
  std::vector<std::string> ids;
  for (const SessionPage& page : pages) {
    EXPECT_EQ(page.total, static_cast<uint32_t>(kSessions));
    EXPECT_LE(page.sessions.size(), 10u);
    for (const SessionInfo& s : page.sessions) ids.push_back(s.session_id);
  }
  EXPECT_TRUE(pages.back().next.empty());
  // Saved in name order, so the longest idle is s00.
  std::vector<std::string> expected;
  for (int i = 0; i < kSessions; ++i) expected.push_back(fmt::format("s{:02}", i));
  EXPECT_EQ(ids, expected);
  // The client's whole listing: the same, in one call.
  auto whole = client_->list_sessions();
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  ASSERT_EQ(whole->size(), static_cast<size_t>(kSessions));
  EXPECT_EQ(whole->front().session_id, "s00");
}

TEST_F(SessionListing, BytesPagesGoFromTheMostBytesDown) {
  const auto pages = all_pages(SessionOrder::kBytes, 7);
  ASSERT_EQ(pages.size(), 4u);
  std::set<std::string> seen;
  uint32_t previous = UINT32_MAX;
  for (const SessionPage& page : pages) {
    for (const SessionInfo& s : page.sessions) {
      EXPECT_TRUE(seen.insert(s.session_id).second) << s.session_id << " listed twice";
      EXPECT_EQ(s.blocks, blocks_[s.session_id]);
      EXPECT_LE(s.blocks, previous) << s.session_id;
      previous = s.blocks;
    }
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kSessions));
}

// A daemon with no session lists an empty last page, and a closed session is simply
// absent from the next listing.
TEST_F(SessionListing, AnEmptyListingAndAClosedSessionAreAnsweredPlainly) {
  auto empty = Daemon::start();
  ASSERT_TRUE(empty.is_ok()) << empty.status().to_string();
  auto nobody = Client::connect((*empty)->socket_path());
  ASSERT_TRUE(nobody.is_ok()) << nobody.status().to_string();
  auto none = (*nobody)->list_sessions_page({});
  ASSERT_TRUE(none.is_ok()) << none.status().to_string();
  EXPECT_TRUE(none->sessions.empty());
  EXPECT_TRUE(none->next.empty());
  EXPECT_EQ(none->total, 0u);
  ASSERT_TRUE(client_->close_session("s03").is_ok());
  auto page = client_->list_sessions_page({});
  ASSERT_TRUE(page.is_ok()) << page.status().to_string();
  EXPECT_EQ(page->sessions.size(), kSessions - 1u);
  EXPECT_EQ(page->total, kSessions - 1u);
  for (const SessionInfo& info : page->sessions) EXPECT_NE(info.session_id, "s03");
}

TEST_F(SessionListing, ACursorFromAnotherOrderOrNowhereIsRefused) {
  ListSessionsOptions options;
  options.limit = 5;
  auto first = client_->list_sessions_page(options);
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  ASSERT_FALSE(first->next.empty());
  options.after = first->next;
  options.order = SessionOrder::kBytes;
  EXPECT_TRUE(IsError(client_->list_sessions_page(options).status(), StatusCode::kInvalidArgument,
                      "ListSessions.after"));
  options.order = SessionOrder::kIdle;
  options.after = "x";
  EXPECT_TRUE(IsError(client_->list_sessions_page(options).status(), StatusCode::kInvalidArgument,
                      "ListSessions.after"));
  // The connection goes on: the right cursor still works.
  options.after = first->next;
  auto second = client_->list_sessions_page(options);
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  ASSERT_EQ(second->sessions.size(), 5u);
  EXPECT_EQ(second->sessions.front().session_id, "s05");
}

}  // namespace
}  // namespace kvtier::integration
