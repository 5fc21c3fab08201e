// Every kvtierctl command against a live daemon, as a person reads it and as --json,
// with its exit codes; admin commands refused for an unprivileged uid (and allowed for
// the admin group); and a pin that really keeps a session's blocks where they are.
#include <gtest/gtest.h>
#include <unistd.h>

#include <thread>

#include "tests/integration/ops_harness.h"

namespace kvtier::integration {
namespace {

constexpr uid_t kNobody = 65534;
constexpr gid_t kNoGroup = 65534;

// Saves `blocks` blocks of `session` from an in-process engine and ends the turn.
::testing::AssertionResult SaveSession(const Daemon& daemon, const std::string& session,
                                       size_t blocks) {
  auto engine = Engine::connect(daemon.socket_path(), small_shape(blocks), "kvtierctl-test");
  if (!engine.is_ok()) return ::testing::AssertionFailure() << engine.status().to_string();
  const auto refs = Engine::refs(PagedCache::chain_hashes(session, blocks), 0);
  engine->fill(refs);
  auto saved = engine->client->save(session, refs, true);
  if (!saved.is_ok()) return ::testing::AssertionFailure() << saved.status().to_string();
  return ::testing::AssertionSuccess();
}

class Kvtierctl : public DaemonTest {
 protected:
  std::vector<std::string> daemon_flags() const override {
    auto flags = small_tier_flags();
    flags.insert(flags.end(), {"--metrics-addr", "off"});
    return flags;
  }
  void SetUp() override {
    DaemonTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_TRUE(SaveSession(*daemon_, "chat-small", 2));
    // Idle times are whole milliseconds: make chat-small's strictly the longer.
    std::this_thread::sleep_for(milliseconds(3));
    ASSERT_TRUE(SaveSession(*daemon_, "chat-large", 6));
    ASSERT_TRUE(daemon_->wait_until_settled().is_ok());
  }
  // Runs kvtierctl and expects `exit_code`.
  ProcessResult ctl(const std::vector<std::string>& args, int exit_code = 0) {
    ProcessResult run = daemon_->run_kvtierctl(args);
    EXPECT_TRUE(run.status.exited && run.status.code == exit_code)
        << "kvtierctl " << fmt::format("{}", fmt::join(args, " ")) << " (expected exit "
        << exit_code << "): " << run.describe();
    return run;
  }
  boost::json::value json(const std::vector<std::string>& args) {
    ProcessResult run = ctl(args);
    auto value = parse_json(run.stdout_text);
    EXPECT_TRUE(value.is_ok()) << value.status().to_string();
    return value.is_ok() ? *value : boost::json::value();
  }
};

TEST_F(Kvtierctl, ReadCommandsForPeopleAndAsJson) {
  auto status = ctl({"status"});
  EXPECT_NE(status.stdout_text.find("sessions   0 active, 2 idle"), std::string::npos)
      << status.stdout_text;
  EXPECT_NE(status.stdout_text.find("KiB"), std::string::npos) << "human units";
  auto status_json = json({"status", "--json"});
  EXPECT_EQ(status_json.at("sessions").at("idle").as_int64(), 2);
  EXPECT_EQ(status_json.at("tiers").as_array()[0].at("blocks").as_int64(), 8);

  auto sessions = ctl({"sessions"});
  EXPECT_NE(sessions.stdout_text.find("chat-small"), std::string::npos) << sessions.stdout_text;
  auto by_bytes = json({"sessions", "--sort", "bytes", "--json"});
  const auto& list = by_bytes.at("sessions").as_array();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].at("id").as_string(), "chat-large");
  EXPECT_GT(list[0].at("bytes").as_int64(), list[1].at("bytes").as_int64());
  auto by_idle = json({"--json", "sessions", "--sort", "idle"});
  EXPECT_EQ(by_idle.at("sessions").as_array()[0].at("id").as_string(), "chat-small")
      << "saved first, so idle longest: " << boost::json::serialize(by_idle);

  auto session = ctl({"session", "chat-large"});
  EXPECT_NE(session.stdout_text.find("idle for"), std::string::npos) << session.stdout_text;
  EXPECT_NE(session.stdout_text.find("turns      1"), std::string::npos) << session.stdout_text;
  auto session_json = json({"session", "chat-large", "--json"});
  EXPECT_EQ(session_json.at("blocks").as_int64(), 6);
  EXPECT_EQ(session_json.at("blocks_per_tier").at("hbm").as_int64(), 6);

