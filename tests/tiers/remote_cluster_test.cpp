// The Redis Cluster routing layer (tiers/remote_cluster.h): key slots and hash tags
// against the cluster spec's examples, redirect and endpoint parsing, the slot map —
// then against a real cluster that the test starts itself (redis-server from Debian,
// 3 masters and 3 replicas on loopback ports in a temporary directory): routing, a
// MOVED after a slot changed owner, an ASK during a migration, dead seeds and a dead
// master.
#include "tiers/remote_cluster.h"

#include <gtest/gtest.h>

#include <chrono>

#include "tests/support/redis_cluster.h"

namespace kvtier::remote {
namespace {

TEST(KeySlot, MatchesTheClusterSpec) {
  // The spec's CRC16 test vector: CRC16("123456789") = 0x31C3.
  EXPECT_EQ(key_slot("123456789"), 0x31C3 % kClusterSlots);
  EXPECT_EQ(key_slot(""), 0);
  // Hash tags: the first '{' to the next '}', when not empty.
  EXPECT_EQ(hash_tag("{user1000}.following"), "user1000");
  EXPECT_EQ(key_slot("{user1000}.following"), key_slot("{user1000}.followers"));
  EXPECT_EQ(hash_tag("foo{}{bar}"), "foo{}{bar}");
  EXPECT_EQ(hash_tag("foo{{bar}}zap"), "{bar");
  EXPECT_EQ(hash_tag("foo{bar}{zap}"), "bar");
  EXPECT_EQ(hash_tag("no tag"), "no tag");
  EXPECT_EQ(hash_tag("open{only"), "open{only");
  EXPECT_EQ(key_slot("kvtier:{7}:a"), key_slot("kvtier:{7}:b"));
}

TEST(Redirects, AreParsedAndAnythingElseIsNot) {
  auto moved = parse_redirect("MOVED 3999 127.0.0.1:6381");
  ASSERT_TRUE(moved.has_value());
  EXPECT_EQ(moved->kind, Redirect::Kind::kMoved);
  EXPECT_EQ(moved->slot, 3999);
  EXPECT_EQ(moved->to, (Endpoint{"127.0.0.1", 6381}));
  // A cluster announcing unknown endpoints: ":port" on the node that replied.
  auto unknown = parse_redirect("MOVED 5 :7002");
  ASSERT_TRUE(unknown.has_value());
  EXPECT_EQ(unknown->to, (Endpoint{"", 7002}));
  EXPECT_FALSE(parse_redirect("MOVED 5 :0").has_value());
  auto ask = parse_redirect("ASK 16383 ::1:7000");
  ASSERT_TRUE(ask.has_value());
  EXPECT_EQ(ask->kind, Redirect::Kind::kAsk);
  EXPECT_EQ(ask->to, (Endpoint{"::1", 7000}));
  for (const char* bad :
       {"ERR wrong number of arguments", "MOVED", "MOVED 3999", "MOVED 16384 127.0.0.1:1",
        "MOVED x 127.0.0.1:1", "ASK 1 host", "ASK 1 host:0", "ASK 1 host:70000", "MOVED -1 h:1"}) {
    EXPECT_FALSE(parse_redirect(bad).has_value()) << bad;
  }
  EXPECT_FALSE(parse_endpoint("nohost").is_ok());
  auto bracketed = parse_endpoint("[::1]:6379");
  ASSERT_TRUE(bracketed.is_ok());
  EXPECT_EQ(*bracketed, (Endpoint{"::1", 6379}));
}

Reply integer(long long v) {
  Reply r;
  r.kind = Reply::Kind::kInteger;
  r.integer = v;
  return r;
}
Reply string(std::string s) {
  Reply r;
  r.kind = Reply::Kind::kString;
  r.str = std::move(s);
  return r;
}
Reply array(std::vector<Reply> elements) {
  Reply r;
  r.kind = Reply::Kind::kArray;
  r.elements = std::move(elements);
  return r;
}

// Test clusters started side by side never pick one port: a claim is exclusive while
// its holder lives (a second open of the lock file conflicts, in this process too).
TEST(LocalRedisClusterPorts, AClaimIsExclusiveUntilReleased) {
  constexpr int kPort = 9999;  // below the clusters' range: no test cluster claims it
  std::optional<UniqueFd> first = claim_port(kPort);
  ASSERT_TRUE(first.has_value());
  if (!first->valid()) GTEST_SKIP() << "no lock file can be made in /tmp/kvtier-redis-ports";
  EXPECT_FALSE(claim_port(kPort).has_value());
  first.reset();
  EXPECT_TRUE(claim_port(kPort).has_value());
  // A cluster holds the claims of the ports it chose until it goes.
  std::optional<LocalRedisCluster> cluster(std::in_place);
  ASSERT_TRUE(cluster->choose_ports().is_ok());
  const int chosen = cluster->ports().front();
  EXPECT_FALSE(claim_port(chosen).has_value());
  cluster.reset();
  EXPECT_TRUE(claim_port(chosen).has_value());
}

TEST(SlotMap, ReadsClusterSlotsAndRefusesMalformedReplies) {
  SlotMap map;
  Reply slots = array({
      array({integer(0), integer(5460), array({string("10.0.0.1"), integer(7000), string("a")}),
             array({string("10.0.0.4"), integer(7003), string("d")})}),
      array({integer(5461), integer(10000), array({string(""), integer(7001), string("b")})}),
      array({integer(10001), integer(16383), array({Reply{}, integer(7002), string("c")})}),
  });
  ASSERT_TRUE(map.assign_from_cluster_slots(slots, "10.0.0.9").is_ok());
  EXPECT_EQ(*map.master_of(0), (Endpoint{"10.0.0.1", 7000}));
  EXPECT_EQ(*map.master_of(5460), (Endpoint{"10.0.0.1", 7000}));
  // An empty host is the node that replied.
  EXPECT_EQ(*map.master_of(5461), (Endpoint{"10.0.0.9", 7001}));
  // A nil host (unknown-endpoint mode) too.
  EXPECT_EQ(*map.master_of(16383), (Endpoint{"10.0.0.9", 7002}));
  EXPECT_EQ(map.masters().size(), 3u);

  const std::vector<Reply> malformed = {
      string("nope"),
      array({array({integer(0), integer(16384), array({string("h"), integer(1)})})}),
      array({array({integer(9), integer(3), array({string("h"), integer(1)})})}),
      array({array({integer(0), integer(5), array({string("h"), integer(0)})})}),
      array({array({integer(0), integer(5)})}),
      array({array({integer(0), integer(5), array({integer(1), integer(1)})})}),
  };
  for (const Reply& bad : malformed) {
    EXPECT_EQ(map.assign_from_cluster_slots(bad, "x").code(), StatusCode::kInternal);
    EXPECT_EQ(*map.master_of(0), (Endpoint{"10.0.0.1", 7000})) << "the map is unchanged";
  }
}

// ---- Against a real cluster ----

class RemoteClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Status started = redis_.start();
    ASSERT_TRUE(started.is_ok()) << started.to_string();
    ClusterOptions options;
    options.seeds = {redis_.seeds().front()};
    auto cluster = RemoteCluster::connect(options);
    ASSERT_TRUE(cluster.is_ok()) << cluster.status().to_string();
    cluster_ = std::move(*cluster);
  }
  Endpoint another_master(const Endpoint& than) const {
    for (const Endpoint& m : cluster_->slots().masters()) {
      if (!(m == than)) return m;
    }
    return than;
  }

