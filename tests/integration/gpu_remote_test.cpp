// The remote tier on the CUDA backend: blocks an engine saved into GPU memory are
// written behind at the end of each turn, staged through pinned host memory by the
// Device (they stay in HBM), and a second kvtierd resumes the conversation from the
// cluster for a new engine process, bit-exact.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "tests/integration/gpu_harness.h"
#include "tests/integration/remote_harness.h"

namespace kvtier::integration {
namespace {

std::vector<std::string> with_remote(std::vector<std::string> flags,
                                     const remote::LocalRedisCluster& redis) {
  // HBM keeps the session: what reaches the cluster came out of GPU memory.
  flags.insert(flags.end(), {"--remote-nodes", nodes_flag(redis.seeds()), "--hbm-idle-ms", "10m"});
  return flags;
}

TEST(GpuRemote, BlocksInGpuMemoryAreWrittenBehindAndResumeOnAnotherNode) {
  remote::LocalRedisCluster redis;
  ASSERT_TRUE(redis.start().is_ok());
  auto node_a = start_cuda_daemon(with_remote(cuda_daemon_flags(), redis));
  if (!node_a) return;
  auto connected = node_a->wait_for_stats([](const StatsInfo& s) { return s.remote.connected; });
  ASSERT_TRUE(connected.is_ok()) << connected.status().to_string();

  const GpuEngineRun saver{
      .gpu = 0, .memory = "ipc", .session = "gpu-handoff", .mode = GpuEngineRun::Mode::kSaveOnly};
  ASSERT_TRUE(EngineRoundTripped(run_gpu_engine(node_a->socket_path(), saver), saver));
  const size_t blocks = saver.session_blocks();
  auto written =
      node_a->wait_for_stats([&](const StatsInfo& s) { return s.remote.written_blocks == blocks; });
  ASSERT_TRUE(written.is_ok()) << written.status().to_string();
  EXPECT_EQ(written->remote.deferred_blocks, 0u);
  // Still in GPU memory: nothing was demoted for the write.
  auto in_hbm = wait_for_session_in_tier(node_a->socket_path(), saver.session, Tier::kHbm, blocks);
  ASSERT_TRUE(in_hbm.is_ok()) << in_hbm.status().to_string();
  // The record follows the blocks.
  auto store = open_store(redis);
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  auto hello = hello_as_cuda_engine(node_a->socket_path());
  ASSERT_TRUE(hello.is_ok()) << hello.status().to_string();
  Result<std::string> record = not_found("not yet");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (!(record = (*store)->get_session(hello->namespace_name, saver.session)).is_ok() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(record.is_ok()) << record.status().to_string();

  // Another node, another engine process, other memory: every byte from the cluster.
  auto node_b = start_cuda_daemon(with_remote(cuda_daemon_flags(), redis));
  ASSERT_NE(node_b, nullptr);
  connected = node_b->wait_for_stats([](const StatsInfo& s) { return s.remote.connected; });
  ASSERT_TRUE(connected.is_ok()) << connected.status().to_string();
  const GpuEngineRun loader{
      .gpu = 0, .memory = "vmm", .session = saver.session, .mode = GpuEngineRun::Mode::kVerifyOnly};
  EXPECT_TRUE(EngineRoundTripped(run_gpu_engine(node_b->socket_path(), loader), loader));
  auto stats_b = node_b->wait_for_stats([](const StatsInfo&) { return true; });
  ASSERT_TRUE(stats_b.is_ok()) << stats_b.status().to_string();
  EXPECT_EQ(stats_b->remote.resumed_sessions, 1u);
  EXPECT_EQ(stats_b->remote.fetched_blocks, blocks);

  EXPECT_TRUE(node_a->stop().ok());
  EXPECT_TRUE(node_b->stop().ok());
}

}  // namespace
}  // namespace kvtier::integration
