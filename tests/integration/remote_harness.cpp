#include "tests/integration/remote_harness.h"

#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "tiers/nvme_format.h"
#include "tiers/remote_format.h"

namespace kvtier::integration {

std::string nodes_flag(const std::vector<remote::Endpoint>& seeds) {
  std::string out;
  for (const remote::Endpoint& e : seeds) out += (out.empty() ? "" : ",") + e.to_string();
  return out;
}

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

Result<std::unique_ptr<Daemon>> start_node(const remote::LocalRedisCluster& redis,
                                           std::vector<std::string> extra, bool wait_connected) {
  auto flags = small_tier_flags();
  flags.insert(flags.end(), {"--remote-nodes", nodes_flag(redis.seeds()), "--metrics-addr", "off"});
  flags.insert(flags.end(), extra.begin(), extra.end());
  auto daemon = Daemon::start(flags);
  if (!daemon.is_ok() || !wait_connected) return daemon;
  auto connected =
      (*daemon)->wait_for_stats([](const StatsInfo& stats) { return stats.remote.connected; });
  if (!connected.is_ok()) return connected.status().with_context("connecting to the cluster");
  return daemon;
}

std::vector<BlockHash> save_turns(Engine& engine, const std::string& session, size_t turns,
                                  size_t per_turn) {
  const auto hashes = PagedCache::chain_hashes(session, turns * per_turn);
  for (size_t turn = 0; turn < turns; ++turn) {
    const auto refs =
        Engine::refs(std::span(hashes).subspan(per_turn * turn, per_turn), per_turn * turn);
    engine.fill(refs);
    auto saved = engine.client->save(session, refs, /*end_of_turn=*/true);
    EXPECT_TRUE(saved.is_ok()) << saved.status().to_string();
  }
  return hashes;
}

Result<StatsInfo> WrittenAndCounted(Daemon& node, uint64_t blocks) {
  // At least: a count past `blocks` is for the caller's EXPECT to report at once.
  return node.wait_for_stats([blocks](const StatsInfo& stats) {
    return stats.remote.connected && stats.remote.written_blocks >= blocks &&
           stats.remote.deferred_blocks == 0;
  });
}

::testing::AssertionResult WrittenBehind(const remote::LocalRedisCluster& redis,
                                         const std::string& ns, uint64_t layout_digest,
                                         const std::string& session,
                                         const std::vector<BlockHash>& blocks) {
  auto store = open_store(redis);
  if (!store.is_ok()) return ::testing::AssertionFailure() << store.status().to_string();
  std::vector<remote::RemoteBlockId> ids;
  for (const BlockHash& h : blocks) ids.push_back({ns, layout_digest, h});
  std::string last = "nothing read";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (std::chrono::steady_clock::now() < deadline) {
    auto record = (*store)->get_session(ns, session);
    if (record.is_ok()) {
      auto decoded = decode_session(encode_session_key(ns, session), *record);
      bool all = decoded.has_value() && decoded->blocks == blocks;
      for (auto& exists : (*store)->exists_blocks(ids)) {
        all = all && exists.is_ok() && *exists;
      }
      if (all) return ::testing::AssertionSuccess();
      last = decoded ? fmt::format("a record of {} blocks", decoded->blocks.size())
                     : "a malformed record";
    } else {
      last = record.status().to_string();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return ::testing::AssertionFailure() << "not written behind within 15 s; last: " << last;
}

Result<std::unique_ptr<remote::RemoteStore>> open_store(const remote::LocalRedisCluster& redis) {
  remote::RemoteStoreOptions options;
  options.cluster.seeds = redis.seeds();
  return remote::RemoteStore::open(options);
}

::testing::AssertionResult LoadsBitExact(Engine& engine, const std::vector<BlockHash>& hashes) {
  engine.cache.wipe();
  const auto refs = Engine::refs(hashes, 0);
  auto loaded = engine.client->load("", refs);
  if (!loaded.is_ok()) return ::testing::AssertionFailure() << loaded.status().to_string();
  if (loaded->loaded_count != hashes.size()) {
    return ::testing::AssertionFailure()
           << "loaded " << loaded->loaded_count << " of " << hashes.size() << ": "
           << loaded->stop_reason.to_string();
  }
  const size_t verified = engine.count_verified(refs, refs.size());
  if (verified != hashes.size()) {
    return ::testing::AssertionFailure() << verified << " of " << hashes.size() << " bit-exact";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace kvtier::integration
