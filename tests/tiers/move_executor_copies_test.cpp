// MoveExecutor::copy_out and copy_in (move_executor.h, move_executor_copy_*.cpp): copies of
// blocks written into the key-addressed tier while the blocks stay where they are, and
// blocks this node lacks read out of it into memory, against a
// GPU-like memory (not host-addressable; the test's Device copies it), a RAM pool, a fake
// NVMe tier and a fake spill tier, with a control thread the test drives by hand.
//  - a block in host memory is written from where it lies, under its pin until the tier
//    is done; one in GPU memory through a staging slot (its pin goes once staged); one on
//    NVMe through a read buffer (its pin goes once read); all bit-exact, all still held
//    where they were afterwards, nothing left pinned;
//  - the batch takes keys in order and stops at the first it cannot start: not held,
//    half the in-flight bound, or bytes to stage while the tier is unreachable;
//  - a declined batch, a failed write, a failed staging copy and a block that does not
//    read cut what was written at the first failure, and the caller is told only later,
//    on the control thread;
//  - copy_in reads blocks bit-exact into RAM, visible only once read, joining reads under
//    way; a block the tier lacks is a miss and gives its slot back; unreachable or
//    declined reads read nothing; full memory makes room by evicting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <vector>

#include "tests/tiers/spill_fakes.h"
#include "tests/tiers/test_memory.h"
#include "tiers/block_store.h"
#include "tiers/move_executor.h"
#include "tiers/tier.h"

namespace kvtier {
namespace {

using tiers_test::key_of;
using namespace tiers_test::spill_fakes;

constexpr uint64_t kTierBytes = 8 * kBlockBytes;
constexpr uint64_t kStagingSlots = 2;  // blocks GPU memory can stage at once

// GPU memory: the daemon cannot touch it (no host_data); the test's Device can.
class GpuMemory final : public Memory {
 public:
  explicit GpuMemory(uint64_t bytes) : bytes_(bytes) {}
  uint64_t size_bytes() const override { return bytes_.size(); }
  MemoryLocation location() const override { return MemoryLocation::kGpu; }
  std::byte* host_data() override { return nullptr; }
  std::string describe() const override { return "test gpu memory"; }
  std::byte* device_bytes() { return bytes_.data(); }

 private:
  std::vector<std::byte> bytes_;
};

std::byte* bytes_of(Memory& memory) {
  if (memory.host_data() != nullptr) return memory.host_data();
  return static_cast<GpuMemory&>(memory).device_bytes();
}

class MoveExecutorCopyOutTest : public ::testing::Test {
 protected:
  MoveExecutorCopyOutTest()
      : gpu_(std::make_shared<GpuMemory>(kTierBytes)),
        ram_(tiers_test::make_memory(kTierBytes)),
        store_({{Tier::kHbm, gpu_, 4 * kBlockBytes},
                {Tier::kRam, ram_, 4 * kBlockBytes},
                {Tier::kNvme, nullptr, 4 * kBlockBytes, kNvmeBytes, /*confirm_release=*/true,
                 /*parts=*/1, /*keep_copies=*/true}}),
        hbm_tier_(Tier::kHbm, gpu_),
        ram_tier_(Tier::kRam, ram_),
        executor_(store_, {&hbm_tier_, &ram_tier_, &nvme_}, hooks()) {
    EXPECT_TRUE(store_.register_layout(kLayout, kBlockBytes).is_ok());
  }
  void SetUp() override {
    executor_.attach_spill_tier(spill_, bound_bytes_,
                                tiers_test::make_memory(kStagingSlots * kBlockBytes), kBlockBytes);
  }

