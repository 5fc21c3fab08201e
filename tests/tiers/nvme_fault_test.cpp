// Injected slab-file faults through FaultInjectingSlabIo: a failed write fails only its
// block and commits nothing for it; a failed sync commits nothing; read errors are
// reported, and only known-bad bytes are marked corrupt. Injected index faults (RocksDB's
// own file writes failing) and a real full file system: the tier degrades to read-only,
// keeps serving what it acknowledged, and heals without being reopened.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "tests/tiers/nvme_test_util.h"

namespace kvtier {
namespace {

using nvme_test::AlignedBuffer;
using nvme_test::block_key;
using nvme_test::read_now;
using nvme_test::release_now;
using nvme_test::TempDir;
using nvme_test::write_now;

constexpr uint64_t kBlock = 16 << 10;

SlabIoFault fault(const std::string& spec) {
  auto parsed = parse_slab_io_fault(spec);
  EXPECT_TRUE(parsed.is_ok()) << spec << ": " << parsed.status().to_string();
  return parsed.is_ok() ? *parsed : SlabIoFault{};
}

class NvmeFaultTest : public ::testing::Test {
 protected:
  // `heal_first_delay_ms`: long enough for a test to act while the tier is degraded.
  std::unique_ptr<NvmeTier> open(std::vector<std::string> faults, NvmeRecovery* recovered,
                                 uint64_t heal_first_delay_ms = 5) {
    NvmeTierOptions options;
    options.dir = dir_.path();
    options.heal_first_delay_ms = heal_first_delay_ms;
    options.heal_max_delay_ms = std::max<uint64_t>(20, heal_first_delay_ms);
    options.capacity_bytes = 1 << 20;
    options.slab_bytes = 256 << 10;
    for (const std::string& spec : faults) options.faults.push_back(fault(spec));
    auto tier = NvmeTier::open(options, recovered);
    EXPECT_TRUE(tier.is_ok()) << tier.status().to_string();
    return tier.is_ok() ? std::move(*tier) : nullptr;
  }
  NvmeTier::WriteItem write_item(uint32_t n) {
    return {block_key(n), source_.data() + n * kBlock, kBlock, n * kBlock, 0};
  }
  NvmeTier::ReadItem read_item(uint32_t n) {
    return {block_key(n), destination_.data() + n * kBlock, kBlock, n * kBlock};
  }
  // Whether the tier heals within 10 s.
  static bool wait_healed(const NvmeTier& tier) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (tier.degraded() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return !tier.degraded();
  }
  bool source_matches(uint32_t n) const {
    return std::memcmp(source_.data() + n * kBlock, destination_.data() + n * kBlock, kBlock) == 0;
  }
  size_t recovered_blocks() {
    NvmeRecovery recovered;
    auto tier = open({}, &recovered);
    return recovered.blocks.size();
  }

