// Two kvtierds on one Redis Cluster the test starts (remote_harness.h): a second node
// resumes a conversation from the cluster (BeginTurn, Lookup, Load) bit-exact; a corrupt
// value is DataLoss and never served; namespaces stay apart; a master killed mid-run
// leaves right bytes or misses; TTL and budget hold; with the cluster unreachable the
// daemon serves as before and says so. Writing to the cluster: remote_write_test.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "tests/integration/remote_harness.h"
#include "tiers/remote_cluster.h"
#include "tiers/remote_format.h"
#include "tiers/remote_store.h"

namespace kvtier::integration {
namespace {

// The issue's headline: engine on node A saves a 3-turn session; engine on node B
// (another kvtierd, socket and data dir) resumes it by session id and loads it
// bit-exact; B's next turn is written behind too, and A, which still holds the first
// three turns, finds the fourth in the cluster.
TEST_F(RemoteHandOff, ASessionSavedOnOneNodeResumesOnAnotherBitExact) {
  ASSERT_NO_FATAL_FAILURE(start({}, {}, 32));
  const auto hashes = save_turns(*engine_a, "chat-9", 3, 4);
  const std::string ns = engine_a->hello.namespace_name;
  const uint64_t digest = engine_a->hello.layout_digest;
  ASSERT_TRUE(WrittenBehind(redis, ns, digest, "chat-9", hashes));

  ASSERT_EQ(engine_b->hello.namespace_name, ns);
  auto begun = engine_b->client->begin_turn("chat-9");
  ASSERT_TRUE(begun.is_ok()) << begun.status().to_string();
  EXPECT_EQ(begun->known_blocks, 12u);
  EXPECT_EQ(begun->promoted_blocks, 12u);  // all read from the cluster
  auto looked = engine_b->client->lookup(hashes);
  ASSERT_TRUE(looked.is_ok()) << looked.status().to_string();
  EXPECT_EQ(looked->hit_count, 12u);
  // Into other engine blocks than A used, from a cache that holds nothing yet.
  const auto refs = Engine::refs(hashes, 16);
  EXPECT_EQ(engine_b->count_verified(refs, refs.size()), 0u);
  auto loaded = engine_b->client->load("chat-9", refs);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->loaded_count, 12u) << loaded->stop_reason.to_string();
  EXPECT_EQ(engine_b->count_verified(refs, refs.size()), 12u);
  auto sessions = engine_b->client->list_sessions(false);
  ASSERT_TRUE(sessions.is_ok());
  ASSERT_EQ(sessions->size(), 1u);
  EXPECT_EQ((*sessions)[0].session_id, "chat-9");
  EXPECT_EQ((*sessions)[0].blocks, 12u);
  EXPECT_EQ((*sessions)[0].turns, 3u);  // the record's turn count came along
  auto stats_b = engine_b->client->stats();
  ASSERT_TRUE(stats_b.is_ok());
  EXPECT_TRUE(stats_b->remote.configured);
  EXPECT_EQ(stats_b->remote.resumed_sessions, 1u);
  EXPECT_EQ(stats_b->remote.fetched_blocks, 12u);

  // Turn 4 on B: saved with the whole prefix, written behind from B.
  const auto more = PagedCache::chain_hashes("chat-9", 16);
  const auto turn4 = Engine::refs(std::span(more).subspan(12, 4), 28);
  engine_b->fill(turn4);
  auto saved = engine_b->client->save("chat-9", turn4, /*end_of_turn=*/true);
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  ASSERT_TRUE(WrittenBehind(redis, ns, digest, "chat-9", more));

