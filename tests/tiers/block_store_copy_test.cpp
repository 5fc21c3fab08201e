// BlockStore copies: a durable tier configured with keep_copies (NVMe, inclusive below
// RAM) keeps the slot of a block that moved up out of it as the block's copy; the
// block moves back down onto it without a new slot, and copies go first when the tier
// needs room.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

#include "tests/tiers/test_memory.h"
#include "tiers/block_store.h"

namespace kvtier {
namespace {

using tiers_test::key_of;
using tiers_test::make_memory;

constexpr uint64_t kBlock = 4096;

class BlockStoreCopyTest : public ::testing::Test {
 protected:
  BlockStoreCopyTest()
      : store_({{Tier::kHbm, make_memory(2 * kBlock), kBlock},
                {Tier::kRam, make_memory(4 * kBlock), kBlock},
                {Tier::kNvme, nullptr, 4 * kBlock, 4 * kBlock, /*confirm_release=*/true,
                 /*parts=*/1, /*keep_copies=*/true}}) {
    EXPECT_TRUE(store_.register_layout(layout_, kBlock).is_ok());
  }

  BlockKey key(uint32_t n) const { return key_of(layout_, n); }

  // A block saved into RAM and moved down to NVMe.
  void put_on_nvme(uint32_t n) {
    auto reserved = store_.reserve(key(n), std::vector<Tier>{Tier::kRam}, 1);
    ASSERT_TRUE(reserved.is_ok()) << reserved.status().to_string();
    ASSERT_TRUE(reserved->has_value());
    (*reserved)->commit();
    move(n, Tier::kNvme);
  }
  void move(uint32_t n, Tier to) {
    auto started = store_.begin_move(key(n), to);
    ASSERT_TRUE(started.is_ok()) << started.status().to_string();
    started->commit();
  }
  // Confirms every pending release, as the executor does once the index deletes are
  // durable; returns them.
  std::vector<BlockStore::PendingRelease> confirm_all() {
    auto pending = store_.take_pending_releases();
    for (const auto& release : pending) store_.confirm_release(release.location, release.bytes);
    return pending;
  }

  const LayoutKey layout_{1, 0x42};
  BlockStore store_;
};

TEST_F(BlockStoreCopyTest, PromotionOutOfNvmeKeepsTheSlotAsACopy) {
  put_on_nvme(1);
  const uint64_t nvme_slot = store_.lookup(key(1))->location.offset;
  EXPECT_FALSE(store_.copy_of(key(1)).has_value());
  move(1, Tier::kRam);

  auto info = store_.lookup(key(1));
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->location.tier, Tier::kRam);
  EXPECT_TRUE(info->has_copy);
  auto copy = store_.copy_of(key(1));
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->tier, Tier::kNvme);
  EXPECT_EQ(copy->offset, nvme_slot);
  // Nothing is given up: the index entry keeps naming the slot.
  EXPECT_TRUE(store_.take_pending_releases().empty());
  EXPECT_EQ(store_.unconfirmed_release_bytes(Tier::kNvme), 0u);
  // The copy counts as used, not as a block living there.
  const TierUsage nvme = store_.usage(Tier::kNvme);
  EXPECT_EQ(nvme.used_bytes, kBlock);
  EXPECT_EQ(nvme.copy_bytes, kBlock);
  EXPECT_EQ(nvme.copies, 1u);
  EXPECT_EQ(nvme.blocks, 0u);
  EXPECT_EQ(store_.usage(Tier::kRam).blocks, 1u);
  size_t listed = 0;
  store_.for_each_in_tier(Tier::kNvme, [&](const BlockKey&, const BlockInfo&) { ++listed; });
  EXPECT_EQ(listed, 0u);

  // Moving on up (RAM → HBM) and back keeps the copy where it was.
  move(1, Tier::kHbm);
  move(1, Tier::kRam);
  ASSERT_TRUE(store_.copy_of(key(1)).has_value());
  EXPECT_EQ(store_.copy_of(key(1))->offset, nvme_slot);
}