  TempDir dir_;
  AlignedBuffer source_{4 * kBlock, 3};
  AlignedBuffer destination_{4 * kBlock, 4};
};

TEST(SlabIoFaultSpec, ParsesEveryKindAndRejectsNonsense) {
  auto write = parse_slab_io_fault("write:3:ENOSPC");
  ASSERT_TRUE(write.is_ok());
  EXPECT_EQ(write->kind, SlabIoFault::Kind::kWrite);
  EXPECT_EQ(write->nth, 3u);
  EXPECT_EQ(write->last, 3u);
  EXPECT_EQ(write->error, ENOSPC);
  EXPECT_FALSE(write->applies_to(2));
  EXPECT_TRUE(write->applies_to(3));
  EXPECT_FALSE(write->applies_to(4));
  auto read = parse_slab_io_fault("read:2+:5");
  ASSERT_TRUE(read.is_ok());
  EXPECT_TRUE(read->applies_to(2));
  EXPECT_TRUE(read->applies_to(1'000'000));
  EXPECT_EQ(read->error, 5);
  auto index = parse_slab_io_fault("index:4-6:EIO");
  ASSERT_TRUE(index.is_ok());
  EXPECT_EQ(index->kind, SlabIoFault::Kind::kIndex);
  EXPECT_FALSE(index->applies_to(3));
  EXPECT_TRUE(index->applies_to(4));
  EXPECT_TRUE(index->applies_to(6));
  EXPECT_FALSE(index->applies_to(7));
  EXPECT_TRUE(parse_slab_io_fault("flip:2-2").is_ok());
  EXPECT_TRUE(parse_slab_io_fault("shortread:1").is_ok());
  EXPECT_TRUE(parse_slab_io_fault("flip:4").is_ok());
  EXPECT_TRUE(parse_slab_io_fault("sync:1:EIO").is_ok());
  for (const char* bad :
       {"", "write", "write:0:EIO", "write:1", "flip:1:EIO", "write:x:EIO", "write:1:ENOPE",
        "erase:1", "write:5-3:EIO", "write:5-:EIO", "write:-3:EIO", "index:1", "write:1-x:EIO"}) {
    EXPECT_FALSE(parse_slab_io_fault(bad).is_ok()) << bad;
  }
}

TEST_F(NvmeFaultTest, FailedWriteFailsOnlyItsBlockAndIndexesNothingForIt) {
  NvmeRecovery recovered;
  {
    auto tier = open({"write:2:ENOSPC"}, &recovered);
    ASSERT_NE(tier, nullptr);
    auto results = write_now(*tier, {write_item(0), write_item(1), write_item(2)});
    EXPECT_TRUE(results[0].is_ok());
    EXPECT_EQ(results[1].code(), StatusCode::kResourceExhausted) << results[1].to_string();
    EXPECT_TRUE(results[1].retryable());
    EXPECT_NE(results[1].message().find("No space left"), std::string::npos);
    EXPECT_TRUE(results[2].is_ok());
    auto read = read_now(*tier, {read_item(1)});
    EXPECT_EQ(read[0].status.code(), StatusCode::kDataLoss);  // nothing indexed for it
  }
  EXPECT_EQ(recovered_blocks(), 2u);
}

TEST_F(NvmeFaultTest, FailedSyncCommitsNothing) {
  NvmeRecovery recovered;
  {
    auto tier = open({"sync:1:EIO"}, &recovered);
    ASSERT_NE(tier, nullptr);
    auto results = write_now(*tier, {write_item(0), write_item(1)});
    // EIO on fdatasync: the device failed, nothing is known wrong, the write may be
    // retried (it succeeds below). Unavailable+retryable, not DataLoss.
    EXPECT_EQ(results[0].code(), StatusCode::kUnavailable) << results[0].to_string();
    EXPECT_TRUE(results[0].retryable());
    EXPECT_EQ(results[1].code(), StatusCode::kUnavailable);
    ASSERT_TRUE(wait_healed(*tier));  // the fault was one-shot
    auto again = write_now(*tier, {write_item(0)});
    EXPECT_TRUE(again[0].is_ok()) << again[0].to_string();
  }
  EXPECT_EQ(recovered_blocks(), 1u);
}

TEST_F(NvmeFaultTest, ReadErrorsAreReportedAndOnlyBadBytesAreCorrupt) {
  NvmeRecovery recovered;
  auto tier = open({"read:1:EIO", "shortread:2", "flip:3"}, &recovered);
  ASSERT_NE(tier, nullptr);
  auto results = write_now(*tier, {write_item(0), write_item(1), write_item(2), write_item(3)});
  for (const Status& status : results) ASSERT_TRUE(status.is_ok());

  auto eio = read_now(*tier, {read_item(0)});
  EXPECT_EQ(eio[0].status.code(), StatusCode::kUnavailable);  // EIO: not known bad bytes
  EXPECT_TRUE(eio[0].status.retryable());
  EXPECT_NE(eio[0].status.message().find("Input/output error"), std::string::npos);
  EXPECT_FALSE(eio[0].corrupt);  // the medium may recover: the block is kept
  // Bytes known gone or wrong stay DataLoss, and are final.
  auto short_read = read_now(*tier, {read_item(1)});
  EXPECT_EQ(short_read[0].status.code(), StatusCode::kDataLoss);
  EXPECT_FALSE(short_read[0].status.retryable());
  EXPECT_TRUE(short_read[0].corrupt);
  auto flipped = read_now(*tier, {read_item(2)});
  EXPECT_EQ(flipped[0].status.code(), StatusCode::kDataLoss);
  EXPECT_FALSE(flipped[0].status.retryable());
  EXPECT_NE(flipped[0].status.message().find("checksum mismatch"), std::string::npos);
  EXPECT_TRUE(flipped[0].corrupt);
  auto clean = read_now(*tier, {read_item(0), read_item(3)});
  EXPECT_TRUE(clean[0].status.is_ok()) << clean[0].status.to_string();
  EXPECT_TRUE(clean[1].status.is_ok()) << clean[1].status.to_string();
  EXPECT_EQ(std::memcmp(source_.data(), destination_.data(), kBlock), 0);
}

TEST_F(NvmeFaultTest, AndLaterFailsEveryWriteFromTheNth) {
  NvmeRecovery recovered;
  auto tier = open({"write:2+:EIO"}, &recovered);
  ASSERT_NE(tier, nullptr);
  auto results = write_now(*tier, {write_item(0), write_item(1), write_item(2)});
  EXPECT_TRUE(results[0].is_ok());
  EXPECT_FALSE(results[1].is_ok());
  EXPECT_FALSE(results[2].is_ok());
}

TEST_F(NvmeFaultTest, FailedWriteMakesTheTierReadOnlyUntilItHeals) {
  NvmeRecovery recovered;
  auto tier = open({"write:2:EIO"}, &recovered, /*heal_first_delay_ms=*/2'000);
  ASSERT_NE(tier, nullptr);
  ASSERT_TRUE(write_now(*tier, {write_item(0)})[0].is_ok());
  EXPECT_FALSE(tier->degraded());
  EXPECT_FALSE(write_now(*tier, {write_item(1)})[0].is_ok());
  // Degraded at once: the next write is refused before it reaches the disk, until the
  // background try heals it; what was acknowledged still reads while it is degraded.
  const NvmeHealth degraded = tier->health();
  EXPECT_EQ(degraded.degradations, 1u);
  ASSERT_TRUE(degraded.degraded);
  auto refused = write_now(*tier, {write_item(2)});
  EXPECT_EQ(refused[0].code(), StatusCode::kUnavailable) << refused[0].to_string();
  EXPECT_TRUE(refused[0].retryable());
  EXPECT_NE(refused[0].message().find("degraded"), std::string::npos);
  EXPECT_NE(refused[0].message().find("Input/output error"), std::string::npos);
  auto read = read_now(*tier, {read_item(0)});
  EXPECT_TRUE(read[0].status.is_ok()) << read[0].status.to_string();
  EXPECT_TRUE(source_matches(0));
  ASSERT_TRUE(wait_healed(*tier));
  EXPECT_EQ(tier->health().heals, 1u);
  EXPECT_GE(tier->health().heal_attempts, 1u);
  ASSERT_TRUE(write_now(*tier, {write_item(2)})[0].is_ok());
  ASSERT_TRUE(read_now(*tier, {read_item(2)})[0].status.is_ok());
  EXPECT_TRUE(source_matches(2));
  tier.reset();
  EXPECT_EQ(recovered_blocks(), 2u);  // 0 and 2; nothing for the failed 1
}

// RocksDB meets an I/O error syncing its own log: it refuses to resume, so healing
// reopens the index — here only on the second try, the first reopen failing as well (the
// index is closed between the two: reads are refused, never answered wrongly). The failed
// commit's record reached the log before its sync failed, and the reopen replays it: the
// release of its slot (what the caller does for a failed write) waits for the heal and
// then deletes it, so the slot can be reused without two records naming it.
TEST_F(NvmeFaultTest, IndexIoErrorHealsByReopeningTheIndex) {
  NvmeRecovery recovered;
  auto tier = open({"index:2-3:EIO"}, &recovered, /*heal_first_delay_ms=*/200);
  ASSERT_NE(tier, nullptr);
  ASSERT_TRUE(write_now(*tier, {write_item(0)})[0].is_ok());  // index operation 1
  auto failed = write_now(*tier, {write_item(1)});            // 2: the commit fails
  EXPECT_FALSE(failed[0].is_ok());
  EXPECT_NE(failed[0].message().find("injected"), std::string::npos) << failed[0].to_string();
  EXPECT_EQ(tier->health().degradations, 1u);
  ASSERT_TRUE(tier->degraded());
  const Status early = release_now(*tier, {{block_key(1), kBlock}});
  EXPECT_FALSE(early.is_ok()) << "a release while the index is stopped must wait for the heal";
  ASSERT_TRUE(wait_healed(*tier));  // try 1 (operation 3) fails, try 2 reopens
  EXPECT_GE(tier->health().heal_attempts, 2u);
  EXPECT_EQ(tier->health().heals, 1u);
  EXPECT_TRUE(release_now(*tier, {{block_key(1), kBlock}}).is_ok());  // the retry
  ASSERT_TRUE(write_now(*tier, {write_item(2)})[0].is_ok());
  auto read = read_now(*tier, {read_item(0), read_item(1), read_item(2)});
  EXPECT_TRUE(read[0].status.is_ok()) << read[0].status.to_string();
  EXPECT_EQ(read[1].status.code(), StatusCode::kDataLoss);  // never acknowledged, released
  EXPECT_TRUE(read[2].status.is_ok()) << read[2].status.to_string();
  EXPECT_TRUE(source_matches(0));
  EXPECT_TRUE(source_matches(2));
  tier.reset();
  EXPECT_EQ(recovered_blocks(), 2u);
}

// No space inside RocksDB (past the room check): it heals once writes work again, and
// releases (index deletes) work after it.
TEST_F(NvmeFaultTest, IndexOutOfSpaceHeals) {
  NvmeRecovery recovered;
  auto tier = open({"index:2:ENOSPC"}, &recovered);
  ASSERT_NE(tier, nullptr);
  ASSERT_TRUE(write_now(*tier, {write_item(0)})[0].is_ok());
  auto failed = write_now(*tier, {write_item(1)});
  EXPECT_FALSE(failed[0].is_ok());
  EXPECT_NE(failed[0].message().find("No space left"), std::string::npos) << failed[0].to_string();
  ASSERT_TRUE(wait_healed(*tier));
  ASSERT_TRUE(write_now(*tier, {write_item(3)})[0].is_ok());
  // Releases write the index too: block 0's, and the failed write's slot (as the caller
  // releases it), whose record may be in the log.
  EXPECT_TRUE(release_now(*tier, {{block_key(0), 0}, {block_key(1), kBlock}}).is_ok());
  tier.reset();
  EXPECT_EQ(recovered_blocks(), 1u);  // 3; 0 released, 1 never committed
}

}  // namespace
}  // namespace kvtier