  // Back on A, which knows turns 1-3 only: a Lookup and Load of the whole prefix take
  // turn 4 from the cluster.
  auto looked_a = engine_a->client->lookup(more);
  ASSERT_TRUE(looked_a.is_ok()) << looked_a.status().to_string();
  ASSERT_EQ(looked_a->hit_count, 16u);
  EXPECT_NE(looked_a->tiers[11], Tier::kRemote);  // held on A
  EXPECT_EQ(looked_a->tiers[12], Tier::kRemote);
  const auto refs_a = Engine::refs(more, 0);
  std::vector<BlockRef> turn4_a(refs_a.begin() + 12, refs_a.end());
  EXPECT_EQ(engine_a->count_verified(turn4_a, turn4_a.size()), 0u);  // never in A's engine
  auto loaded_a = engine_a->client->load("chat-9", refs_a);
  ASSERT_TRUE(loaded_a.is_ok()) << loaded_a.status().to_string();
  EXPECT_EQ(loaded_a->loaded_count, 16u) << loaded_a->stop_reason.to_string();
  EXPECT_EQ(engine_a->count_verified(refs_a, refs_a.size()), 16u);
  EXPECT_TRUE((*node_a)->stop().ok());
  EXPECT_TRUE((*node_b)->stop().ok());
}

// A value overwritten in the cluster is DataLoss on the node that reads it: the Load
// stops there with the blocks before it right, the key is deleted and counted.
TEST_F(RemoteHandOff, ACorruptRemoteValueIsDataLossAndNeverServed) {
  ASSERT_NO_FATAL_FAILURE(start({}, {}, 16));
  const auto hashes = save_turns(*engine_a, "doc", 1, 8);
  const std::string ns = engine_a->hello.namespace_name;
  const uint64_t digest = engine_a->hello.layout_digest;
  ASSERT_TRUE(WrittenBehind(redis, ns, digest, "doc", hashes));

  auto store = open_store(redis);
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  const std::string key = remote::block_key(ns, digest, hashes[3]);
  const int port = (*store)->cluster().slots().master_of(remote::key_slot(key))->port;
  // The right length, a header's worth of the right shape even, but not the bytes.
  auto raw = (*store)->cluster().command({"GET", key});
  ASSERT_TRUE(raw.is_ok());
  ASSERT_EQ(raw->kind, remote::Reply::Kind::kString);
  std::string bad = raw->str;
  bad[bad.size() / 2] ^= 0x5a;
  ASSERT_TRUE((*store)->cluster().command({"SET", key, bad}).is_ok());

  const auto refs = Engine::refs(hashes, 0);
  auto loaded = engine_b->client->load("", refs);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->loaded_count, 3u);
  EXPECT_EQ(loaded->stop_reason.code(), StatusCode::kDataLoss) << loaded->stop_reason.to_string();
  EXPECT_EQ(engine_b->count_verified(refs, 3), 3u);
  EXPECT_FALSE(engine_b->cache.verify(3, hashes[3]));  // nothing written there
  EXPECT_EQ(redis.cli(port, {"exists", key}), "0");    // deleted
  auto stats = engine_b->client->stats();
  ASSERT_TRUE(stats.is_ok());
  EXPECT_EQ(stats->remote.corrupt_values, 1u);
  // Asked again: a miss now, never the bad bytes.
  auto again = engine_b->client->load("", std::span(refs).subspan(3));
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->loaded_count, 0u);
  EXPECT_EQ(again->stop_reason.code(), StatusCode::kNotFound) << again->stop_reason.to_string();
  EXPECT_TRUE((*node_a)->stop().ok());
  EXPECT_TRUE((*node_b)->stop().ok());
}

