// Namespaces: blocks saved by one uid are invisible to another uid, even with the
// same layout and the same hashes, unless --shared-namespace puts both uids in one
// namespace. Engines run as forked children that drop to unprivileged uids, so these
// tests need root.
#include <grp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>

#include "tests/integration/daemon_harness.h"

namespace kvtier::integration {
namespace {

constexpr uid_t kUidA = 65534;
constexpr uid_t kUidB = 65533;
constexpr uid_t kUidOutsider = 65532;
constexpr size_t kBlocks = 6;

enum class Role {
  kSave,        // save the session, then read it back itself
  kSeesAll,     // every block visible, loads bit-exact, the session is listed
  kSeesNothing  // no block visible, nothing loads, the session is unknown
};

// The body of an engine child running as `uid`; its exit code says what went wrong.
int engine_as(uid_t uid, const std::string& socket_path, const std::string& expected_namespace,
              const std::string& session, Role role) {
  if (::setgroups(0, nullptr) != 0 || ::setgid(uid) != 0 || ::setuid(uid) != 0) {
    return child_failure(2, fmt::format("cannot become uid {}", uid));
  }
  auto engine =
      Engine::connect(socket_path, small_shape(2 * kBlocks), fmt::format("engine-uid-{}", uid));
  if (!engine.is_ok()) return child_failure(10, "connect", engine.status());
  if (engine->hello.namespace_name != expected_namespace) {
    return child_failure(11, fmt::format("namespace is '{}', expected '{}'",
                                         engine->hello.namespace_name, expected_namespace));
  }
  const auto hashes = PagedCache::chain_hashes(session, kBlocks);
  if (role == Role::kSave) {
    const auto refs = Engine::refs(hashes, 0);
    engine->fill(refs);
    auto saved = engine->client->save(session, refs, true);
    if (!saved.is_ok()) return child_failure(12, "save", saved.status());
    if (saved->stored != kBlocks) {
      return child_failure(13, fmt::format("stored {} blocks", saved->stored));
    }
  }
  auto found = engine->client->lookup(hashes);
  if (!found.is_ok()) return child_failure(14, "lookup", found.status());
  const size_t expected = role == Role::kSeesNothing ? 0 : kBlocks;
  if (found->hit_count != expected) {
    return child_failure(
        15, fmt::format("lookup hit {} blocks, expected {}", found->hit_count, expected));
  }
  const auto restored = Engine::refs(hashes, kBlocks);
  auto loaded = engine->client->load(session, restored);
  if (!loaded.is_ok()) return child_failure(16, "load", loaded.status());
  if (loaded->loaded_count != expected || engine->count_verified(restored, expected) != expected) {
    return child_failure(
        17, fmt::format("loaded {} blocks ({}), expected {} bit-exact", loaded->loaded_count,
                        loaded->stop_reason.to_string(), expected));
  }
  auto sessions = engine->client->list_sessions();
  if (!sessions.is_ok()) return child_failure(18, "list sessions", sessions.status());
  bool listed = std::any_of(sessions->begin(), sessions->end(),
                            [&](const SessionInfo& info) { return info.session_id == session; });
  if (listed != (role != Role::kSeesNothing)) {
    return child_failure(19,
                         fmt::format("session '{}' is {}listed", session, listed ? "" : "not "));
  }
  auto begun = engine->client->begin_turn(session);
  if (role == Role::kSeesNothing && begun.status().code() != StatusCode::kNotFound) {
    return child_failure(20, "another namespace's session answered BeginTurn", begun.status());
  }
  if (role != Role::kSeesNothing && !begun.is_ok()) {
    return child_failure(21, "begin turn", begun.status());
  }
  // Every namespace at once is for admins only.
  if (auto all = engine->client->list_sessions(true);
      all.status().code() != StatusCode::kPermissionDenied) {
    return child_failure(22, "an unprivileged uid listed every namespace's sessions", all.status());
  }
  if (auto all = engine->client->stats(true);
      all.status().code() != StatusCode::kPermissionDenied) {
    return child_failure(23, "an unprivileged uid read every namespace's stats", all.status());
  }
  return 0;
}

::testing::AssertionResult RunEngineAs(const Daemon& daemon, uid_t uid,
                                       const std::string& expected_namespace,
                                       const std::string& session, Role role) {
  pid_t child = fork_child(
      [&] { return engine_as(uid, daemon.socket_path(), expected_namespace, session, role); });
  ExitStatus status = wait_for_exit(child);
  if (status.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "engine as uid " << uid << " " << status.describe() << " (exit codes: see engine_as)";
}

class Namespaces : public DaemonTest {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) {
      GTEST_SKIP() << "namespace isolation is tested by running engines as two different uids, "
                      "which needs root; run the integration tests as root to cover it";
    }
    DaemonTest::SetUp();
    if (daemon_) {
      ASSERT_TRUE(daemon_->open_to_all_users().is_ok());
    }
  }
};

TEST_F(Namespaces, UidsDoNotSeeEachOthersBlocks) {
  ASSERT_TRUE(RunEngineAs(*daemon_, kUidA, "uid:65534", "private-conversation", Role::kSave));
  ASSERT_TRUE(
      RunEngineAs(*daemon_, kUidB, "uid:65533", "private-conversation", Role::kSeesNothing));
  // A later process of the saving uid still sees its blocks: the namespace is the uid,
  // not the connection.
  ASSERT_TRUE(RunEngineAs(*daemon_, kUidA, "uid:65534", "private-conversation", Role::kSeesAll));

  // Nor does root's own (non-admin request) view include them.
  auto engine = Engine::connect(daemon_->socket_path(), small_shape(2 * kBlocks), "root-engine");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  EXPECT_EQ(engine->hello.namespace_name, "uid:0");
  auto found = engine->client->lookup(PagedCache::chain_hashes("private-conversation", kBlocks));
  ASSERT_TRUE(found.is_ok()) << found.status().to_string();
  EXPECT_EQ(found->hit_count, 0u);
}

TEST_F(Namespaces, SameHashesInTwoNamespacesAreStoredTwice) {
  ASSERT_TRUE(RunEngineAs(*daemon_, kUidA, "uid:65534", "common-prompt", Role::kSave));
  ASSERT_TRUE(RunEngineAs(*daemon_, kUidB, "uid:65533", "common-prompt", Role::kSave));
  auto settled = daemon_->wait_until_settled();
  ASSERT_TRUE(settled.is_ok()) << settled.status().to_string();
  EXPECT_EQ(total_blocks(*settled), 2 * kBlocks) << "a block was deduplicated across namespaces";
}

class SharedNamespace : public Namespaces {
 protected:
  std::vector<std::string> daemon_flags() const override {
    std::vector<std::string> flags = small_tier_flags();
    flags.insert(flags.end(), {"--shared-namespace", fmt::format("team={},{}", kUidA, kUidB)});
    return flags;
  }
};

TEST_F(SharedNamespace, ListedUidsShareBlocksAndOthersDoNot) {
  ASSERT_TRUE(RunEngineAs(*daemon_, kUidA, "team", "team-conversation", Role::kSave));
  ASSERT_TRUE(RunEngineAs(*daemon_, kUidB, "team", "team-conversation", Role::kSeesAll));
  ASSERT_TRUE(
      RunEngineAs(*daemon_, kUidOutsider, "uid:65532", "team-conversation", Role::kSeesNothing));
}

}  // namespace
}  // namespace kvtier::integration
