// Engines with GPU memory against the real kvtierd --device cuda: two engine processes
// on two GPUs at once; legacy IPC with K and V at offsets inside one allocation; a VMM
// region of many chunks starting inside the first; engines packing blocks with the
// staging kernels; an engine of each kind through a kvtierd restart. Every run saves, wipes and
// loads a session through the daemon and checks every byte and every canary around its tensors.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <regex>
#include <string>
#include <vector>

#include "client/gpu_stager.h"
#include "tests/integration/gpu_harness.h"
#include "tests/integration/nvme_harness.h"

namespace kvtier::integration {
namespace {

// One "registered ..." line of the example engine: a region it shared with the daemon.
struct RegisteredRegion {
  int gpu = -1;
  uint64_t offset_bytes = 0;
  std::string sharing;  // "legacy IPC, a 16.0 MiB allocation" or "VMM, 9 chunks of ..."
};

std::vector<RegisteredRegion> registered_regions(const std::string& engine_stdout) {
  static const std::regex line(
      R"(registered .* of GPU (\d+) \(GPU-[0-9a-f-]+\) at \+(\d+) \((.*)\))");
  std::vector<RegisteredRegion> out;
  for (auto it = std::sregex_iterator(engine_stdout.begin(), engine_stdout.end(), line);
       it != std::sregex_iterator(); ++it) {
    out.push_back({std::stoi((*it)[1]), std::stoull((*it)[2]), (*it)[3]});
  }
  return out;
}

// An engine's blocks go to its own GPU's part of the arena, and Stats says how full
// each part is.
TEST(GpuEngines, AnEnginesBlocksLandInItsOwnGpusPartOfTheArena) {
  // Idle sessions stay in HBM for the test's whole life.
  auto daemon = start_cuda_daemon(with_flag(cuda_daemon_flags(), "--hbm-idle-ms", "600000"));
  if (!daemon) return;
  auto client = daemon->connect();
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  auto before = (*client)->stats();
  ASSERT_TRUE(before.is_ok()) << before.status().to_string();
  if (before->gpus.size() < 2) GTEST_SKIP() << "one GPU";
  for (const auto& gpu : before->gpus) {
    EXPECT_EQ(gpu.hbm_used_bytes, 0u) << gpu.uuid;
    EXPECT_GT(gpu.hbm_capacity_bytes, 0u) << gpu.uuid;
  }
  const GpuEngineRun on_second{
      .gpu = 1, .memory = "vmm", .session = "lands-on-gpu1", .mode = GpuEngineRun::Mode::kSaveOnly};
  ASSERT_TRUE(EngineRoundTripped(run_gpu_engine(daemon->socket_path(), on_second), on_second));
  auto after = (*client)->stats();
  ASSERT_TRUE(after.is_ok()) << after.status().to_string();
  const uint64_t block_bytes = 256 << 10;  // gpu_engine_shape: 4 layers × K/V × 32 KiB
  EXPECT_EQ(after->gpus[1].hbm_used_bytes, on_second.session_blocks() * block_bytes);
  EXPECT_EQ(after->gpus[0].hbm_used_bytes, 0u);
  const GpuEngineRun on_first{
      .gpu = 0, .memory = "ipc", .session = "lands-on-gpu0", .mode = GpuEngineRun::Mode::kSaveOnly};
  ASSERT_TRUE(EngineRoundTripped(run_gpu_engine(daemon->socket_path(), on_first), on_first));
  auto both = (*client)->stats();
  ASSERT_TRUE(both.is_ok()) << both.status().to_string();
  EXPECT_EQ(both->gpus[0].hbm_used_bytes, on_first.session_blocks() * block_bytes);
  EXPECT_EQ(both->gpus[1].hbm_used_bytes, on_second.session_blocks() * block_bytes);
}

TEST(GpuEngines, TwoEnginesOnTwoGpusSaveAndLoadThroughOneDaemonAtOnce) {
  auto daemon = start_cuda_daemon(cuda_daemon_flags());
  if (!daemon) return;
  auto hello = hello_as_cuda_engine(daemon->socket_path());
  ASSERT_TRUE(hello.is_ok()) << hello.status().to_string();
  if (cuda_driver_under_test() == CudaDriver::kFake) {
    ASSERT_GE(hello->gpu_uuids.size(), 2u) << "the fake driver has two GPUs by default";
  }
  // A one-GPU machine runs both engines on its GPU.
  const int second_gpu = hello->gpu_uuids.size() > 1 ? 1 : 0;

  const GpuEngineRun first{.gpu = 0, .memory = "ipc", .session = "engine-on-gpu0"};
  const GpuEngineRun second{.gpu = second_gpu, .memory = "vmm", .session = "engine-on-gpu1"};
  auto a = BackgroundProcess::start(first.args(daemon->socket_path()));
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  auto b = BackgroundProcess::start(second.args(daemon->socket_path()));
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  const ProcessResult a_result = (*a)->finish();
  const ProcessResult b_result = (*b)->finish();
  EXPECT_TRUE(EngineRoundTripped(a_result, first));
  EXPECT_TRUE(EngineRoundTripped(b_result, second));
  for (const RegisteredRegion& region : registered_regions(a_result.stdout_text)) {
    EXPECT_EQ(region.gpu, 0) << a_result.stdout_text;
  }
  const auto b_regions = registered_regions(b_result.stdout_text);
  ASSERT_EQ(b_regions.size(), 1u) << b_result.stdout_text;
  EXPECT_EQ(b_regions[0].gpu, second_gpu);

  // Each session is one set of blocks whichever GPU saved it: the first engine's
  // session loads bit-exact into VMM memory on the other GPU.
  const GpuEngineRun across{.gpu = second_gpu,
                            .memory = "vmm",
                            .session = first.session,
                            .mode = GpuEngineRun::Mode::kVerifyOnly};
  EXPECT_TRUE(EngineRoundTripped(run_gpu_engine(daemon->socket_path(), across), across));

  ExitStatus stopped = daemon->stop();
  EXPECT_TRUE(stopped.ok()) << "kvtierd " << stopped.describe();
}

TEST(GpuEngines, LegacyIpcWithKAndVAtOffsetsInOneAllocationLeavesCanariesIntact) {
  auto daemon = start_cuda_daemon(cuda_daemon_flags());
  if (!daemon) return;
  const GpuEngineRun run{.gpu = 0, .memory = "ipc", .session = "kv-at-offsets"};
  const ProcessResult result = run_gpu_engine(daemon->socket_path(), run);
  EXPECT_TRUE(EngineRoundTripped(result, run));

  // K and V are two regions of one allocation, both at non-zero offsets, V after K.
  const auto regions = registered_regions(result.stdout_text);
  ASSERT_EQ(regions.size(), 2u) << result.stdout_text;
  for (const RegisteredRegion& region : regions) {
    EXPECT_NE(region.sharing.find("legacy IPC"), std::string::npos) << region.sharing;
    EXPECT_GT(region.offset_bytes, 0u);
  }
  EXPECT_EQ(regions[0].sharing, regions[1].sharing) << "K and V share one allocation";
  EXPECT_GT(regions[1].offset_bytes, regions[0].offset_bytes);

  ExitStatus stopped = daemon->stop();
  EXPECT_TRUE(stopped.ok()) << "kvtierd " << stopped.describe();
}

TEST(GpuEngines, VmmRegionOfEightOrMoreChunksStartingAtAnOffsetRoundTrips) {
  auto daemon = start_cuda_daemon(cuda_daemon_flags());
  if (!daemon) return;
  const GpuEngineRun run{.gpu = 0, .memory = "vmm", .session = "vmm-chunks"};
  const ProcessResult result = run_gpu_engine(daemon->socket_path(), run);
  EXPECT_TRUE(EngineRoundTripped(result, run));

  const auto regions = registered_regions(result.stdout_text);
  ASSERT_EQ(regions.size(), 1u) << result.stdout_text;
  std::smatch chunks;
  ASSERT_TRUE(std::regex_search(regions[0].sharing, chunks, std::regex(R"(VMM, (\d+) chunks)")))
      << regions[0].sharing;
  EXPECT_GE(std::stoul(chunks[1]), 8u) << regions[0].sharing;
  EXPECT_GT(regions[0].offset_bytes, 0u);

  ExitStatus stopped = daemon->stop();
  EXPECT_TRUE(stopped.ok()) << "kvtierd " << stopped.describe();
}

// The staging kernels (client/gpu_stager.h): an engine packs its blocks into a staging
// buffer with the gather kernel and unpacks Loads with the scatter kernel, whole blocks
// or layer by layer, in legacy-IPC and VMM memory; what it saves, a plane-copying engine
// loads bit-exact, and the other way round (blocks are the same bytes either way).
TEST(GpuEngines, StagingKernelsRoundTripAndShareBlocksWithPlaneCopyingEngines) {
  if (!GpuStager::kernels_built()) GTEST_SKIP() << "built without nvcc: no staging kernels";
  auto daemon = start_cuda_daemon(cuda_daemon_flags());
  if (!daemon) return;
  // A ring of 64 MiB holds a whole request; one of 3 blocks (768 KiB) makes each Save
  // and Load stream through it in chunks, and a layer-wise Load wait for ring space.
  for (const std::string memory : {"ipc", "vmm"}) {
    for (bool layer_wise : {false, true}) {
      for (uint64_t ring : {uint64_t{0}, uint64_t{768} << 10}) {
        const std::string name = memory + (layer_wise ? "-layers" : "") + (ring ? "-ring" : "");
        SCOPED_TRACE(name);
        const GpuEngineRun run{.gpu = 0,
                               .memory = memory,
                               .session = "staged-" + name,
                               .staging_kernels = true,
                               .layer_wise = layer_wise,
                               .staging_ring_bytes = ring};
        EXPECT_TRUE(EngineRoundTripped(run_gpu_engine(daemon->socket_path(), run), run));
      }
    }
  }
  // Saved by kernels, loaded by plane copies; saved by plane copies, loaded by kernels.
  for (bool kernels_save : {true, false}) {
    SCOPED_TRACE(kernels_save ? "kernels save" : "kernels load");
    const std::string session = kernels_save ? "kernel-saved" : "copy-saved";
    const GpuEngineRun save{.gpu = 0,
                            .memory = "ipc",
                            .session = session,
                            .mode = GpuEngineRun::Mode::kSaveOnly,
                            .staging_kernels = kernels_save};
    ASSERT_TRUE(EngineRoundTripped(run_gpu_engine(daemon->socket_path(), save), save));
    const GpuEngineRun load{.gpu = 0,
                            .memory = "vmm",
                            .session = session,
                            .mode = GpuEngineRun::Mode::kVerifyOnly,
                            .staging_kernels = !kernels_save};
    EXPECT_TRUE(EngineRoundTripped(run_gpu_engine(daemon->socket_path(), load), load));
  }
  ExitStatus stopped = daemon->stop();
  EXPECT_TRUE(stopped.ok()) << "kvtierd " << stopped.describe();
}

// kvtierd restarts (SIGTERM: the session drains to NVMe) while an engine process with
// its cache in GPU memory waits between saving and loading. Its client re-registers the
// region from what it kept (the IPC handle, or duplicates of the VMM chunks' fds) on
// the new daemon, and the load lands bit-exact in the same GPU memory.
TEST(GpuEngines, EngineReRegistersItsGpuMemoryAfterKvtierdRestarts) {
  for (const std::string memory : {"ipc", "vmm"}) {
    SCOPED_TRACE(memory);
    auto daemon = start_cuda_daemon(cuda_nvme_daemon_flags());
    if (!daemon) return;
    const GpuEngineRun run{.gpu = 0, .memory = memory, .session = "restart-" + memory};
    std::vector<std::string> argv = run.args(daemon->socket_path());
    argv.push_back("--pause-before-load");
    int fds[2];
    ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    UniqueFd output(fds[0]), output_write(fds[1]);
    auto engine = spawn(argv, output_write.get(), output_write.get());
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    output_write.reset();
    ProcessResult result;
    result.stdout_text = read_pipe_until(output.get(), "paused before load");
    ASSERT_NE(result.stdout_text.find("paused before load"), std::string::npos)
        << result.stdout_text;

    ExitStatus stopped = daemon->stop();
    ASSERT_TRUE(stopped.ok()) << "kvtierd " << stopped.describe();
    ASSERT_TRUE(daemon->restart().is_ok());
    ASSERT_EQ(::kill(*engine, SIGUSR1), 0);
    result.status = wait_for_exit(*engine);
    result.stdout_text += read_pipe_until(output.get());
    EXPECT_TRUE(EngineRoundTripped(result, run));
    EXPECT_NE(result.stdout_text.find("connection: 1 reconnects"), std::string::npos)
        << result.stdout_text;
    stopped = daemon->stop();
    EXPECT_TRUE(stopped.ok()) << "kvtierd " << stopped.describe();
  }
}

}  // namespace
}  // namespace kvtier::integration
