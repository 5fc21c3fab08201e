// What kvtierd writes to the Redis Cluster (remote_harness.h): at the end of each turn
// the session's new blocks and its record, from host memory, from NVMe when they went
// down before the cluster was reachable, in batches within the in-flight bound; blocks
// evicted from NVMe that the cluster lacks, on their way out; never a block whose NVMe
// bytes do not verify.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "tests/integration/nvme_harness.h"
#include "tests/integration/remote_harness.h"
#include "tiers/nvme_format.h"
#include "tiers/nvme_index.h"
#include "tiers/remote_cluster.h"
#include "tiers/remote_format.h"
#include "tiers/remote_store.h"

namespace kvtier::integration {
namespace {

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
  auto store = open_store(redis);
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

// Blocks evicted from NVMe that the cluster lacks (here: deleted there, as when their
// TTL ran out) are written there on their way out, bit-exact, so the node that evicted
// them finds them again (Lookup says remote, Load reads them back); blocks the cluster
// holds are not written again.
TEST(RemoteTier, BlocksEvictedFromNvmeAreWrittenToTheClusterFirst) {
  remote::LocalRedisCluster redis;
  ASSERT_TRUE(redis.start().is_ok());
  // 32 KiB blocks; NVMe holds 64 of them and keeps under 32 (evicting down to 16).
  auto node =
      start_node(redis, {"--nvme-bytes", "2MiB", "--slab-bytes", "1MiB", "--nvme-high-watermark",
                         "0.5", "--nvme-low-watermark", "0.25", "--hbm-idle-ms", "0",
                         "--ram-idle-ms", "0", "--plan-interval-ms", "10ms"});
  ASSERT_TRUE(node.is_ok()) << node.status().to_string();
  const PagedCacheShape shape = small_shape(32);
  auto engine = Engine::connect((*node)->socket_path(), shape, "engine");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const std::string ns = engine->hello.namespace_name;
  const uint64_t digest = engine->hello.layout_digest;
  const auto old_hashes = save_turns(*engine, "old", 1, 16);
  ASSERT_TRUE(WrittenBehind(redis, ns, digest, "old", old_hashes));
  auto all_on_nvme = (*node)->wait_for_stats([](const StatsInfo& stats) {
    const TierStatsInfo* nvme = find_tier(stats, Tier::kNvme);
    return nvme != nullptr && nvme->blocks == 16 && total_blocks(stats) == 16;
  });
  ASSERT_TRUE(all_on_nvme.is_ok()) << all_on_nvme.status().to_string();
  // The cluster forgets "old"'s blocks; the node still holds them on NVMe.
  auto store = open_store(redis);
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  std::vector<remote::RemoteBlockId> ids;
  for (const BlockHash& h : old_hashes) {
    ids.push_back({ns, digest, h});
    const std::string key = remote::block_key(ns, digest, h);
    ASSERT_TRUE((*store)->cluster().command({"DEL", key}).is_ok());
  }
  for (auto& f : (*store)->exists_blocks(ids)) ASSERT_FALSE(f.is_ok() && *f);

  // A newer session of 24 blocks takes NVMe past its high watermark: the oldest go.
  const auto new_hashes = save_turns(*engine, "new", 1, 24);
  ASSERT_TRUE(WrittenBehind(redis, ns, digest, "new", new_hashes));
  // Settled: everything came down to NVMe, it is back under its high watermark, and no
  // eviction is still on its way to the cluster (a spill pins its blocks until it is
  // written there or given up), so the counters read below are final.
  auto evicted = (*node)->wait_for_stats([](const StatsInfo& stats) {
    const TierStatsInfo* nvme = find_tier(stats, Tier::kNvme);
    return stats.blocks_evicted > 0 && nvme != nullptr && nvme->blocks <= 32 &&
           total_blocks(stats) == nvme->blocks && stats.pinned_blocks == 0 &&
           stats.copies_in_flight == 0;
  });
  ASSERT_TRUE(evicted.is_ok()) << evicted.status().to_string();
  const uint64_t gone = evicted->blocks_evicted;

  // Which of "old"'s blocks left the node: each of those is in the cluster, bit-exact.
  auto looked = engine->client->lookup(old_hashes);
  ASSERT_TRUE(looked.is_ok()) << looked.status().to_string();
  ASSERT_EQ(looked->hit_count, 16u);  // every one, here or in the cluster
  size_t old_evicted = 0;
  for (Tier tier : looked->tiers) old_evicted += tier == Tier::kRemote ? 1 : 0;
  EXPECT_GE(old_evicted, 1u);  // the oldest went first
  std::vector<remote::RemoteStore::BlockRead> reads;
  for (const BlockHash& h : old_hashes) reads.push_back({{ns, digest, h}, shape.block_bytes()});
  auto got = (*store)->get_blocks(reads);
  size_t in_cluster = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!got[i].is_ok()) continue;
    ++in_cluster;
    EXPECT_EQ(*got[i], expected_block(shape, old_hashes[i])) << "block " << i;
  }
  EXPECT_EQ(in_cluster, old_evicted);
  // Written once each; "new"'s evicted blocks were there already and cost no write.
  auto stats = engine->client->stats();
  ASSERT_TRUE(stats.is_ok());
  EXPECT_EQ(stats->remote.spilled_blocks, old_evicted);
  EXPECT_EQ(stats->remote.spill_unwritten, 0u);
  EXPECT_EQ(stats->blocks_evicted, gone);
  auto status = (*node)->run_kvtierctl({"status"});
  EXPECT_NE(status.stdout_text.find(fmt::format("NVMe evictions: {} written there", old_evicted)),
            std::string::npos)
      << status.describe();

