// Eviction when the RAM pool is full, in the in-process daemon (handler_fixture.h): a
// Save that finds no room makes it by evicting cold blocks, and every session holding
// an evicted block is cut there, so its later Lookups and Loads stop at that block even
// where blocks after it are still held.
//
// The daemon runs with RAM only (no HBM arena, no NVMe tier): 1 MiB, 32 slots of the
// 32 KiB test blocks, and a high watermark of 1 so that the planner never evicts on its
// own: every eviction here is one a Save asked for.
#include <chrono>
#include <string>
#include <vector>

#include "tests/daemon/handler_fixture.h"

namespace kvtier::daemon {
namespace {

constexpr uint32_t kRamSlots = 32;

class RamPressureTest : public HandlerTest {
 protected:
  DaemonConfig daemon_config() const override {
    DaemonConfig config = inprocess_config();
    config.hbm_bytes = 0;
    config.ram_bytes = 1ull << 20;
    config.ram_high_watermark = 1.0;
    config.ram_low_watermark = 1.0;
    return config;
  }
  PagedCacheShape shape() const override { return integration::small_shape(/*num_blocks=*/48); }

  void SetUp() override {
    HandlerTest::SetUp();
    if (HasFatalFailure()) return;
    auto stats = engine_->client->stats();
    ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
    const TierStatsInfo* ram = integration::find_tier(*stats, Tier::kRam);
    ASSERT_NE(ram, nullptr);
    ASSERT_EQ(ram->capacity_bytes / block_bytes(), kRamSlots);
    ASSERT_EQ(integration::find_tier(*stats, Tier::kHbm), nullptr);
  }
};

class LruRamPressureTest : public RamPressureTest {
 protected:
  DaemonConfig daemon_config() const override {
    DaemonConfig config = RamPressureTest::daemon_config();
    config.policy = "lru";  // evicts least recently read first, wherever it sits in a session
    return config;
  }
};

// Session a's blocks 4..7 are the least recently used (a Load read the others later),
// so the eviction takes them from the middle of the session: a is cut at block 4, and
// its blocks 8..15, still held, are no longer part of it.
TEST_F(LruRamPressureTest, EvictionCutsTheSessionAtTheEvictedBlockAndALaterLoadStopsThere) {
  const auto a = PagedCache::chain_hashes("a", 16);
  const auto b = PagedCache::chain_hashes("b", 16);
  ASSERT_TRUE(save_hashes(*engine_, "a", a, 0).is_ok());
  daemon_->advance_clock_ms(10);
  ASSERT_TRUE(save_hashes(*engine_, "b", b, 16).is_ok());
  daemon_->advance_clock_ms(10);
  std::vector<BlockHash> read(a.begin(), a.begin() + 4);
  read.insert(read.end(), a.begin() + 8, a.end());
  auto touched = load(*engine_, "a", read, 32);
  ASSERT_TRUE(touched.is_ok()) << touched.status().to_string();
  ASSERT_EQ(touched->reply.loaded_count, 12u);
  auto full = wait_until_settled();
  ASSERT_TRUE(full.is_ok()) << full.status().to_string();
  ASSERT_EQ(integration::total_blocks(*full), kRamSlots);
  daemon_->advance_clock_ms(10);

  auto saved = save(*engine_, "c", 4, 44);
  ASSERT_TRUE(saved.is_ok()) << "a Save into a full RAM pool must evict to make room: "
                             << saved.status().to_string();
  EXPECT_EQ(saved->stored, 4u);
  auto stats = wait_until_settled();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->blocks_evicted, 4u);
  EXPECT_EQ(integration::total_blocks(*stats), kRamSlots);
  EXPECT_TRUE(NoLeakedSlots(*stats, block_bytes()));

