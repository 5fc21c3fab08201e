// kvtierctl's request handlers in the in-process daemon (handler_fixture.h): Stats,
// ListSessions and GetSession (open to every peer for its own namespace), and the admin
// requests Evict, Pin, Drain and GetConfig (uid 0 or the admin group).
//
// The test process is root, so its own connections are admin; non-admin peers are
// connections made with other uids (InProcessDaemon::connect_as). Where the process
// cannot take another uid, the tests that need one skip and say so.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "tests/daemon/handler_fixture.h"

namespace kvtier::daemon {
namespace {

constexpr std::string_view kOtherNamespace = "uid:60001";

std::vector<std::string> ids_of(const std::vector<SessionInfo>& sessions) {
  std::vector<std::string> ids;
  for (const SessionInfo& s : sessions) ids.push_back(s.namespace_name + "/" + s.session_id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

// --- Stats -----------------------------------------------------------------------------

TEST_F(HandlerTest, StatsCountsTheCallersSessionsAndFollowsTheirTurns) {
  auto other = connect_engine_as(kOtherUid, kOtherUid, "other-user");
  KVTIER_SKIP_IF_NO_OTHER_USER(other.status());
  ASSERT_TRUE(other.is_ok()) << other.status().to_string();
  auto third = connect_as(kThirdUid, kThirdUid);  // Stats needs no Hello
  ASSERT_TRUE(third.is_ok()) << third.status().to_string();
  struct Counts {
    uint64_t active, idle;
    bool operator==(const Counts&) const = default;
  };
  auto counts = [](Client& client) -> Counts {
    auto stats = client.stats();
    EXPECT_TRUE(stats.is_ok()) << stats.status().to_string();
    return stats.is_ok() ? Counts{stats->sessions_active, stats->sessions_idle} : Counts{99, 99};
  };
  ASSERT_TRUE(save(*engine_, "root-in-turn", 2, 0, /*end_of_turn=*/false).is_ok());
  ASSERT_TRUE(save(*engine_, "root-idle", 2, 2, /*end_of_turn=*/true).is_ok());
  ASSERT_TRUE(save(*other, "other", 2, 0, /*end_of_turn=*/true).is_ok());

  EXPECT_EQ(counts(*other->client), (Counts{0, 1})) << "another namespace's sessions counted";
  EXPECT_EQ(counts(**third), (Counts{0, 0}));
  // An admin's Stats counts every namespace.
  EXPECT_EQ(counts(*engine_->client), (Counts{1, 2}));

  // The other user's session through a turn: BeginTurn, a Save within the turn, the
  // Save that ends it, and the close.
  ASSERT_TRUE(other->client->begin_turn("other").is_ok());
  EXPECT_EQ(counts(*other->client), (Counts{1, 0}));
  ASSERT_TRUE(save(*other, "other", 3, 0, /*end_of_turn=*/false).is_ok());
  EXPECT_EQ(counts(*other->client), (Counts{1, 0}));
  ASSERT_TRUE(save(*other, "other", 4, 0, /*end_of_turn=*/true).is_ok());
  EXPECT_EQ(counts(*other->client), (Counts{0, 1}));
  ASSERT_TRUE(other->client->close_session("other").is_ok());
  EXPECT_EQ(counts(*other->client), (Counts{0, 0}));
  EXPECT_EQ(counts(*engine_->client), (Counts{1, 1}));

  EXPECT_TRUE(IsError(other->client->stats(/*all_namespaces=*/true).status(),
                      StatusCode::kPermissionDenied,
                      "stats of all namespaces need uid 0 or the admin group"));
  auto everything = engine_->client->stats(/*all_namespaces=*/true);
  ASSERT_TRUE(everything.is_ok()) << everything.status().to_string();
  EXPECT_EQ(everything->sessions_active + everything->sessions_idle, 2u);
  EXPECT_EQ(everything->bytes_saved, (2 + 2 + 2 + 1 + 1) * block_bytes());
  EXPECT_EQ(everything->connections, 3u);
}

// --- ListSessions / GetSession ---------------------------------------------------------

TEST_F(HandlerTest, ListAndGetSessionShowOnlyTheCallersNamespaceUnlessAdmin) {
  auto other = connect_engine_as(kOtherUid, kOtherUid, "other-user");
  KVTIER_SKIP_IF_NO_OTHER_USER(other.status());
  ASSERT_TRUE(other.is_ok()) << other.status().to_string();
  ASSERT_EQ(other->hello.namespace_name, kOtherNamespace);
  const std::string root_namespace = engine_->hello.namespace_name;
  ASSERT_TRUE(save(*engine_, "same-name", 4).is_ok());
  ASSERT_TRUE(save(*engine_, "root-only", 2, 4).is_ok());
  ASSERT_TRUE(save(*other, "same-name", 3).is_ok());
  ASSERT_TRUE(save(*other, "other-only", 2, 4).is_ok());
  daemon_->advance_clock_ms(250);

  auto own = other->client->list_sessions();
  ASSERT_TRUE(own.is_ok()) << own.status().to_string();
  EXPECT_EQ(ids_of(*own),
            (std::vector<std::string>{"uid:60001/other-only", "uid:60001/same-name"}));
  EXPECT_TRUE(IsError(other->client->list_sessions(/*all_namespaces=*/true).status(),
                      StatusCode::kPermissionDenied,
                      "listing all namespaces' sessions needs uid 0 or the admin group"));
  auto mine = other->client->get_session("same-name");
  ASSERT_TRUE(mine.is_ok()) << mine.status().to_string();
  EXPECT_EQ(mine->namespace_name, kOtherNamespace);
  EXPECT_EQ(mine->blocks, 3u);
  EXPECT_EQ(mine->bytes, 3 * block_bytes());
  EXPECT_EQ(mine->turns, 1u);
  EXPECT_FALSE(mine->active);
  EXPECT_EQ(mine->idle_ms, 250u);
  EXPECT_EQ(mine->layout_digest, other->hello.layout_digest);
  EXPECT_EQ(mine->blocks_per_tier, (std::vector<uint32_t>{3, 0, 0, 0}));
  // Another namespace's session: not there when unnamed, refused when named.
  EXPECT_TRUE(IsError(other->client->get_session("root-only").status(), StatusCode::kNotFound,
                      "no session 'root-only'"));
  EXPECT_TRUE(IsError(other->client->get_session("same-name", root_namespace).status(),
                      StatusCode::kPermissionDenied, "reading another namespace's session"));

  // Root is admin: its own namespace by default, every one when asked, any one by name.
  auto root_own = engine_->client->list_sessions();
  ASSERT_TRUE(root_own.is_ok()) << root_own.status().to_string();
  EXPECT_EQ(ids_of(*root_own), (std::vector<std::string>{root_namespace + "/root-only",
                                                         root_namespace + "/same-name"}));
  auto all = engine_->client->list_sessions(/*all_namespaces=*/true);
  ASSERT_TRUE(all.is_ok()) << all.status().to_string();
  EXPECT_EQ(ids_of(*all),
            (std::vector<std::string>{root_namespace + "/root-only", root_namespace + "/same-name",
                                      "uid:60001/other-only", "uid:60001/same-name"}));
  auto theirs = engine_->client->get_session("same-name", std::string(kOtherNamespace));
  ASSERT_TRUE(theirs.is_ok()) << theirs.status().to_string();
  EXPECT_EQ(theirs->blocks, 3u);
  auto root_same = engine_->client->get_session("same-name");
  ASSERT_TRUE(root_same.is_ok()) << root_same.status().to_string();
  EXPECT_EQ(root_same->blocks, 4u);
  EXPECT_TRUE(IsError(engine_->client->get_session("other-only").status(), StatusCode::kNotFound,
                      "no session 'other-only'"));
}

TEST_F(HandlerTest, NamespacesDoNotShareBlocksEvenWithTheSameLayout) {
  auto other = connect_engine_as(kOtherUid, kOtherUid, "other-user");
  KVTIER_SKIP_IF_NO_OTHER_USER(other.status());
  ASSERT_TRUE(other.is_ok()) << other.status().to_string();
  ASSERT_EQ(other->hello.layout_digest, engine_->hello.layout_digest);
  const auto hashes = PagedCache::chain_hashes("private", 4);
  ASSERT_TRUE(save(*engine_, "private", 4).is_ok());

  auto seen = other->client->lookup(hashes);
  ASSERT_TRUE(seen.is_ok()) << seen.status().to_string();
  EXPECT_EQ(seen->hit_count, 0u) << "another namespace's blocks are visible";
  auto loaded = load(*other, "private", hashes, 8);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->reply.loaded_count, 0u) << "another namespace's blocks were loaded";
  EXPECT_EQ(loaded->reply.stop_reason.code(), StatusCode::kNotFound);
  // The same hashes saved there are stored again, not deduplicated against root's.
  auto saved = save(*other, "private", 4);
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  EXPECT_EQ(saved->stored, 4u);
  EXPECT_EQ(saved->deduplicated, 0u);
  auto stats = wait_until_settled();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(integration::total_blocks(*stats), 8u);
}

// --- Admin requests: who may ---------------------------------------------------------

TEST_F(HandlerTest, AdminRequestsFromANonAdminPeerArePermissionDeniedAndChangeNothing) {
  ASSERT_TRUE(save(*engine_, "target", 4).is_ok());
  ASSERT_TRUE(wait_until_settled().is_ok());
  auto user = connect_as(kOtherUid, kOtherUid);
  KVTIER_SKIP_IF_NO_OTHER_USER(user.status());
  ASSERT_TRUE(user.is_ok()) << user.status().to_string();
  const std::string why =
      "it needs root (uid 0); uid 60001 is not, and no admin-group is configured";
  EXPECT_TRUE(IsError((*user)->evict("target", "").status(), StatusCode::kPermissionDenied,
                      "evict is an admin command: " + why));
  EXPECT_TRUE(IsError((*user)->evict("", "", 1).status(), StatusCode::kPermissionDenied,
                      "evict is an admin command"));
  EXPECT_TRUE(IsError((*user)->pin("target", "", true).status(), StatusCode::kPermissionDenied,
                      "pin is an admin command: " + why));
  EXPECT_TRUE(IsError((*user)->pin("target", "", false).status(), StatusCode::kPermissionDenied,
                      "unpin is an admin command"));
  EXPECT_TRUE(IsError((*user)->drain().status(), StatusCode::kPermissionDenied,
                      "drain is an admin command: " + why));
  EXPECT_TRUE(IsError((*user)->get_config().status(), StatusCode::kPermissionDenied,
                      "config is an admin command: " + why));
  EXPECT_FALSE((*user)->evict("target", "").status().retryable());

  auto target = engine_->client->get_session("target");
  ASSERT_TRUE(target.is_ok()) << "a refused Evict dropped the session: "
                              << target.status().to_string();
  EXPECT_EQ(target->blocks_per_tier, (std::vector<uint32_t>{4, 0, 0, 0}));
  EXPECT_FALSE(target->pinned);
  auto stats = engine_->client->stats();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->admin_pinned_blocks, 0u);
  EXPECT_EQ(stats->blocks_evicted, 0u);
}

class AdminGroupTest : public HandlerTest {
 protected:
  DaemonConfig daemon_config() const override { return admin_group_config(); }
};

TEST_F(AdminGroupTest, AMemberOfTheAdminGroupMayUseAdminRequestsAndOthersAreToldWhichGroup) {
  ASSERT_TRUE(save(*engine_, "target", 4).is_ok());
  ASSERT_TRUE(wait_until_settled().is_ok());
  auto member = connect_as(kOtherUid, kAdminGid);
  KVTIER_SKIP_IF_NO_OTHER_USER(member.status());
  ASSERT_TRUE(member.is_ok()) << member.status().to_string();
  auto outsider = connect_as(kThirdUid, kThirdUid);
  ASSERT_TRUE(outsider.is_ok()) << outsider.status().to_string();

  EXPECT_TRUE(IsError((*outsider)->get_config().status(), StatusCode::kPermissionDenied,
                      "config is an admin command: it needs root (uid 0) or membership in the "
                      "admin group 'kvtier-test-admins'; uid 60002 has neither"));
  EXPECT_TRUE(IsError((*outsider)->list_sessions(true).status(), StatusCode::kPermissionDenied,
                      "needs uid 0 or the admin group"));

  auto config = (*member)->get_config();
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  auto all = (*member)->list_sessions(/*all_namespaces=*/true);
  ASSERT_TRUE(all.is_ok()) << all.status().to_string();
  EXPECT_EQ(ids_of(*all), (std::vector<std::string>{engine_->hello.namespace_name + "/target"}));
  auto pinned = (*member)->pin("target", "", true);
  ASSERT_TRUE(pinned.is_ok()) << pinned.status().to_string();
  EXPECT_EQ(*pinned, 4u);
  ASSERT_TRUE((*member)->pin("target", "", false).is_ok());
  auto evicted = (*member)->evict("target", "");
  ASSERT_TRUE(evicted.is_ok()) << evicted.status().to_string();
  EXPECT_EQ(evicted->sessions, 1u);
  EXPECT_EQ(evicted->blocks_evicted, 4u);
}

// --- Evict -----------------------------------------------------------------------------

TEST_F(HandlerTest, EvictDropsOneSessionOrEverySessionIdleLongerThanAsked) {
  ASSERT_TRUE(save(*engine_, "old", 4, 0).is_ok());
  daemon_->advance_clock_ms(5'000);
  ASSERT_TRUE(save(*engine_, "recent", 4, 4).is_ok());
  ASSERT_TRUE(save(*engine_, "in-turn", 2, 8, /*end_of_turn=*/false).is_ok());
  ASSERT_TRUE(wait_until_settled().is_ok());

  EXPECT_TRUE(IsError(engine_->client->evict("", "", 0).status(), StatusCode::kInvalidArgument,
                      "give a sessionId or an idleOverMs above 0"));
  EXPECT_TRUE(IsError(engine_->client->evict("nope", "").status(), StatusCode::kNotFound,
                      "no session 'nope' in any namespace"));
  EXPECT_TRUE(IsError(engine_->client->evict("old", "uid:424242").status(), StatusCode::kNotFound,
                      "no session 'old' in namespace 'uid:424242'"));

  // Idle over 3 s on the manual clock: only "old" (5 s); "recent" is idle 0 s and
  // "in-turn" is not idle at all.
  daemon_->advance_clock_ms(100);
  auto idle = engine_->client->evict("", "", 3'000);
  ASSERT_TRUE(idle.is_ok()) << idle.status().to_string();
  EXPECT_EQ(idle->sessions, 1u);
  EXPECT_EQ(idle->blocks_evicted, 4u);
  EXPECT_EQ(idle->bytes_freed, 4 * block_bytes());
  EXPECT_EQ(idle->blocks_kept, 0u);
  EXPECT_TRUE(IsError(engine_->client->get_session("old").status(), StatusCode::kNotFound, "old"));
  auto old_blocks = engine_->client->lookup(PagedCache::chain_hashes("old", 4));
  ASSERT_TRUE(old_blocks.is_ok()) << old_blocks.status().to_string();
  EXPECT_EQ(old_blocks->hit_count, 0u);
  auto recent = engine_->client->lookup(PagedCache::chain_hashes("recent", 4));
  ASSERT_TRUE(recent.is_ok()) << recent.status().to_string();
  EXPECT_EQ(recent->hit_count, 4u);

  auto one = engine_->client->evict("in-turn", engine_->hello.namespace_name);
  ASSERT_TRUE(one.is_ok()) << one.status().to_string();
  EXPECT_EQ(one->sessions, 1u);
  EXPECT_EQ(one->blocks_evicted, 2u);
  auto stats = wait_until_settled();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(integration::total_blocks(*stats), 4u);
  EXPECT_EQ(stats->sessions_active + stats->sessions_idle, 1u);
  EXPECT_TRUE(NoLeakedSlots(*stats, block_bytes()));
}

TEST_F(HandlerTest, EvictOfASessionIdInTwoNamespacesNeedsTheNamespace) {
  auto other = connect_engine_as(kOtherUid, kOtherUid, "other-user");
  KVTIER_SKIP_IF_NO_OTHER_USER(other.status());
  ASSERT_TRUE(other.is_ok()) << other.status().to_string();
  ASSERT_TRUE(save(*engine_, "twice", 4).is_ok());
  ASSERT_TRUE(save(*other, "twice", 4).is_ok());
  ASSERT_TRUE(wait_until_settled().is_ok());
  EXPECT_TRUE(IsError(engine_->client->evict("twice", "").status(), StatusCode::kInvalidArgument,
                      "session 'twice' exists in namespaces"));
  auto evicted = engine_->client->evict("twice", std::string(kOtherNamespace));
  ASSERT_TRUE(evicted.is_ok()) << evicted.status().to_string();
  EXPECT_EQ(evicted->blocks_evicted, 4u);
  EXPECT_TRUE(
      IsError(other->client->get_session("twice").status(), StatusCode::kNotFound, "twice"));
  auto root_twice = engine_->client->get_session("twice");
  ASSERT_TRUE(root_twice.is_ok()) << "the other namespace's session went instead: "
                                  << root_twice.status().to_string();
  EXPECT_EQ(root_twice->blocks, 4u);
}

// --- Pin -------------------------------------------------------------------------------

// Both sessions idle past the HBM threshold on the manual clock; the pinned one (the
// older, which the planner would demote first) stays in HBM until it is unpinned.
TEST_F(HandlerTest, PinnedSessionStaysInHbmPastItsIdleThresholdUntilUnpinned) {
  ASSERT_TRUE(save(*engine_, "pinned", 4, 0).is_ok());
  daemon_->advance_clock_ms(10);
  ASSERT_TRUE(save(*engine_, "unpinned", 4, 4).is_ok());
  ASSERT_TRUE(wait_until_settled().is_ok());
  EXPECT_TRUE(IsError(engine_->client->pin("nope", "", true).status(), StatusCode::kNotFound,
                      "no session 'nope'"));
  auto pinned = engine_->client->pin("pinned", "", true);
  ASSERT_TRUE(pinned.is_ok()) << pinned.status().to_string();
  EXPECT_EQ(*pinned, 4u);
  auto stats = engine_->client->stats();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->admin_pinned_blocks, 4u);
  EXPECT_EQ(stats->pinned_sessions, 1u);
  EXPECT_EQ(stats->pinned_blocks, 0u) << "admin pins counted as copies' pins";

  daemon_->advance_clock_ms(daemon_->config().hbm_idle_ms + 1);
  ASSERT_TRUE(wait_until_in_tier("unpinned", Tier::kRam, 4).is_ok());
  ASSERT_TRUE(wait_until_settled().is_ok());
  auto held = engine_->client->get_session("pinned");
  ASSERT_TRUE(held.is_ok()) << held.status().to_string();
  EXPECT_TRUE(held->pinned);
  EXPECT_EQ(held->blocks_per_tier, (std::vector<uint32_t>{4, 0, 0, 0}))
      << "a pinned session was demoted";

  auto unpinned = engine_->client->pin("pinned", "", false);
  ASSERT_TRUE(unpinned.is_ok()) << unpinned.status().to_string();
  auto released = wait_until_in_tier("pinned", Tier::kRam, 4);
  ASSERT_TRUE(released.is_ok()) << "unpinned, the idle session was never demoted: "
                                << released.status().to_string();
  EXPECT_FALSE(released->pinned);
  stats = engine_->client->stats();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->admin_pinned_blocks, 0u);
  EXPECT_EQ(stats->pinned_sessions, 0u);
}

// --- Drain -----------------------------------------------------------------------------

TEST_F(HandlerTest, DrainWithoutAnNvmeTierIsRefusedAndMovesNothing) {
  ASSERT_TRUE(save(*engine_, "stays", 4).is_ok());
  EXPECT_TRUE(IsError(engine_->client->drain().status(), StatusCode::kInvalidArgument,
                      "no NVMe tier is configured"));
  auto session = engine_->client->get_session("stays");
  ASSERT_TRUE(session.is_ok()) << session.status().to_string();
  EXPECT_EQ(session->blocks_per_tier, (std::vector<uint32_t>{4, 0, 0, 0}));
}

class NvmeHandlerTest : public HandlerTest {
 protected:
  DaemonConfig daemon_config() const override {
    DaemonConfig config = inprocess_config();
    config.nvme_bytes = 8ull << 20;
    return config;
  }
};

TEST_F(NvmeHandlerTest, DrainMovesEveryUnpinnedBlockToNvmeAndTheyLoadBackBitExact) {
  ASSERT_TRUE(save(*engine_, "drained", 4, 0).is_ok());
  ASSERT_TRUE(save(*engine_, "pinned", 4, 4).is_ok());
  ASSERT_TRUE(wait_until_settled().is_ok());
  auto pinned = engine_->client->pin("pinned", "", true);
  ASSERT_TRUE(pinned.is_ok()) << pinned.status().to_string();
  ASSERT_EQ(*pinned, 4u);

  auto drained = engine_->client->drain();
  ASSERT_TRUE(drained.is_ok()) << drained.status().to_string();
  EXPECT_EQ(drained->blocks_queued, 4u);
  EXPECT_EQ(drained->bytes_queued, 4 * block_bytes());
  auto on_nvme = wait_until_in_tier("drained", Tier::kNvme, 4);
  ASSERT_TRUE(on_nvme.is_ok()) << on_nvme.status().to_string();
  auto kept = engine_->client->get_session("pinned");
  ASSERT_TRUE(kept.is_ok()) << kept.status().to_string();
  EXPECT_EQ(kept->blocks_per_tier, (std::vector<uint32_t>{4, 0, 0, 0})) << "a pinned block moved";
  auto where = engine_->client->lookup(PagedCache::chain_hashes("drained", 4));
  ASSERT_TRUE(where.is_ok()) << where.status().to_string();
  EXPECT_EQ(where->tiers, std::vector<Tier>(4, Tier::kNvme));

  auto loaded = load(*engine_, "drained", PagedCache::chain_hashes("drained", 4), 8);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->reply.loaded_count, 4u) << loaded->reply.stop_reason.to_string();
  EXPECT_EQ(loaded->verified, 4u);
}

// --- GetConfig -------------------------------------------------------------------------

TEST_F(HandlerTest, GetConfigReturnsTheEffectiveConfigurationWithReloadability) {
  auto entries = engine_->client->get_config();
  ASSERT_TRUE(entries.is_ok()) << entries.status().to_string();
  std::map<std::string, ConfigEntryInfo> by_key;
  for (const ConfigEntryInfo& entry : *entries) by_key[entry.key] = entry;
  EXPECT_EQ(by_key.size(), entries->size()) << "a key is listed twice";
  // Exactly what the daemon runs with: the test's configuration, socket path included.
  const std::vector<ConfigEntry> expected = describe(daemon_->config());
  ASSERT_EQ(entries->size(), expected.size());
  for (const ConfigEntry& want : expected) {
    SCOPED_TRACE(want.key);
    auto got = by_key.find(want.key);
    ASSERT_NE(got, by_key.end());
    EXPECT_EQ(got->second.value, want.value);
    EXPECT_EQ(got->second.reloadable, want.reloadable);
  }
  EXPECT_EQ(by_key.at("hbm-bytes").value, "\"4MiB\"");
  EXPECT_EQ(by_key.at("policy").value, "\"session\"");
  EXPECT_NE(by_key.at("socket").value.find(daemon_->socket_path()), std::string::npos);
  EXPECT_TRUE(by_key.at("hbm-idle-ms").reloadable);
  EXPECT_FALSE(by_key.at("hbm-bytes").reloadable);
}

}  // namespace
}  // namespace kvtier::daemon