TEST_F(BlockStoreCopyTest, DemoteOntoCopyAllocatesNothingAndFreesTheMemorySlot) {
  put_on_nvme(1);
  const uint64_t nvme_slot = store_.lookup(key(1))->location.offset;
  move(1, Tier::kRam);
  EXPECT_EQ(store_.usage(Tier::kRam).used_bytes, kBlock);

  // begin_move into the copy's tier is refused: it would give the block two slots there.
  auto refused = store_.begin_move(key(1), Tier::kNvme);
  EXPECT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);

  auto landed = store_.demote_onto_copy(key(1));
  ASSERT_TRUE(landed.is_ok()) << landed.status().to_string();
  EXPECT_EQ(landed->tier, Tier::kNvme);
  EXPECT_EQ(landed->offset, nvme_slot);
  auto info = store_.lookup(key(1));
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->location.tier, Tier::kNvme);
  EXPECT_EQ(info->location.offset, nvme_slot);
  EXPECT_EQ(info->state, BlockState::kReady);
  EXPECT_FALSE(info->has_copy);
  EXPECT_FALSE(store_.copy_of(key(1)).has_value());
  EXPECT_EQ(store_.usage(Tier::kRam).used_bytes, 0u);  // the memory slot is free at once
  EXPECT_EQ(store_.usage(Tier::kRam).blocks, 0u);
  const TierUsage nvme = store_.usage(Tier::kNvme);
  EXPECT_EQ(nvme.used_bytes, kBlock);  // no new slot
  EXPECT_EQ(nvme.copy_bytes, 0u);
  EXPECT_EQ(nvme.blocks, 1u);
  EXPECT_TRUE(store_.take_pending_releases().empty());

  // Without a copy there is nothing to move onto.
  auto again = store_.demote_onto_copy(key(1));
  EXPECT_FALSE(again.is_ok());
  EXPECT_FALSE(store_.demote_onto_copy(key(9)).is_ok());
}

TEST_F(BlockStoreCopyTest, DemoteOntoCopyUnderAReaderDefersTheMemorySlot) {
  put_on_nvme(1);
  move(1, Tier::kRam);
  PinnedBlock reader = store_.pin(key(1), 5);
  ASSERT_TRUE(reader);
  ASSERT_TRUE(store_.demote_onto_copy(key(1)).is_ok());
  EXPECT_EQ(store_.usage(Tier::kRam).used_bytes, kBlock);  // the reader's slot stays
  reader.reset();
  EXPECT_EQ(store_.usage(Tier::kRam).used_bytes, 0u);
}

TEST_F(BlockStoreCopyTest, EvictGivesUpTheBlockAndItsCopy) {
  put_on_nvme(1);
  const BlockLocation nvme_slot = store_.lookup(key(1))->location;
  move(1, Tier::kRam);
  ASSERT_TRUE(store_.evict(key(1)));
  EXPECT_FALSE(store_.lookup(key(1)).has_value());
  EXPECT_EQ(store_.usage(Tier::kRam).used_bytes, 0u);
  // The copy's slot goes through the durable release, like any NVMe slot.
  EXPECT_EQ(store_.unconfirmed_release_bytes(Tier::kNvme), kBlock);
  EXPECT_EQ(store_.usage(Tier::kNvme).copy_bytes, 0u);
  EXPECT_EQ(store_.usage(Tier::kNvme).copies, 0u);
  auto released = confirm_all();
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0].key, key(1));
  EXPECT_EQ(released[0].location.tier, nvme_slot.tier);
  EXPECT_EQ(released[0].location.offset, nvme_slot.offset);
  EXPECT_EQ(store_.usage(Tier::kNvme).used_bytes, 0u);
}

