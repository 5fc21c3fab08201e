// A session saved by one engine process is loaded bit-exact by another process with
// the same layout, and is invisible to a process whose layout differs.
#include <gtest/gtest.h>

#include "tests/integration/daemon_harness.h"

namespace kvtier::integration {
namespace {

// The example engine saves 3 turns × 4 blocks; --num-blocks 24 leaves room for the
// load to restore into different engine blocks.
constexpr size_t kSessionBlocks = 12;
const std::vector<std::string> kEngineShape = {"--turns",      "3", "--blocks-per-turn", "4",
                                               "--num-blocks", "24"};

std::vector<std::string> engine_args(const std::string& mode, const std::string& session) {
  std::vector<std::string> args = {mode, "--session", session};
  args.insert(args.end(), kEngineShape.begin(), kEngineShape.end());
  return args;
}

TEST(SessionRoundTrip, SavedByOneEngineProcessLoadsBitExactInAnother) {
  auto daemon = Daemon::start();
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();

  const std::string session = "conversation-A";
  ProcessResult saver = (*daemon)->run_example_engine(engine_args("--save-only", session));
  ASSERT_TRUE(saver.status.ok()) << saver.describe();
  EXPECT_NE(saver.stdout_text.find("12 blocks"), std::string::npos) << saver.describe();

  ProcessResult verifier = (*daemon)->run_example_engine(engine_args("--verify-only", session));
  ASSERT_TRUE(verifier.status.ok()) << verifier.describe();
  EXPECT_NE(verifier.stdout_text.find("lookup hit 12/12, loaded 12, bit-exact 12"),
            std::string::npos)
      << verifier.describe();

  // A verifier for a session nobody saved must fail: the exit code means something.
  ProcessResult unknown =
      (*daemon)->run_example_engine(engine_args("--verify-only", "never-saved"));
  EXPECT_TRUE(unknown.status.exited && unknown.status.code != 0) << unknown.describe();

  auto settled = (*daemon)->wait_until_settled();
  ASSERT_TRUE(settled.is_ok()) << settled.status().to_string();
  EXPECT_EQ(total_blocks(*settled), kSessionBlocks);
  EXPECT_TRUE(NoLeakedSlots(*settled, example_shape(24).block_bytes()));

  ExitStatus stopped = (*daemon)->stop();
  EXPECT_TRUE(stopped.ok()) << "kvtierd " << stopped.describe();
}

TEST(SessionRoundTrip, DifferentLayoutNeverSharesBlocks) {
  auto daemon = Daemon::start();
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();

  const std::string session = "conversation-B";
  ProcessResult saver = (*daemon)->run_example_engine(engine_args("--save-only", session));
  ASSERT_TRUE(saver.status.ok()) << saver.describe();
  const std::vector<BlockHash> hashes = PagedCache::chain_hashes(session, kSessionBlocks);

  // Another model in a forked engine process: same hashes, different layout digest.
  pid_t other_model = fork_child([&]() -> int {
    PagedCacheShape shape = example_shape(24);
    shape.model_id = "other";
    auto engine = Engine::connect((*daemon)->socket_path(), shape, "other-model");
    if (!engine.is_ok()) return child_failure(10, "connect", engine.status());
    auto found = engine->client->lookup(hashes);
    if (!found.is_ok()) return child_failure(11, "lookup", found.status());
    if (found->hit_count != 0) {
      return child_failure(
          12, fmt::format("lookup under another layout hit {} blocks", found->hit_count));
    }
    auto refs = Engine::refs(hashes, 0);
    auto loaded = engine->client->load(session, refs);
    if (!loaded.is_ok()) return child_failure(13, "load", loaded.status());
    if (loaded->loaded_count != 0 || loaded->stop_reason.code() != StatusCode::kNotFound) {
      return child_failure(14, fmt::format("load under another layout restored {} blocks ({})",
                                           loaded->loaded_count, loaded->stop_reason.to_string()));
    }
    return 0;
  });
  ExitStatus other = wait_for_exit(other_model);
  EXPECT_TRUE(other.ok()) << "other-model engine " << other.describe();

  // The same check in this process with a different extra key (e.g. a LoRA adapter).
  {
    auto cache = PagedCache::create(example_shape(24));
    ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
    LayoutSpec layout = cache->layout();
    layout.extra_key = "lora:adapter-7";
    auto client = (*daemon)->connect();
    ASSERT_TRUE(client.is_ok()) << client.status().to_string();
    auto hello = (*client)->hello(layout, "lora-engine");
    ASSERT_TRUE(hello.is_ok()) << hello.status().to_string();
    auto found = (*client)->lookup(hashes);
    ASSERT_TRUE(found.is_ok()) << found.status().to_string();
    EXPECT_EQ(found->hit_count, 0u);
  }

  // Control: the saver's own layout does see every block, so a zero above is the
  // layout's doing and not a broken lookup.
  auto same = Engine::connect((*daemon)->socket_path(), example_shape(24), "same-layout");
  ASSERT_TRUE(same.is_ok()) << same.status().to_string();
  auto found = same->client->lookup(hashes);
  ASSERT_TRUE(found.is_ok()) << found.status().to_string();
  EXPECT_EQ(found->hit_count, kSessionBlocks);
  auto refs = Engine::refs(hashes, 0);
  auto loaded = same->client->load(session, refs);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->loaded_count, kSessionBlocks) << loaded->stop_reason.to_string();
  EXPECT_EQ(same->count_verified(refs, loaded->loaded_count), kSessionBlocks);

  ExitStatus stopped = (*daemon)->stop();
  EXPECT_TRUE(stopped.ok()) << "kvtierd " << stopped.describe();
}

}  // namespace
}  // namespace kvtier::integration