  // The node loads them back from the cluster.
  EXPECT_TRUE(LoadsBitExact(*engine, old_hashes));
  EXPECT_TRUE((*node)->stop().ok());
}

// A turn that ended while the cluster was unreachable is written behind once it is
// reachable: the write-behind sweep tries sessions with blocks left to write again.
TEST(RemoteTier, ATurnEndedWhileTheClusterWasDownIsWrittenOnceItIsUp) {
  remote::LocalRedisCluster redis;
  ASSERT_TRUE(redis.choose_ports().is_ok());  // nothing listens there yet
  auto node = start_node(redis, {"--remote-timeout", "200ms"}, /*wait_connected=*/false);
  ASSERT_TRUE(node.is_ok()) << node.status().to_string();
  auto engine = Engine::connect((*node)->socket_path(), small_shape(16), "engine");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const auto hashes = save_turns(*engine, "offline", 2, 3);
  ASSERT_TRUE(redis.start().is_ok());
  EXPECT_TRUE(WrittenBehind(redis, engine->hello.namespace_name, engine->hello.layout_digest,
                            "offline", hashes));
  auto stats = WrittenAndCounted(**node, 6);
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_TRUE(stats->remote.connected);
  EXPECT_EQ(stats->remote.written_blocks, 6u);
  EXPECT_TRUE((*node)->stop().ok());
}

// The same when the turn's blocks went down to NVMe before the cluster came up: the
// sweep reads them out of NVMe to write them.
TEST(RemoteTier, ATurnThatReachedNvmeWhileTheClusterWasDownIsWrittenOnceItIsUp) {
  remote::LocalRedisCluster redis;
  ASSERT_TRUE(redis.choose_ports().is_ok());  // nothing listens there yet
  auto node =
      start_node(redis,
                 {"--remote-timeout", "200ms", "--nvme-bytes", "64MiB", "--slab-bytes", "1MiB",
                  "--hbm-idle-ms", "0", "--ram-idle-ms", "0", "--plan-interval-ms", "10ms"},
                 /*wait_connected=*/false);
  ASSERT_TRUE(node.is_ok()) << node.status().to_string();
  auto engine = Engine::connect((*node)->socket_path(), small_shape(16), "engine");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const auto hashes = save_turns(*engine, "went-down", 2, 3);
  auto on_nvme = (*node)->wait_for_stats([](const StatsInfo& stats) {
    const TierStatsInfo* nvme = find_tier(stats, Tier::kNvme);
    return nvme != nullptr && nvme->blocks == 6 && total_blocks(stats) == 6;
  });
  ASSERT_TRUE(on_nvme.is_ok()) << on_nvme.status().to_string();
  ASSERT_TRUE(redis.start().is_ok());
  EXPECT_TRUE(WrittenBehind(redis, engine->hello.namespace_name, engine->hello.layout_digest,
                            "went-down", hashes));
  auto stats = WrittenAndCounted(**node, 6);
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->remote.written_blocks, 6u);
  EXPECT_EQ(stats->remote.deferred_blocks, 0u);
  // Read out of NVMe, not moved: the blocks are still there.
  const TierStatsInfo* nvme = find_tier(*stats, Tier::kNvme);
  ASSERT_NE(nvme, nullptr);
  EXPECT_EQ(nvme->blocks, 6u);
  EXPECT_TRUE((*node)->stop().ok());
}

// A turn larger than remote-max-in-flight is written in batches within the bound (one
// write of it all would be declined every time).
TEST(RemoteTier, ATurnLargerThanTheInFlightBoundIsWrittenInBatches) {
  remote::LocalRedisCluster redis;
  ASSERT_TRUE(redis.start().is_ok());
  // 32 KiB blocks, 64 KiB in flight: one block a batch (a batch takes at most half).
  auto node = start_node(redis, {"--remote-max-in-flight", "64KiB"});
  ASSERT_TRUE(node.is_ok()) << node.status().to_string();
  auto engine = Engine::connect((*node)->socket_path(), small_shape(16), "engine");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const auto hashes = save_turns(*engine, "big-turns", 2, 5);
  EXPECT_TRUE(WrittenBehind(redis, engine->hello.namespace_name, engine->hello.layout_digest,
                            "big-turns", hashes));
  auto stats = WrittenAndCounted(**node, 10);
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->remote.written_blocks, 10u);
  EXPECT_EQ(stats->remote.deferred_blocks, 0u);
  EXPECT_TRUE((*node)->stop().ok());
}

