// NvmeTier against a real RocksDB and a real slab file in a temporary directory:
// round trips, recovery after reopen, checksums, conditional release, and the format
// version check.
#include "tiers/nvme_tier.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/tiers/nvme_test_util.h"

namespace kvtier {
namespace {

using nvme_test::AlignedBuffer;
using nvme_test::block_key;
using nvme_test::read_now;
using nvme_test::release_now;
using nvme_test::TempDir;
using nvme_test::write_now;

constexpr uint64_t kBlock = 64 << 10;
constexpr uint64_t kCapacity = 4 << 20;
constexpr uint64_t kSlab = 1 << 20;

class NvmeTierTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }

  std::unique_ptr<NvmeTier> open(NvmeRecovery* recovered, NvmeTierOptions options = {}) {
    options.dir = dir_.path();
    options.capacity_bytes = kCapacity;
    options.slab_bytes = kSlab;
    options.io_buffers = {source_.span(), destination_.span()};
    auto tier = NvmeTier::open(options, recovered);
    EXPECT_TRUE(tier.is_ok()) << tier.status().to_string();
    return tier.is_ok() ? std::move(*tier) : nullptr;
  }
  // Block n: kBlock bytes at source_ + n × kBlock, stored at slot n.
  NvmeTier::WriteItem write_item(uint32_t n) {
    return {block_key(n), source_.data() + n * kBlock, kBlock, n * kBlock, 1000 + n};
  }
  NvmeTier::ReadItem read_item(uint32_t n) {
    return {block_key(n), destination_.data() + n * kBlock, kBlock, n * kBlock};
  }
  bool same_bytes(uint32_t n) const {
    return std::memcmp(source_.data() + n * kBlock, destination_.data() + n * kBlock, kBlock) == 0;
  }

  TempDir dir_;
  AlignedBuffer source_{8 * kBlock, 1};
  AlignedBuffer destination_{8 * kBlock, 2};
};

TEST_F(NvmeTierTest, WritesAndReadsBackBitExact) {
  NvmeRecovery recovered;
  auto tier = open(&recovered);
  ASSERT_NE(tier, nullptr);
  EXPECT_TRUE(recovered.blocks.empty());
  auto written = write_now(*tier, {write_item(0), write_item(1), write_item(5)});
  for (const Status& status : written) EXPECT_TRUE(status.is_ok()) << status.to_string();
  auto read = read_now(*tier, {read_item(0), read_item(1), read_item(5)});
  for (const auto& outcome : read)
    EXPECT_TRUE(outcome.status.is_ok()) << outcome.status.to_string();
  EXPECT_TRUE(same_bytes(0));
  EXPECT_TRUE(same_bytes(1));
  EXPECT_TRUE(same_bytes(5));
}

TEST_F(NvmeTierTest, IndexAndSessionsSurviveReopen) {
  {
    NvmeRecovery recovered;
    auto tier = open(&recovered);
    ASSERT_NE(tier, nullptr);
    auto written = write_now(*tier, {write_item(2), write_item(3)});
    ASSERT_TRUE(written[0].is_ok() && written[1].is_ok());
    NvmeSessionRecord session;
    session.namespace_name = "uid:1000";
    session.session_id = "conversation";
    session.layout_digest = 0x1234;
    session.turns = 3;
    session.state = 1;
    session.blocks = {block_key(2).hash, block_key(3).hash};
    std::promise<Status> done;
    tier->write_sessions({session}, {}, true, [&](Status s) { done.set_value(s); });
    ASSERT_TRUE(done.get_future().get().is_ok());
  }
  NvmeRecovery recovered;
  auto tier = open(&recovered);
  ASSERT_NE(tier, nullptr);
  ASSERT_EQ(recovered.blocks.size(), 2u);
  ASSERT_EQ(recovered.layouts.size(), 1u);
  EXPECT_EQ(recovered.layouts[0].block_bytes, kBlock);
  EXPECT_EQ(recovered.layouts[0].namespace_name, "uid:1000");
  for (const auto& block : recovered.blocks) {
    EXPECT_EQ(block.record.bytes, kBlock);
    EXPECT_TRUE(block.key == block_key(2) || block.key == block_key(3));
    EXPECT_EQ(block.record.offset, block.key == block_key(2) ? 2 * kBlock : 3 * kBlock);
  }
  ASSERT_EQ(recovered.sessions.size(), 1u);
  EXPECT_EQ(recovered.sessions[0].session_id, "conversation");
  EXPECT_EQ(recovered.sessions[0].turns, 3u);
  EXPECT_EQ(recovered.sessions[0].blocks.size(), 2u);
  auto read = read_now(*tier, {read_item(2), read_item(3)});
  EXPECT_TRUE(read[0].status.is_ok() && read[1].status.is_ok());
  EXPECT_TRUE(same_bytes(2) && same_bytes(3));
}