  auto top = ctl({"top", "--iterations", "2", "--interval", "50ms"});
  EXPECT_NE(top.stdout_text.find("hbm   ["), std::string::npos) << top.stdout_text;
  EXPECT_NE(top.stdout_text.find("save 0 B/s"), std::string::npos) << "rates on frame 2";
  auto top_json = parse_json_lines(
      ctl({"top", "--json", "--iterations", "2", "--interval", "50ms"}).stdout_text);
  ASSERT_TRUE(top_json.is_ok()) << top_json.status().to_string();
  ASSERT_EQ(top_json->size(), 2u);
  EXPECT_EQ((*top_json)[1].at("top_sessions").as_array()[0].at("id").as_string(), "chat-large");

  auto config = ctl({"config"});
  EXPECT_NE(config.stdout_text.find("hbm-bytes = \"32MiB\""), std::string::npos)
      << config.stdout_text;
  EXPECT_NE(config.stdout_text.find("# [reload]"), std::string::npos);
  auto config_json = json({"config", "--json"});
  EXPECT_FALSE(config_json.at("config").as_array().empty());
}

TEST_F(Kvtierctl, StatusListsConnectedEnginesWithTheModelTheirBlocksAreKeyedBy) {
  // The engines of SetUp have gone: none is listed.
  EXPECT_TRUE(json({"status", "--json"}).at("engines").as_array().empty());
  PagedCacheShape second = small_shape(4);
  second.model_id = "operators-own-id";
  auto b = Engine::connect(daemon_->socket_path(), second, "vllm-b");
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  {
    PagedCacheShape first = small_shape(4);
    first.model_id = "kvtier-model:0123456789abcdef0123456789abcdef";
    auto a = Engine::connect(daemon_->socket_path(), first, "vllm-a");
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    auto engines = json({"status", "--json"}).at("engines").as_array();
    ASSERT_EQ(engines.size(), 2u) << boost::json::serialize(engines);
    EXPECT_EQ(engines[0].at("engine").as_string(), "vllm-b");
    EXPECT_EQ(engines[0].at("model_id").as_string(), "operators-own-id");
    EXPECT_EQ(engines[0].at("tp_rank").as_int64(), 0);
    EXPECT_EQ(engines[0].at("tp_size").as_int64(), 1);
    EXPECT_EQ(engines[1].at("engine").as_string(), "vllm-a");
    EXPECT_EQ(engines[1].at("model_id").as_string(), first.model_id);
    EXPECT_EQ(engines[1].at("pid").as_int64(), static_cast<int64_t>(getpid()));
    EXPECT_EQ(engines[1].at("layout_digest").as_string(),
              fmt::format("{:016x}", a->hello.layout_digest));
    auto text = ctl({"status"}).stdout_text;
    EXPECT_NE(text.find(first.model_id), std::string::npos) << text;
    EXPECT_NE(text.find("vllm-b"), std::string::npos) << text;
  }  // vllm-a's connection closes
  boost::json::array engines;
  for (int i = 0; i < 500; ++i) {  // the daemon sees the close a moment later
    engines = json({"status", "--json"}).at("engines").as_array();
    if (engines.size() == 1) break;
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_EQ(engines.size(), 1u) << boost::json::serialize(engines);
  EXPECT_EQ(engines[0].at("engine").as_string(), "vllm-b");
}

TEST_F(Kvtierctl, PinUnpinAndEvict) {
  auto pinned = ctl({"pin", "chat-large"});
  EXPECT_NE(pinned.stdout_text.find("6 blocks"), std::string::npos) << pinned.stdout_text;
  EXPECT_TRUE(json({"session", "chat-large", "--json"}).at("pinned").as_bool());
  auto status = json({"status", "--json"});
  EXPECT_EQ(status.at("admin_pinned_blocks").as_int64(), 6);
  EXPECT_EQ(status.at("pinned_blocks").as_int64(), 0) << "admin pins are not copies in flight";
  EXPECT_EQ(status.at("sessions").at("pinned").as_int64(), 1);
  EXPECT_EQ(json({"unpin", "chat-large", "--json"}).at("pinned").as_bool(), false);
  EXPECT_EQ(json({"status", "--json"}).at("admin_pinned_blocks").as_int64(), 0);

  auto evicted = json({"evict", "chat-small", "--json"});
  EXPECT_EQ(evicted.at("sessions").as_int64(), 1);
  EXPECT_EQ(evicted.at("blocks_evicted").as_int64(), 2);
  ctl({"session", "chat-small"}, 5);
  std::this_thread::sleep_for(milliseconds(20));
  auto idle = ctl({"evict", "--idle-over", "10ms"});
  EXPECT_NE(idle.stdout_text.find("evicted 1 session: 6 blocks freed"), std::string::npos)
      << idle.stdout_text;
  EXPECT_TRUE(json({"sessions", "--json"}).at("sessions").as_array().empty());
  EXPECT_EQ(json({"status", "--json"}).at("tiers").as_array()[0].at("blocks").as_int64(), 0);
}

TEST_F(Kvtierctl, ExitCodesSayWhatHappened) {
  auto missing = ctl({"session", "no-such-session"}, 5);
  EXPECT_NE(missing.stderr_text.find("no session 'no-such-session'"), std::string::npos);
  ctl({"pin", "no-such-session"}, 5);
  auto drain = ctl({"drain"}, 1);
  EXPECT_NE(drain.stderr_text.find("no NVMe tier is configured"), std::string::npos)
      << drain.stderr_text;
  ctl({"evict"}, 2);
  ctl({"evict", "chat-small", "--idle-over", "1m"}, 2);
  ctl({"no-such-command"}, 2);
  ctl({"sessions", "--sort", "color"}, 2);
  auto unreachable =
      run_process({binary_path("kvtierctl"), "--socket", daemon_->dir() + "/nope.sock", "status"});
  EXPECT_TRUE(unreachable.status.exited && unreachable.status.code == 3) << unreachable.describe();
  EXPECT_TRUE(ctl({"--help"}).stdout_text.find("Exit codes") != std::string::npos);
}

// Non-admins: the daemon refuses admin commands and kvtierctl says why (exit 4).
class KvtierctlAsOthers : public Kvtierctl {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) {
      GTEST_SKIP() << "running kvtierctl as another uid needs root; run the tests as root to "
                      "cover the admin checks";
    }
    Kvtierctl::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_TRUE(daemon_->open_to_all_users().is_ok());
  }
  ProcessResult as(uid_t uid, gid_t gid, std::vector<std::string> args) {
    args.insert(args.begin(), {binary_path("kvtierctl"), "--socket", daemon_->socket_path()});
    return run_as(uid, gid, args);
  }
};