  MoveExecutor::Hooks hooks() {
    MoveExecutor::Hooks hooks;
    // The Device: copies each segment now, answers on the control thread.
    hooks.copy = [this](CopyBatch batch, std::function<void(Status)> done) {
      if (fail_copies_) return unavailable("injected copy failure");
      for (const CopySegment& s : batch.segments) {
        std::memcpy(bytes_of(*batch.memories[s.dst_memory]) + s.dst_offset,
                    bytes_of(*batch.memories[s.src_memory]) + s.src_offset, s.bytes);
      }
      ++copies_;
      control_.poster()([done] { done(Status::ok()); });
      return Status::ok();
    };
    hooks.control_thread = [this] { return control_.poster(); };
    hooks.room_by_demotion = [](Tier, uint64_t) { return std::vector<policy::Move>{}; };
    hooks.not_moved = [](const BlockKey&) {};
    hooks.removed = [this](const std::vector<BlockKey>& keys, bool lost) {
      for (const BlockKey& key : keys) (lost ? lost_ : removed_).push_back(key);
    };
    hooks.before_persistent_write = [] {};
    hooks.settled = [] {};
    // Room for a copy in: the oldest block of the tier that has one, evicted.
    hooks.room_by_eviction = [this](Tier tier, uint64_t bytes) {
      std::vector<policy::Move> moves;
      store_.for_each_in_tier(tier, [&](const BlockKey& key, const BlockInfo&) {
        if (moves.empty()) {
          moves.push_back({policy::MoveKind::kEvict, key, tier, Tier::kNone,
                           policy::MoveReason::kMakeRoom, bytes});
        }
      });
      return moves;
    };
    hooks.inserted = [this](const BlockKey& key, bool ok) { inserted_.push_back({key, ok}); };
    hooks.now_ms = [] { return uint64_t{200}; };
    hooks.wall_ms_of = [](uint64_t steady_ms) { return steady_ms; };
    return hooks;
  }

  // Block n saved into `tier` (HBM or RAM) with its bytes there.
  BlockKey saved_in(Tier tier, uint32_t n) {
    const BlockKey key = key_of(kLayout, n);
    const Tier allowed[] = {tier};
    auto reserved = store_.reserve(key, allowed, 100);
    EXPECT_TRUE(reserved.is_ok() && reserved->has_value());
    PendingWrite& slot = **reserved;
    Memory& memory = tier == Tier::kHbm ? static_cast<Memory&>(*gpu_) : *ram_;
    const Bytes bytes = contents_of(n);
    std::memcpy(bytes_of(memory) + slot.location().offset, bytes.data(), bytes.size());
    slot.commit();
    return key;
  }
  // Block n, recovered into NVMe slot n with its bytes there.
  BlockKey on_nvme(uint32_t n) { return recover_on_nvme(store_, nvme_, n); }

  size_t copy_out(const std::vector<BlockKey>& keys) {
    return executor_.copy_out(keys, [this](MoveExecutor::CopyOutResult result) {
      EXPECT_FALSE(result_.has_value()) << "done ran twice";
      result_ = result;
    });
  }
  void drain_control_thread() { control_.drain(); }
  void run_until_settled() { tiers_test::spill_fakes::run_until_settled(control_, spill_); }
  // copy_in of `keys`; the answers land in answers_ by index.
  void copy_in(const std::vector<BlockKey>& keys) {
    answers_.assign(keys.size(), std::nullopt);
    executor_.copy_in(keys, [this](size_t i, const Status& status) {
      ASSERT_LT(i, answers_.size());
      EXPECT_FALSE(answers_[i].has_value()) << "answered twice: " << i;
      answers_[i] = status;
    });
  }
  Bytes ram_bytes_of(const BlockKey& key) {
    const auto info = store_.lookup(key);
    if (!info || info->location.tier != Tier::kRam) return {};
    const std::byte* at = ram_->host_data() + info->location.offset;
    return Bytes(at, at + kBlockBytes);
  }
  bool stored_right(uint32_t n) const {
    const auto it = spill_.stored.find(key_of(kLayout, n));
    return it != spill_.stored.end() && it->second == contents_of(n);
  }
  std::optional<Tier> tier_of(const BlockKey& key) const {
    const auto info = store_.lookup(key);
    if (!info) return std::nullopt;
    return info->location.tier;
  }

