// What the remote tier's integration tests share (remote_tier_test.cpp,
// remote_write_test.cpp): kvtierds started on a Redis Cluster the test starts
// (tests/support/redis_cluster.h), an engine's turns saved and checked in the cluster,
// and two nodes with an engine each.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tests/integration/daemon_harness.h"
#include "tests/support/redis_cluster.h"
#include "tiers/remote_store.h"

namespace kvtier::integration {

// "host:port,host:port,..." for --remote-nodes.
std::string nodes_flag(const std::vector<remote::Endpoint>& seeds);
// What the daemon stores for a block of a PagedCache: its planes in order.
std::string expected_block(const PagedCacheShape& shape, const BlockHash& hash);
// A kvtierd on the cluster, with `extra` flags; once it has connected to the cluster
// (it connects in the background) unless `wait_connected` is false.
Result<std::unique_ptr<Daemon>> start_node(const remote::LocalRedisCluster& redis,
                                           std::vector<std::string> extra = {},
                                           bool wait_connected = true);
// Saves `turns` turns of `per_turn` blocks of `session` (hashes chained from its name),
// each ending the turn; returns the hashes.
std::vector<BlockHash> save_turns(Engine& engine, const std::string& session, size_t turns,
                                  size_t per_turn);
// Waits until the cluster holds `session`'s record with `blocks` blocks and every one
// of those blocks (written behind the turn: within seconds, not at the reply).
::testing::AssertionResult WrittenBehind(const remote::LocalRedisCluster& redis,
                                         const std::string& ns, uint64_t layout_digest,
                                         const std::string& session,
                                         const std::vector<BlockHash>& blocks);
// Waits until the node has counted `blocks` blocks written behind, none deferred, and
// is connected: a block is visible in the cluster before its write's completion counts
// it on the daemon's control thread, so a test that saw the blocks waits for this.
Result<StatsInfo> WrittenAndCounted(Daemon& node, uint64_t blocks);
// A store client of the test's own on the cluster (to look at or tamper with values).
Result<std::unique_ptr<remote::RemoteStore>> open_store(const remote::LocalRedisCluster& redis);
// The engine's cache wiped, a Load of the prefix `hashes` (engine blocks 0...) brings
// every block back bit-exact.
::testing::AssertionResult LoadsBitExact(Engine& engine, const std::vector<BlockHash>& hashes);

// Two nodes on one cluster: a Redis Cluster, kvtierd A and kvtierd B on it (each with
// its own flags, once connected), and an engine on each with `blocks` engine blocks.
class RemoteHandOff : public ::testing::Test {
 protected:
  void start(std::vector<std::string> flags_a, std::vector<std::string> flags_b, uint64_t blocks) {
    ASSERT_TRUE(redis.start().is_ok());
    auto a = start_node(redis, std::move(flags_a));
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    node_a.emplace(std::move(*a));
    auto b = start_node(redis, std::move(flags_b));
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    node_b.emplace(std::move(*b));
    shape = small_shape(blocks);
    auto ea = Engine::connect((*node_a)->socket_path(), shape, "engine-a");
    ASSERT_TRUE(ea.is_ok()) << ea.status().to_string();
    engine_a.emplace(std::move(*ea));
    auto eb = Engine::connect((*node_b)->socket_path(), shape, "engine-b");
    ASSERT_TRUE(eb.is_ok()) << eb.status().to_string();
    engine_b.emplace(std::move(*eb));
  }
  // Saves `session` on A (hashes chained from its name) and waits until the cluster
  // holds it.
  std::vector<BlockHash> save_on_a(const std::string& session, size_t turns, size_t per_turn) {
    auto hashes = save_turns(*engine_a, session, turns, per_turn);
    EXPECT_TRUE(WrittenBehind(redis, engine_a->hello.namespace_name, engine_a->hello.layout_digest,
                              session, hashes));
    return hashes;
  }

  remote::LocalRedisCluster redis;
  std::optional<std::unique_ptr<Daemon>> node_a, node_b;
  PagedCacheShape shape;
  std::optional<Engine> engine_a, engine_b;
};

}  // namespace kvtier::integration
