// Room for a Save or a read when RAM is full and NVMe below it has room, in the
// in-process daemon (handler_fixture.h): RAM's coldest blocks go down to NVMe, and
// the Save (or the Load reading an NVMe block up) waits for those writes. Nothing
// leaves the daemon, so no session is cut; ram_pressure_test.cpp shows the eviction
// that happens when there is no tier below.
//
// The daemon runs without HBM: 1 MiB of RAM (32 slots of the 32 KiB test blocks) and
// 2 MiB of NVMe (64 slots); RAM watermarks of 1 and long idle thresholds so that the
// planner never moves a block on its own: every move here is one that room asked for.
#include <string>
#include <vector>

#include "tests/daemon/handler_fixture.h"

namespace kvtier::daemon {
namespace {

constexpr uint32_t kRamSlots = 32;

class SaveRoomTest : public HandlerTest {
 protected:
  DaemonConfig daemon_config() const override {
    DaemonConfig config = inprocess_config();
    config.hbm_bytes = 0;
    config.ram_bytes = 1ull << 20;
    config.ram_high_watermark = 1.0;
    config.ram_low_watermark = 1.0;
    config.nvme_bytes = 2ull << 20;
    config.ram_idle_ms = 3'600'000;  // on the manual clock: never
    config.save_room_wait_ms = 1'000;
    return config;
  }
  PagedCacheShape shape() const override { return integration::small_shape(/*num_blocks=*/96); }

  static const TierStatsInfo& tier_of(const StatsInfo& stats, Tier tier) {
    return *integration::find_tier(stats, tier);
  }
  // The whole session is still the engine's to load, bit-exact.
  void expect_whole(const std::string& session, const std::vector<BlockHash>& hashes,
                    uint64_t load_at) {
    auto info = engine_->client->get_session(session);
    ASSERT_TRUE(info.is_ok()) << info.status().to_string();
    EXPECT_EQ(info->blocks, hashes.size()) << session << " was cut";
    auto loaded = load(*engine_, session, hashes, load_at);
    ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
    EXPECT_EQ(loaded->reply.loaded_count, hashes.size()) << session;
    EXPECT_EQ(loaded->verified, hashes.size()) << session;
  }
};

TEST_F(SaveRoomTest, ASaveIntoFullRamDemotesTheColdestToNvmeAndEvictsNothing) {
  const auto a = PagedCache::chain_hashes("a", 16);
  const auto b = PagedCache::chain_hashes("b", 16);
  const auto c = PagedCache::chain_hashes("c", 8);
  ASSERT_TRUE(save_hashes(*engine_, "a", a, 0).is_ok());
  daemon_->advance_clock_ms(10);
  ASSERT_TRUE(save_hashes(*engine_, "b", b, 16).is_ok());
  auto full = wait_until_settled();
  ASSERT_TRUE(full.is_ok()) << full.status().to_string();
  ASSERT_EQ(tier_of(*full, Tier::kRam).blocks, kRamSlots);
  ASSERT_EQ(tier_of(*full, Tier::kNvme).blocks, 0u);
  daemon_->advance_clock_ms(10);

  auto saved = save_hashes(*engine_, "c", c, 32);
  ASSERT_TRUE(saved.is_ok()) << "a Save into full RAM with room on NVMe must get room: "
                             << saved.status().to_string();
  EXPECT_EQ(saved->stored, c.size());
  auto stats = wait_until_settled();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->blocks_evicted, 0u);
  EXPECT_EQ(tier_of(*stats, Tier::kRam).blocks, kRamSlots);
  EXPECT_EQ(tier_of(*stats, Tier::kNvme).blocks, c.size()) << "RAM made room for c, no more";
  EXPECT_EQ(integration::total_blocks(*stats), a.size() + b.size() + c.size());
  EXPECT_TRUE(NoLeakedSlots(*stats, block_bytes()));