  std::shared_ptr<GpuMemory> gpu_;
  std::shared_ptr<Memory> ram_;
  BlockStore store_;
  MemoryTier hbm_tier_;
  MemoryTier ram_tier_;
  FakeNvmeTier nvme_;
  FakeSpillTier spill_;
  ControlThread control_;
  std::vector<BlockKey> removed_;
  std::vector<BlockKey> lost_;
  uint64_t bound_bytes_ = 8 * kBlockBytes;  // the in-flight bound (derived fixtures change it)
  bool fail_copies_ = false;
  size_t copies_ = 0;
  std::optional<MoveExecutor::CopyOutResult> result_;
  std::vector<std::optional<Status>> answers_;
  std::vector<std::pair<BlockKey, bool>> inserted_;
  MoveExecutor executor_;
};

TEST_F(MoveExecutorCopyOutTest, HostGpuAndNvmeBlocksAreWrittenBitExactAndStayWhereTheyAre) {
  const BlockKey in_ram = saved_in(Tier::kRam, 1);
  const BlockKey in_gpu = saved_in(Tier::kHbm, 2);
  const BlockKey in_nvme = on_nvme(3);
  EXPECT_EQ(copy_out({in_ram, in_gpu, in_nvme}), 3u);
  EXPECT_EQ(store_.pinned_blocks(), 3u);
  drain_control_thread();  // staged and read: only the block written in place stays pinned
  EXPECT_EQ(copies_, 1u);
  EXPECT_EQ(executor_.counters().staged_blocks, 1u);
  EXPECT_EQ(store_.pinned_blocks(), 1u);
  EXPECT_FALSE(result_.has_value()) << "told before the tier answered";
  run_until_settled();
  ASSERT_TRUE(result_.has_value());
  EXPECT_EQ(result_->sent, 3u);
  EXPECT_EQ(result_->written, 3u);
  EXPECT_FALSE(result_->declined);
  EXPECT_TRUE(stored_right(1));
  EXPECT_TRUE(stored_right(2));
  EXPECT_TRUE(stored_right(3));
  EXPECT_EQ(tier_of(in_ram), Tier::kRam);
  EXPECT_EQ(tier_of(in_gpu), Tier::kHbm);
  EXPECT_EQ(tier_of(in_nvme), Tier::kNvme);
  EXPECT_EQ(store_.pinned_blocks(), 0u);
  EXPECT_TRUE(removed_.empty());
  // The staging slots came back: as many GPU blocks as there are slots go at once again.
  result_.reset();
  EXPECT_EQ(copy_out({saved_in(Tier::kHbm, 4), saved_in(Tier::kHbm, 5)}), kStagingSlots);
  run_until_settled();
  EXPECT_TRUE(stored_right(4));
  EXPECT_TRUE(stored_right(5));
}

TEST_F(MoveExecutorCopyOutTest, TakesKeysInOrderUntilOneCannotStart) {
  const BlockKey first = saved_in(Tier::kRam, 1);
  const BlockKey missing = key_of(kLayout, 9);
  const BlockKey third = saved_in(Tier::kRam, 3);
  EXPECT_EQ(copy_out({first, missing, third}), 1u);
  run_until_settled();
  EXPECT_TRUE(stored_right(1));
  EXPECT_FALSE(spill_.stored.contains(third));
  // Unreachable: a block read in place still goes; one that must be staged first stops it.
  result_.reset();
  spill_.reachable_now = false;
  const BlockKey in_gpu = saved_in(Tier::kHbm, 4);
  EXPECT_EQ(copy_out({third, in_gpu, saved_in(Tier::kRam, 5)}), 1u);
  EXPECT_EQ(copy_out({in_gpu}), 0u);
  EXPECT_EQ(copy_out({on_nvme(6)}), 0u);
  EXPECT_EQ(copies_, 0u);
  // More GPU blocks than staging slots: the batch stops when they are taken.
  spill_.reachable_now = true;
  run_until_settled();
  result_.reset();
  EXPECT_EQ(copy_out({saved_in(Tier::kHbm, 7), saved_in(Tier::kHbm, 8), in_gpu}), kStagingSlots);
  run_until_settled();
  EXPECT_EQ(store_.pinned_blocks(), 0u);
}

TEST_F(MoveExecutorCopyOutTest, ABatchStaysWithinHalfTheBound) {
  std::vector<BlockKey> keys;
  for (uint32_t n = 1; n <= 6; ++n) keys.push_back(saved_in(Tier::kRam, n));
  EXPECT_EQ(copy_out(keys), 4u);  // bound 8 blocks: half of it
  run_until_settled();
  EXPECT_EQ(result_->written, 4u);
  result_.reset();
  EXPECT_EQ(copy_out({keys[4], keys[5]}), 2u);
  run_until_settled();
  for (uint32_t n = 1; n <= 6; ++n) EXPECT_TRUE(stored_right(n)) << n;
}

class MoveExecutorCopyOutSmallBound : public MoveExecutorCopyOutTest {
 protected:
  MoveExecutorCopyOutSmallBound() { bound_bytes_ = kBlockBytes + kBlockBytes / 2; }  // 1.5 blocks
};

TEST_F(MoveExecutorCopyOutSmallBound, AFirstBlockLargerThanHalfTheBoundGoesAlone) {
  EXPECT_EQ(copy_out({saved_in(Tier::kRam, 1), saved_in(Tier::kRam, 2)}), 1u);
  run_until_settled();
  EXPECT_TRUE(stored_right(1));
  EXPECT_EQ(result_->written, 1u);
}

TEST_F(MoveExecutorCopyOutTest, ADeclinedBatchIsToldLaterAndLetsGoOfEverything) {
  spill_.decline_writes = true;
  const BlockKey in_ram = saved_in(Tier::kRam, 1);
  const BlockKey in_gpu = saved_in(Tier::kHbm, 2);
  EXPECT_EQ(copy_out({in_ram, in_gpu}), 2u);
  EXPECT_FALSE(result_.has_value());
  drain_control_thread();
  ASSERT_TRUE(result_.has_value());
  EXPECT_TRUE(result_->declined);
  EXPECT_EQ(result_->sent, 0u);
  EXPECT_EQ(result_->written, 0u);
  EXPECT_EQ(store_.pinned_blocks(), 0u);
  EXPECT_TRUE(spill_.stored.empty());
  // Its staging slot is free again.
  spill_.decline_writes = false;
  result_.reset();
  EXPECT_EQ(copy_out({in_gpu, saved_in(Tier::kHbm, 3)}), kStagingSlots);
  run_until_settled();
  EXPECT_EQ(result_->written, kStagingSlots);
}

TEST_F(MoveExecutorCopyOutTest, AFailedWriteCountsOnlyTheBlocksBeforeIt) {
  const BlockKey a = saved_in(Tier::kRam, 1);
  const BlockKey b = saved_in(Tier::kRam, 2);
  const BlockKey c = saved_in(Tier::kRam, 3);
  spill_.failing_writes.insert(b);
  EXPECT_EQ(copy_out({a, b, c}), 3u);
  run_until_settled();
  ASSERT_TRUE(result_.has_value());
  EXPECT_EQ(result_->sent, 3u);
  EXPECT_EQ(result_->written, 1u);
  EXPECT_FALSE(result_->declined);
  EXPECT_EQ(store_.pinned_blocks(), 0u);
}

TEST_F(MoveExecutorCopyOutTest, AFailedStagingCopyCutsTheBatchAtItsFirstGpuBlock) {
  fail_copies_ = true;
  const BlockKey in_ram = saved_in(Tier::kRam, 1);
  const BlockKey in_gpu = saved_in(Tier::kHbm, 2);
  EXPECT_EQ(copy_out({in_ram, in_gpu}), 2u);
  run_until_settled();
  ASSERT_TRUE(result_.has_value());
  EXPECT_EQ(result_->sent, 1u);
  EXPECT_EQ(result_->written, 1u);
  EXPECT_TRUE(stored_right(1));
  EXPECT_FALSE(spill_.stored.contains(in_gpu));
  EXPECT_EQ(store_.pinned_blocks(), 0u);
  EXPECT_EQ(tier_of(in_gpu), Tier::kHbm);
}

TEST_F(MoveExecutorCopyOutTest, ABlockThatDoesNotReadIsDroppedAndNothingFromItOnIsWritten) {
  const BlockKey in_ram = saved_in(Tier::kRam, 1);
  const BlockKey bad = on_nvme(2);
  nvme_.bytes_at_offset.erase(2 * kBlockBytes);  // its bytes are gone: corrupt
  EXPECT_EQ(copy_out({in_ram, bad}), 2u);
  run_until_settled();
  ASSERT_TRUE(result_.has_value());
  EXPECT_EQ(result_->sent, 1u);
  EXPECT_EQ(result_->written, 1u);
  EXPECT_FALSE(spill_.stored.contains(bad));
  EXPECT_EQ(lost_, std::vector<BlockKey>{bad});
  EXPECT_FALSE(tier_of(bad).has_value());
  // A read that fails for a reason that may pass keeps the block.
  result_.reset();
  const BlockKey flaky = on_nvme(3);
  nvme_.unreadable.insert(flaky);
  EXPECT_EQ(copy_out({flaky}), 1u);
  run_until_settled();
  EXPECT_EQ(result_->sent, 0u);
  EXPECT_EQ(tier_of(flaky), Tier::kNvme);
  EXPECT_EQ(store_.pinned_blocks(), 0u);
}

// Copies in (MoveExecutor::copy_in): blocks this node lacks, read out of the spill tier.

TEST_F(MoveExecutorCopyOutTest, CopyInReadsMissingBlocksIntoRamBitExactAndJoinsReadsUnderWay) {
  const BlockKey a = key_of(kLayout, 1);
  const BlockKey b = key_of(kLayout, 2);
  spill_.stored[a] = contents_of(1);
  spill_.stored[b] = contents_of(2);
  copy_in({a, b});
  EXPECT_TRUE(executor_.copying_in(a));
  EXPECT_FALSE(store_.lookup(a).has_value()) << "visible before it was read";
  // A second ask for a block under way joins its read.
  std::optional<Status> joined;
  executor_.copy_in({a}, [&](size_t, const Status& status) { joined = status; });
  EXPECT_EQ(spill_.read_attempts.size(), 2u);
  run_until_settled();
  ASSERT_TRUE(answers_[0].has_value() && answers_[1].has_value());
  EXPECT_TRUE(answers_[0]->is_ok()) << answers_[0]->to_string();
  EXPECT_TRUE(answers_[1]->is_ok());
  ASSERT_TRUE(joined.has_value());
  EXPECT_TRUE(joined->is_ok());
  EXPECT_EQ(ram_bytes_of(a), contents_of(1));
  EXPECT_EQ(ram_bytes_of(b), contents_of(2));
  EXPECT_FALSE(executor_.copying_in(a));
  EXPECT_EQ(executor_.counters().copied_in_blocks, 2u);
  EXPECT_EQ(inserted_.size(), 2u);
  // Held now: answered at once, nothing read.
  copy_in({a});
  EXPECT_TRUE(answers_[0].has_value() && answers_[0]->is_ok());
  EXPECT_EQ(spill_.read_attempts.size(), 2u);
}

TEST_F(MoveExecutorCopyOutTest, CopyInOfABlockTheTierLacksIsAMissAndItsSlotIsGivenBack) {
  const BlockKey there = key_of(kLayout, 1);
  const BlockKey absent = key_of(kLayout, 2);
  spill_.stored[there] = contents_of(1);
  copy_in({there, absent});
  run_until_settled();
  EXPECT_TRUE(answers_[0]->is_ok());
  ASSERT_TRUE(answers_[1].has_value());
  EXPECT_EQ(answers_[1]->code(), StatusCode::kNotFound);
  EXPECT_FALSE(store_.lookup(absent).has_value());
  EXPECT_EQ(store_.usage(Tier::kRam).used_bytes, kBlockBytes);  // only the block read
  EXPECT_EQ(executor_.counters().copy_in_misses, 1u);
  EXPECT_EQ(inserted_.back(), std::make_pair(absent, false));
}

TEST_F(MoveExecutorCopyOutTest, CopyInWithTheTierUnreachableOrItsBoundFullReadsNothing) {
  const BlockKey held = saved_in(Tier::kRam, 1);
  const BlockKey away = key_of(kLayout, 2);
  spill_.stored[away] = contents_of(2);
  spill_.reachable_now = false;
  copy_in({held, away});  // answered at once
  EXPECT_TRUE(answers_[0].has_value() && answers_[0]->is_ok());
  ASSERT_TRUE(answers_[1].has_value());
  EXPECT_EQ(answers_[1]->code(), StatusCode::kUnavailable);
  spill_.reachable_now = true;
  spill_.decline_reads = true;
  copy_in({away, key_of(kLayout, 3)});
  for (const auto& answer : answers_) {
    ASSERT_TRUE(answer.has_value());
    EXPECT_EQ(answer->code(), StatusCode::kResourceExhausted);
  }
  EXPECT_FALSE(executor_.copying_in(away));
  EXPECT_EQ(store_.usage(Tier::kRam).used_bytes, kBlockBytes);  // the held block only
  EXPECT_TRUE(spill_.read_attempts.empty());
}

TEST_F(MoveExecutorCopyOutTest, CopyInIntoFullMemoryMakesRoomByEvicting) {
  std::vector<BlockKey> held;
  for (uint32_t n = 1; n <= 8; ++n) held.push_back(saved_in(Tier::kRam, n));  // RAM full
  for (uint32_t n = 11; n <= 18; ++n) saved_in(Tier::kHbm, n);  // and HBM (not host memory)
  const BlockKey away = key_of(kLayout, 20);
  spill_.stored[away] = contents_of(20);
  copy_in({away});
  run_until_settled();
  ASSERT_TRUE(answers_[0].has_value());
  EXPECT_TRUE(answers_[0]->is_ok()) << answers_[0]->to_string();
  EXPECT_EQ(ram_bytes_of(away), contents_of(20));
  EXPECT_EQ(removed_.size(), 1u);  // one RAM block made room
  EXPECT_EQ(store_.usage(Tier::kRam).blocks, 8u);
}

TEST_F(MoveExecutorCopyOutTest, CopyInReadsALongPrefixAChunkAtATimeWithinTheBound) {
  // The bound is 8 blocks: chunks of 8, one at the tier at a time (a window of 1).
  constexpr uint32_t kKeys = 20;
  std::vector<BlockKey> keys;
  for (uint32_t n = 1; n <= kKeys; ++n) {
    keys.push_back(key_of(kLayout, n));
    spill_.stored[keys.back()] = contents_of(n);
  }
  copy_in(keys);
  size_t chunks = 0;
  while (!spill_.reads_in_flight.empty()) {
    EXPECT_EQ(spill_.reads_in_flight.size(), 1u) << "more than the window at the tier";
    EXPECT_LE(spill_.reads_in_flight.front().first.size(), 8u) << "a chunk over the bound";
    ++chunks;
    spill_.complete_reads();
    drain_control_thread();
  }
  EXPECT_EQ(chunks, 3u);  // 8 + 8 + 4
  for (uint32_t i = 0; i < kKeys; ++i) {
    ASSERT_TRUE(answers_[i].has_value()) << i;
    EXPECT_TRUE(answers_[i]->is_ok()) << i << ": " << answers_[i]->to_string();
  }
  EXPECT_EQ(executor_.counters().copied_in_blocks, kKeys);
  // RAM holds 8: the last chunk's blocks are there, bit-exact; room was made by evicting.
  EXPECT_EQ(ram_bytes_of(keys.back()), contents_of(kKeys));
  EXPECT_EQ(store_.usage(Tier::kRam).blocks, 8u);
  EXPECT_EQ(store_.pinned_blocks(), 0u);
}

}  // namespace
}  // namespace kvtier