// Two namespaces on two nodes: B's engine, in another namespace, never sees A's
// session or blocks; a third node in A's namespace does.
TEST_F(RemoteHandOff, TwoNamespacesOnTwoNodesNeverSeeEachOthersBlocks) {
  const uid_t uid = ::getuid();
  ASSERT_NO_FATAL_FAILURE(start({"--shared-namespace", fmt::format("team-a={}", uid)},
                                {"--shared-namespace", fmt::format("team-b={}", uid)}, 16));
  ASSERT_EQ(engine_a->hello.namespace_name, "team-a");
  const auto hashes = save_turns(*engine_a, "secret", 2, 4);
  ASSERT_TRUE(WrittenBehind(redis, "team-a", engine_a->hello.layout_digest, "secret", hashes));

  ASSERT_EQ(engine_b->hello.namespace_name, "team-b");
  auto begun = engine_b->client->begin_turn("secret");
  EXPECT_TRUE(IsError(begun.status(), StatusCode::kNotFound, "unknown session"));
  auto looked = engine_b->client->lookup(hashes);
  ASSERT_TRUE(looked.is_ok());
  EXPECT_EQ(looked->hit_count, 0u);
  const auto refs = Engine::refs(hashes, 0);
  auto loaded = engine_b->client->load("", refs);
  ASSERT_TRUE(loaded.is_ok());
  EXPECT_EQ(loaded->loaded_count, 0u);
  EXPECT_EQ(engine_b->count_verified(refs, refs.size()), 0u);

  auto node_c = start_node(redis, {"--shared-namespace", fmt::format("team-a={}", uid)});
  ASSERT_TRUE(node_c.is_ok()) << node_c.status().to_string();
  auto engine_c = Engine::connect((*node_c)->socket_path(), shape, "engine-c");
  ASSERT_TRUE(engine_c.is_ok()) << engine_c.status().to_string();
  auto resumed = engine_c->client->begin_turn("secret");
  ASSERT_TRUE(resumed.is_ok()) << resumed.status().to_string();
  EXPECT_EQ(resumed->known_blocks, 8u);
  auto loaded_c = engine_c->client->load("secret", refs);
  ASSERT_TRUE(loaded_c.is_ok());
  EXPECT_EQ(loaded_c->loaded_count, 8u) << loaded_c->stop_reason.to_string();
  EXPECT_EQ(engine_c->count_verified(refs, refs.size()), 8u);
  for (auto* node : {&*node_a, &*node_b, &*node_c}) EXPECT_TRUE((*node)->stop().ok());
}