// A block whose bytes on NVMe do not verify, met reading a session's blocks out of NVMe
// to write them behind, is not written: it is dropped and counted as DataLoss, as when a
// Load meets it, and the blocks before it are written.
TEST(RemoteTier, ACorruptNvmeBlockMetWritingBehindIsDroppedNotWritten) {
  remote::LocalRedisCluster redis;
  ASSERT_TRUE(redis.choose_ports().is_ok());  // nothing listens there yet
  ScratchDir scratch;
  const std::string data = scratch.path() + "/data";
  auto flags = nvme_tier_flags();
  flags.insert(flags.end(),
               {"--remote-nodes", nodes_flag(redis.seeds()), "--remote-timeout", "200ms"});
  constexpr size_t kBlocks = 8;
  constexpr size_t kVictim = 5;
  const PagedCacheShape shape = small_shape(32);
  const auto hashes = PagedCache::chain_hashes("victim", kBlocks + 2);
  auto node = PersistentDaemon::start(scratch.path(), data, flags);
  ASSERT_TRUE(node.is_ok()) << node.status().to_string();
  std::string ns;
  uint64_t digest = 0;
  {
    auto engine = Engine::connect((*node)->socket_path(), shape, "victim");
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    ns = engine->hello.namespace_name;
    digest = engine->hello.layout_digest;
    ASSERT_TRUE(save_session(*engine, "victim", kBlocks).is_ok());
    auto on_nvme = (*node)->wait_for_stats([](const StatsInfo& stats) {
      return tier_blocks(stats, Tier::kNvme) == kBlocks && stats.copies_in_flight == 0 &&
             stats.pinned_blocks == 0;
    });
    ASSERT_TRUE(on_nvme.is_ok()) << on_nvme.status().to_string();
  }
  ASSERT_TRUE((*node)->stop().ok());
  // Flip a byte of block 5's slot, as a failing medium would.
  uint64_t offset = 0;
  {
    auto index = NvmeIndex::open(data + "/nvme/index", 1);
    ASSERT_TRUE(index.is_ok()) << index.status().to_string();
    auto record = (*index)->get_block({ns, digest, hashes[kVictim]});
    ASSERT_TRUE(record.is_ok() && record->has_value());
    offset = (*record)->offset;
  }
  {
    UniqueFd fd(::open((data + "/nvme/slabs.dat").c_str(), O_RDWR));
    ASSERT_TRUE(fd.valid());
    const off_t at = static_cast<off_t>(offset + shape.block_bytes() / 2);
    char byte = 0;
    ASSERT_EQ(::pread(fd.get(), &byte, 1, at), 1);
    byte = static_cast<char>(byte ^ 0x10);
    ASSERT_EQ(::pwrite(fd.get(), &byte, 1, at), 1);
  }
  // Back with the cluster up: the next end of turn writes the session from its start,
  // reading what is on NVMe.
  ASSERT_TRUE((*node)->restart().is_ok());
  ASSERT_TRUE(redis.start().is_ok());
  auto connected =
      (*node)->wait_for_stats([](const StatsInfo& stats) { return stats.remote.connected; });
  ASSERT_TRUE(connected.is_ok()) << connected.status().to_string();
  auto engine = Engine::connect((*node)->socket_path(), shape, "victim");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const auto next_turn = Engine::refs(std::span(hashes).subspan(kBlocks, 2), kBlocks);
  engine->fill(next_turn);
  ASSERT_TRUE(engine->client->save("victim", next_turn, /*end_of_turn=*/true).is_ok());

  auto dropped = (*node)->wait_for_stats([](const StatsInfo& stats) {
    return stats.data_loss_blocks == 1 && stats.pinned_blocks == 0;
  });
  ASSERT_TRUE(dropped.is_ok()) << dropped.status().to_string();
  const std::vector<BlockHash> before(hashes.begin(), hashes.begin() + kVictim);
  EXPECT_TRUE(WrittenBehind(redis, ns, digest, "victim", before));
  auto store = open_store(redis);
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  auto victim = (*store)->exists_blocks({{ns, digest, hashes[kVictim]}});
  ASSERT_EQ(victim.size(), 1u);
  ASSERT_TRUE(victim[0].is_ok()) << victim[0].status().to_string();
  EXPECT_FALSE(*victim[0]) << "a block that did not verify was written to the cluster";
  auto sessions = engine->client->list_sessions();
  ASSERT_TRUE(sessions.is_ok() && sessions->size() == 1);
  EXPECT_EQ((*sessions)[0].blocks, kVictim);
  EXPECT_TRUE((*node)->stop().ok());
}

}  // namespace
}  // namespace kvtier::integration
