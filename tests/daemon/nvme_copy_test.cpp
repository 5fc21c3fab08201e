// NVMe is inclusive below RAM, in the in-process daemon (handler_fixture.h): a block
// read up from NVMe keeps its NVMe copy, demoting it again writes nothing, and copies
// give their room up before any block living only on NVMe is evicted.
//
// The daemon runs without HBM: 2 MiB of RAM (64 slots of the 32 KiB test blocks) and
// 1 MiB of NVMe (32 slots); RAM watermarks of 1 so that the planner never evicts from
// RAM on its own.
#include <string>
#include <vector>

#include "tests/daemon/handler_fixture.h"

namespace kvtier::daemon {
namespace {

constexpr uint32_t kNvmeSlots = 32;

class NvmeCopyTest : public HandlerTest {
 protected:
  DaemonConfig daemon_config() const override { return nvme_below_ram_config(); }
  PagedCacheShape shape() const override { return integration::small_shape(/*num_blocks=*/128); }

  Result<StatsInfo> settled_stats() { return wait_until_settled(); }
  // Saves `hashes` as `session` from engine block 0 on, drains it to NVMe and loads it
  // back into engine blocks `load_at`.. (bit-exact): RAM holds it, NVMe its copies.
  void read_up_from_nvme(const std::string& session, const std::vector<BlockHash>& hashes,
                         uint64_t load_at) {
    ASSERT_TRUE(save_hashes(*engine_, session, hashes, 0).is_ok());
    ASSERT_TRUE(settled_stats().is_ok());
    ASSERT_TRUE(engine_->client->drain().is_ok());
    ASSERT_TRUE(wait_until_in_tier(session, Tier::kNvme, hashes.size()).is_ok());
    auto loaded = load(*engine_, session, hashes, load_at);
    ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
    ASSERT_EQ(loaded->verified, hashes.size());
  }
  static const TierStatsInfo& nvme_of(const StatsInfo& stats) {
    return *integration::find_tier(stats, Tier::kNvme);
  }
};

// Save → drain (written once) → Load (read up: the copy stays) → drain again: the
// second demotion writes zero NVMe bytes, and the block still loads bit-exact from
// the slot its copy kept.
TEST_F(NvmeCopyTest, PromoteThenDemoteWritesNothingTheSecondTimeAndLoadsBitExact) {
  constexpr uint32_t kBlocks = 4;
  const auto hashes = PagedCache::chain_hashes("round", kBlocks);
  ASSERT_TRUE(save_hashes(*engine_, "round", hashes, 0).is_ok());
  ASSERT_TRUE(settled_stats().is_ok());
  ASSERT_TRUE(engine_->client->drain().is_ok());
  ASSERT_TRUE(wait_until_in_tier("round", Tier::kNvme, kBlocks).is_ok());
  auto first = settled_stats();
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  const uint64_t written_once = kBlocks * block_bytes();
  EXPECT_EQ(nvme_of(*first).written_bytes, written_once);
  EXPECT_EQ(nvme_of(*first).copy_bytes, 0u);

  // The Load reads the blocks up into RAM; NVMe keeps them as copies.
  auto loaded = load(*engine_, "round", hashes, 16);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->verified, kBlocks);
  ASSERT_TRUE(wait_until_in_tier("round", Tier::kRam, kBlocks).is_ok());
  auto promoted = settled_stats();
  ASSERT_TRUE(promoted.is_ok()) << promoted.status().to_string();
  EXPECT_EQ(nvme_of(*promoted).blocks, 0u);
  EXPECT_EQ(nvme_of(*promoted).copy_bytes, written_once);
  EXPECT_EQ(nvme_of(*promoted).used_bytes, written_once);
  EXPECT_TRUE(NoLeakedSlots(*promoted, block_bytes()));
  EXPECT_EQ(metric("kvtier_tier_copy_bytes{tier=\"nvme\"}"), static_cast<double>(written_once));