  auto cut = engine_->client->get_session("a");
  ASSERT_TRUE(cut.is_ok()) << cut.status().to_string();
  EXPECT_EQ(cut->blocks, 4u) << "the session was not cut at its first evicted block";
  auto lookup = engine_->client->lookup(a);
  ASSERT_TRUE(lookup.is_ok()) << lookup.status().to_string();
  EXPECT_EQ(lookup->hit_count, 4u);
  auto loaded = load(*engine_, "a", a, 0);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->reply.loaded_count, 4u);
  EXPECT_TRUE(IsError(loaded->reply.stop_reason, StatusCode::kNotFound, "blocks[4]"))
      << loaded->reply.stop_reason.to_string();
  EXPECT_EQ(loaded->verified, 4u);
  // The blocks after the cut are still held (as prefix cache) but no longer a's.
  auto tail = engine_->client->lookup(std::vector<BlockHash>(a.begin() + 8, a.end()));
  ASSERT_TRUE(tail.is_ok()) << tail.status().to_string();
  EXPECT_EQ(tail->hit_count, 8u);

  auto untouched = engine_->client->get_session("b");
  ASSERT_TRUE(untouched.is_ok()) << untouched.status().to_string();
  EXPECT_EQ(untouched->blocks, 16u);
  auto whole = load(*engine_, "b", b, 16);
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  EXPECT_EQ(whole->reply.loaded_count, 16u);
  EXPECT_EQ(whole->verified, 16u);
}

// The session-aware policy evicts the blocks no session holds first. b (the older) and
// a share an 8-block prompt; a is closed, so its own 8 blocks are held by nobody and
// go first, while the prompt, still b's, stays. Had a still held its blocks after the
// close, b's tail (the older idle session's) would have been the victim; had the close
// taken the prompt from b too, the prompt (the least recently used of the unheld blocks)
// would have gone, and b with it. (Which blocks the store still counts references on is
// CloseSessionDropsItsReferencesAndSharedBlocksStayWithTheOthers's part.)
TEST_F(RamPressureTest, ClosedSessionsOwnBlocksAreEvictedFirstAndTheSharedPromptStays) {
  const auto prompt = PagedCache::chain_hashes("system-prompt", 8);
  const auto a = concat_hashes(prompt, PagedCache::chain_hashes("a", 8));
  const auto b = concat_hashes(prompt, PagedCache::chain_hashes("b", 8));
  ASSERT_TRUE(save_hashes(*engine_, "b", b, 0).is_ok());
  daemon_->advance_clock_ms(10);
  auto saved_a = save_hashes(*engine_, "a", a, 16);
  ASSERT_TRUE(saved_a.is_ok()) << saved_a.status().to_string();
  ASSERT_EQ(saved_a->deduplicated, 8u);
  daemon_->advance_clock_ms(10);
  auto closed = engine_->client->close_session("a");
  ASSERT_TRUE(closed.is_ok()) << closed.status().to_string();
  EXPECT_EQ(*closed, 16u);
  ASSERT_TRUE(wait_until_settled().is_ok());

  auto saved_c = save(*engine_, "c", 16, 32);
  ASSERT_TRUE(saved_c.is_ok()) << saved_c.status().to_string();
  EXPECT_EQ(saved_c->stored, 16u);
  auto stats = wait_until_settled();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->blocks_evicted, 8u);
  EXPECT_EQ(integration::total_blocks(*stats), kRamSlots);

  auto kept = engine_->client->get_session("b");
  ASSERT_TRUE(kept.is_ok()) << kept.status().to_string();
  EXPECT_EQ(kept->blocks, 16u) << "the open session was cut instead of the closed one's blocks";
  auto loaded = load(*engine_, "b", b, 0);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->reply.loaded_count, 16u) << loaded->reply.stop_reason.to_string();
  EXPECT_EQ(loaded->verified, 16u);
  auto closed_blocks = engine_->client->lookup(a);
  ASSERT_TRUE(closed_blocks.is_ok()) << closed_blocks.status().to_string();
  EXPECT_EQ(closed_blocks->hit_count, 8u) << "the prompt is held, a's own blocks are gone";
}