  LocalRedisCluster redis_;
  std::unique_ptr<RemoteCluster> cluster_;
};

TEST_F(RemoteClusterTest, RoutesEveryKeyToTheMasterOfItsSlot) {
  EXPECT_EQ(cluster_->slots().masters().size(), 3u);
  for (int i = 0; i < 300; ++i) {
    const std::string key = fmt::format("key-{}", i);
    const std::string value = fmt::format("value-{}", i);
    auto set = cluster_->command({"SET", key, value});
    ASSERT_TRUE(set.is_ok()) << set.status().to_string();
    ASSERT_EQ(set->kind, Reply::Kind::kStatus) << set->str;
    // The key is on the master its slot names, asked directly.
    const Endpoint* master = cluster_->slots().master_of(key_slot(key));
    ASSERT_NE(master, nullptr);
    if (i % 30 == 0) {
      EXPECT_EQ(redis_.cli(master->port, {"get", key}), value) << key;
    }
    auto get = cluster_->command({"GET", key});
    ASSERT_TRUE(get.is_ok());
    EXPECT_EQ(get->str, value);
  }
  EXPECT_EQ(cluster_->moved_count(), 0u) << "a fresh map needs no redirect";
  auto missing = cluster_->command({"GET", "never-set"});
  ASSERT_TRUE(missing.is_ok());
  EXPECT_EQ(missing->kind, Reply::Kind::kNil);
  // Redis's own errors come back as replies, not as routing failures.
  auto wrong = cluster_->command({"INCR", "key-1"});
  ASSERT_TRUE(wrong.is_ok());
  EXPECT_EQ(wrong->kind, Reply::Kind::kError);
}