  // Demoting again moves the blocks onto their copies: nothing more is written.
  auto drained = engine_->client->drain();
  ASSERT_TRUE(drained.is_ok()) << drained.status().to_string();
  EXPECT_EQ(drained->blocks_queued, kBlocks);
  ASSERT_TRUE(wait_until_in_tier("round", Tier::kNvme, kBlocks).is_ok());
  auto second = settled_stats();
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  EXPECT_EQ(nvme_of(*second).written_bytes, written_once);
  EXPECT_EQ(nvme_of(*second).copy_bytes, 0u);
  EXPECT_EQ(nvme_of(*second).blocks, kBlocks);
  EXPECT_EQ(second->bytes_demoted, written_once);  // copied down once only
  EXPECT_EQ(integration::find_tier(*second, Tier::kRam)->used_bytes, 0u);
  EXPECT_TRUE(NoLeakedSlots(*second, block_bytes()));
  EXPECT_EQ(metric("kvtier_tier_written_bytes_total{tier=\"nvme\"}"),
            static_cast<double>(written_once));
  EXPECT_EQ(metric("kvtier_demoted_onto_copy_bytes_total"), static_cast<double>(written_once));

  // Read from the NVMe slots the copies kept: every byte is the saved one.
  auto again = load(*engine_, "round", hashes, 32);
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(again->reply.loaded_count, kBlocks) << again->reply.stop_reason.to_string();
  EXPECT_EQ(again->verified, kBlocks);
}

// nvme-copy-after-ms after a Save its blocks still in RAM get an NVMe copy (written once,
// counted as copied down, not demoted); demoting them later moves them onto the copies
// and writes nothing more; they load bit-exact from there.
TEST_F(NvmeCopyTest, ASavesBlocksGetTheirNvmeCopyAfterTheWindowAndDemoteOntoIt) {
  constexpr uint32_t kBlocks = 4;
  const uint64_t bytes = kBlocks * block_bytes();
  const auto hashes = PagedCache::chain_hashes("window", kBlocks);
  ASSERT_TRUE(save_hashes(*engine_, "window", hashes, 0).is_ok());
  auto before = settled_stats();
  ASSERT_TRUE(before.is_ok()) << before.status().to_string();
  EXPECT_EQ(nvme_of(*before).copy_bytes, 0u) << "copied before the window was over";

  daemon_->advance_clock_ms(daemon_config().nvme_copy_after_ms);
  auto copied = daemon_->wait_for_stats(
      [&](const StatsInfo& s) { return nvme_of(s).copy_bytes == bytes && s.copies_in_flight == 0; },
      integration::kDeadline);
  ASSERT_TRUE(copied.is_ok()) << copied.status().to_string();
  EXPECT_EQ(nvme_of(*copied).blocks, 0u);  // the blocks themselves stay in RAM
  EXPECT_EQ(integration::find_tier(*copied, Tier::kRam)->blocks, kBlocks);
  EXPECT_EQ(nvme_of(*copied).written_bytes, bytes);
  EXPECT_EQ(copied->bytes_demoted, 0u);
  EXPECT_EQ(metric("kvtier_copied_down_bytes_total"), static_cast<double>(bytes));

  ASSERT_TRUE(engine_->client->drain().is_ok());
  ASSERT_TRUE(wait_until_in_tier("window", Tier::kNvme, kBlocks).is_ok());
  auto drained = settled_stats();
  ASSERT_TRUE(drained.is_ok()) << drained.status().to_string();
  EXPECT_EQ(nvme_of(*drained).written_bytes, bytes);  // nothing more written
  EXPECT_EQ(nvme_of(*drained).copy_bytes, 0u);
  EXPECT_EQ(metric("kvtier_demoted_onto_copy_bytes_total"), static_cast<double>(bytes));
  EXPECT_TRUE(NoLeakedSlots(*drained, block_bytes()));
  auto loaded = load(*engine_, "window", hashes, 16);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->verified, kBlocks);
}