// The oldest idle session gives up its tail first under the session-aware policy; the
// Load of it stops where the eviction cut it, and the newer session is untouched.
TEST_F(RamPressureTest, SessionAwareEvictionTakesTheOldestIdleSessionsTail) {
  const auto old_session = PagedCache::chain_hashes("old", 16);
  const auto new_session = PagedCache::chain_hashes("new", 16);
  ASSERT_TRUE(save_hashes(*engine_, "old", old_session, 0).is_ok());
  daemon_->advance_clock_ms(10);
  ASSERT_TRUE(save_hashes(*engine_, "new", new_session, 16).is_ok());
  ASSERT_TRUE(wait_until_settled().is_ok());
  daemon_->advance_clock_ms(10);

  auto saved = save(*engine_, "newest", 6, 32);
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  EXPECT_EQ(saved->stored, 6u);
  auto old_info = engine_->client->get_session("old");
  ASSERT_TRUE(old_info.is_ok()) << old_info.status().to_string();
  EXPECT_EQ(old_info->blocks, 10u);
  auto loaded = load(*engine_, "old", old_session, 0);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->reply.loaded_count, 10u);
  EXPECT_TRUE(IsError(loaded->reply.stop_reason, StatusCode::kNotFound, "blocks[10]"))
      << loaded->reply.stop_reason.to_string();
  EXPECT_EQ(loaded->verified, 10u);
  auto new_info = engine_->client->get_session("new");
  ASSERT_TRUE(new_info.is_ok()) << new_info.status().to_string();
  EXPECT_EQ(new_info->blocks, 16u);
}

// Retention priorities come before the policy's own order: the session that would
// lose its tail (the oldest idle one, as above) is durable, and the newer session's
// last six blocks were saved as one-off, so those go; GetSession shows both priorities.
TEST_F(RamPressureTest, RetentionPrioritiesDecideWhatAFullTierGivesUp) {
  const auto old_session = PagedCache::chain_hashes("old", 16);
  const auto new_session = PagedCache::chain_hashes("new", 16);
  auto refs = Engine::refs(old_session, 0);
  engine_->fill(refs);
  ASSERT_TRUE(engine_->client->save("old", refs, true, session_retention(90, 0)).is_ok());
  daemon_->advance_clock_ms(10);
  refs = Engine::refs(new_session, 16);
  engine_->fill(refs);
  SaveOptions one_off_tail;
  one_off_tail.block_retention.push_back({10, 6, {5, 0}});
  ASSERT_TRUE(engine_->client->save("new", refs, true, one_off_tail).is_ok());
  ASSERT_TRUE(wait_until_settled().is_ok());
  daemon_->advance_clock_ms(10);

  auto saved = save(*engine_, "newest", 6, 32);
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  auto old_info = engine_->client->get_session("old");
  ASSERT_TRUE(old_info.is_ok()) << old_info.status().to_string();
  EXPECT_EQ(old_info->blocks, 16u);
  EXPECT_EQ(old_info->priority, 90);
  EXPECT_EQ(old_info->priority_remaining_ms, 0u);
  auto new_info = engine_->client->get_session("new");
  ASSERT_TRUE(new_info.is_ok()) << new_info.status().to_string();
  EXPECT_EQ(new_info->blocks, 10u);
  EXPECT_EQ(new_info->priority, 35);
  auto loaded = load(*engine_, "old", old_session, 0);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->reply.loaded_count, 16u);
  EXPECT_EQ(loaded->verified, 16u);
}

// Every slot is a block still being written (its Save's copy held on the device): a
// Save that finds no room, not even by evicting, waits for it instead of failing, and
// goes on when the copy lands; until then a later Save waits behind it (not ahead).
TEST_F(RamPressureTest, ASaveThatFindsEveryBlockInFlightWaitsForRoomAndThenSucceeds) {
  const auto filling = PagedCache::chain_hashes("filling", kRamSlots);
  const auto filling_refs = Engine::refs(filling, 0);
  engine_->fill(filling_refs);
  auto second = Engine::connect(daemon_->socket_path(), shape(), "second");
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  const auto waiting = PagedCache::chain_hashes("waiting", 4);
  const auto waiting_refs = Engine::refs(waiting, 40);
  second->fill(waiting_refs);
  const auto behind = PagedCache::chain_hashes("behind", 2);
  const auto behind_refs = Engine::refs(behind, 44);
  second->fill(behind_refs);

  daemon_->hold_copies();
  auto first = engine_->client->save_async("filling", filling_refs, true);
  ASSERT_TRUE(daemon_->wait_for_held_copies(1, kDeadline)) << "the first Save never started";
  auto parked = second->client->save_async("waiting", waiting_refs, true);
  auto later = second->client->save_async("behind", behind_refs, true);
  // Answered after both Saves were handled (one connection, in order).
  auto during = second->client->stats();
  ASSERT_TRUE(during.is_ok()) << during.status().to_string();
  EXPECT_EQ(during->copies_in_flight, 1u) << "a Save with no room started a copy";
  EXPECT_FALSE(parked.ready()) << "a Save with no room was answered instead of waiting";
  EXPECT_FALSE(later.ready()) << "a later Save overtook the one waiting for room";

  daemon_->release_copies();
  auto filled = first.wait();
  ASSERT_TRUE(filled.is_ok()) << filled.status().to_string();
  EXPECT_EQ(filled->stored, kRamSlots);
  auto saved = parked.wait();
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  EXPECT_EQ(saved->stored, 4u);
  auto saved_later = later.wait();
  ASSERT_TRUE(saved_later.is_ok()) << saved_later.status().to_string();
  EXPECT_EQ(saved_later->stored, 2u);
  auto loaded = load(*second, "waiting", waiting, 0);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->reply.loaded_count, 4u) << loaded->reply.stop_reason.to_string();
  EXPECT_EQ(loaded->verified, 4u);
  auto stats = wait_until_settled();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->blocks_evicted, 6u);
  EXPECT_TRUE(NoLeakedSlots(*stats, block_bytes()));
}