TEST_F(NvmeTierTest, FlippedByteOnDiskIsCorruptDataLoss) {
  NvmeRecovery recovered;
  auto tier = open(&recovered);
  ASSERT_NE(tier, nullptr);
  ASSERT_TRUE(write_now(*tier, {write_item(1)})[0].is_ok());
  {
    int fd = ::open((dir_.path() + "/slabs.dat").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char byte = 0;
    ASSERT_EQ(::pread(fd, &byte, 1, kBlock + 100), 1);
    byte ^= 1;
    ASSERT_EQ(::pwrite(fd, &byte, 1, kBlock + 100), 1);
    ::close(fd);
  }
  auto read = read_now(*tier, {read_item(1)});
  EXPECT_EQ(read[0].status.code(), StatusCode::kDataLoss) << read[0].status.to_string();
  EXPECT_NE(read[0].status.message().find("checksum mismatch"), std::string::npos);
  EXPECT_TRUE(read[0].corrupt);
}

TEST_F(NvmeTierTest, ReadOfAnUnindexedSlotIsCorrupt) {
  NvmeRecovery recovered;
  auto tier = open(&recovered);
  ASSERT_NE(tier, nullptr);
  auto read = read_now(*tier, {read_item(4)});
  EXPECT_EQ(read[0].status.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(read[0].corrupt);
}

TEST_F(NvmeTierTest, ReleaseDeletesOnlyAnEntryNamingThatSlot) {
  NvmeRecovery recovered;
  auto tier = open(&recovered);
  ASSERT_NE(tier, nullptr);
  ASSERT_TRUE(write_now(*tier, {write_item(1), write_item(2)})[0].is_ok());
  // A stale release (the key was written again elsewhere since) must not delete it.
  ASSERT_TRUE(release_now(*tier, {{block_key(1), 7 * kBlock}}).is_ok());
  ASSERT_TRUE(release_now(*tier, {{block_key(2), 2 * kBlock}}).is_ok());
  tier.reset();
  auto reopened = open(&recovered);
  ASSERT_NE(reopened, nullptr);
  ASSERT_EQ(recovered.blocks.size(), 1u);
  EXPECT_TRUE(recovered.blocks[0].key == block_key(1));
}

TEST_F(NvmeTierTest, BufferedIoWhenDirectIsNotAllowed) {
  NvmeRecovery recovered;
  NvmeTierOptions options;
  options.allow_direct_io = false;
  auto tier = open(&recovered, options);
  ASSERT_NE(tier, nullptr);
  EXPECT_NE(tier->describe().find("buffered"), std::string::npos) << tier->describe();
  ASSERT_TRUE(write_now(*tier, {write_item(6)})[0].is_ok());
  ASSERT_TRUE(read_now(*tier, {read_item(6)})[0].status.is_ok());
  EXPECT_TRUE(same_bytes(6));
}

TEST_F(NvmeTierTest, UnalignedBlocksFallBackToBufferedIo) {
  NvmeRecovery recovered;
  auto tier = open(&recovered);
  ASSERT_NE(tier, nullptr);
  // 1000-byte blocks at odd offsets: O_DIRECT cannot take them, buffered I/O must.
  NvmeTier::WriteItem item{block_key(9), source_.data() + 3, 1000, 3 * kBlock + 1000, 0};
  ASSERT_TRUE(write_now(*tier, {item})[0].is_ok());
  NvmeTier::ReadItem read{block_key(9), destination_.data() + 5, 1000, 3 * kBlock + 1000};
  ASSERT_TRUE(read_now(*tier, {read})[0].status.is_ok());
  EXPECT_EQ(std::memcmp(source_.data() + 3, destination_.data() + 5, 1000), 0);
}

TEST_F(NvmeTierTest, RefusesAnotherFormatVersionNamingBoth) {
  {
    NvmeRecovery recovered;
    ASSERT_NE(open(&recovered), nullptr);
  }
  ASSERT_TRUE(NvmeIndex::overwrite_format_version(dir_.path() + "/index", 99).is_ok());
  NvmeTierOptions options;
  options.dir = dir_.path();
  options.capacity_bytes = kCapacity;
  NvmeRecovery recovered;
  auto tier = NvmeTier::open(options, &recovered);
  ASSERT_FALSE(tier.is_ok());
  EXPECT_EQ(tier.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(tier.status().message().find("format version 99"), std::string::npos)
      << tier.status().to_string();
  EXPECT_NE(tier.status().message().find(fmt::format("format version {}", kNvmeFormatVersion)),
            std::string::npos)
      << tier.status().to_string();
}

// A conversation's record grows by deltas (RocksDB merges), survives a reopen whole,
// and a rewrite (a cut session) replaces what the deltas built.
TEST_F(NvmeTierTest, SessionDeltasAppendAndARewriteReplaces) {
  auto write = [](NvmeTier& tier, NvmeSessionRecord record) {
    std::promise<Status> done;
    tier.write_sessions({std::move(record)}, {}, true, [&](Status s) { done.set_value(s); });
    return done.get_future().get();
  };
  NvmeSessionRecord session;
  session.namespace_name = "uid:1000";
  session.session_id = "long";
  session.layout_digest = 0x1234;
  std::vector<BlockHash> all;
  for (uint32_t i = 0; i < 40; ++i) all.push_back(block_key(i).hash);
  {
    NvmeRecovery recovered;
    auto tier = open(&recovered);
    ASSERT_NE(tier, nullptr);
    session.blocks.assign(all.begin(), all.begin() + 4);
    ASSERT_TRUE(write(*tier, session).is_ok());   // whole
    for (uint32_t turn = 1; turn < 10; ++turn) {  // each turn appends 4
      session.turns = turn;
      session.last_active_wall_ms = 1000 + turn;
      session.append_from = static_cast<uint32_t>(session.blocks.size());
      session.blocks.insert(session.blocks.end(), all.begin() + 4 * turn,
                            all.begin() + 4 * turn + 4);
      ASSERT_TRUE(write(*tier, session).is_ok());
    }
  }
  {
    NvmeRecovery recovered;
    auto tier = open(&recovered);
    ASSERT_NE(tier, nullptr);
    ASSERT_EQ(recovered.sessions.size(), 1u);
    EXPECT_EQ(recovered.sessions[0].blocks, all);
    EXPECT_EQ(recovered.sessions[0].turns, 9u);
    EXPECT_EQ(recovered.sessions[0].last_active_wall_ms, 1009u);
    // Cut at 10 blocks: written whole, then one more delta on top.
    session.append_from.reset();
    session.blocks.assign(all.begin(), all.begin() + 10);
    ASSERT_TRUE(write(*tier, session).is_ok());
    session.append_from = 10;
    session.blocks.push_back(all[39]);
    ASSERT_TRUE(write(*tier, session).is_ok());
  }
  NvmeRecovery recovered;
  auto tier = open(&recovered);
  ASSERT_NE(tier, nullptr);
  ASSERT_EQ(recovered.sessions.size(), 1u);
  std::vector<BlockHash> expected(all.begin(), all.begin() + 10);
  expected.push_back(all[39]);
  EXPECT_EQ(recovered.sessions[0].blocks, expected);
}

// A version-1 store (no session deltas) opens and is upgraded in place.
TEST_F(NvmeTierTest, UpgradesAVersionOneStore) {
  {
    NvmeRecovery recovered;
    auto tier = open(&recovered);
    ASSERT_NE(tier, nullptr);
    NvmeSessionRecord session;
    session.namespace_name = "uid:1000";
    session.session_id = "old";
    session.blocks = {block_key(1).hash};
    std::promise<Status> done;
    tier->write_sessions({session}, {}, true, [&](Status s) { done.set_value(s); });
    ASSERT_TRUE(done.get_future().get().is_ok());
  }
  ASSERT_TRUE(NvmeIndex::overwrite_format_version(dir_.path() + "/index", 1).is_ok());
  NvmeRecovery recovered;
  auto tier = open(&recovered);
  ASSERT_NE(tier, nullptr);
  ASSERT_EQ(recovered.sessions.size(), 1u);
  EXPECT_EQ(recovered.sessions[0].session_id, "old");
  tier.reset();
  // A store claiming a version above ours is still refused.
  ASSERT_TRUE(NvmeIndex::overwrite_format_version(dir_.path() + "/index", 3).is_ok());
  NvmeTierOptions options;
  options.dir = dir_.path();
  options.capacity_bytes = kCapacity;
  NvmeRecovery again;
  EXPECT_FALSE(NvmeTier::open(options, &again).is_ok());
}

TEST_F(NvmeTierTest, AnExistingTierKeepsItsSlabSize) {
  {
    NvmeRecovery recovered;
    ASSERT_NE(open(&recovered), nullptr);
  }
  NvmeTierOptions options;
  options.dir = dir_.path();
  options.capacity_bytes = kCapacity;
  options.slab_bytes = 2 * kSlab;
  NvmeRecovery recovered;
  auto tier = NvmeTier::open(options, &recovered);
  ASSERT_TRUE(tier.is_ok()) << tier.status().to_string();
  EXPECT_EQ((*tier)->slab_bytes(), kSlab);
}

// A tmpfs of its own, so the test can fill a file system without filling the machine's.
// Mounting needs root: without it the test is skipped, saying why.
class FullFileSystem : public NvmeTierTest {
 protected:
  void SetUp() override {
    NvmeTierTest::SetUp();
    if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
    mount_point_ = dir_.path() + "/fs";
    ASSERT_EQ(::mkdir(mount_point_.c_str(), 0700), 0);
    if (::mount("tmpfs", mount_point_.c_str(), "tmpfs", 0, "size=96m") != 0) {
      GTEST_SKIP() << "mount tmpfs: " << std::strerror(errno);
    }
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_) ::umount2(mount_point_.c_str(), MNT_DETACH);
  }
  NvmeTierOptions options() const {
    NvmeTierOptions options;
    options.dir = mount_point_ + "/nvme";
    options.capacity_bytes = kCapacity;
    options.slab_bytes = kSlab;
    options.heal_first_delay_ms = 5;
    options.heal_max_delay_ms = 20;
    return options;
  }
  // Writes a file until the file system is full.
  void fill(const std::string& name) {
    int fd = ::open((mount_point_ + "/" + name).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    std::vector<char> chunk(4096, 'x');
    while (::write(fd, chunk.data(), chunk.size()) > 0) {
    }
    ::close(fd);
  }

  std::string mount_point_;
  bool mounted_ = false;
};

TEST_F(FullFileSystem, TheIndexReopensOnAFullDiskFromItsReserve) {
  uint64_t stored = 0;
  {
    NvmeRecovery recovered;
    auto tier = NvmeTier::open(options(), &recovered);
    ASSERT_TRUE(tier.is_ok()) << tier.status().to_string();
    ASSERT_TRUE(std::filesystem::exists(options().dir + "/index.reserve"));
    std::memset(source_.data(), 0x5a, kBlock);
    auto written = write_now(**tier, {write_item(0)});
    ASSERT_TRUE(written[0].is_ok()) << written[0].to_string();
    stored = 1;
  }
  fill("filler");
  // Reopening on the full disk uses the reserve's room; the block is still there.
  NvmeRecovery recovered;
  auto tier = NvmeTier::open(options(), &recovered);
  ASSERT_TRUE(tier.is_ok()) << tier.status().to_string();
  EXPECT_EQ(recovered.blocks.size(), stored);
  auto read = read_now(**tier, {read_item(0)});
  ASSERT_TRUE(read[0].status.is_ok()) << read[0].status.to_string();
  EXPECT_TRUE(same_bytes(0));
}

// Below the index's room the tier degrades (read-only: what it holds still reads), and
// it heals by itself once room comes back.
TEST_F(FullFileSystem, WritesOnAFullDiskDegradeTheTierUntilThereIsRoomAgain) {
  NvmeRecovery recovered;
  auto tier = NvmeTier::open(options(), &recovered);
  ASSERT_TRUE(tier.is_ok()) << tier.status().to_string();
  std::memset(source_.data(), 0x3c, 2 * kBlock);
  ASSERT_TRUE(write_now(**tier, {write_item(1)})[0].is_ok());
  fill("filler");
  auto refused = write_now(**tier, {write_item(0)});
  EXPECT_EQ(refused[0].code(), StatusCode::kResourceExhausted) << refused[0].to_string();
  EXPECT_TRUE(refused[0].retryable());
  EXPECT_NE(refused[0].message().find("bytes free"), std::string::npos) << refused[0].message();
  EXPECT_TRUE((*tier)->degraded());
  // Tries at healing fail while the disk stays full, saying why.
  const auto tried_until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((*tier)->health().heal_attempts < 2 && std::chrono::steady_clock::now() < tried_until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const NvmeHealth full = (*tier)->health();
  EXPECT_TRUE(full.degraded);
  EXPECT_GE(full.heal_attempts, 2u);
  EXPECT_NE(full.reason.message().find("bytes free"), std::string::npos) << full.reason.message();
  auto read = read_now(**tier, {read_item(1)});
  ASSERT_TRUE(read[0].status.is_ok()) << read[0].status.to_string();
  EXPECT_TRUE(same_bytes(1));
  ASSERT_EQ(::unlink((mount_point_ + "/filler").c_str()), 0);
  const auto healed_until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((*tier)->degraded() && std::chrono::steady_clock::now() < healed_until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_FALSE((*tier)->degraded());
  EXPECT_EQ((*tier)->health().heals, 1u);
  auto written = write_now(**tier, {write_item(0)});
  ASSERT_TRUE(written[0].is_ok()) << written[0].to_string();
  read = read_now(**tier, {read_item(0)});
  ASSERT_TRUE(read[0].status.is_ok()) << read[0].status.to_string();
  EXPECT_TRUE(same_bytes(0));
}

TEST_F(FullFileSystem, OpeningWithNoRoomAndNoReserveIsRefusedNamingTheFreeBytes) {
  {
    NvmeRecovery recovered;
    ASSERT_TRUE(NvmeTier::open(options(), &recovered).is_ok());
  }
  ASSERT_EQ(::unlink((options().dir + "/index.reserve").c_str()), 0);
  fill("filler");
  NvmeRecovery recovered;
  auto tier = NvmeTier::open(options(), &recovered);
  ASSERT_FALSE(tier.is_ok());
  EXPECT_EQ(tier.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(tier.status().message().find("bytes free"), std::string::npos)
      << tier.status().message();
}

}  // namespace
}  // namespace kvtier