  // Every session whole; reading the demoted blocks back up needs RAM room in turn,
  // made the same way (never by evicting).
  expect_whole("c", c, 0);
  expect_whole("a", a, 16);
  expect_whole("b", b, 48);
  auto after = wait_until_settled();
  ASSERT_TRUE(after.is_ok()) << after.status().to_string();
  EXPECT_EQ(after->blocks_evicted, 0u);
  EXPECT_EQ(integration::total_blocks(*after), a.size() + b.size() + c.size());
  EXPECT_TRUE(NoLeakedSlots(*after, block_bytes()));
}

// A Save larger than RAM: as much as fits in RAM at once comes from demoting the rest of
// RAM; once its wait for room is over (save-room-wait-ms) it keeps the prefix that fits
// then and says so (a partial Save, never a refusal), and still nothing held is lost
// for it.
TEST_F(SaveRoomTest, ASaveLargerThanRamKeepsThePrefixThatFitsWithoutLosingWhatIsHeld) {
  const auto a = PagedCache::chain_hashes("a", 16);
  ASSERT_TRUE(save_hashes(*engine_, "a", a, 0).is_ok());
  daemon_->advance_clock_ms(10);
  const auto big = PagedCache::chain_hashes("big", kRamSlots + 8);
  auto partial = save_hashes(*engine_, "big", big, 16);
  ASSERT_TRUE(partial.is_ok()) << partial.status().to_string();
  EXPECT_LT(partial->saved(), big.size());
  EXPECT_LE(partial->saved(), kRamSlots);
  auto stats = wait_until_settled();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->blocks_evicted, 0u);
  EXPECT_TRUE(NoLeakedSlots(*stats, block_bytes()));
  expect_whole("a", a, 16);
}

// A Load of more NVMe blocks than RAM holds: the blocks read first are scattered to the
// engine and let go of while the rest are read, so every block comes back, bit-exact,
// instead of the Load waiting out nvme-load-wait-ms for room its own pins keep and
// answering a prefix.
TEST_F(SaveRoomTest, ALoadOfMoreNvmeBlocksThanRamHoldsLoadsThemAll) {
  const auto long_session = PagedCache::chain_hashes("long", kRamSlots + 8);
  const std::vector<BlockHash> head(long_session.begin(), long_session.begin() + 20);
  ASSERT_TRUE(save_hashes(*engine_, "long", head, 0).is_ok());
  ASSERT_TRUE(engine_->client->drain().is_ok());
  ASSERT_TRUE(wait_until_in_tier("long", Tier::kNvme, head.size()).is_ok());
  // The whole conversation: its first 20 blocks deduplicated on NVMe, 20 more into RAM.
  auto saved = save_hashes(*engine_, "long", long_session, 0);
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  ASSERT_EQ(saved->saved(), long_session.size());
  ASSERT_TRUE(engine_->client->drain().is_ok());
  ASSERT_TRUE(wait_until_in_tier("long", Tier::kNvme, long_session.size()).is_ok());

  auto loaded = load(*engine_, "long", long_session, 48);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->reply.loaded_count, long_session.size())
      << loaded->reply.stop_reason.to_string();
  EXPECT_EQ(loaded->verified, long_session.size());
  auto stats = wait_until_settled();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->blocks_evicted, 0u);
  EXPECT_TRUE(NoLeakedSlots(*stats, block_bytes()));
}

// A Save never takes HBM from blocks sessions hold when nothing below can make room: it
// stores the prefix that fits and says so. HBM and RAM, 8 slots each, no NVMe; RAM's
// blocks are pinned by an admin, so nothing in RAM can go either.
class PartialSaveTest : public HandlerTest {
 protected:
  static constexpr uint32_t kSlots = 8;
  DaemonConfig daemon_config() const override {
    DaemonConfig config = inprocess_config();
    config.hbm_bytes = 256ull << 10;
    config.ram_bytes = 256ull << 10;
    config.nvme_bytes = 0;
    config.hbm_high_watermark = config.hbm_low_watermark = 1.0;
    config.ram_high_watermark = config.ram_low_watermark = 1.0;
    config.hbm_idle_ms = config.ram_idle_ms = 3'600'000;  // on the manual clock: never
    config.save_room_wait_ms = 1'000;
    return config;
  }
  PagedCacheShape shape() const override { return integration::small_shape(/*num_blocks=*/64); }
};