TEST_F(KvtierctlAsOthers, AdminCommandsAreRefusedForOtherUids) {
  const std::vector<std::vector<std::string>> admin_commands = {
      {"evict", "chat-small"},
      {"evict", "--idle-over", "1s"},
      {"pin", "chat-large"},
      {"unpin", "chat-large"},
      {"drain"},
      {"config"},
      {"status", "--all"},
      {"sessions", "--all"},
      {"session", "chat-large", "--namespace", "uid:0"}};
  for (const auto& command : admin_commands) {
    auto run = as(kNobody, kNoGroup, command);
    EXPECT_TRUE(run.status.exited && run.status.code == 4)
        << fmt::format("{}", fmt::join(command, " ")) << ": " << run.describe();
    EXPECT_NE(run.stderr_text.find("PermissionDenied"), std::string::npos) << run.stderr_text;
    EXPECT_NE(run.stderr_text.find("uid 0"), std::string::npos) << run.stderr_text;
  }
  auto evict = as(kNobody, kNoGroup, {"evict", "chat-small"});
  EXPECT_NE(evict.stderr_text.find("evict is an admin command"), std::string::npos)
      << evict.stderr_text;
  // Read-only views of one's own namespace stay open.
  auto here = Engine::connect(daemon_->socket_path(), small_shape(4), "root-engine");
  ASSERT_TRUE(here.is_ok()) << here.status().to_string();
  auto own = as(kNobody, kNoGroup, {"status", "--json"});
  EXPECT_TRUE(own.status.ok()) << own.describe();
  EXPECT_TRUE(parse_json(own.stdout_text).is_ok());
  EXPECT_NE(own.stdout_text.find("\"engines\":[]"), std::string::npos)
      << "another namespace's engines are not visible: " << own.stdout_text;
  auto none = as(kNobody, kNoGroup, {"sessions", "--json"});
  EXPECT_TRUE(none.status.ok()) << none.describe();
  EXPECT_NE(none.stdout_text.find("\"sessions\":[]"), std::string::npos) << none.stdout_text;
  EXPECT_EQ(as(kNobody, kNoGroup, {"session", "chat-large"}).status.code, 5)
      << "another namespace's session is not visible";
  // Nothing was changed by the refused commands.
  EXPECT_EQ(json({"sessions", "--json"}).at("sessions").as_array().size(), 2u);
}

