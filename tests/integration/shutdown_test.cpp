// Clean shutdown: SIGTERM while engines are connected and a large copy is in flight
// still ends with exit code 0, and the engine sees either its reply or a closed
// connection, never a hang.
#include <gtest/gtest.h>

#include "tests/integration/daemon_harness.h"

namespace kvtier::integration {
namespace {

TEST(Shutdown, SigtermWithACopyInFlightExitsZero) {
  auto daemon =
      Daemon::start({"--hbm-bytes", "64MiB", "--ram-bytes", "64MiB", "--copy-threads", "2"});
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  constexpr size_t kBlocks = 32;  // 64 MiB in one Save
  auto engine = Engine::connect((*daemon)->socket_path(), example_shape(kBlocks), "interrupted");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  auto idle = Engine::connect((*daemon)->socket_path(), small_shape(), "idle-bystander");
  ASSERT_TRUE(idle.is_ok()) << idle.status().to_string();
  const auto refs = Engine::refs(PagedCache::chain_hashes("interrupted", kBlocks), 0);
  engine->fill(refs);

  auto pending = engine->client->save_async("interrupted", refs, true);
  ExitStatus stopped = (*daemon)->stop();
  EXPECT_TRUE(stopped.ok()) << "kvtierd " << stopped.describe();
  auto saved = pending.wait();
  EXPECT_TRUE(saved.is_ok() || saved.status().code() == StatusCode::kUnavailable)
      << saved.status().to_string();
  // The bystander's connection was closed, not left dangling.
  EXPECT_TRUE(IsError(idle->client->stats().status(), StatusCode::kUnavailable, ""));
  // The socket file is gone, so the next daemon can take the path.
  EXPECT_FALSE(Client::connect((*daemon)->socket_path()).is_ok());
}

}  // namespace
}  // namespace kvtier::integration