TEST_F(BlockStoreCopyTest, CopiesAreDroppedOldestFirstWhenTheTierNeedsRoom) {
  for (uint32_t n = 0; n < 4; ++n) put_on_nvme(n);
  EXPECT_FALSE(store_.has_room(Tier::kNvme, kBlock));
  // Blocks 0, 1, 2 come up to RAM in that order; 3 stays on NVMe.
  for (uint32_t n = 0; n < 3; ++n) move(n, Tier::kRam);
  EXPECT_EQ(store_.usage(Tier::kNvme).copies, 3u);
  EXPECT_FALSE(store_.has_room(Tier::kNvme, kBlock));

  // Oldest made first: 0 and 1 go, also while 0 is pinned up in RAM (its pin names
  // the RAM slot, never the copy's).
  PinnedBlock reader = store_.pin(key(0), 9);
  ASSERT_TRUE(reader);
  EXPECT_EQ(reader.location().tier, Tier::kRam);
  EXPECT_EQ(store_.drop_copies(Tier::kNvme, 2 * kBlock), 2 * kBlock);
  EXPECT_FALSE(store_.copy_of(key(0)).has_value());
  EXPECT_FALSE(store_.copy_of(key(1)).has_value());
  EXPECT_TRUE(store_.copy_of(key(2)).has_value());
  EXPECT_FALSE(store_.lookup(key(1))->has_copy);
  // The dropped copies are pending releases: not reusable before their index deletes.
  EXPECT_FALSE(store_.has_room(Tier::kNvme, kBlock));
  EXPECT_EQ(store_.unconfirmed_release_bytes(Tier::kNvme), 2 * kBlock);
  auto released = confirm_all();
  ASSERT_EQ(released.size(), 2u);
  EXPECT_EQ(released[0].key, key(0));
  EXPECT_EQ(released[1].key, key(1));
  EXPECT_TRUE(store_.has_room(Tier::kNvme, kBlock));
  // The blocks that lost their copies live on in RAM; the block on NVMe is untouched.
  EXPECT_EQ(store_.lookup(key(0))->location.tier, Tier::kRam);
  EXPECT_EQ(store_.lookup(key(1))->location.tier, Tier::kRam);
  EXPECT_EQ(store_.lookup(key(3))->location.tier, Tier::kNvme);
  const TierUsage nvme = store_.usage(Tier::kNvme);
  EXPECT_EQ(nvme.used_bytes, 2 * kBlock);
  EXPECT_EQ(nvme.copy_bytes, kBlock);
  EXPECT_EQ(nvme.copies, 1u);
  reader.reset();

  // The last copy goes; nothing is left to drop after it.
  EXPECT_EQ(store_.drop_copies(Tier::kNvme, 4 * kBlock), kBlock);
  EXPECT_EQ(store_.drop_copies(Tier::kNvme, kBlock), 0u);
  EXPECT_EQ(store_.usage(Tier::kNvme).copies, 0u);

  // A block without a copy is written to a new slot again (begin_move is allowed).
  confirm_all();
  auto move_1 = store_.begin_move(key(1), Tier::kNvme);
  ASSERT_TRUE(move_1.is_ok());
  move_1->commit();
  EXPECT_EQ(store_.lookup(key(1))->location.tier, Tier::kNvme);
}

// A reader that pinned the block on NVMe may still read the old slot when the block
// lands in RAM: while it does, the slot is no copy (a copy may be dropped and its slot
// reused whenever room is needed); once the reader is gone, it becomes the block's copy,
// as it would have at once without the reader, index entry and all (nothing released).
TEST_F(BlockStoreCopyTest, APromotionUnderAReaderKeepsTheOldSlotAsACopyOnceTheReaderIsGone) {
  put_on_nvme(1);
  const uint64_t nvme_slot = store_.lookup(key(1))->location.offset;
  PinnedBlock reader = store_.pin(key(1), 5);
  ASSERT_TRUE(reader);
  EXPECT_EQ(reader.location().tier, Tier::kNvme);
  move(1, Tier::kRam);
  EXPECT_FALSE(store_.copy_of(key(1)).has_value());
  EXPECT_EQ(store_.usage(Tier::kNvme).copies, 0u);
  EXPECT_EQ(store_.usage(Tier::kNvme).used_bytes, kBlock);  // the reader's slot stays
  // A second reader, of the new place, keeps the old slot from becoming a copy too.
  PinnedBlock late = store_.pin(key(1), 6);
  ASSERT_TRUE(late);
  EXPECT_EQ(late.location().tier, Tier::kRam);
  reader.reset();
  EXPECT_FALSE(store_.copy_of(key(1)).has_value());
  late.reset();
  auto copy = store_.copy_of(key(1));
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->tier, Tier::kNvme);
  EXPECT_EQ(copy->offset, nvme_slot);
  EXPECT_TRUE(confirm_all().empty());
  EXPECT_EQ(store_.usage(Tier::kNvme).copies, 1u);
  EXPECT_EQ(store_.usage(Tier::kNvme).blocks, 0u);
  // It serves as any copy: the block moves back down onto it.
  ASSERT_TRUE(store_.demote_onto_copy(key(1)).is_ok());
  EXPECT_EQ(store_.lookup(key(1))->location.offset, nvme_slot);
}

