// What goes wrong on the disk never reaches an engine as wrong bytes:
//  * a byte flipped in the slab file → the Load stops before that block with DataLoss,
//    the block is dropped and counted;
//  * injected ENOSPC/EIO on writes, syncs and reads → clear errors, the daemon keeps
//    serving, and nothing acknowledged as stored is lost;
//  * an I/O error inside the NVMe index's RocksDB → the tier is degraded (read-only,
//    Stats say why), Loads keep reading it, and it heals without a restart.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "tests/integration/nvme_harness.h"
#include "tiers/nvme_index.h"

namespace kvtier::integration {
namespace {

constexpr size_t kBlocks = 8;

std::vector<std::string> with_faults(std::vector<std::string> faults) {
  std::vector<std::string> flags = nvme_tier_flags();
  for (const std::string& fault : faults) flags.insert(flags.end(), {"--fault-nvme", fault});
  return flags;
}

Result<StatsInfo> wait_until_on_nvme(const PersistentDaemon& daemon, size_t blocks) {
  return daemon.wait_for_stats([blocks](const StatsInfo& s) {
    return tier_blocks(s, Tier::kNvme) == blocks && s.copies_in_flight == 0 && s.pinned_blocks == 0;
  });
}

TEST(NvmeCorruption, FlippedByteEndsThePrefixWithDataLossAndDropsTheBlock) {
  ScratchDir scratch;
  const std::string data = scratch.path() + "/data";
  std::string namespace_name;
  uint64_t layout_digest = 0;
  {
    auto daemon = PersistentDaemon::start(scratch.path(), data, nvme_tier_flags());
    ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
    auto engine = Engine::connect((*daemon)->socket_path(), small_shape(32), "victim");
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    namespace_name = engine->hello.namespace_name;
    layout_digest = engine->hello.layout_digest;
    ASSERT_TRUE(save_session(*engine, "victim", kBlocks).is_ok());
    ASSERT_TRUE(wait_until_on_nvme(**daemon, kBlocks).is_ok());
    ASSERT_TRUE((*daemon)->stop().ok());
  }
  // Flip one byte in the middle of block 5's slot, as a failing medium would.
  const BlockHash victim = PagedCache::chain_hashes("victim", kBlocks)[5];
  uint64_t offset = 0;
  {
    auto index = NvmeIndex::open(data + "/nvme/index", 1);
    ASSERT_TRUE(index.is_ok()) << index.status().to_string();
    auto record = (*index)->get_block({namespace_name, layout_digest, victim});
    ASSERT_TRUE(record.is_ok() && record->has_value());
    offset = (*record)->offset;
  }
  {
    UniqueFd fd(::open((data + "/nvme/slabs.dat").c_str(), O_RDWR));
    ASSERT_TRUE(fd.valid());
    const off_t at = static_cast<off_t>(offset + small_shape().block_bytes() / 2);
    char byte = 0;
    ASSERT_EQ(::pread(fd.get(), &byte, 1, at), 1);
    byte = static_cast<char>(byte ^ 0x10);
    ASSERT_EQ(::pwrite(fd.get(), &byte, 1, at), 1);
  }

  auto daemon = PersistentDaemon::start(scratch.path(), data, nvme_tier_flags());
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  auto engine = Engine::connect((*daemon)->socket_path(), small_shape(32), "reader");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  auto check = load_session(*engine, "victim", kBlocks, 16);
  ASSERT_TRUE(check.is_ok()) << check.status().to_string();
  EXPECT_EQ(check->loaded, 5u) << check->describe();
  EXPECT_EQ(check->bit_exact, 5u) << check->describe();
  EXPECT_EQ(check->stop_reason.code(), StatusCode::kDataLoss) << check->describe();
  EXPECT_FALSE(check->stop_reason.retryable());  // the bytes are known wrong: recompute
  EXPECT_NE(check->stop_reason.message().find("checksum mismatch"), std::string::npos)
      << check->describe();
  auto stats = engine->client->stats();
  ASSERT_TRUE(stats.is_ok());
  EXPECT_EQ(stats->data_loss_blocks, 1u);
  // Dropped: the next Load reports it missing, and the session ends before it.
  auto again = load_session(*engine, "victim", kBlocks, 16);
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->loaded, 5u) << again->describe();
  EXPECT_EQ(again->bit_exact, 5u) << again->describe();
  EXPECT_EQ(again->stop_reason.code(), StatusCode::kNotFound) << again->describe();
  auto sessions = engine->client->list_sessions();
  ASSERT_TRUE(sessions.is_ok() && sessions->size() == 1);
  EXPECT_EQ((*sessions)[0].blocks, 5u);
  EXPECT_TRUE((*daemon)->stop().ok());
}

TEST(NvmeFaults, WritesThatKeepFailingLeaveBlocksInRamAndTheDaemonServing) {
  ScratchDir scratch;
  auto daemon = PersistentDaemon::start(scratch.path(), scratch.path() + "/data",
                                        with_faults({"write:1+:ENOSPC"}));
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  auto engine = Engine::connect((*daemon)->socket_path(), small_shape(32), "full-disk");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  ASSERT_TRUE(save_session(*engine, "kept", kBlocks).is_ok());
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while ((*daemon)->log().find("stay where they were") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    auto stats = engine->client->stats();  // a round trip, not a sleep
    ASSERT_TRUE(stats.is_ok());
  }
  EXPECT_NE((*daemon)->log().find("No space left on device"), std::string::npos)
      << (*daemon)->log();
  auto stats = engine->client->stats();
  ASSERT_TRUE(stats.is_ok());
  EXPECT_GE(stats->nvme.degradations, 1u);  // and never heals: every write fails
  EXPECT_EQ(tier_blocks(*stats, Tier::kNvme), 0u);
  EXPECT_EQ(total_blocks(*stats), kBlocks);
  auto check = load_session(*engine, "kept", kBlocks, 16);
  ASSERT_TRUE(check.is_ok()) << check.status().to_string();
  EXPECT_EQ(check->bit_exact, kBlocks) << check->describe();
  // The daemon keeps serving other work.
  auto other = Engine::connect((*daemon)->socket_path(), small_shape(32), "bystander");
  ASSERT_TRUE(other.is_ok());
  ASSERT_TRUE(save_session(*other, "after-enospc", 4).is_ok());
  auto after = load_session(*other, "after-enospc", 4, 16);
  ASSERT_TRUE(after.is_ok());
  EXPECT_EQ(after->bit_exact, 4u) << after->describe();
  // The drain cannot write either; the daemon still exits cleanly.
  EXPECT_TRUE((*daemon)->stop().ok());
}

TEST(NvmeFaults, OneFailedWriteOrSyncIsRetriedAndEverythingArrives) {
  for (const char* fault : {"write:2:EIO", "sync:1:EIO"}) {
    SCOPED_TRACE(fault);
    ScratchDir scratch;
    auto daemon =
        PersistentDaemon::start(scratch.path(), scratch.path() + "/data", with_faults({fault}));
    ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
    auto engine = Engine::connect((*daemon)->socket_path(), small_shape(32), "retry");
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    ASSERT_TRUE(save_session(*engine, "retried", kBlocks).is_ok());
    // After the backoff the failed blocks are written again.
    ASSERT_TRUE(wait_until_on_nvme(**daemon, kBlocks).is_ok());
    EXPECT_NE((*daemon)->log().find("Input/output error"), std::string::npos);
    auto check = load_session(*engine, "retried", kBlocks, 16);
    ASSERT_TRUE(check.is_ok()) << check.status().to_string();
    EXPECT_EQ(check->loaded, kBlocks) << check->describe();
    EXPECT_EQ(check->bit_exact, kBlocks) << check->describe();
    EXPECT_TRUE((*daemon)->stop().ok());
  }
}

TEST(NvmeFaults, FailedReadsAreReportedAndTheBlockStaysForARetry) {
  for (const char* fault : {"read:1:EIO", "read:1:ENOSPC"}) {
    SCOPED_TRACE(fault);
    ScratchDir scratch;
    auto daemon =
        PersistentDaemon::start(scratch.path(), scratch.path() + "/data", with_faults({fault}));
    ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
    auto engine = Engine::connect((*daemon)->socket_path(), small_shape(32), "reader");
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    ASSERT_TRUE(save_session(*engine, "unlucky", kBlocks).is_ok());
    ASSERT_TRUE(wait_until_on_nvme(**daemon, kBlocks).is_ok());
    // The first read of the Load's batch is block 0's: the prefix is empty.
    auto failed = load_session(*engine, "unlucky", kBlocks, 16);
    ASSERT_TRUE(failed.is_ok()) << failed.status().to_string();
    EXPECT_EQ(failed->loaded, 0u) << failed->describe();
    // Both faults pass (an EIO is the device failing one I/O, not bytes known wrong):
    // the stop reason says so across the wire, and the retry below succeeds.
    const StatusCode expected = std::string(fault).ends_with("EIO")
                                    ? StatusCode::kUnavailable
                                    : StatusCode::kResourceExhausted;
    EXPECT_EQ(failed->stop_reason.code(), expected) << failed->describe();
    EXPECT_TRUE(failed->stop_reason.retryable()) << failed->describe();
    EXPECT_NE(failed->stop_reason.message().find("injected fault"), std::string::npos)
        << failed->describe();
    auto stats = engine->client->stats();
    ASSERT_TRUE(stats.is_ok());
    EXPECT_EQ(stats->data_loss_blocks, 0u);  // the bytes may be fine: not dropped
    auto retried = load_session(*engine, "unlucky", kBlocks, 16);
    ASSERT_TRUE(retried.is_ok());
    EXPECT_EQ(retried->loaded, kBlocks) << retried->describe();
    EXPECT_EQ(retried->bit_exact, kBlocks) << retried->describe();
    EXPECT_TRUE((*daemon)->stop().ok());
  }
}

TEST(NvmeFaults, AnIndexIoErrorDegradesTheTierAndItHealsWithoutARestart) {
  ScratchDir scratch;
  // Index operations 3 and 4 fail (a RocksDB write, then the first try at healing).
  auto daemon = PersistentDaemon::start(scratch.path(), scratch.path() + "/data",
                                        with_faults({"index:3-4:EIO"}));
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  auto engine = Engine::connect((*daemon)->socket_path(), small_shape(32), "healing");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const std::vector<std::string> sessions = {"first", "second", "third"};
  for (const std::string& session : sessions) {
    ASSERT_TRUE(save_session(*engine, session, kBlocks).is_ok());
  }
  // The faults count RocksDB's file writes, and how many the demotions take depends on
  // how they batch (on a loaded machine one write may carry them all): more idle
  // sessions go down until the third write has failed.
  const auto is_degraded = [](const StatsInfo& s) {
    return s.nvme.configured && s.nvme.degradations >= 1;
  };
  auto degraded = (*daemon)->wait_for_stats(is_degraded, std::chrono::seconds(5));
  for (int more = 0; !degraded.is_ok() && more < 8; ++more) {
    ASSERT_TRUE(save_session(*engine, "more-" + std::to_string(more), kBlocks).is_ok());
    degraded = (*daemon)->wait_for_stats(is_degraded, std::chrono::seconds(5));
  }
  ASSERT_TRUE(degraded.is_ok()) << degraded.status().to_string() << (*daemon)->log();
  // While it is degraded or after: every acknowledged block loads bit-exact (from
  // whichever tier holds it); none is lost.
  for (const std::string& session : sessions) {
    auto check = load_session(*engine, session, kBlocks, 16);
    ASSERT_TRUE(check.is_ok()) << check.status().to_string();
    EXPECT_EQ(check->bit_exact, kBlocks) << session << ": " << check->describe();
  }
  // (The Loads began those sessions' turns: they stay in RAM, as active sessions do.)
  auto healed = (*daemon)->wait_for_stats(
      [](const StatsInfo& s) { return !s.nvme.degraded && s.nvme.heals >= 1; });
  ASSERT_TRUE(healed.is_ok()) << healed.status().to_string() << (*daemon)->log();
  EXPECT_EQ(healed->nvme.degradations, 1u);
  EXPECT_GE(healed->nvme.heal_attempts, 2u);
  EXPECT_NE((*daemon)->log().find("healed after"), std::string::npos) << (*daemon)->log();
  // After healing it takes new blocks (an idle session's go down to it), and everything
  // survives a restart (the drain writes the active sessions' blocks).
  ASSERT_TRUE(save_session(*engine, "after", kBlocks).is_ok());
  auto written = (*daemon)->wait_for_stats([](const StatsInfo& s) {
    return tier_blocks(s, Tier::kNvme) >= kBlocks && s.copies_in_flight == 0;
  });
  ASSERT_TRUE(written.is_ok()) << written.status().to_string() << (*daemon)->log();
  ASSERT_TRUE((*daemon)->stop().ok());
  auto restarted =
      PersistentDaemon::start(scratch.path(), scratch.path() + "/data", nvme_tier_flags());
  ASSERT_TRUE(restarted.is_ok()) << restarted.status().to_string();
  auto again = Engine::connect((*restarted)->socket_path(), small_shape(32), "healing");
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  for (const char* session : {"first", "second", "third", "after"}) {
    auto check = load_session(*again, session, kBlocks, 16);
    ASSERT_TRUE(check.is_ok()) << check.status().to_string();
    EXPECT_EQ(check->bit_exact, kBlocks) << session << ": " << check->describe();
  }
  EXPECT_TRUE((*restarted)->stop().ok());
}

}  // namespace
}  // namespace kvtier::integration