TEST_F(RemoteClusterTest, FollowsMovedWhenASlotChangedOwnerAndRefreshesTheMap) {
  const std::string key = "moving-key";
  const uint16_t slot = key_slot(key);
  const Endpoint from = *cluster_->slots().master_of(slot);
  const Endpoint to = another_master(from);
  const std::string to_id = redis_.cli(to.port, {"cluster", "myid"});
  // The slot (empty: the key was never written) is given to `to` on every master.
  for (const Endpoint& m : cluster_->slots().masters()) {
    EXPECT_EQ(redis_.cli(m.port, {"cluster", "setslot", std::to_string(slot), "node", to_id}),
              "OK");
  }
  auto set = cluster_->command({"SET", key, "v"});
  ASSERT_TRUE(set.is_ok()) << set.status().to_string();
  EXPECT_EQ(set->kind, Reply::Kind::kStatus) << set->str;
  EXPECT_EQ(cluster_->moved_count(), 1u);
  EXPECT_EQ(*cluster_->slots().master_of(slot), to);
  EXPECT_EQ(redis_.cli(to.port, {"get", key}), "v");
  auto get = cluster_->command({"GET", key});
  ASSERT_TRUE(get.is_ok());
  EXPECT_EQ(get->str, "v");
  EXPECT_EQ(cluster_->moved_count(), 1u) << "the refreshed map needs no second redirect";
}

TEST_F(RemoteClusterTest, FollowsAskDuringAMigrationWithoutChangingTheMap) {
  const std::string key = "asked-key";
  const uint16_t slot = key_slot(key);
  const Endpoint from = *cluster_->slots().master_of(slot);
  const Endpoint to = another_master(from);
  const std::string from_id = redis_.cli(from.port, {"cluster", "myid"});
  const std::string to_id = redis_.cli(to.port, {"cluster", "myid"});
  EXPECT_EQ(redis_.cli(to.port, {"cluster", "setslot", std::to_string(slot), "importing", from_id}),
            "OK");
  EXPECT_EQ(redis_.cli(from.port, {"cluster", "setslot", std::to_string(slot), "migrating", to_id}),
            "OK");
  // Not on the source: the source says ASK, and the target takes it after ASKING.
  auto set = cluster_->command({"SET", key, "w"});
  ASSERT_TRUE(set.is_ok()) << set.status().to_string();
  EXPECT_EQ(set->kind, Reply::Kind::kStatus) << set->str;
  EXPECT_EQ(cluster_->ask_count(), 1u);
  EXPECT_EQ(cluster_->moved_count(), 0u);
  EXPECT_EQ(*cluster_->slots().master_of(slot), from) << "ASK leaves the map as it was";
  EXPECT_EQ(redis_.cli(to.port, {"-c", "get", key}), "w");
}