// A demotion's old slot (RAM keeps no copies) is given up once its reader is gone.
TEST_F(BlockStoreCopyTest, ADemotionUnderAReaderFreesTheOldSlotOnceTheReaderIsGone) {
  auto reserved = store_.reserve(key(1), std::vector<Tier>{Tier::kRam}, 1);
  ASSERT_TRUE(reserved.is_ok() && reserved->has_value());
  (*reserved)->commit();
  PinnedBlock reader = store_.pin(key(1), 5);
  ASSERT_TRUE(reader);
  move(1, Tier::kNvme);
  EXPECT_EQ(store_.usage(Tier::kRam).used_bytes, kBlock);  // the reader's slot stays
  reader.reset();
  EXPECT_EQ(store_.usage(Tier::kRam).used_bytes, 0u);
  EXPECT_FALSE(store_.copy_of(key(1)).has_value());
  EXPECT_EQ(store_.lookup(key(1))->location.tier, Tier::kNvme);
}

// Every subscriber hears each block enter and leave each tier, with why it left, in the
// order it happened; one that unsubscribed hears nothing more.
TEST_F(BlockStoreCopyTest, EveryListenerHearsEachBlockEnterAndLeaveWithWhy) {
  struct Recorder final : policy::BlockListener {
    void block_entered(const BlockKey& k, Tier tier, uint64_t bytes) override {
      heard.push_back(fmt(k, "+", tier, bytes == kBlock ? "" : "?"));
    }
    void block_left(const BlockKey& k, Tier tier, policy::Departure why) override {
      static constexpr const char* kWhy[] = {"promoted", "demoted", "copy dropped", "evicted",
                                             "released"};
      heard.push_back(fmt(k, "-", tier, kWhy[static_cast<int>(why)]));
    }
    static std::string fmt(const BlockKey& k, const char* sign, Tier tier, const char* why) {
      std::string line = std::string(sign) + std::to_string(k.hash.bytes()[0]) + " " +
                         std::string(tier_name(tier));
      if (*why != 0) line += std::string(" ") + why;
      return line;
    }
    std::vector<std::string> heard;
  };
  Recorder first, second;
  store_.subscribe(first);
  store_.subscribe(second);

  put_on_nvme(1);
  move(1, Tier::kRam);  // a promotion that keeps its copy: NVMe still holds it
  ASSERT_TRUE(store_.demote_onto_copy(key(1)).is_ok());  // back onto it: NVMe again
  auto aborted = store_.reserve(key(2), std::vector<Tier>{Tier::kHbm}, 1);
  ASSERT_TRUE(aborted.is_ok() && aborted->has_value());
  (*aborted)->abort();  // a write that failed
  move(1, Tier::kRam);
  EXPECT_GT(store_.drop_copies(Tier::kNvme, kBlock), 0u);  // the copy goes for room
  store_.unsubscribe(second);
  EXPECT_TRUE(store_.evict(key(1)));

  const std::vector<std::string> expected = {
      "+1 ram",        "-1 ram demoted",
      "+1 nvme",  // saved, moved down
      "+1 ram",        "-1 ram demoted",
      "+1 nvme",                                // up (keeping its copy), back onto the copy
      "+2 hbm",        "-2 hbm released",       // the failed write
      "+1 ram",        "-1 nvme copy dropped",  // up again; the copy goes
      "-1 ram evicted"};
  EXPECT_EQ(first.heard, expected);
  EXPECT_EQ(second.heard, std::vector<std::string>(expected.begin(), expected.end() - 1));
}

