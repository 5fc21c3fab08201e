// The tiers below HBM on the CUDA backend: a session saved from GPU memory walks down
// HBM → RAM → NVMe (the device's arena, then its pinned pool, then the slab file) after
// its engine exited, and a new engine process on the other GPU, with the other kind of
// memory, loads it back up through the pinned pool bit-exact.
#include <gtest/gtest.h>

#include <string>

#include "tests/integration/gpu_harness.h"
#include "tests/integration/nvme_harness.h"

namespace kvtier::integration {
namespace {

TEST(GpuTiers, SessionDemotedFromHbmThroughRamToNvmeLoadsBitExactIntoAnotherEngine) {
  // Idle thresholds of 0: the session leaves HBM, then RAM, as soon as its turn ends.
  auto daemon = start_cuda_daemon(cuda_nvme_daemon_flags());
  if (!daemon) return;
  auto hello = hello_as_cuda_engine(daemon->socket_path());
  ASSERT_TRUE(hello.is_ok()) << hello.status().to_string();
  const int other_gpu = hello->gpu_uuids.size() > 1 ? 1 : 0;

  const GpuEngineRun saver{
      .gpu = 0, .memory = "ipc", .session = "walks-to-nvme", .mode = GpuEngineRun::Mode::kSaveOnly};
  const ProcessResult saved = run_gpu_engine(daemon->socket_path(), saver);
  ASSERT_TRUE(EngineRoundTripped(saved, saver));

  auto on_nvme = wait_for_session_in_tier(daemon->socket_path(), saver.session, Tier::kNvme,
                                          saver.session_blocks());
  ASSERT_TRUE(on_nvme.is_ok()) << on_nvme.status().to_string();
  EXPECT_EQ(on_nvme->blocks_per_tier[static_cast<size_t>(Tier::kHbm)], 0u);
  EXPECT_EQ(on_nvme->blocks_per_tier[static_cast<size_t>(Tier::kRam)], 0u);
  // Both hops happened, through the device's copies (HBM → pinned RAM) and the NVMe
  // tier's (pinned RAM → slab file).
  ProcessResult status = daemon->run_kvtierctl({"status", "--json"});
  ASSERT_TRUE(status.status.ok()) << status.describe();
  EXPECT_NE(status.stdout_text.find(R"("kind":"demote","from":"hbm","to":"ram")"),
            std::string::npos)
      << status.stdout_text;
  EXPECT_NE(status.stdout_text.find(R"("kind":"demote","from":"ram","to":"nvme")"),
            std::string::npos)
      << status.stdout_text;

  const GpuEngineRun loader{.gpu = other_gpu,
                            .memory = "vmm",
                            .session = saver.session,
                            .mode = GpuEngineRun::Mode::kVerifyOnly};
  EXPECT_TRUE(EngineRoundTripped(run_gpu_engine(daemon->socket_path(), loader), loader));
  auto settled = daemon->wait_until_settled();
  ASSERT_TRUE(settled.is_ok()) << settled.status().to_string();
  EXPECT_TRUE(NoLeakedSlots(*settled, gpu_engine_shape().block_bytes()));

  ExitStatus stopped = daemon->stop();
  EXPECT_TRUE(stopped.ok()) << "kvtierd " << stopped.describe();
}

}  // namespace
}  // namespace kvtier::integration