class ShortRoomWaitTest : public RamPressureTest {
 protected:
  DaemonConfig daemon_config() const override {
    DaemonConfig config = RamPressureTest::daemon_config();
    config.save_room_wait_ms = 50;
    return config;
  }
};

// The wait is bounded: with the copy still held after save-room-wait-ms, the Save is
// answered with what fits then (here nothing: a partial Save of 0 blocks, so the engine
// has its memory back), an engine that leaves while its Save waits is simply
// forgotten, and the daemon serves on.
TEST_F(ShortRoomWaitTest, ASaveWaitingForRoomLongerThanTheLimitKeepsWhatFitsThen) {
  const auto filling = PagedCache::chain_hashes("filling", kRamSlots);
  const auto filling_refs = Engine::refs(filling, 0);
  engine_->fill(filling_refs);
  auto second = Engine::connect(daemon_->socket_path(), shape(), "second");
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  auto leaving = Engine::connect(daemon_->socket_path(), shape(), "leaving");
  ASSERT_TRUE(leaving.is_ok()) << leaving.status().to_string();
  const auto refs = Engine::refs(PagedCache::chain_hashes("refused", 4), 40);
  second->fill(refs);
  leaving->fill(refs);

  daemon_->hold_copies();
  auto first = engine_->client->save_async("filling", filling_refs, true);
  ASSERT_TRUE(daemon_->wait_for_held_copies(1, kDeadline));
  auto abandoned = leaving->client->save_async("abandoned", refs, true);
  ASSERT_TRUE(leaving->client->stats().is_ok());  // the Save was handled: it waits
  abandoned.abandon();
  leaving->client.reset();  // the engine leaves while its Save waits
  const auto asked = std::chrono::steady_clock::now();
  auto refused = second->client->save("refused", refs, true);
  const auto waited = std::chrono::steady_clock::now() - asked;
  ASSERT_TRUE(refused.is_ok()) << refused.status().to_string();
  EXPECT_EQ(refused->saved(), 0u) << "a block was stored while every slot was still in flight";
  // Within the wait and a planner period or two, not seconds.
  EXPECT_LT(waited, std::chrono::milliseconds(2'000));
  auto cut = second->client->stats();
  ASSERT_TRUE(cut.is_ok());
  EXPECT_GE(cut->partial_saves, 1u);

  daemon_->release_copies();
  ASSERT_TRUE(first.wait().is_ok());
  auto again = second->client->save("refused", refs, true);
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(again->stored, 4u);
  auto stats = wait_until_settled();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_TRUE(NoLeakedSlots(*stats, block_bytes()));
}

class NvmeRamPressureTest : public RamPressureTest {
 protected:
  DaemonConfig daemon_config() const override {
    DaemonConfig config = RamPressureTest::daemon_config();
    config.nvme_bytes = 8ull << 20;
    return config;
  }
};

// Every RAM slot is a block still being written when a Load needs one to read an NVMe
// block into: the Load waits for a slot instead of failing, and restores the block
// bit-exact once the copies land.
TEST_F(NvmeRamPressureTest, ALoadThatFindsNoSlotToReadIntoWaitsForOne) {
  const auto cold = PagedCache::chain_hashes("cold", 4);
  ASSERT_TRUE(save_hashes(*engine_, "cold", cold, 0).is_ok());
  ASSERT_TRUE(wait_until_settled().is_ok());
  auto drained = engine_->client->drain();
  ASSERT_TRUE(drained.is_ok()) << drained.status().to_string();
  auto on_nvme = wait_until_in_tier("cold", Tier::kNvme, 4);
  ASSERT_TRUE(on_nvme.is_ok()) << on_nvme.status().to_string();

  const auto filling = PagedCache::chain_hashes("filling", kRamSlots);
  const auto filling_refs = Engine::refs(filling, 4);
  engine_->fill(filling_refs);
  auto reader = Engine::connect(daemon_->socket_path(), shape(), "reader");
  ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();

  daemon_->hold_copies();
  auto first = engine_->client->save_async("filling", filling_refs, true);
  ASSERT_TRUE(daemon_->wait_for_held_copies(1, kDeadline)) << "the filling Save never started";
  const auto cold_refs = Engine::refs(cold, 40);
  reader->cache.wipe();
  auto waiting = reader->client->load_async("cold", cold_refs);
  // Answered after the Load was handled (one connection, in order).
  ASSERT_TRUE(reader->client->stats().is_ok());
  EXPECT_FALSE(waiting.ready()) << "a Load with no slot to read into was answered at once";

  daemon_->release_copies();
  ASSERT_TRUE(first.wait().is_ok());
  auto loaded = waiting.wait();
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->loaded_count, 4u) << loaded->stop_reason.to_string();
  EXPECT_EQ(reader->count_verified(cold_refs, 4), 4u);
  auto stats = wait_until_settled();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_TRUE(NoLeakedSlots(*stats, block_bytes()));
}

// The host backend's HBM is host memory too: a Load of more NVMe blocks than RAM has
// slots reads the rest into HBM's free slots. Reading into RAM only, the Load waited
// for slots that only its own pins kept full, until nvme-load-wait-ms ran out.
class NvmeLoadLargerThanRamTest : public HandlerTest {
 protected:
  static constexpr uint32_t kBlocks = 40;  // RAM 32 slots + HBM 16 slots hold them
  DaemonConfig daemon_config() const override {
    DaemonConfig config = inprocess_config();
    config.hbm_bytes = 512ull << 10;
    config.ram_bytes = 1ull << 20;
    config.nvme_bytes = 8ull << 20;
    config.nvme_load_wait_ms = 3'000;  // what a Load that cannot finish waits
    return config;
  }
  PagedCacheShape shape() const override { return integration::small_shape(/*num_blocks=*/96); }
};

TEST_F(NvmeLoadLargerThanRamTest, ReadsIntoHbmWhenRamIsFullAndLoadsEveryBlock) {
  const auto hashes = PagedCache::chain_hashes("long", kBlocks);
  ASSERT_TRUE(save_hashes(*engine_, "long", hashes, 0).is_ok());
  ASSERT_TRUE(wait_until_settled().is_ok());
  auto drained = engine_->client->drain();
  ASSERT_TRUE(drained.is_ok()) << drained.status().to_string();
  auto on_nvme = daemon_->wait_for_stats(
      [&](const StatsInfo& s) {
        const TierStatsInfo* nvme = integration::find_tier(s, Tier::kNvme);
        return nvme != nullptr && nvme->blocks == kBlocks && s.copies_in_flight == 0 &&
               integration::total_blocks(s) == kBlocks;
      },
      integration::kDeadline);
  ASSERT_TRUE(on_nvme.is_ok()) << on_nvme.status().to_string();

  const auto refs = Engine::refs(hashes, 48);
  engine_->cache.wipe();
  auto loaded = engine_->client->load("long", refs);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->loaded_count, kBlocks) << loaded->stop_reason.to_string();
  EXPECT_EQ(engine_->count_verified(refs, kBlocks), kBlocks);
  auto stats = wait_until_settled();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_TRUE(NoLeakedSlots(*stats, block_bytes()));
}

}  // namespace
}  // namespace kvtier::daemon
