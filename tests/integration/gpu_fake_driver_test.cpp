// What needs the fake driver's switches (so these tests run on it only): copies slowed
// down to stay in flight (KVTIER_FAKECUDA_COPY_US_PER_MIB), device memory named after
// the process that made it in /proc/<pid>/maps, and an injected sticky error
// (KVTIER_FAKECUDA_FAULT_FILE).
//  - UnregisterRegion sent while a Save copies from the region: its reply comes after
//    the Save's, when the daemon no longer maps the engine's memory.
//  - An engine SIGKILLed while the daemon copies from its VMM memory: the daemon
//    finishes, lets the memory go and serves the next engine.
//  - A sticky error: kvtierd logs "GPU context lost" and exits 3; restarted on the same
//    data directory, the sessions it had on NVMe load bit-exact.
// The engines here that must act mid-copy are forked children with a GpuPagedCache;
// the test process itself never calls the driver, so its children can.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "examples/engine/gpu_paged_cache.h"
#include "tests/integration/gpu_harness.h"
#include "tests/integration/nvme_harness.h"

namespace kvtier::integration {
namespace {

using Clock = std::chrono::steady_clock;

// A Save of kSlowSaveBlocks 256 KiB blocks (16 MiB) at this copy speed takes about
// three seconds on the fake: long enough to act while it is in flight (a few requests,
// a Stats poll, a kill) on a loaded machine or a sanitizer build, whose slowness does
// not stretch the fake's sleeps.
constexpr size_t kSlowSaveBlocks = 64;
constexpr const char* kCopyUsPerMib = "187500";

// Skips the calling test unless it runs on the fake driver (GTEST_SKIP returns from
// the function it is in, hence a macro).
#define REQUIRE_FAKE_DRIVER()                                                     \
  do {                                                                            \
    if (cuda_driver_under_test() != CudaDriver::kFake) {                          \
      GTEST_SKIP() << "needs the fake driver's switches (KVTIER_TEST_CUDA=fake)"; \
    }                                                                             \
  } while (0)

// A daemon whose copies crawl (only the daemon: engines fill their memory at full speed).
std::unique_ptr<Daemon> start_slow_copy_daemon() {
  ScopedEnv slow("KVTIER_FAKECUDA_COPY_US_PER_MIB", kCopyUsPerMib);
  return start_cuda_daemon(cuda_daemon_flags("64MiB", "64MiB"));
}

// An engine in a forked child: GPU KV cache of 2 × kSlowSaveBlocks blocks, registered,
// with the first kSlowSaveBlocks blocks filled for `session`.
struct ChildEngine {
  std::unique_ptr<GpuPagedCache> cache;
  std::unique_ptr<Client> client;
  std::vector<BlockRef> refs;
};

Result<ChildEngine> make_child_engine(const std::string& socket_path, int gpu, GpuMemoryMode mode,
                                      const std::string& session) {
  ChildEngine engine;
  auto cache = GpuPagedCache::create(gpu_engine_shape(2 * kSlowSaveBlocks), gpu, mode);
  if (!cache.is_ok()) return cache.status();
  engine.cache = std::move(*cache);
  auto client = Client::connect(socket_path);
  if (!client.is_ok()) return client.status();
  engine.client = std::move(*client);
  auto hello =
      engine.client->hello(engine.cache->layout(), "forked-gpu-engine", 0, DeviceKind::kCuda);
  if (!hello.is_ok()) return hello.status();
  KVTIER_RETURN_IF_ERROR(engine.cache->register_with(*engine.client));
  engine.refs = Engine::refs(PagedCache::chain_hashes(session, kSlowSaveBlocks), 0);
  for (const BlockRef& ref : engine.refs) {
    KVTIER_RETURN_IF_ERROR(engine.cache->fill(ref.engine_block_id, ref.hash));
  }
  KVTIER_RETURN_IF_ERROR(engine.cache->synchronize());
  return engine;
}

// Polls Stats on `client` until a copy is in flight.
Status wait_for_copy_in_flight(Client& client) {
  const auto deadline = Clock::now() + kDeadline;
  while (Clock::now() < deadline) {
    auto stats = client.stats();
    if (!stats.is_ok()) return stats.status();
    if (stats->copies_in_flight > 0) return Status::ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // re-check interval
  }
  return internal_error("no copy in flight within {} ms", kDeadline.count());
}

// Polls /proc/<process>/maps until it no longer holds memory `exporter` made.
Status wait_until_unmapped(pid_t process, pid_t exporter) {
  const auto deadline = Clock::now() + kDeadline;
  while (true) {
    auto mapped = maps_memory_of(process, exporter);
    if (!mapped.is_ok()) return mapped.status();
    if (!*mapped) return Status::ok();
    if (Clock::now() >= deadline) {
      return internal_error("process {} still maps memory of process {} after {} ms", process,
                            exporter, kDeadline.count());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // re-check interval
  }
}

// The forked engine of UnregisterRepliesAfterTheInFlightSaveAndUnmapsFirst.
int save_then_unregister(const std::string& socket_path, pid_t daemon_pid,
                         const std::string& session) {
  auto engine = make_child_engine(socket_path, 0, GpuMemoryMode::kIpc, session);
  if (!engine.is_ok()) return child_failure(10, "set up the GPU engine", engine.status());
  auto mapped = maps_memory_of(daemon_pid, ::getpid());
  if (!mapped.is_ok() || !*mapped) {
    return child_failure(11, "kvtierd does not map the registered memory", mapped.status());
  }
  auto observer = Client::connect(socket_path);
  if (!observer.is_ok()) return child_failure(12, "connect an observer", observer.status());

  auto save = engine->client->save_async(session, engine->refs, /*end_of_turn=*/true);
  if (Status busy = wait_for_copy_in_flight(**observer); !busy.is_ok()) {
    return child_failure(13, "wait for the Save's copy", busy);
  }
  // K and V, both while the Save copies from them (pipelined on one connection).
  // Regions 0 and 1 (GpuPagedCache's first region id is 0).
  std::vector<Pending<uint32_t>> unregisters;
  for (uint32_t region_id = 0; region_id < engine->cache->regions().size(); ++region_id) {
    unregisters.push_back(engine->client->unregister_region_async(region_id));
  }
  auto still_busy = (*observer)->stats();
  if (!still_busy.is_ok() || still_busy->copies_in_flight == 0) {
    return child_failure(14, "the Save finished before the Unregisters were sent; slow copies more",
                         still_busy.status());
  }
  for (size_t i = 0; i < unregisters.size(); ++i) {
    auto reply = unregisters[i].wait();
    if (!reply.is_ok() || *reply != i) {
      return child_failure(15, fmt::format("UnregisterRegion {}", i), reply.status());
    }
  }
  // The replies came once the daemon was done with the memory: no copy left, no mapping.
  auto after = (*observer)->stats();
  if (!after.is_ok()) return child_failure(16, "stats", after.status());
  if (after->copies_in_flight != 0) {
    return child_failure(17, fmt::format("UnregisterRegion replied with {} copies in flight",
                                         after->copies_in_flight));
  }
  mapped = maps_memory_of(daemon_pid, ::getpid());
  if (!mapped.is_ok() || *mapped) {
    return child_failure(18, "UnregisterRegion replied while kvtierd still maps the memory",
                         mapped.status());
  }
  // The Save's reply was sent first on this connection, so reading the Unregisters'
  // replies filed it: it is here without waiting.
  if (!save.ready()) {
    return child_failure(21, "the Save's reply had not arrived when the Unregisters' had");
  }
  auto saved = save.wait();
  if (!saved.is_ok()) return child_failure(19, "Save", saved.status());
  if (saved->stored != kSlowSaveBlocks) {
    return child_failure(
        20, fmt::format("Save stored {} of {} blocks", saved->stored, kSlowSaveBlocks));
  }
  // The memory may be freed now (the cache's destructor does).
  return 0;
}

TEST(GpuFakeDriver, UnregisterRepliesAfterTheInFlightSaveAndUnmapsFirst) {
  REQUIRE_FAKE_DRIVER();
  auto daemon = start_slow_copy_daemon();
  if (!daemon) return;
  const std::string session = "saved-while-unregistering";
  const std::string socket = daemon->socket_path();
  const pid_t daemon_pid = daemon->pid();
  pid_t child = fork_child([&] { return save_then_unregister(socket, daemon_pid, session); });
  ExitStatus engine = wait_for_exit(child);
  ASSERT_TRUE(engine.ok()) << "engine " << engine.describe();

  // What the Save copied before the mapping closed is the engine's data, every byte.
  const GpuEngineRun loader{.gpu = 1,
                            .memory = "vmm",
                            .session = session,
                            .mode = GpuEngineRun::Mode::kVerifyOnly,
                            .turns = kSlowSaveBlocks / kBlocksPerTurn,
                            .num_blocks = 2 * kSlowSaveBlocks};
  EXPECT_TRUE(EngineRoundTripped(run_gpu_engine(socket, loader), loader));
  ExitStatus stopped = daemon->stop();
  EXPECT_TRUE(stopped.ok()) << "kvtierd " << stopped.describe();
}

// A driver that cannot load the staging kernels (no code for the GPU, PTX newer than
// it): an engine asked to use them says so and keeps the plane-copy path, bit-exact.
TEST(GpuFakeDriver, WithoutLoadableKernelsAnEngineKeepsThePlaneCopyPath) {
  REQUIRE_FAKE_DRIVER();
  auto daemon = start_cuda_daemon(cuda_daemon_flags());
  if (!daemon) return;
  ProcessResult result;
  GpuEngineRun run{.gpu = 0, .memory = "ipc", .session = "no-kernels", .staging_kernels = true};
  {
    ScopedEnv no_image("KVTIER_FAKECUDA_NO_KERNEL_IMAGE", "1");  // the engine's driver
    result = run_gpu_engine(daemon->socket_path(), run);
  }
  run.staging_kernels = false;  // what it ran
  EXPECT_TRUE(EngineRoundTripped(result, run));
  EXPECT_NE(result.stdout_text.find("staging kernels unavailable"), std::string::npos)
      << result.stdout_text;
  EXPECT_EQ(result.stdout_text.find("data path: staging kernels"), std::string::npos)
      << result.stdout_text;
  ExitStatus stopped = daemon->stop();
  EXPECT_TRUE(stopped.ok()) << "kvtierd " << stopped.describe();
}

TEST(GpuFakeDriver, EngineKilledMidCopyLeavesTheDaemonServingTheNextEngine) {
  REQUIRE_FAKE_DRIVER();
  auto daemon = start_slow_copy_daemon();
  if (!daemon) return;
  const std::string socket = daemon->socket_path();
  int sent[2];
  int hold[2];
  ASSERT_EQ(::pipe(sent), 0);
  ASSERT_EQ(::pipe(hold), 0);
  pid_t child = fork_child([&] {
    ::close(sent[0]);
    ::close(hold[1]);
    // VMM memory: the daemon's imported mapping keeps it alive after this process dies.
    auto engine = make_child_engine(socket, 0, GpuMemoryMode::kVmm, "killed-mid-copy");
    if (!engine.is_ok()) return child_failure(10, "set up the GPU engine", engine.status());
    auto save = engine->client->save_async("killed-mid-copy", engine->refs, true);
    (void)save;
    if (::write(sent[1], "s", 1) != 1) return child_failure(11, "signal the parent");
    char byte;
    (void)::read(hold[0], &byte, 1);  // until killed: the parent never writes
    return child_failure(12, "the parent let the engine go instead of killing it");
  });
  ::close(sent[1]);
  ::close(hold[0]);

  // A byte once the Save is sent; end of file when the child gave up before that.
  pollfd ready{sent[0], POLLIN, 0};
  char byte = 0;
  const bool saving =
      ::poll(&ready, 1, static_cast<int>(kDeadline.count())) == 1 && ::read(sent[0], &byte, 1) == 1;
  ::close(sent[0]);
  if (!saving) {
    ::close(hold[1]);
    FAIL() << "the engine never sent its Save: " << wait_for_exit(child).describe();
  }
  auto in_flight =
      daemon->wait_for_stats([](const StatsInfo& s) { return s.copies_in_flight > 0; });
  ASSERT_TRUE(in_flight.is_ok()) << in_flight.status().to_string();
  auto mapped = maps_memory_of(daemon->pid(), child);
  ASSERT_TRUE(mapped.is_ok()) << mapped.status().to_string();
  EXPECT_TRUE(*mapped) << "kvtierd does not map the engine's VMM memory";
  ::kill(child, SIGKILL);
  ExitStatus killed = wait_for_exit(child);
  ::close(hold[1]);
  ASSERT_EQ(killed.signal, SIGKILL) << "engine " << killed.describe();

  // The daemon finishes (or drops) the copy, lets the dead engine's memory go, and
  // serves the next engine bit-exact.
  auto settled = daemon->wait_until_settled();
  ASSERT_TRUE(settled.is_ok()) << settled.status().to_string();
  ASSERT_TRUE(daemon->running()) << daemon->log();
  Status unmapped = wait_until_unmapped(daemon->pid(), child);
  EXPECT_TRUE(unmapped.is_ok()) << unmapped.to_string();
  const GpuEngineRun next{.gpu = 1, .memory = "ipc", .session = "after-the-kill"};
  EXPECT_TRUE(EngineRoundTripped(run_gpu_engine(socket, next), next));
  ASSERT_TRUE(daemon->running()) << daemon->log();
  ExitStatus stopped = daemon->stop();
  EXPECT_TRUE(stopped.ok()) << "kvtierd " << stopped.describe();
}

TEST(GpuFakeDriver, StickyErrorExitsWithCode3AndNvmeSessionsLoadAfterRestart) {
  REQUIRE_FAKE_DRIVER();
  ScratchDir scratch;
  ASSERT_FALSE(scratch.path().empty());
  const std::string data = scratch.path() + "/data";
  const std::string fault = scratch.path() + "/sticky-error";
  std::unique_ptr<PersistentDaemon> daemon;
  {
    ScopedEnv faults("KVTIER_FAKECUDA_FAULT_FILE", fault);
    auto started = PersistentDaemon::start(scratch.path(), data, cuda_nvme_daemon_flags());
    ASSERT_TRUE(started.is_ok()) << started.status().to_string();
    daemon = std::move(*started);
  }
  const GpuEngineRun saver{.gpu = 0,
                           .memory = "vmm",
                           .session = "survives-the-fault",
                           .mode = GpuEngineRun::Mode::kSaveOnly};
  const ProcessResult saved = run_gpu_engine(daemon->socket_path(), saver);
  ASSERT_TRUE(EngineRoundTripped(saved, saver));
  auto on_nvme = wait_for_session_in_tier(daemon->socket_path(), saver.session, Tier::kNvme,
                                          saver.session_blocks());
  ASSERT_TRUE(on_nvme.is_ok()) << on_nvme.status().to_string();

  // From now on every copy the daemon's streams run faults, and the context is dead.
  { std::ofstream(fault) << "fault\n"; }
  const GpuEngineRun doomed{.gpu = 1, .memory = "ipc", .session = "copied-into-a-dead-context"};
  const ProcessResult failed = run_gpu_engine(daemon->socket_path(), doomed);
  EXPECT_FALSE(failed.status.ok())
      << "the engine's copies cannot have succeeded: " << failed.describe();
  const auto deadline = Clock::now() + kDeadline;
  while (daemon->running() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // re-check interval
  }
  ASSERT_FALSE(daemon->running()) << "kvtierd still runs on a dead context";
  const ExitStatus lost = daemon->stop();
  EXPECT_TRUE(lost.exited && lost.code == 3) << "kvtierd " << lost.describe();
  EXPECT_NE(daemon->log().find("GPU context lost"), std::string::npos) << daemon->log();
  daemon.reset();

  std::filesystem::remove(fault);
  auto restarted = PersistentDaemon::start(scratch.path(), data, cuda_nvme_daemon_flags());
  ASSERT_TRUE(restarted.is_ok()) << restarted.status().to_string();
  const GpuEngineRun loader{
      .gpu = 1, .memory = "ipc", .session = saver.session, .mode = GpuEngineRun::Mode::kVerifyOnly};
  EXPECT_TRUE(EngineRoundTripped(run_gpu_engine((*restarted)->socket_path(), loader), loader));
  ExitStatus stopped = (*restarted)->stop();
  EXPECT_TRUE(stopped.ok()) << "kvtierd " << stopped.describe();
}

}  // namespace
}  // namespace kvtier::integration
