// Eight engine processes at once, 500 operations each: saves, lookups, loads, turn
// starts and closes on their own sessions and on one shared prefix (the same hashes
// in every process, so the daemon deduplicates across them). The tiers are small, so
// demotion and eviction run underneath; a load may then legitimately stop early, but
// every block it does restore must be bit-exact.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <random>

#include "tests/integration/daemon_harness.h"

namespace kvtier::integration {
namespace {

constexpr int kEngines = 8;
constexpr int kOperations = 500;
constexpr int kOwnSessions = 4;
constexpr uint64_t kSessionBlocks = 8;  // engine blocks 0..7 save, 8..15 receive loads
const std::string kSharedPrefix = "shared-system-prompt";

// What one engine did; written by the child into memory shared with the parent.
struct EngineTally {
  uint64_t operations, saves, stored, deduplicated, exhausted;
  uint64_t lookups, lookup_hits, loads, full_loads, partial_loads, verified_blocks;
};

class ConcurrentEngines : public DaemonTest {
 protected:
  // 64 blocks of 32 KiB in HBM, 128 in RAM; the engines' sessions need 264.
  std::vector<std::string> daemon_flags() const override {
    return {"--hbm-bytes",         "2MiB", "--ram-bytes",    "4MiB", "--hbm-high-watermark", "0.9",
            "--hbm-low-watermark", "0.5",  "--copy-threads", "2"};
  }
};

int run_engine(const std::string& socket_path, int index, EngineTally& tally) {
  auto engine = Engine::connect(socket_path, small_shape(2 * kSessionBlocks),
                                fmt::format("engine-{}", index));
  if (!engine.is_ok()) return child_failure(10, "connect", engine.status());
  // Sessions 0..3 are this engine's own; session 4 is the prefix every engine shares.
  std::vector<std::string> session_ids;
  std::vector<std::vector<BlockHash>> chains;
  for (int k = 0; k < kOwnSessions; ++k) {
    session_ids.push_back(fmt::format("engine-{}-session-{}", index, k));
    chains.push_back(PagedCache::chain_hashes(session_ids.back(), kSessionBlocks));
  }
  session_ids.push_back("shared");
  chains.push_back(PagedCache::chain_hashes(kSharedPrefix, kSessionBlocks));

  auto save = [&](size_t session, size_t blocks, bool end_of_turn) -> int {
    const auto refs = Engine::refs(std::span(chains[session]).first(blocks), 0);
    engine->fill(refs);
    auto saved = engine->client->save(session_ids[session], refs, end_of_turn);
    ++tally.saves;
    if (!saved.is_ok() && saved.status().code() == StatusCode::kResourceExhausted) {
      ++tally.exhausted;  // "retry later": every slot is pinned by the other engines
      return 0;
    }
    if (!saved.is_ok()) return child_failure(11, "save", saved.status());
    if (saved->stored + saved->deduplicated != blocks) {
      return child_failure(12, fmt::format("save of {} blocks: {} stored + {} deduplicated", blocks,
                                           saved->stored, saved->deduplicated));
    }
    tally.stored += saved->stored;
    tally.deduplicated += saved->deduplicated;
    return 0;
  };
  auto lookup = [&](size_t session, size_t blocks) -> int {
    auto found = engine->client->lookup(std::span(chains[session]).first(blocks));
    ++tally.lookups;
    if (!found.is_ok()) return child_failure(13, "lookup", found.status());
    if (found->hit_count > blocks || found->tiers.size() != found->hit_count) {
      return child_failure(14, fmt::format("lookup of {} blocks: hit {} with {} tiers", blocks,
                                           found->hit_count, found->tiers.size()));
    }
    tally.lookup_hits += found->hit_count;
    return 0;
  };
  auto load = [&](size_t session, size_t blocks) -> int {
    engine->cache.wipe();
    const auto refs = Engine::refs(std::span(chains[session]).first(blocks), kSessionBlocks);
    auto loaded = engine->client->load(session_ids[session], refs);
    ++tally.loads;
    if (!loaded.is_ok()) return child_failure(15, "load", loaded.status());
    const size_t count = loaded->loaded_count;
    if (count > blocks || (count == blocks) != loaded->stop_reason.is_ok()) {
      return child_failure(16, fmt::format("load of {} blocks restored {} with stop reason {}",
                                           blocks, count, loaded->stop_reason.to_string()));
    }
    if (engine->count_verified(refs, count) != count) {
      return child_failure(
          17, fmt::format("load of '{}': block {} of {} restored is not bit-exact",
                          session_ids[session], engine->count_verified(refs, count), count));
    }
    tally.verified_blocks += count;
    ++(count == blocks ? tally.full_loads : tally.partial_loads);
    return 0;
  };

  for (size_t session = 0; session < chains.size(); ++session) {
    if (int failed = save(session, kSessionBlocks, true); failed != 0) return failed;
  }
  std::mt19937_64 rng(static_cast<uint64_t>(index) + 1);
  auto pick = [&](uint64_t bound) { return static_cast<size_t>(rng() % bound); };
  for (int op = 0; op < kOperations; ++op) {
    const size_t session = pick(chains.size());
    const size_t blocks = 1 + pick(kSessionBlocks);
    const size_t kind = pick(20);
    int failed = 0;
    if (kind < 7) {
      failed = save(session, blocks, pick(2) == 0);
    } else if (kind < 12) {
      failed = lookup(session, blocks);
    } else if (kind < 18) {
      failed = load(session, blocks);
    } else if (kind == 18) {
      auto begun = engine->client->begin_turn(session_ids[session]);
      if (!begun.is_ok() && begun.status().code() != StatusCode::kNotFound) {
        failed = child_failure(18, "begin turn", begun.status());
      }
    } else {
      auto closed = engine->client->close_session(session_ids[session]);
      if (!closed.is_ok() && closed.status().code() != StatusCode::kNotFound) {
        failed = child_failure(19, "close session", closed.status());
      }
    }
    if (failed != 0) return failed;
    ++tally.operations;
  }
  return 0;
}

TEST_F(ConcurrentEngines, EightProcessesFiveHundredOperationsEachStayBitExact) {
  // One tally per engine in memory the forked children share with this process.
  void* shared = ::mmap(nullptr, sizeof(EngineTally) * kEngines, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  auto* tallies = static_cast<EngineTally*>(shared);
  std::fill(tallies, tallies + kEngines, EngineTally{});

  std::vector<pid_t> children;
  for (int i = 0; i < kEngines; ++i) {
    children.push_back(
        fork_child([&] { return run_engine(daemon_->socket_path(), i, tallies[i]); }));
  }
  EngineTally total{};
  for (int i = 0; i < kEngines; ++i) {
    ExitStatus status = wait_for_exit(children[i]);
    EXPECT_TRUE(status.ok()) << "engine " << i << " " << status.describe()
                             << " (exit codes: see run_engine)";
    const EngineTally& t = tallies[i];
    EXPECT_EQ(t.operations, static_cast<uint64_t>(kOperations)) << "engine " << i;
    total.saves += t.saves;
    total.stored += t.stored;
    total.deduplicated += t.deduplicated;
    total.exhausted += t.exhausted;
    total.lookup_hits += t.lookup_hits;
    total.full_loads += t.full_loads;
    total.partial_loads += t.partial_loads;
    total.verified_blocks += t.verified_blocks;
  }
  ::munmap(shared, sizeof(EngineTally) * kEngines);
  RecordProperty("saves", static_cast<int>(total.saves));
  RecordProperty("full_loads", static_cast<int>(total.full_loads));
  RecordProperty("partial_loads", static_cast<int>(total.partial_loads));
  RecordProperty("save_exhausted", static_cast<int>(total.exhausted));
  // The workload did what it claims: blocks were shared, restored and verified.
  EXPECT_GT(total.deduplicated, 0u);
  EXPECT_GT(total.lookup_hits, 0u);
  EXPECT_GT(total.full_loads, 0u);
  EXPECT_GT(total.verified_blocks, 0u);

  auto settled = daemon_->wait_for_stats([](const StatsInfo& s) {
    return s.copies_in_flight == 0 && s.pinned_blocks == 0 && s.connections == 1;
  });
  ASSERT_TRUE(settled.is_ok()) << settled.status().to_string();
  EXPECT_TRUE(NoLeakedSlots(*settled, small_shape().block_bytes()));
  EXPECT_GT(settled->bytes_demoted, 0u) << "the workload was meant to push blocks out of HBM";
  EXPECT_GT(settled->blocks_evicted, 0u) << "the workload was meant to overflow both tiers";
  EXPECT_TRUE(ServesSaveAndLoad(*daemon_, "after-concurrency"));
}

}  // namespace
}  // namespace kvtier::integration