TEST_F(PartialSaveTest, AFullHbmOfHeldBlocksKeepsThemAndTheSaveStoresThePrefixThatFits) {
  const auto held = PagedCache::chain_hashes("held", kSlots - 2);  // HBM: 2 slots free
  const auto pinned = PagedCache::chain_hashes("pinned", kSlots);  // RAM: full
  const auto fresh = PagedCache::chain_hashes("fresh", 4);
  ASSERT_TRUE(save_hashes(*engine_, "held", held, 0).is_ok());
  ASSERT_TRUE(save(*engine_, "filler", 2, 6).is_ok());  // HBM full, so "pinned" goes to RAM
  ASSERT_TRUE(save_hashes(*engine_, "pinned", pinned, 8).is_ok());
  auto pin = engine_->client->pin("pinned", "", true);
  ASSERT_TRUE(pin.is_ok()) << pin.status().to_string();
  ASSERT_TRUE(engine_->client->evict("filler", "").is_ok());
  auto placed = wait_until_settled();
  ASSERT_TRUE(placed.is_ok()) << placed.status().to_string();
  ASSERT_EQ(integration::find_tier(*placed, Tier::kHbm)->blocks, held.size());
  ASSERT_EQ(integration::find_tier(*placed, Tier::kRam)->blocks, pinned.size());
  daemon_->advance_clock_ms(10);

  auto saved = save_hashes(*engine_, "fresh", fresh, 20);
  ASSERT_TRUE(saved.is_ok()) << "a Save with no room for all of it keeps a prefix: "
                             << saved.status().to_string();
  EXPECT_EQ(saved->stored, 2u);
  EXPECT_EQ(saved->deduplicated, 0u);
  EXPECT_EQ(saved->saved(), 2u) << "the engine learns how much was kept";
  auto stats = wait_until_settled();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->blocks_evicted, placed->blocks_evicted)
      << "no block a session holds made room for the Save";
  EXPECT_EQ(stats->partial_saves, 1u);
  EXPECT_EQ(stats->blocks_not_saved, 2u);
  EXPECT_TRUE(NoLeakedSlots(*stats, block_bytes()));
  auto session = engine_->client->get_session("fresh");
  ASSERT_TRUE(session.is_ok()) << session.status().to_string();
  EXPECT_EQ(session->blocks, 2u) << "the session records the prefix kept";
  auto hits = engine_->client->lookup(fresh);
  ASSERT_TRUE(hits.is_ok()) << hits.status().to_string();
  EXPECT_EQ(hits->hit_count, 2u);

  // Every held block is still the engine's, bit-exact.
  auto loaded = load(*engine_, "held", held, 32);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->reply.loaded_count, held.size());
  EXPECT_EQ(loaded->verified, held.size());

  // With room again, the next turn's Save stores the rest (the engine recomputed it).
  ASSERT_TRUE(engine_->client->pin("pinned", "", false).is_ok());
  ASSERT_TRUE(engine_->client->evict("pinned", "").is_ok());
  ASSERT_TRUE(wait_until_settled().is_ok());
  auto again = save_hashes(*engine_, "fresh", fresh, 20);
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(again->deduplicated, 2u);
  EXPECT_EQ(again->stored, 2u);
  auto whole = load(*engine_, "fresh", fresh, 40);
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  EXPECT_EQ(whole->verified, fresh.size());
}

// A turn saved in pieces (an engine pipelining its Save): once a piece is cut short,
// the pieces after it keep nothing, even with room again (their blocks would follow a
// hole and never load), until the prefix is sent again from its first block or the
// next turn begins; the turn's last piece still ends the turn.
TEST_F(PartialSaveTest, PiecesAfterACutKeepNothingUntilThePrefixOrTheNextTurn) {
  const auto held = PagedCache::chain_hashes("held", kSlots - 2);  // HBM: 2 slots free
  const auto pinned = PagedCache::chain_hashes("pinned", kSlots);  // RAM: full
  const auto turn = PagedCache::chain_hashes("pieces", 8);
  const std::vector<BlockHash> first_piece(turn.begin(), turn.begin() + 4);
  const std::vector<BlockHash> second_piece(turn.begin() + 4, turn.begin() + 6);
  const std::vector<BlockHash> last_piece(turn.begin() + 6, turn.end());
  ASSERT_TRUE(save_hashes(*engine_, "held", held, 0).is_ok());
  ASSERT_TRUE(save(*engine_, "filler", 2, 6).is_ok());
  ASSERT_TRUE(save_hashes(*engine_, "pinned", pinned, 8).is_ok());
  ASSERT_TRUE(engine_->client->pin("pinned", "", true).is_ok());
  ASSERT_TRUE(engine_->client->evict("filler", "").is_ok());
  ASSERT_TRUE(wait_until_settled().is_ok());

  auto cut = save_hashes(*engine_, "pieces", first_piece, 20, /*end_of_turn=*/false);
  ASSERT_TRUE(cut.is_ok()) << cut.status().to_string();
  ASSERT_EQ(cut->saved(), 2u);
  // Room again; the next piece of the same turn still keeps nothing.
  ASSERT_TRUE(engine_->client->pin("pinned", "", false).is_ok());
  ASSERT_TRUE(engine_->client->evict("pinned", "").is_ok());
  ASSERT_TRUE(wait_until_settled().is_ok());
  auto after = save_hashes(*engine_, "pieces", second_piece, 24, /*end_of_turn=*/false);
  ASSERT_TRUE(after.is_ok()) << after.status().to_string();
  EXPECT_EQ(after->saved(), 0u) << "blocks after the hole were kept";
  auto last = save_hashes(*engine_, "pieces", last_piece, 26);
  ASSERT_TRUE(last.is_ok()) << last.status().to_string();
  EXPECT_EQ(last->saved(), 0u) << "blocks after the hole were kept";
  auto session = engine_->client->get_session("pieces");
  ASSERT_TRUE(session.is_ok()) << session.status().to_string();
  EXPECT_EQ(session->blocks, 2u);
  EXPECT_FALSE(session->active) << "the turn's last piece ends the turn, kept or not";

  // The next turn: the engine saves what it recomputed, from the cut on.
  ASSERT_TRUE(engine_->client->begin_turn("pieces").is_ok());
  const std::vector<BlockHash> rest(turn.begin() + 2, turn.end());
  auto resumed = save_hashes(*engine_, "pieces", rest, 30);
  ASSERT_TRUE(resumed.is_ok()) << resumed.status().to_string();
  EXPECT_EQ(resumed->saved(), rest.size());
  auto loaded = load(*engine_, "pieces", turn, 40);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->verified, turn.size());
}