// "kept" was read up from NVMe and stays in RAM (its turn is open); "cold" goes idle and
// is demoted into an NVMe tier whose room the copies of "kept" hold. The copies give
// their room up (durably released, then reused); no block is evicted, and both sessions
// load bit-exact.
TEST_F(NvmeCopyTest, CopiesGiveTheirRoomUpBeforeAnyBlockIsEvicted) {
  constexpr uint32_t kKept = 24;
  constexpr uint32_t kCold = 24;  // with kept's copies: more than NVMe holds
  const auto kept = PagedCache::chain_hashes("kept", kKept);
  read_up_from_nvme("kept", kept, 64);
  if (HasFatalFailure()) return;
  // A Save that does not end the turn keeps the session active: not demoted when idle.
  ASSERT_TRUE(save_hashes(*engine_, "kept", kept, 0, /*end_of_turn=*/false).is_ok());
  auto promoted = settled_stats();
  ASSERT_TRUE(promoted.is_ok()) << promoted.status().to_string();
  ASSERT_EQ(nvme_of(*promoted).copy_bytes, kKept * block_bytes());

  const auto cold = PagedCache::chain_hashes("cold", kCold);
  ASSERT_TRUE(save_hashes(*engine_, "cold", cold, 32).is_ok());
  daemon_->advance_clock_ms(10'000);  // past ram-idle-ms: "cold" goes down to NVMe
  ASSERT_TRUE(wait_until_in_tier("cold", Tier::kNvme, kCold).is_ok());
  auto stats = settled_stats();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->blocks_evicted, 0u);
  EXPECT_EQ(nvme_of(*stats).blocks, kCold);
  EXPECT_EQ(nvme_of(*stats).copy_bytes, (kNvmeSlots - kCold) * block_bytes());
  EXPECT_EQ(nvme_of(*stats).written_bytes, (kKept + kCold) * block_bytes());
  EXPECT_TRUE(NoLeakedSlots(*stats, block_bytes()));
  EXPECT_EQ(metric("kvtier_copy_dropped_bytes_total"),
            static_cast<double>((kKept + kCold - kNvmeSlots) * block_bytes()));

  auto kept_again = load(*engine_, "kept", kept, 64);
  ASSERT_TRUE(kept_again.is_ok()) << kept_again.status().to_string();
  EXPECT_EQ(kept_again->verified, kKept);
  auto cold_again = load(*engine_, "cold", cold, 96);
  ASSERT_TRUE(cold_again.is_ok()) << cold_again.status().to_string();
  EXPECT_EQ(cold_again->verified, kCold);
}

// A Save into a full RAM makes room: the blocks given up that still have NVMe copies
// move onto them (nothing written, their session intact and loadable) instead of being
// evicted.
TEST_F(NvmeCopyTest, MakingRoomMovesBlocksOntoTheirCopiesInsteadOfEvictingThem) {
  constexpr uint32_t kKept = 16;
  constexpr uint32_t kFiller = 48;  // with kept: every RAM slot
  const auto kept = PagedCache::chain_hashes("kept", kKept);
  read_up_from_nvme("kept", kept, 64);
  if (HasFatalFailure()) return;
  ASSERT_TRUE(save_hashes(*engine_, "kept", kept, 64).is_ok());  // idle again
  // The filler's turn stays open, so "kept" is what the policy gives up first.
  const auto filler = PagedCache::chain_hashes("filler", kFiller);
  ASSERT_TRUE(save_hashes(*engine_, "filler", filler, 80, /*end_of_turn=*/false).is_ok());
  auto full = settled_stats();
  ASSERT_TRUE(full.is_ok()) << full.status().to_string();
  ASSERT_EQ(integration::find_tier(*full, Tier::kRam)->blocks, kKept + kFiller);
  const uint64_t written = nvme_of(*full).written_bytes;

  ASSERT_TRUE(save(*engine_, "fresh", 8, 0).is_ok());
  auto stats = settled_stats();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->blocks_evicted, 0u);
  EXPECT_EQ(nvme_of(*stats).written_bytes, written);
  EXPECT_GE(metric("kvtier_demoted_onto_copy_bytes_total"), 8.0 * block_bytes());
  auto info = engine_->client->get_session("kept");
  ASSERT_TRUE(info.is_ok()) << info.status().to_string();
  EXPECT_EQ(info->blocks, kKept);
  EXPECT_TRUE(NoLeakedSlots(*stats, block_bytes()));
  auto kept_again = load(*engine_, "kept", kept, 96);
  ASSERT_TRUE(kept_again.is_ok()) << kept_again.status().to_string();
  EXPECT_EQ(kept_again->verified, kKept);
}

}  // namespace
}  // namespace kvtier::daemon