TEST_F(BlockStoreCopyTest, AFailedPromotionKeepsNoCopy) {
  put_on_nvme(1);
  auto move_2 = store_.begin_move(key(1), Tier::kRam);
  ASSERT_TRUE(move_2.is_ok());
  move_2->abort();
  auto info = store_.lookup(key(1));
  EXPECT_EQ(info->location.tier, Tier::kNvme);
  EXPECT_FALSE(info->has_copy);
  EXPECT_EQ(store_.usage(Tier::kNvme).copies, 0u);
  EXPECT_EQ(store_.usage(Tier::kRam).used_bytes, 0u);
}

TEST(BlockStoreCopyConfigTest, WithoutKeepCopiesAPromotionGivesTheSlotUp) {
  BlockStore store({{Tier::kRam, make_memory(4 * kBlock), kBlock},
                    {Tier::kNvme, nullptr, 4 * kBlock, 4 * kBlock, /*confirm_release=*/true}});
  const LayoutKey layout{1, 0x42};
  ASSERT_TRUE(store.register_layout(layout, kBlock).is_ok());
  auto reserved = store.reserve(key_of(layout, 1), std::vector<Tier>{Tier::kRam}, 1);
  ASSERT_TRUE(reserved.is_ok() && reserved->has_value());
  (*reserved)->commit();
  auto move_3 = store.begin_move(key_of(layout, 1), Tier::kNvme);
  ASSERT_TRUE(move_3.is_ok());
  move_3->commit();
  auto move_4 = store.begin_move(key_of(layout, 1), Tier::kRam);
  ASSERT_TRUE(move_4.is_ok());
  move_4->commit();
  EXPECT_FALSE(store.copy_of(key_of(layout, 1)).has_value());
  EXPECT_EQ(store.take_pending_releases().size(), 1u);
}

