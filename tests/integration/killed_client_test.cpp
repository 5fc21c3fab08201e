// Engines SIGKILLed in the middle of a large Save or Load: the daemon finishes or
// abandons their copies without leaking a pin, a slot or a connection, and nothing it
// serves afterwards is corrupt.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include "tests/integration/daemon_harness.h"

namespace kvtier::integration {
namespace {

constexpr size_t kBlocks = 32;  // of 2 MiB: 64 MiB per request

class KilledClient : public DaemonTest {
 protected:
  // Room for every session below without eviction (HBM 32 + RAM 128 blocks).
  std::vector<std::string> daemon_flags() const override {
    return {"--hbm-bytes", "64MiB", "--ram-bytes", "256MiB", "--copy-threads", "2"};
  }
};

// A child engine that sends one large request, tells the parent through a pipe that
// the request is on the wire, and then waits to be killed.
enum class Request { kSave, kLoad };

pid_t start_engine_to_kill(const std::string& socket_path, Request kind, const std::string& session,
                           int ready_fd) {
  return fork_child([&]() -> int {
    auto engine = Engine::connect(socket_path, example_shape(kBlocks), "doomed-engine");
    if (!engine.is_ok()) return child_failure(10, "connect", engine.status());
    const auto refs = Engine::refs(PagedCache::chain_hashes(session, kBlocks), 0);
    if (kind == Request::kSave) engine->fill(refs);
    // The replies are never read: the process dies first.
    if (kind == Request::kSave) {
      [[maybe_unused]] auto pending = engine->client->save_async(session, refs, true);
    } else {
      [[maybe_unused]] auto pending = engine->client->load_async(session, refs);
    }
    if (::write(ready_fd, "s", 1) != 1) return child_failure(11, "signal the parent");
    ::pause();  // until SIGKILL
    return child_failure(12, "survived past pause()");
  });
}

// Runs one doomed engine and SIGKILLs it as soon as its request has been sent.
::testing::AssertionResult KillMidRequest(const Daemon& daemon, Request kind,
                                          const std::string& session) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return ::testing::AssertionFailure() << "pipe2 failed";
  UniqueFd ready_read(fds[0]), ready_write(fds[1]);
  pid_t child = start_engine_to_kill(daemon.socket_path(), kind, session, ready_write.get());
  ready_write.reset();  // so a child that dies early shows up as end of file
  pollfd ready{ready_read.get(), POLLIN, 0};
  char byte = 0;
  bool sent = ::poll(&ready, 1, static_cast<int>(kDeadline.count())) == 1 &&
              ::read(ready_read.get(), &byte, 1) == 1;
  ::kill(child, SIGKILL);
  ExitStatus status = wait_for_exit(child);
  if (!sent) {
    return ::testing::AssertionFailure()
           << "the engine never sent its request; it " << status.describe();
  }
  if (status.signal != SIGKILL) {
    return ::testing::AssertionFailure()
           << "the engine was not killed by the test; it " << status.describe();
  }
  return ::testing::AssertionSuccess();
}

TEST_F(KilledClient, MidSaveAndMidLoadLeakNothingAndCorruptNothing) {
  const PagedCacheShape shape = example_shape(2 * kBlocks);
  // A complete session for the doomed loaders to read.
  {
    auto saver = Engine::connect(daemon_->socket_path(), shape, "saver");
    ASSERT_TRUE(saver.is_ok()) << saver.status().to_string();
    const auto refs = Engine::refs(PagedCache::chain_hashes("complete", kBlocks), 0);
    saver->fill(refs);
    auto saved = saver->client->save("complete", refs, true);
    ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
    ASSERT_EQ(saved->stored, kBlocks);
  }

  const std::vector<std::string> killed_saves = {"killed-save-1", "killed-save-2", "killed-save-3"};
  for (const std::string& session : killed_saves) {
    EXPECT_TRUE(KillMidRequest(*daemon_, Request::kSave, session)) << session;
    EXPECT_TRUE(KillMidRequest(*daemon_, Request::kLoad, "complete")) << "load after " << session;
  }
  // Several killed loads of the same blocks at once (pins stacked on one block).
  EXPECT_TRUE(KillMidRequest(*daemon_, Request::kLoad, "complete"));
  EXPECT_TRUE(KillMidRequest(*daemon_, Request::kLoad, "complete"));

  // Every copy finishes, every pin is released, every dead connection is closed
  // (the only one left is the poller's own).
  auto settled = daemon_->wait_for_stats([](const StatsInfo& s) {
    return s.copies_in_flight == 0 && s.pinned_blocks == 0 && s.connections == 1;
  });
  ASSERT_TRUE(settled.is_ok()) << settled.status().to_string();
  EXPECT_TRUE(NoLeakedSlots(*settled, shape.block_bytes()));
  EXPECT_GE(total_blocks(*settled), kBlocks);
  EXPECT_LE(total_blocks(*settled), kBlocks * (1 + killed_saves.size()));
  EXPECT_EQ(settled->blocks_evicted, 0u);

  // A fresh engine: whatever of each killed session is visible loads bit-exact.
  auto reader = Engine::connect(daemon_->socket_path(), shape, "reader");
  ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
  uint64_t visible_blocks = 0;
  for (const std::string& session : killed_saves) {
    SCOPED_TRACE(session);
    const auto hashes = PagedCache::chain_hashes(session, kBlocks);
    auto found = reader->client->lookup(hashes);
    ASSERT_TRUE(found.is_ok()) << found.status().to_string();
    visible_blocks += found->hit_count;
    reader->cache.wipe();
    const auto refs = Engine::refs(std::span(hashes).first(found->hit_count), kBlocks);
    auto loaded = reader->client->load(session, refs);
    ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
    EXPECT_EQ(loaded->loaded_count, found->hit_count) << loaded->stop_reason.to_string();
    EXPECT_EQ(reader->count_verified(refs, loaded->loaded_count), loaded->loaded_count)
        << "a block of a killed engine's Save came back corrupt";
  }
  EXPECT_EQ(visible_blocks + kBlocks, total_blocks(*settled))
      << "blocks are held that no lookup can reach";

  // The session the killed loaders read is intact.
  const auto hashes = PagedCache::chain_hashes("complete", kBlocks);
  const auto refs = Engine::refs(hashes, kBlocks);
  reader->cache.wipe();
  auto loaded = reader->client->load("complete", refs);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->loaded_count, kBlocks) << loaded->stop_reason.to_string();
  EXPECT_EQ(reader->count_verified(refs, loaded->loaded_count), kBlocks);

  settled = daemon_->wait_until_settled();
  ASSERT_TRUE(settled.is_ok()) << settled.status().to_string();
  EXPECT_TRUE(NoLeakedSlots(*settled, shape.block_bytes()));
}

}  // namespace
}  // namespace kvtier::integration