// A master killed while another node reads: every Load returns right bytes or stops
// early, never a wrong byte; the daemon stays up, says it is degraded while the master
// is gone, and serves everything again once the replica took over.
TEST_F(RemoteHandOff, AMasterKilledMidRunLeavesRightBytesOrMisses) {
  ASSERT_NO_FATAL_FAILURE(start({}, {"--remote-timeout", "300ms"}, 16));
  // Many small sessions, so that every round on B reads blocks it does not hold yet;
  // their keys spread over the three masters.
  constexpr int kSessions = 120;
  std::vector<std::vector<BlockHash>> sessions;
  for (int i = 0; i < kSessions; ++i) {
    sessions.push_back(save_turns(*engine_a, fmt::format("s{}", i), 1, 2));
  }
  for (int i = 0; i < kSessions; ++i) {
    ASSERT_TRUE(WrittenBehind(redis, engine_a->hello.namespace_name, engine_a->hello.layout_digest,
                              fmt::format("s{}", i), sessions[static_cast<size_t>(i)]));
  }
  const int victim = redis.ports()[0];  // a master at start
  // Which sessions have a block on the victim.
  auto store = open_store(redis);
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  std::vector<bool> on_victim;
  for (const auto& hashes : sessions) {
    bool touches = false;
    for (const BlockHash& h : hashes) {
      const std::string key =
          remote::block_key(engine_a->hello.namespace_name, engine_a->hello.layout_digest, h);
      touches =
          touches || (*store)->cluster().slots().master_of(remote::key_slot(key))->port == victim;
    }
    on_victim.push_back(touches);
  }

  bool saw_degraded = false;
  size_t partial = 0;
  size_t round = 0;
  std::string last_stop;
  // Reads session `round` on B (blocks B does not hold yet); whatever B says it loaded
  // must be right. Returns the count loaded and whether the tier said it was degraded.
  auto read_next = [&]() -> std::pair<uint32_t, bool> {
    const auto& hashes = sessions.at(round);
    const auto refs = Engine::refs(hashes, 2 * (round % 8));
    ++round;
    auto loaded = engine_b->client->load("", refs);
    EXPECT_TRUE(loaded.is_ok()) << loaded.status().to_string();
    if (!loaded.is_ok()) return {0, false};
    EXPECT_EQ(engine_b->count_verified(refs, loaded->loaded_count), loaded->loaded_count)
        << "round " << round - 1;
    auto stats = engine_b->client->stats();
    EXPECT_TRUE(stats.is_ok());
    const bool degraded = stats.is_ok() && stats->remote.degraded;
    saw_degraded = saw_degraded || degraded;
    if (loaded->loaded_count < hashes.size()) {
      ++partial;
      last_stop = loaded->stop_reason.to_string();
    }
    return {loaded->loaded_count, degraded};
  };
  EXPECT_EQ(read_next().first, 2u);  // before the kill: whole
  // The replicas have everything A wrote: after the failover every block is there.
  ASSERT_TRUE(redis.wait_for_replication(std::chrono::seconds(30)).is_ok());
  redis.kill_node(victim);
  // Until the cluster has failed over (the survivors marked the victim failed and a
  // replica took its slots): right bytes or misses, the daemon up.
  const int survivor = redis.ports()[1];
  auto failed_over = [&] {
    const std::string nodes = redis.cli(survivor, {"cluster", "nodes"});
    const size_t at = nodes.find(fmt::format(":{}@", victim));
    if (at == std::string::npos) return false;
    const std::string line = nodes.substr(at, nodes.find('\n', at) - at);
    return line.find(",fail ") != std::string::npos &&
           redis.cli(survivor, {"cluster", "info"}).find("cluster_state:ok") != std::string::npos;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool done = false;
  while (!(done = failed_over()) && std::chrono::steady_clock::now() < deadline) {
    if (round < kSessions / 2) (void)read_next();
    ASSERT_TRUE((*node_b)->running());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(done) << "the cluster never failed over: "
                    << redis.cli(survivor, {"cluster", "nodes"});
  EXPECT_TRUE(saw_degraded) << "the daemon never said the tier was degraded";
  EXPECT_GT(partial, 0u) << "no read ever met the dead master";
  // After the failover: a session with a block in the dead master's slots is read whole
  // again (from the promoted replica; B finds it within a few tries), and the tier is
  // no longer degraded.
  bool served_after = false;
  std::string trace;  // round: loaded/2, degraded, on the victim
  for (int tries = 0; tries < 40 && round < kSessions && !served_after; ++tries) {
    const bool touches = on_victim[round];
    const auto [loaded, degraded] = read_next();
    trace += fmt::format(" {}:{}{}{}", round - 1, loaded, degraded ? "d" : "", touches ? "v" : "");
    served_after = touches && loaded == 2 && !degraded;
    if (!served_after) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(served_after) << "reads did not recover after the failover:" << trace
                            << "; the last early stop: " << last_stop << "; corrupt values: "
                            << engine_b->client->stats()->remote.corrupt_values;
  EXPECT_TRUE((*node_b)->running());
  EXPECT_TRUE((*node_a)->stop().ok());
  EXPECT_TRUE((*node_b)->stop().ok());
}

// remote-ttl: a session not touched for longer is gone from the cluster; remote-bytes:
// a node keeps no more than its budget there.
TEST(RemoteTier, TtlAndBudgetAreKept) {
  remote::LocalRedisCluster redis;
  ASSERT_TRUE(redis.start().is_ok());
  const PagedCacheShape shape = small_shape(32);
  const uint64_t value_bytes = shape.block_bytes() + 64;  // payload and header (40 B), rounded
  // A TTL long enough that the values are surely still there when the write-behind
  // of the last turn is first seen, short enough to wait out.
  auto node_a =
      start_node(redis, {"--remote-ttl", "3s", "--remote-bytes", std::to_string(6 * value_bytes)});
  ASSERT_TRUE(node_a.is_ok()) << node_a.status().to_string();
  auto engine_a = Engine::connect((*node_a)->socket_path(), shape, "engine-a");
  ASSERT_TRUE(engine_a.is_ok()) << engine_a.status().to_string();
  const auto hashes = save_turns(*engine_a, "short", 4, 4);  // 16 blocks, 6 fit
  const std::string ns = engine_a->hello.namespace_name;
  auto store = open_store(redis);
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  std::vector<remote::RemoteBlockId> ids;
  for (const BlockHash& h : hashes) ids.push_back({ns, engine_a->hello.layout_digest, h});
  // Wait for the write-behind of the last turn (its last block is the newest value).
  size_t present = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool last_there = false;
  while (!last_there && std::chrono::steady_clock::now() < deadline) {
    auto found = (*store)->exists_blocks(ids);
    last_there = found.back().is_ok() && *found.back();
    present = 0;
    for (auto& f : found) present += f.is_ok() && *f ? 1 : 0;
    if (!last_there) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(last_there);
  EXPECT_LE(present, 6u);
  EXPECT_GE(present, 1u);
  auto stats = engine_a->client->stats();
  ASSERT_TRUE(stats.is_ok());
  EXPECT_LE(stats->remote.stored_bytes, 6 * value_bytes);
  // The TTL: every value, blocks and session record, is gone once it has passed
  // (Redis expires by wall clock); polled with a deadline well past it.
  const auto expiry_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    bool all_gone = (*store)->get_session(ns, "short").status().code() == StatusCode::kNotFound;
    for (auto& f : (*store)->exists_blocks(ids)) all_gone = all_gone && f.is_ok() && !*f;
    if (all_gone || std::chrono::steady_clock::now() > expiry_deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (auto& f : (*store)->exists_blocks(ids)) {
    ASSERT_TRUE(f.is_ok());
    EXPECT_FALSE(*f);
  }
  EXPECT_EQ((*store)->get_session(ns, "short").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE((*node_a)->stop().ok());
}

// A prefix longer than remote-max-in-flight is read in chunks, in turn: all of it
// arrives (one read of the whole prefix would be declined).
TEST_F(RemoteHandOff, APrefixLongerThanTheInFlightBoundIsReadInTurn) {
  ASSERT_NO_FATAL_FAILURE(start({}, {"--remote-max-in-flight", "64KiB"}, 32));
  // 32 KiB blocks, 64 KiB in flight: chunks of two blocks, one at a time.
  const auto hashes = save_on_a("long", 3, 4);
  ASSERT_FALSE(HasFailure());
  auto begun = engine_b->client->begin_turn("long");
  ASSERT_TRUE(begun.is_ok()) << begun.status().to_string();
  EXPECT_EQ(begun->known_blocks, 12u);
  const auto refs = Engine::refs(hashes, 16);
  auto loaded = engine_b->client->load("long", refs);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->loaded_count, 12u) << loaded->stop_reason.to_string();
  EXPECT_EQ(engine_b->count_verified(refs, refs.size()), 12u);
  // The session grew as its blocks landed.
  auto session = engine_b->client->get_session("long");
  ASSERT_TRUE(session.is_ok()) << session.status().to_string();
  EXPECT_EQ(session->blocks, 12u);
  EXPECT_TRUE((*node_a)->stop().ok());
  EXPECT_TRUE((*node_b)->stop().ok());
}

// A Load whose prefix is partly in the cluster and partly on this node's NVMe: the
// NVMe block is read up, the others come from the cluster, all in prefix order.
TEST_F(RemoteHandOff, ALoadMixesRemoteBlocksWithOnesOnNvmeHere) {
  ASSERT_NO_FATAL_FAILURE(start({},
                                {"--nvme-bytes", "64MiB", "--slab-bytes", "1MiB", "--hbm-idle-ms",
                                 "0", "--ram-idle-ms", "0", "--plan-interval-ms", "10ms"},
                                16));
  const auto hashes = save_on_a("mixed", 1, 4);
  ASSERT_FALSE(HasFailure());
  // B holds block 2 itself, idle, so it goes down to NVMe.
  const auto own = Engine::refs(std::span(hashes).subspan(2, 1), 8);
  engine_b->fill(own);
  ASSERT_TRUE(engine_b->client->save("other", own, /*end_of_turn=*/true).is_ok());
  auto on_nvme = (*node_b)->wait_for_stats([](const StatsInfo& stats) {
    const TierStatsInfo* nvme = find_tier(stats, Tier::kNvme);
    return nvme != nullptr && nvme->blocks == 1 && total_blocks(stats) == 1;
  });
  ASSERT_TRUE(on_nvme.is_ok()) << on_nvme.status().to_string();
  ASSERT_EQ(hashes.size(), 4u);
  EXPECT_TRUE(LoadsBitExact(*engine_b, hashes));
  EXPECT_TRUE((*node_a)->stop().ok());
  EXPECT_TRUE((*node_b)->stop().ok());
}

// A Save of the blocks a BeginTurn is still reading from the cluster (a master that
// hangs makes the read slow): the Save answers once those reads ended, whichever way.
TEST_F(RemoteHandOff, ASaveDuringAPrefetchOfTheSameBlocksIsAnswered) {
  ASSERT_NO_FATAL_FAILURE(start({}, {"--remote-timeout", "500ms"}, 16));
  const auto hashes = save_on_a("raced", 1, 6);
  ASSERT_FALSE(HasFailure());
  // A master with some of the blocks hangs (not the one with the session's record):
  // the prefetch's reads wait on it.
  auto store = open_store(redis);
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  const auto& slots = (*store)->cluster().slots();
  const std::string& ns = engine_a->hello.namespace_name;
  const int record_port = slots.master_of(remote::key_slot(remote::session_key(ns, "raced")))->port;
  int port = 0;
  for (const BlockHash& h : hashes) {
    const std::string key = remote::block_key(ns, engine_a->hello.layout_digest, h);
    const int owner = slots.master_of(remote::key_slot(key))->port;
    if (owner != record_port) port = owner;
  }
  ASSERT_NE(port, 0) << "every block is on the record's master";
  redis.pause_node(port, true);
  auto begun = engine_b->client->begin_turn("raced");
  ASSERT_TRUE(begun.is_ok()) << begun.status().to_string();
  EXPECT_EQ(begun->known_blocks, 6u);
  // The engine saves the same blocks (it computed them itself) while they are read.
  const auto refs = Engine::refs(hashes, 0);
  engine_b->fill(refs);
  auto save = engine_b->client->save_async("raced", refs, /*end_of_turn=*/true);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (!save.ready() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  redis.pause_node(port, false);
  ASSERT_TRUE(save.ready()) << "the Save was never answered";
  auto saved = save.wait();
  if (!saved.is_ok()) {
    // A block whose read failed (the hung master) was not written by that read: the
    // Save is told to come again, as when another Save's copy fails; then it stores.
    EXPECT_TRUE(IsError(saved.status(), StatusCode::kUnavailable, "send the Save again"));
    saved = engine_b->client->save("raced", refs, /*end_of_turn=*/true);
  }
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  // Whatever was stored or read, the daemon holds the right bytes for all six.
  engine_b->cache.wipe();
  auto loaded = engine_b->client->load("raced", refs);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->loaded_count, 6u) << loaded->stop_reason.to_string();
  EXPECT_EQ(engine_b->count_verified(refs, loaded->loaded_count), loaded->loaded_count);
  EXPECT_TRUE((*node_a)->stop().ok());
  EXPECT_TRUE((*node_b)->stop().ok());
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
  // What is not held here is a miss, answered without hanging on the cluster.
  auto engine = Engine::connect((*daemon)->socket_path(), small_shape(16), "engine");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const auto hashes = PagedCache::chain_hashes("elsewhere", 4);
  const auto started = std::chrono::steady_clock::now();
  auto looked = engine->client->lookup(hashes);
  ASSERT_TRUE(looked.is_ok()) << looked.status().to_string();
  EXPECT_EQ(looked->hit_count, 0u);
  auto loaded = engine->client->load("", Engine::refs(hashes, 0));
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->loaded_count, 0u);
  EXPECT_TRUE(IsError(engine->client->begin_turn("elsewhere").status(), StatusCode::kNotFound,
                      "unknown session"));
  // Three requests, each bounded by remote-timeout (200 ms): far less than a hang.
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
  auto stats = engine->client->stats();
  ASSERT_TRUE(stats.is_ok());
  EXPECT_TRUE(stats->remote.configured);
  EXPECT_FALSE(stats->remote.connected);
  EXPECT_TRUE(stats->remote.degraded);
  auto status = (*daemon)->run_kvtierctl({"status"});
  EXPECT_NE(status.stdout_text.find("remote     not connected"), std::string::npos)
      << status.describe();
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