TEST_F(RemoteClusterTest, ADeadSeedIsSkippedAndNoLiveSeedIsUnavailable) {
  ClusterOptions options;
  options.connect_timeout = milliseconds(200);
  options.seeds = {{"127.0.0.1", 1}, redis_.seeds()[1]};
  auto cluster = RemoteCluster::connect(options);
  ASSERT_TRUE(cluster.is_ok()) << cluster.status().to_string();
  EXPECT_EQ((*cluster)->slots().masters().size(), 3u);
  options.seeds = {{"127.0.0.1", 1}};
  auto none = RemoteCluster::connect(options);
  ASSERT_FALSE(none.is_ok());
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("127.0.0.1:1"), std::string::npos)
      << none.status().message();
}

// ACL: a user with a password on every node (ACL SETUSER is per node), its keys only,
// with the commands docs/remote.md and docs/operations.md grant and no others.
TEST_F(RemoteClusterTest, AnAclUserIsAuthenticatedAndAWrongPasswordIsPermissionDenied) {
  for (int port : redis_.ports()) {
    ASSERT_EQ(redis_.cli(port, {"acl", "setuser", "kvtier", "on", ">s3cret", "~kvtier:*", "+get",
                                "+set", "+del", "+exists", "+cluster|slots", "+asking"}),
              "OK");
  }
  ClusterOptions options;
  options.seeds = redis_.seeds();
  options.user = "kvtier";
  options.password = "s3cret";
  auto cluster = RemoteCluster::connect(options);
  ASSERT_TRUE(cluster.is_ok()) << cluster.status().to_string();
  auto set = (*cluster)->command({"SET", "kvtier:1:x:ok", "v"});
  ASSERT_TRUE(set.is_ok()) << set.status().to_string();
  EXPECT_EQ(set->kind, Reply::Kind::kStatus) << set->str;
  for (const char* command : {"GET", "EXISTS", "DEL"}) {
    auto reply = (*cluster)->command({command, "kvtier:1:x:ok"});
    ASSERT_TRUE(reply.is_ok()) << command;
    EXPECT_NE(reply->kind, Reply::Kind::kError) << command << ": " << reply->str;
  }
  // Outside the user's key pattern: Redis refuses it, as a reply.
  auto other = (*cluster)->command({"SET", "not-kvtier", "v"});
  ASSERT_TRUE(other.is_ok());
  EXPECT_EQ(other->kind, Reply::Kind::kError);
  EXPECT_NE(other->str.find("NOPERM"), std::string::npos) << other->str;

  options.password = "wrong";
  auto refused = RemoteCluster::connect(options);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status().to_string();
  EXPECT_NE(refused.status().message().find("kvtier"), std::string::npos);
}

TEST_F(RemoteClusterTest, AMasterThatDiedIsUnavailableWithinTheTimeoutNotAHang) {
  const std::string key = "on-a-dead-node";
  ASSERT_TRUE(cluster_->command({"SET", key, "x"}).is_ok());
  const Endpoint master = *cluster_->slots().master_of(key_slot(key));
  redis_.kill_node(master.port);
  const auto began = std::chrono::steady_clock::now();
  auto get = cluster_->command({"GET", key});
  const auto took = std::chrono::steady_clock::now() - began;
  // Before failover (node timeout 2 s) its slots have no reachable master: Unavailable,
  // promptly, and the client is usable for the other masters' slots.
  ASSERT_FALSE(get.is_ok());
  EXPECT_EQ(get.status().code(), StatusCode::kUnavailable) << get.status().to_string();
  EXPECT_LT(took, std::chrono::seconds(3));
  for (int i = 0; i < 50; ++i) {
    const std::string other = fmt::format("elsewhere-{}", i);
    const Endpoint* owner = cluster_->slots().master_of(key_slot(other));
    if (owner == nullptr || *owner == master) continue;
    auto set = cluster_->command({"SET", other, "y"});
    ASSERT_TRUE(set.is_ok()) << set.status().to_string();
    EXPECT_EQ(set->kind, Reply::Kind::kStatus);
  }
}

}  // namespace
}  // namespace kvtier::remote