class KvtierctlAdminGroup : public KvtierctlAsOthers {
 protected:
  std::vector<std::string> daemon_flags() const override {
    auto flags = Kvtierctl::daemon_flags();
    flags.insert(flags.end(), {"--admin-group", "nogroup"});
    return flags;
  }
};

TEST_F(KvtierctlAdminGroup, MembersOfTheAdminGroupMayAdminister) {
  auto config = as(kNobody, kNoGroup, {"config", "--json"});
  EXPECT_TRUE(config.status.ok()) << config.describe();
  auto all = as(kNobody, kNoGroup, {"sessions", "--all", "--json"});
  ASSERT_TRUE(all.status.ok()) << all.describe();
  EXPECT_NE(all.stdout_text.find("chat-large"), std::string::npos) << all.stdout_text;
  EXPECT_TRUE(as(kNobody, kNoGroup, {"evict", "chat-small"}).status.ok());
  // A uid outside the group is still refused, and told which group it needs.
  auto outsider = as(65533, 65533, {"evict", "chat-large"});
  EXPECT_EQ(outsider.status.code, 4) << outsider.describe();
  EXPECT_NE(outsider.stderr_text.find("admin group 'nogroup'"), std::string::npos)
      << outsider.stderr_text;
}

// A pinned session stays in HBM while an unpinned one idles out of it. The idle
// threshold leaves kvtierctl (a process spawned after the Save) ample time to pin
// "kept" before it could idle out; "left", saved after the pin, idles out later than
// "kept" would have.
class KvtierctlPin : public Kvtierctl {
 protected:
  std::vector<std::string> daemon_flags() const override {
    auto flags = Kvtierctl::daemon_flags();
    flags.insert(flags.end(), {"--hbm-idle-ms", "5s", "--plan-interval-ms", "20ms"});
    return flags;
  }
  void SetUp() override {
    DaemonTest::SetUp();  // sessions are saved after the pin below
  }
};

TEST_F(KvtierctlPin, APinnedSessionIsNotDemoted) {
  ASSERT_TRUE(SaveSession(*daemon_, "kept", 3));
  ctl({"pin", "kept"});
  ASSERT_TRUE(SaveSession(*daemon_, "left", 3));
  // "left" idles out of HBM; wait for it, then look at "kept".
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (json({"session", "left", "--json"}).at("blocks_per_tier").at("hbm").as_int64() != 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  // Whatever the planner moved in that pass has landed (an admin pin does not count
  // as pinned_blocks), so "kept" is not seen in HBM merely because its move is in flight.
  ASSERT_TRUE(daemon_->wait_until_settled().is_ok());
  EXPECT_EQ(json({"session", "left", "--json"}).at("blocks_per_tier").at("ram").as_int64(), 3);
  EXPECT_EQ(json({"session", "kept", "--json"}).at("blocks_per_tier").at("hbm").as_int64(), 3);
  // Blocks a pinned session saves later are pinned too.
  ASSERT_TRUE(SaveSession(*daemon_, "kept", 5));
  EXPECT_EQ(json({"pin", "kept", "--json"}).at("pinned_blocks").as_int64(), 5);
  ctl({"unpin", "kept"});
  while (json({"session", "kept", "--json"}).at("blocks_per_tier").at("hbm").as_int64() != 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_EQ(json({"session", "kept", "--json"}).at("blocks_per_tier").at("ram").as_int64(), 5)
      << "unpinned, it idles out like any other";
}

// With an NVMe tier, drain pushes every unpinned RAM/HBM block down to it.
class KvtierctlNvme : public Kvtierctl {
 protected:
  std::vector<std::string> daemon_flags() const override {
    auto flags = Kvtierctl::daemon_flags();
    flags.insert(flags.end(), {"--nvme-bytes", "64MiB"});
    return flags;
  }
};

TEST_F(KvtierctlNvme, DrainMovesUnpinnedBlocksToNvme) {
  ctl({"pin", "chat-small"});
  auto drained = json({"drain", "--json"});
  EXPECT_EQ(drained.at("blocks_queued").as_int64(), 6) << "chat-large only: chat-small is pinned";
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (json({"session", "chat-large", "--json"}).at("blocks_per_tier").at("nvme").as_int64() !=
             6 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_EQ(json({"session", "chat-large", "--json"}).at("blocks_per_tier").at("nvme").as_int64(),
            6);
  EXPECT_EQ(json({"session", "chat-small", "--json"}).at("blocks_per_tier").at("hbm").as_int64(),
            2);
  ctl({"unpin", "chat-small"});
}

}  // namespace
}  // namespace kvtier::integration
