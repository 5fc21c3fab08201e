// The simulator's offline optimum (Clairvoyant) on small hand-made traces: it must
// know the future (keep what comes back, drop what never does, bring blocks up before
// their turn) and sit between the infinite cache and the online policies.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "sim/sim_runner.h"
#include "sim/sim_store.h"
#include "sim/sim_trace.h"
#include "sim/sim_workloads.h"

namespace kvtier::bench {
namespace {

constexpr uint32_t kTokensPerBlock = 4;
constexpr uint64_t kBlockBytes = 4ull << 20;  // 4 tokens × 1 MiB

struct Line {
  uint64_t at_ms;
  std::vector<uint64_t> hashes;  // every one a full block
};

Trace write_and_load(const std::vector<Line>& lines) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("kvtier-sim-test-" + std::to_string(::getpid()) + ".jsonl");
  {
    std::ofstream out(path);
    for (const Line& line : lines) {
      out << "{\"timestamp\": " << line.at_ms
          << ", \"input_length\": " << line.hashes.size() * kTokensPerBlock
          << ", \"output_length\": 1, \"hash_ids\": [";
      for (size_t i = 0; i < line.hashes.size(); ++i) out << (i ? ", " : "") << line.hashes[i];
      out << "]}\n";
    }
  }
  auto trace = load_trace(path.string(), kTokensPerBlock);
  std::filesystem::remove(path);
  EXPECT_TRUE(trace.is_ok()) << trace.status().to_string();
  return trace.is_ok() ? std::move(*trace) : Trace{};
}

SimConfig config() {
  SimConfig c;
  c.kv_bytes_per_token = 1 << 20;
  return c;
}

SimBudget blocks(uint64_t hbm, uint64_t ram, uint64_t nvme) {
  return SimBudget{"t", {hbm * kBlockBytes, ram * kBlockBytes, nvme * kBlockBytes}};
}

std::vector<uint32_t> sessions_of(const Trace& trace) {
  std::vector<uint32_t> out;
  for (const TraceRequest& r : trace.requests) out.push_back(r.session);
  return out;
}

// ---- sessions derived from prefixes ----

TEST(SimSessions, InterleavedConversationsAreToldApart) {
  // Two conversations, turns interleaved; each turn extends its own last one.
  const Trace trace = write_and_load(
      {{0, {1, 2}}, {10, {5, 6}}, {20, {1, 2, 3}}, {30, {5, 6, 7}}, {40, {1, 2, 3, 4}}});
  EXPECT_EQ(sessions_of(trace), (std::vector<uint32_t>{0, 1, 0, 1, 0}));
  EXPECT_EQ(trace.sessions, 2u);
  EXPECT_EQ(trace.follow_ups, 3u);
}

TEST(SimSessions, ASharedSystemPromptDoesNotMergeConversations) {
  // Block 0 is everyone's system prompt; the first request is the prompt alone (a
  // warm-up), so every later request extends it. Only one may continue it.
  const Trace trace = write_and_load({{0, {0}},
                                      {10, {0, 1}},
                                      {20, {0, 2}},
                                      {30, {0, 3}},
                                      {40, {0, 1, 11}},
                                      {50, {0, 2, 21}},
                                      {60, {0, 3, 31}}});
  // Conversations: the warm-up continued by (0,1); (0,2) and (0,3) start their own;
  // each later turn continues its own conversation.
  EXPECT_EQ(sessions_of(trace), (std::vector<uint32_t>{0, 0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(trace.sessions, 3u);
  EXPECT_EQ(trace.follow_ups, 4u);
  EXPECT_EQ(trace.forks, 2u);
}

TEST(SimSessions, AForkStartsAConversationOfItsOwn) {
  // (1,2) is continued twice: the second continuation is a fork (a regenerated
  // answer, another user on the same document), and its own follow-up stays with it.
  const Trace trace =
      write_and_load({{0, {1, 2}}, {10, {1, 2, 3}}, {20, {1, 2, 4}}, {30, {1, 2, 4, 5}}});
  EXPECT_EQ(sessions_of(trace), (std::vector<uint32_t>{0, 0, 1, 1}));
  EXPECT_EQ(trace.follow_ups, 2u);
  EXPECT_EQ(trace.forks, 1u);
}

TEST(SimSessions, OnlyAWholePrefixContinuesATurn) {
  // (1,2,3) shares a prefix with (1,2,9) but does not extend it; (1,2,3) does extend
  // (1,2) only if (1,2) was a request.
  const Trace trace = write_and_load({{0, {1, 2, 9}}, {10, {1, 2, 3}}, {20, {1, 2}}});
  EXPECT_EQ(sessions_of(trace), (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(trace.follow_ups, 0u);
}

TEST(SimWorkloads, DerivedSessionsAreTheGeneratorsConversations) {
  for (const std::string& name : workload_names()) {
    std::vector<uint64_t> truth;
    auto trace = generate_workload(name, 7, 512, &truth);
    ASSERT_TRUE(trace.is_ok()) << trace.status().to_string();
    ASSERT_EQ(truth.size(), trace->requests.size());
    // The same partition: one derived session per true conversation, both ways.
    std::map<uint64_t, uint32_t> session_of_truth;
    std::map<uint32_t, uint64_t> truth_of_session;
    for (size_t i = 0; i < truth.size(); ++i) {
      const uint32_t session = trace->requests[i].session;
      auto [a, new_truth] = session_of_truth.try_emplace(truth[i], session);
      auto [b, new_session] = truth_of_session.try_emplace(session, truth[i]);
      ASSERT_EQ(a->second, session) << name << " request " << i;
      ASSERT_EQ(b->second, truth[i]) << name << " request " << i;
    }
    EXPECT_EQ(trace->sessions, session_of_truth.size()) << name;
    EXPECT_GT(trace->follow_ups, 0u) << name;
  }
}

TEST(SimWorkloads, SameSeedSameTraceAndUnknownNamesAreRefused) {
  for (const std::string& name : workload_names()) {
    auto a = generate_workload(name, 3, 512);
    auto b = generate_workload(name, 3, 512);
    auto c = generate_workload(name, 4, 512);
    ASSERT_TRUE(a.is_ok() && b.is_ok() && c.is_ok());
    ASSERT_EQ(a->requests.size(), b->requests.size());
    for (size_t i = 0; i < a->requests.size(); ++i) {
      ASSERT_EQ(a->requests[i].arrival_ms, b->requests[i].arrival_ms);
      ASSERT_EQ(a->requests[i].hash_ids, b->requests[i].hash_ids);
    }
    EXPECT_NE(a->blocks_requested, c->blocks_requested) << name;
  }
  auto bad = generate_workload("nope", 1, 512);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("nope"), std::string::npos);
}

// ---- the engines' queue ----

TEST(SimQueue, ARequestWaitsForAFreeSlotAndItsTtftCountsTheWait) {
  // Two requests of 4 new blocks each arrive together; one slot serves them in turn.
  const Trace trace = write_and_load({{0, {1, 2, 3, 4}}, {0, {5, 6, 7, 8}}});
  SimConfig one = config();
  one.engines = 1;
  const double service_ms = 4.0 * kTokensPerBlock / one.prefill_tokens_per_s * 1000.0;
  const SimResult queued = simulate(trace, one, blocks(16, 0, 0), SimPolicy::kLruTiering);
  EXPECT_NEAR(queued.wait_mean_ms, service_ms / 2, 1.0);  // 0 and one service (ms-rounded)
  EXPECT_NEAR(queued.ttft_mean_ms, service_ms * 1.5, 1.0);
  SimConfig unlimited = config();
  unlimited.engines = 0;
  const SimResult free = simulate(trace, unlimited, blocks(16, 0, 0), SimPolicy::kLruTiering);
  EXPECT_EQ(free.wait_mean_ms, 0.0);
  EXPECT_NEAR(free.ttft_mean_ms, service_ms, 1e-9);
}

TEST(SimQueue, EnginesAreDerivedFromTheLoad) {
  // 100 requests of 8 blocks (32 tokens) over 9.9 s at 8,000 tokens/s: 0.04 engines
  // busy; at least one.
  std::vector<Line> lines;
  for (uint64_t i = 0; i < 100; ++i)
    lines.push_back(
        {i * 100,
         {8 * i, 8 * i + 1, 8 * i + 2, 8 * i + 3, 8 * i + 4, 8 * i + 5, 8 * i + 6, 8 * i + 7}});
  const Trace light = write_and_load(lines);
  EXPECT_EQ(derived_engines(light, config()), 1u);
  SimConfig slow = config();
  slow.prefill_tokens_per_s = 10;  // 3,200 tokens ÷ 10/s ÷ 9.9 s ÷ 0.8 = 40.4
  EXPECT_EQ(derived_engines(light, slow), 41u);
}

// ---- the offline optimum ----

TEST(SimOptimum, KeepsWhatComesBackSoonestWhereLruThrashes) {
  // Three one-block prompts in a cycle, room for two: LRU always evicts the one that
  // comes next; Belady keeps it.
  std::vector<Line> lines;
  for (uint64_t i = 0; i < 30; ++i) lines.push_back({i * 100, {i % 3}});
  const Trace trace = write_and_load(lines);
  const SimResult lru = simulate(trace, config(), blocks(2, 0, 0), SimPolicy::kLruTiering);
  const SimResult optimum = simulate(trace, config(), blocks(2, 0, 0), SimPolicy::kClairvoyant);
  EXPECT_EQ(lru.hit_rate(), 0.0);
  EXPECT_GT(optimum.hit_rate(), 0.4);
  EXPECT_LT(optimum.ttft_mean_ms, lru.ttft_mean_ms);
}

TEST(SimOptimum, StoresNothingThatIsNeverReadAgain) {
  std::vector<Line> lines;
  for (uint64_t i = 0; i < 10; ++i) lines.push_back({i * 100, {10 * i, 10 * i + 1}});
  const Trace trace = write_and_load(lines);
  const SimResult lru = simulate(trace, config(), blocks(4, 4, 4), SimPolicy::kLruTiering);
  const SimResult optimum = simulate(trace, config(), blocks(4, 4, 4), SimPolicy::kClairvoyant);
  EXPECT_GT(lru.bytes_saved, 0u);
  EXPECT_EQ(optimum.bytes_saved, 0u);
  EXPECT_EQ(optimum.hit_rate(), 0.0);
}

TEST(SimOptimum, BringsABlockBackToHbmBeforeItsTurn) {
  // HBM holds one block. b, needed sooner, takes HBM from a; after b's last use the
  // optimum brings a back up on a plan tick, so a's return reads HBM, not RAM.
  const Trace trace = write_and_load({{0, {1}}, {100, {2}}, {200, {2}}, {5000, {1}}});
  const SimResult optimum = simulate(trace, config(), blocks(1, 8, 0), SimPolicy::kClairvoyant);
  EXPECT_EQ(optimum.hit_blocks[static_cast<size_t>(Tier::kHbm)], 2u);  // b at 200, a at 5000
  EXPECT_EQ(optimum.hit_blocks[static_cast<size_t>(Tier::kRam)], 0u);
  EXPECT_GT(optimum.bytes_promoted, 0u);
  EXPECT_GT(optimum.bytes_demoted, 0u);
}

TEST(SimOptimum, LiesBetweenTheInfiniteCacheAndTheOnlinePolicies) {
  // Conversations that come back at random, sharing a system prompt, with budgets
  // that hold a fraction of them.
  std::mt19937_64 rng(42);
  std::vector<std::vector<uint64_t>> conversations;
  uint64_t next_hash = 1;
  std::vector<Line> lines;
  uint64_t now = 0;
  for (int r = 0; r < 400; ++r) {
    now += rng() % 400;
    if (conversations.empty() || rng() % 3 == 0) {
      conversations.push_back({0});  // the shared system prompt
    }
    std::vector<uint64_t>& c = conversations[rng() % conversations.size()];
    for (uint64_t k = 1 + rng() % 3; k > 0; --k) c.push_back(next_hash++);
    lines.push_back({now, c});
  }
  const Trace trace = write_and_load(lines);
  const SimResult ideal = simulate(trace, config(), blocks(0, 0, 0), SimPolicy::kInfiniteCache);
  for (const SimBudget& budget : {blocks(20, 40, 200), blocks(10, 10, 60)}) {
    const SimResult optimum = simulate(trace, config(), budget, SimPolicy::kClairvoyant);
    EXPECT_GE(optimum.ttft_mean_ms, ideal.ttft_mean_ms - 1e-9);
    for (SimPolicy p : {SimPolicy::kLruTiering, SimPolicy::kSessionAware, SimPolicy::kPredictive}) {
      const SimResult online = simulate(trace, config(), budget, p);
      EXPECT_LE(optimum.ttft_mean_ms, online.ttft_mean_ms) << sim_policy_label(p);
      EXPECT_LE(online.hit_rate(), ideal.hit_rate() + 1e-12) << sim_policy_label(p);
    }
  }
}

// ---- retention priorities ----

// A trace built in memory, so that its requests carry priorities.
Trace build(const std::vector<Line>& lines, const std::vector<RequestPriorities>& priorities) {
  TraceBuilder builder(kTokensPerBlock);
  for (size_t i = 0; i < lines.size(); ++i) {
    const Line& line = lines[i];
    EXPECT_TRUE(builder
                    .add(line.at_ms, static_cast<uint32_t>(line.hashes.size() * kTokensPerBlock), 1,
                         line.hashes, priorities[i])
                    .is_ok());
  }
  auto trace = std::move(builder).finish();
  EXPECT_TRUE(trace.is_ok()) << trace.status().to_string();
  return trace.is_ok() ? std::move(*trace) : Trace{};
}

TEST(SimPriorities, ADurablePromptOutlivesTheOneOffRequestsThatWouldPushItOut) {
  // HBM holds four blocks and nothing is below it. A prompt (1, 2) is saved as durable,
  // three one-off requests of two fresh blocks each follow, then the prompt is read.
  const std::vector<Line> lines = {
      {0, {1, 2}}, {1'000, {3, 4}}, {2'000, {5, 6}}, {3'000, {7, 8}}, {4'000, {1, 2, 9}}};
  RequestPriorities prompt{0, {{0, 2, 90}}};
  RequestPriorities one_off{10, {}};
  const Trace trace = build(lines, {prompt, one_off, one_off, one_off, {}});
  ASSERT_TRUE(trace.has_priorities);
  SimConfig plain = config();
  plain.priorities = false;
  for (SimPolicy p : {SimPolicy::kHbmOnlyLru, SimPolicy::kLruTiering, SimPolicy::kSessionAware,
                      SimPolicy::kPredictive}) {
    const SimResult with = simulate(trace, config(), blocks(4, 0, 0), p);
    const SimResult without = simulate(trace, plain, blocks(4, 0, 0), p);
    EXPECT_EQ(with.hit_blocks[0], 2u) << sim_policy_label(p);
    EXPECT_EQ(without.hit_blocks[0], 0u) << sim_policy_label(p);
    EXPECT_LT(with.ttft_mean_ms, without.ttft_mean_ms) << sim_policy_label(p);
  }
}

TEST(SimSave, ASaveLargerThanTheTiersKeepsItsPrefixNotItsTail) {
  // A turn saves six blocks where two fit (HBM only). The Save's blocks are pinned until
  // it is recorded (kvtierd's reserved slots), so room for block 3 never evicts block 1
  // or 2; after the Save the HBM watermark (0.9 high, 0.75 low) gives up the tail
  // block, and the next turn loads block 1. Evicting the earlier blocks for the later
  // ones would leave a prefix with a hole at its start: nothing to load.
  const Trace trace = write_and_load({{0, {1, 2, 3, 4, 5, 6}}, {10'000, {1, 2, 3, 4, 5, 6, 7}}});
  for (SimPolicy p : {SimPolicy::kHbmOnlyLru, SimPolicy::kLruTiering, SimPolicy::kSessionAware,
                      SimPolicy::kPredictive}) {
    const SimResult result = simulate(trace, config(), blocks(2, 0, 0), p);
    uint64_t hits = 0;
    for (uint64_t h : result.hit_blocks) hits += h;
    EXPECT_EQ(hits, 1u) << sim_policy_label(p);
  }
}

TEST(SimSave, ASaveIntoFullRamLandsThereAndRamsColdestGoDownToNvme) {
  // RAM holds 8 blocks, NVMe 8. A saves 6; B saves 6 a second later: as in kvtierd, B's
  // blocks land in RAM and A's go down to NVMe to make room for them (nothing is lost),
  // and the RAM watermark after the Save (0.9 high, 0.75 low) takes A's last two down
  // too. B's next turn reads all six from RAM, A's (much later) all six from NVMe.
  // (Storing B's blocks straight into NVMe, the old rule, gave B two RAM hits and four
  // NVMe hits.)
  const Trace trace = write_and_load({{0, {1, 2, 3, 4, 5, 6}},
                                      {1'000, {11, 12, 13, 14, 15, 16}},
                                      {2'000, {11, 12, 13, 14, 15, 16, 17}},
                                      {600'000, {1, 2, 3, 4, 5, 6, 7}}});
  for (SimPolicy p : {SimPolicy::kLruTiering, SimPolicy::kSessionAware}) {
    const SimResult result = simulate(trace, config(), blocks(0, 8, 8), p);
    EXPECT_EQ(result.blocks_evicted, 0u) << sim_policy_label(p);
    EXPECT_EQ(result.hit_blocks[static_cast<size_t>(Tier::kRam)], 6u) << sim_policy_label(p);
    EXPECT_EQ(result.hit_blocks[static_cast<size_t>(Tier::kNvme)], 6u) << sim_policy_label(p);
  }
}

TEST(SimStoreMoves, AMoveSomethingWaitsForIsThereAtOnceAndHoldsItsLink) {
  const double kNvmeBytesPerS = 1e9;  // a 4 MiB block takes 4.19 ms
  SimStore store({0, 2 * kBlockBytes, 4 * kBlockBytes}, {1e12, 1e11, kNvmeBytesPerS}, kBlockBytes,
                 4);
  const BlockKey a = SimStore::key_of(0), b = SimStore::key_of(1);
  ASSERT_EQ(store.insert(a, 0, Tier::kRam), Tier::kRam);
  ASSERT_EQ(store.insert(b, 0, Tier::kRam), Tier::kRam);
  EXPECT_EQ(store.insert(SimStore::key_of(2), 0, Tier::kRam), Tier::kNone) << "RAM is full";
  ASSERT_TRUE(store.move_now(a, Tier::kNvme, 100));
  EXPECT_EQ(store.placement(a).tier, Tier::kNvme);
  EXPECT_TRUE(store.placement(a).movable);
  EXPECT_EQ(store.space(Tier::kRam).used_bytes, kBlockBytes);
  EXPECT_EQ(store.nvme_written_bytes(), kBlockBytes);
  const double transfer_ms = static_cast<double>(kBlockBytes) / kNvmeBytesPerS * 1000.0;
  EXPECT_DOUBLE_EQ(store.link_free_at_ms(Tier::kRam, Tier::kNvme), 100 + transfer_ms);
  // A move started now queues behind it on the link.
  ASSERT_TRUE(store.begin_move(b, Tier::kNvme, 100));
  store.finish_moves(100 + static_cast<uint64_t>(transfer_ms * 1.5));
  EXPECT_EQ(store.placement(b).tier, Tier::kRam) << "landed before the link was free";
  store.finish_moves(100 + static_cast<uint64_t>(transfer_ms * 2) + 1);
  EXPECT_EQ(store.placement(b).tier, Tier::kNvme);
  // Read back up at once: NVMe keeps its copy.
  ASSERT_TRUE(store.move_now(a, Tier::kRam, 200));
  EXPECT_EQ(store.placement(a).tier, Tier::kRam);
  EXPECT_TRUE(store.has_nvme_copy(a));
  // Busy or pinned blocks do not move.
  store.set_pinned(a, true);
  EXPECT_FALSE(store.move_now(a, Tier::kNvme, 300));
}

TEST(SimPriorities, BadPrioritiesAreRefused) {
  TraceBuilder builder(kTokensPerBlock);
  const std::vector<uint64_t> hashes = {1, 2};
  EXPECT_FALSE(builder.add(0, 2 * kTokensPerBlock, 1, hashes, {101, {}}).is_ok());
  EXPECT_FALSE(builder.add(0, 2 * kTokensPerBlock, 1, hashes, {0, {{1, 2, 50}}}).is_ok());
  EXPECT_FALSE(builder.add(0, 2 * kTokensPerBlock, 1, hashes, {0, {{0, 1, 0}}}).is_ok());
  EXPECT_FALSE(builder.add(0, 2 * kTokensPerBlock, 1, hashes, {0, {{0, 0, 50}}}).is_ok());
  EXPECT_TRUE(builder.add(0, 2 * kTokensPerBlock, 1, hashes, {0, {{0, 2, 50}}}).is_ok());
  auto trace = std::move(builder).finish();
  ASSERT_TRUE(trace.is_ok());
  EXPECT_EQ(trace->distinct_blocks, 2u);  // the refused requests renumbered nothing
  EXPECT_EQ(trace->requests.size(), 1u);
}

// ---- NVMe inclusive below RAM ----

TEST(SimInclusiveNvme, APromotionKeepsTheCopyAndADemotionOntoItWritesNothing) {
  const double kFast = 1e12;  // every link: moves land within a millisecond
  SimStore store({kBlockBytes, kBlockBytes, 2 * kBlockBytes}, {kFast, kFast, kFast}, kBlockBytes,
                 4);
  const BlockKey a = SimStore::key_of(0), b = SimStore::key_of(1), c = SimStore::key_of(2);
  // a goes down to NVMe (written once) and comes back up to RAM.
  ASSERT_EQ(store.insert(a, 0), Tier::kHbm);
  ASSERT_TRUE(store.begin_move(a, Tier::kNvme, 0));
  store.finish_moves(10);
  EXPECT_EQ(store.nvme_written_bytes(), kBlockBytes);
  ASSERT_TRUE(store.begin_move(a, Tier::kRam, 10));
  store.finish_moves(20);
  EXPECT_EQ(store.placement(a).tier, Tier::kRam);
  EXPECT_EQ(store.nvme_copy_bytes(), kBlockBytes);
  EXPECT_EQ(store.space(Tier::kNvme).used_bytes, 0u);  // copies are free to the planner
  // Down again: onto the copy, at once, nothing written.
  ASSERT_TRUE(store.begin_move(a, Tier::kNvme, 20));
  EXPECT_EQ(store.placement(a).tier, Tier::kNvme);
  EXPECT_TRUE(store.placement(a).movable);
  EXPECT_EQ(store.nvme_written_bytes(), kBlockBytes);
  EXPECT_EQ(store.demoted_onto_copy_bytes(), kBlockBytes);
  EXPECT_EQ(store.nvme_copy_bytes(), 0u);
  EXPECT_EQ(store.space(Tier::kRam).used_bytes, 0u);

  // Copies give their room up to blocks that need it: a and b come up (two copies
  // fill NVMe), c needs NVMe room and takes a's (the oldest copy).
  ASSERT_TRUE(store.begin_move(a, Tier::kRam, 30));
  ASSERT_EQ(store.insert(b, 30), Tier::kHbm);
  ASSERT_TRUE(store.begin_move(b, Tier::kNvme, 30));
  store.finish_moves(40);
  ASSERT_TRUE(store.begin_move(b, Tier::kHbm, 40));
  store.finish_moves(50);
  EXPECT_EQ(store.nvme_copy_bytes(), 2 * kBlockBytes);
  ASSERT_TRUE(store.evict(b));  // an eviction drops the copy too
  EXPECT_EQ(store.nvme_copy_bytes(), kBlockBytes);
  ASSERT_EQ(store.insert(b, 50), Tier::kHbm);
  ASSERT_TRUE(store.begin_move(b, Tier::kNvme, 50));  // into the room b's old copy had
  store.finish_moves(60);
  ASSERT_EQ(store.insert(c, 60), Tier::kHbm);
  ASSERT_TRUE(store.begin_move(c, Tier::kNvme, 60));  // NVMe full but for a's copy
  store.finish_moves(70);
  EXPECT_EQ(store.nvme_copy_bytes(), 0u);
  EXPECT_EQ(store.placement(c).tier, Tier::kNvme);
  EXPECT_EQ(store.placement(a).tier, Tier::kRam);
  EXPECT_EQ(store.nvme_written_bytes(), 4 * kBlockBytes);  // a, b, b again, c
}

TEST(SimInclusiveNvme, ExclusiveModeGivesTheSlotUpOnPromotion) {
  SimStore store({kBlockBytes, kBlockBytes, 2 * kBlockBytes}, {1e12, 1e12, 1e12}, kBlockBytes, 1,
                 /*inclusive_nvme=*/false);
  const BlockKey a = SimStore::key_of(0);
  ASSERT_EQ(store.insert(a, 0), Tier::kHbm);
  ASSERT_TRUE(store.begin_move(a, Tier::kNvme, 0));
  store.finish_moves(10);
  ASSERT_TRUE(store.begin_move(a, Tier::kRam, 10));
  store.finish_moves(20);
  EXPECT_EQ(store.nvme_copy_bytes(), 0u);
  ASSERT_TRUE(store.begin_move(a, Tier::kNvme, 20));
  store.finish_moves(30);
  EXPECT_EQ(store.nvme_written_bytes(), 2 * kBlockBytes);
  EXPECT_EQ(store.demoted_onto_copy_bytes(), 0u);
}

// Conversations that go idle long enough to reach NVMe and come back: each return reads
// the prefix up, and the next idle period demotes it again. Inclusive, only the new
// blocks of each turn are written; exclusive, the whole prefix is written again.
TEST(SimInclusiveNvme, WritesLessThanExclusiveWhenSessionsReturn) {
  std::vector<Line> lines;
  std::vector<std::vector<uint64_t>> conversations(3);
  uint64_t next_hash = 0;
  for (uint64_t turn = 0; turn < 6; ++turn) {
    for (size_t c = 0; c < conversations.size(); ++c) {
      conversations[c].push_back(next_hash++);
      conversations[c].push_back(next_hash++);
      lines.push_back({turn * 60'000 + c * 1'000, conversations[c]});
    }
  }
  const Trace trace = write_and_load(lines);
  SimConfig inclusive = config();
  inclusive.planner.hbm_idle_ms = 2'000;
  inclusive.planner.ram_idle_ms = 10'000;
  SimConfig exclusive = inclusive;
  exclusive.inclusive_nvme = false;
  // The session-aware policy brings every returning prefix up at BeginTurn.
  for (SimPolicy p : {SimPolicy::kSessionAware}) {
    const SimResult in = simulate(trace, inclusive, blocks(8, 8, 200), p);
    const SimResult ex = simulate(trace, exclusive, blocks(8, 8, 200), p);
    EXPECT_GT(ex.bytes_promoted, 0u) << sim_policy_label(p);  // prefixes came back up
    EXPECT_GT(in.bytes_demoted_onto_copy, 0u) << sim_policy_label(p);
    EXPECT_EQ(ex.bytes_demoted_onto_copy, 0u) << sim_policy_label(p);
    EXPECT_LT(in.nvme_written_bytes, ex.nvme_written_bytes) << sim_policy_label(p);
    EXPECT_LT(in.nvme_written_bytes_per_turn(), ex.nvme_written_bytes_per_turn());
    // Every block reaches NVMe once at most while it lives (NVMe never fills here).
    EXPECT_LE(in.nvme_written_bytes, trace.distinct_blocks * kBlockBytes) << sim_policy_label(p);
  }
}

TEST(SimInclusiveNvme, WritesTheSameAsExclusiveWhenNothingReturns) {
  // One-shot requests, no shared blocks: nothing comes back up from NVMe, so there is
  // never a copy to demote onto.
  std::vector<Line> lines;
  for (uint64_t i = 0; i < 20; ++i) lines.push_back({i * 5'000, {10 * i, 10 * i + 1}});
  const Trace trace = write_and_load(lines);
  SimConfig inclusive = config();
  inclusive.planner.hbm_idle_ms = 1'000;
  inclusive.planner.ram_idle_ms = 2'000;
  SimConfig exclusive = inclusive;
  exclusive.inclusive_nvme = false;
  for (SimPolicy p : {SimPolicy::kLruTiering, SimPolicy::kSessionAware}) {
    const SimResult in = simulate(trace, inclusive, blocks(2, 2, 100), p);
    const SimResult ex = simulate(trace, exclusive, blocks(2, 2, 100), p);
    EXPECT_GT(in.nvme_written_bytes, 0u) << sim_policy_label(p);
    EXPECT_EQ(in.nvme_written_bytes, ex.nvme_written_bytes) << sim_policy_label(p);
    EXPECT_EQ(in.bytes_demoted_onto_copy, 0u) << sim_policy_label(p);
    EXPECT_EQ(in.ttft_mean_ms, ex.ttft_mean_ms) << sim_policy_label(p);
  }
}

}  // namespace
}  // namespace kvtier::bench