// A Save whose leading blocks the daemon already holds, unheld (a closed session's
// prompt), with no room for the rest: making room must not evict that prefix (the
// session would record blocks just dropped, and every Load stop at block 0). It keeps
// the prefix, deduplicated, and says so.
TEST_F(PartialSaveTest, MakingRoomNeverEvictsTheSavesOwnDeduplicatedPrefix) {
  const auto held = PagedCache::chain_hashes("held", kSlots - 2);
  const auto prompt = PagedCache::chain_hashes("prompt", 2);
  const auto pinned = PagedCache::chain_hashes("pinned", kSlots);
  ASSERT_TRUE(save_hashes(*engine_, "held", held, 0).is_ok());
  ASSERT_TRUE(save_hashes(*engine_, "old", prompt, 6).is_ok());     // HBM full
  ASSERT_TRUE(save_hashes(*engine_, "pinned", pinned, 8).is_ok());  // into RAM
  ASSERT_TRUE(engine_->client->pin("pinned", "", true).is_ok());
  ASSERT_TRUE(engine_->client->close_session("old").is_ok());  // the prompt: unheld
  auto placed = wait_until_settled();
  ASSERT_TRUE(placed.is_ok()) << placed.status().to_string();
  ASSERT_EQ(integration::find_tier(*placed, Tier::kHbm)->blocks, kSlots);
  ASSERT_EQ(integration::find_tier(*placed, Tier::kRam)->blocks, pinned.size());
  daemon_->advance_clock_ms(10);

  const auto turn = concat_hashes(prompt, PagedCache::chain_hashes("answer", 2));
  auto saved = save_hashes(*engine_, "new", turn, 20);
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  EXPECT_EQ(saved->deduplicated, 2u);
  EXPECT_EQ(saved->stored, 0u);
  EXPECT_EQ(saved->saved(), 2u);
  auto stats = wait_until_settled();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->blocks_evicted, placed->blocks_evicted) << "the prompt was evicted";
  EXPECT_TRUE(NoLeakedSlots(*stats, block_bytes()));
  auto loaded = load(*engine_, "new", turn, 32);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->reply.loaded_count, 2u) << "the session's recorded prefix loads";
  EXPECT_EQ(loaded->verified, 2u);
}

// An empty Save opens its session (and only a Save cut to nothing does not).
TEST_F(PartialSaveTest, AnEmptySaveStillOpensItsSession) {
  ASSERT_TRUE(save_hashes(*engine_, "empty", {}, 0).is_ok());
  EXPECT_TRUE(engine_->client->get_session("empty").is_ok());
}

// Nothing fits: the Save keeps nothing, says so, and opens no session.
TEST_F(PartialSaveTest, ASaveWithNoRoomAtAllKeepsNothingAndOpensNoSession) {
  const auto held = PagedCache::chain_hashes("held", kSlots);
  const auto pinned = PagedCache::chain_hashes("pinned", kSlots);
  ASSERT_TRUE(save_hashes(*engine_, "held", held, 0).is_ok());
  ASSERT_TRUE(save_hashes(*engine_, "pinned", pinned, 8).is_ok());
  ASSERT_TRUE(wait_until_settled().is_ok());
  ASSERT_TRUE(engine_->client->pin("pinned", "", true).is_ok());
  auto saved = save(*engine_, "none", 3, 20);
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  EXPECT_EQ(saved->saved(), 0u);
  EXPECT_FALSE(engine_->client->get_session("none").is_ok());
  auto stats = wait_until_settled();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->blocks_evicted, 0u);
  EXPECT_EQ(stats->blocks_not_saved, 3u);
  auto loaded = load(*engine_, "held", held, 32);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->verified, held.size());
}

}  // namespace
}  // namespace kvtier::daemon