// A seeded random walk over saves, moves both ways, moves onto copies, copy drops,
// evictions, read pins and (delayed) release confirmations, checked after every step:
// no two live NVMe slots (blocks, copies, slots waiting for their release) overlap —
// a copy's slot is never handed to another block — has_copy and copy_of agree, a
// copy lies below its block, and NVMe's used bytes are exactly its blocks, copies and
// unconfirmed releases (plus, while readers hold pins, old slots they may still read).
TEST(BlockStoreCopyRandomTest, CopiesNeverShareASlotAndUsageAddsUp) {
  constexpr uint32_t kKeys = 24;
  const LayoutKey layout{1, 0x42};
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    BlockStore store({{Tier::kRam, make_memory(8 * kBlock), kBlock},
                      {Tier::kNvme, nullptr, 4 * kBlock, 12 * kBlock, /*confirm_release=*/true,
                       /*parts=*/1, /*keep_copies=*/true}});
    ASSERT_TRUE(store.register_layout(layout, kBlock).is_ok());
    std::mt19937 rng(seed);
    std::vector<PinnedBlock> readers;
    std::vector<BlockStore::PendingRelease> unconfirmed;
    for (int step = 0; step < 2000; ++step) {
      const BlockKey key = key_of(layout, rng() % kKeys);
      switch (rng() % 9) {
        case 0: {  // save into RAM
          auto reserved = store.reserve(key, std::vector<Tier>{Tier::kRam}, step);
          if (reserved.is_ok() && reserved->has_value()) (*reserved)->commit();
          break;
        }
        case 1:
        case 2: {  // a move either way, landing or failing at once
          auto info = store.lookup(key);
          if (!info) break;
          const Tier to = info->location.tier == Tier::kRam ? Tier::kNvme : Tier::kRam;
          if (auto move = store.begin_move(key, to); move.is_ok()) {
            rng() % 5 != 0 ? move->commit() : move->abort();
          }
          break;
        }
        case 3:
          (void)store.demote_onto_copy(key);
          break;
        case 4:
          (void)store.drop_copies(Tier::kNvme, (rng() % 3) * kBlock);
          break;
        case 5:
          (void)store.evict(key);
          break;
        case 6: {  // a read pin, or one given back
          if (!readers.empty() && rng() % 2 == 0) {
            readers.erase(readers.begin() + rng() % readers.size());
          } else if (PinnedBlock pin = store.pin(key, step)) {
            readers.push_back(std::move(pin));
          }
          break;
        }
        case 7: {  // releases are confirmed late, some of them
          for (auto& release : store.take_pending_releases()) unconfirmed.push_back(release);
          if (!unconfirmed.empty() && rng() % 2 == 0) {
            const size_t at = rng() % unconfirmed.size();
            store.confirm_release(unconfirmed[at].location, unconfirmed[at].bytes);
            unconfirmed.erase(unconfirmed.begin() + at);
          }
          break;
        }
        case 8:
          store.add_session_ref(key);
          break;
      }
      for (auto& release : store.take_pending_releases()) unconfirmed.push_back(release);

      std::set<uint64_t> nvme_slots;
      uint64_t nvme_blocks = 0, copies = 0;
      auto claim = [&](uint64_t offset) {
        EXPECT_TRUE(nvme_slots.insert(offset).second)
            << "seed " << seed << " step " << step << ": NVMe slot " << offset << " held twice";
      };
      for (uint32_t n = 0; n < kKeys; ++n) {
        const BlockKey k = key_of(layout, n);
        auto info = store.lookup(k);
        auto copy = store.copy_of(k);
        if (!info) {
          EXPECT_FALSE(copy.has_value());
          continue;
        }
        EXPECT_EQ(info->has_copy, copy.has_value());
        if (info->location.tier == Tier::kNvme) {
          ++nvme_blocks;
          claim(info->location.offset);
        }
        if (copy) {
          ++copies;
          EXPECT_EQ(copy->tier, Tier::kNvme);
          EXPECT_EQ(info->location.tier, Tier::kRam);
          claim(copy->offset);
        }
      }
      for (const auto& release : unconfirmed) {
        ASSERT_EQ(release.location.tier, Tier::kNvme);
        claim(release.location.offset);
      }
      // No reader's pin names a copy's slot (copies are dropped under pins).
      for (const PinnedBlock& reader : readers) {
        auto copy = store.copy_of(reader.key());
        EXPECT_FALSE(copy && copy->tier == reader.location().tier &&
                     copy->offset == reader.location().offset)
            << "seed " << seed << " step " << step;
      }
      const TierUsage nvme = store.usage(Tier::kNvme);
      // Old slots of blocks read up under a reader stay until the reader goes.
      const uint64_t accounted = (nvme_blocks + copies + unconfirmed.size()) * kBlock;
      if (readers.empty()) {
        ASSERT_EQ(nvme.used_bytes, accounted) << "seed " << seed << " step " << step;
      } else {
        ASSERT_GE(nvme.used_bytes, accounted) << "seed " << seed << " step " << step;
      }
      ASSERT_EQ(nvme.copies, copies);
      ASSERT_EQ(nvme.copy_bytes, copies * kBlock);
      ASSERT_EQ(nvme.blocks, nvme_blocks);
      ASSERT_EQ(store.unconfirmed_release_bytes(Tier::kNvme), unconfirmed.size() * kBlock);
    }
    // With every reader gone and every release confirmed, RAM holds exactly its blocks.
    readers.clear();
    for (auto& release : store.take_pending_releases()) unconfirmed.push_back(release);
    for (const auto& release : unconfirmed) store.confirm_release(release.location, release.bytes);
    const TierUsage ram = store.usage(Tier::kRam);
    EXPECT_EQ(ram.used_bytes, ram.blocks * kBlock) << "seed " << seed;
    EXPECT_EQ(store.usage(Tier::kNvme).used_bytes,
              (store.usage(Tier::kNvme).blocks + store.usage(Tier::kNvme).copies) * kBlock);
  }
}

}  // namespace
}  // namespace kvtier
