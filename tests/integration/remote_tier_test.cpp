// kvtierd with a remote tier (--remote-nodes) on a Redis Cluster the test starts
// (tests/support/redis_cluster.h): at the end of each turn the session's new blocks and
// its record are written behind the turn, and another node's store reads them
// bit-exact; with the cluster unreachable the daemon serves as before and says so.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "tests/integration/daemon_harness.h"
#include "tests/support/redis_cluster.h"
#include "tiers/nvme_format.h"
#include "tiers/remote_format.h"
#include "tiers/remote_store.h"

namespace kvtier::integration {
namespace {

std::string nodes_flag(const std::vector<remote::Endpoint>& seeds) {
  std::string out;
  for (const remote::Endpoint& e : seeds) out += (out.empty() ? "" : ",") + e.to_string();
  return out;
}

// What the daemon stores for a block of a PagedCache: its planes in order.
std::string expected_block(const PagedCacheShape& shape, const BlockHash& hash) {
  std::string out(shape.block_bytes(), '\0');
  const uint32_t planes = 2 * shape.num_layers;
  for (uint32_t p = 0; p < planes; ++p) {
    PagedCache::generate(hash, p,
                         reinterpret_cast<std::byte*>(out.data()) + p * shape.plane_bytes(),
                         shape.plane_bytes());
  }
  return out;
}

TEST(RemoteTier, EndOfTurnWritesTheSessionsBlocksAndRecordBehindIt) {
  remote::LocalRedisCluster redis;
  ASSERT_TRUE(redis.start().is_ok());
  auto flags = small_tier_flags();
  flags.insert(flags.end(), {"--remote-nodes", nodes_flag(redis.seeds()), "--remote-ttl", "10m",
                             "--metrics-addr", "off"});
  auto daemon = Daemon::start(flags);
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  const PagedCacheShape shape = small_shape(16);
  auto engine = Engine::connect((*daemon)->socket_path(), shape, "writer");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();

  // Three turns of four blocks each, one conversation.
  const auto hashes = PagedCache::chain_hashes("chat-7", 12);
  for (size_t turn = 0; turn < 3; ++turn) {
    const auto refs = Engine::refs(std::span(hashes).subspan(4 * turn, 4), 4 * turn);
    engine->fill(refs);
    auto saved = engine->client->save("chat-7", refs, /*end_of_turn=*/true);
    ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  }

  // Another node's view of the cluster.
  remote::RemoteStoreOptions options;
  options.cluster.seeds = redis.seeds();
  auto store = remote::RemoteStore::open(options);
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  const std::string ns = engine->hello.namespace_name;
  std::vector<remote::RemoteStore::BlockRead> reads;
  for (const BlockHash& h : hashes) {
    reads.push_back({{ns, engine->hello.layout_digest, h}, shape.block_bytes()});
  }
  // Written behind the turn: within a few seconds, not at the reply.
  std::vector<Result<std::string>> got;
  Result<std::string> record = not_found("not yet");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (std::chrono::steady_clock::now() < deadline) {
    got = (*store)->get_blocks(reads);
    record = (*store)->get_session(ns, "chat-7");
    bool all = record.is_ok();
    for (const auto& g : got) all = all && g.is_ok();
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(record.is_ok()) << record.status().to_string();
  for (size_t i = 0; i < hashes.size(); ++i) {
    ASSERT_TRUE(got[i].is_ok()) << i << ": " << got[i].status().to_string();
    EXPECT_TRUE(*got[i] == expected_block(shape, hashes[i])) << "block " << i << " differs";
  }
  auto decoded = decode_session(encode_session_key(ns, "chat-7"), *record);
  ASSERT_TRUE(decoded.has_value());
  EXPECT_EQ(decoded->session_id, "chat-7");
  EXPECT_EQ(decoded->layout_digest, engine->hello.layout_digest);
  EXPECT_EQ(decoded->turns, 3u);
  EXPECT_EQ(decoded->blocks, hashes);
  EXPECT_TRUE((*daemon)->stop().ok());
}

TEST(RemoteTier, AnUnreachableClusterLeavesTheDaemonServing) {
  remote::LocalRedisCluster redis;
  ASSERT_TRUE(redis.choose_ports().is_ok());  // nothing listens there
  auto flags = small_tier_flags();
  flags.insert(flags.end(), {"--remote-nodes", nodes_flag(redis.seeds()), "--remote-timeout",
                             "200ms", "--metrics-addr", "off"});
  auto daemon = Daemon::start(flags);
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  EXPECT_TRUE(ServesSaveAndLoad(**daemon, "local-only"));
  EXPECT_TRUE(ServesSaveAndLoad(**daemon, "local-only-2"));
  EXPECT_TRUE((*daemon)->stop().ok());
}

TEST(RemoteTier, BadRemoteSettingsAreRefusedAtStartNamingTheKey) {
  auto flags = small_tier_flags();
  flags.insert(flags.end(), {"--remote-nodes", "127.0.0.1:notaport"});
  auto daemon = Daemon::start(flags);
  ASSERT_FALSE(daemon.is_ok());
  EXPECT_NE(daemon.status().message().find("remote-nodes"), std::string::npos)
      << daemon.status().message();
  flags = small_tier_flags();
  flags.insert(flags.end(), {"--remote-nodes", "127.0.0.1:7000", "--remote-password-file",
                             "/nonexistent/kvtier-password"});
  daemon = Daemon::start(flags);
  ASSERT_FALSE(daemon.is_ok());
  EXPECT_NE(daemon.status().message().find("remote-password-file"), std::string::npos)
      << daemon.status().message();
}

}  // namespace
}  // namespace kvtier::integration
