// Harness for the GPU-path integration tests: the real kvtierd on the CUDA backend and
// real engine processes (kvtier-example-engine --device cuda, or forked children with a
// GpuPagedCache), on the fake driver (tests/fakecuda) or on a real GPU.
//
// Which driver, from the environment ctest sets:
//   KVTIER_TEST_CUDA=fake  LD_LIBRARY_PATH names the fake libcuda.so.1; every test runs
//                          and a daemon that cannot start fails the test.
//   otherwise (real)       the system driver; a test whose daemon cannot start skips,
//                          unless /dev/nvidiactl exists or KVTIER_REQUIRE_GPU=1, where
//                          it fails. Tests that need the fake's switches skip.
//
// Process rules (besides daemon_harness.h's): the test process never calls the CUDA
// driver itself, so the children it forks may (a forked child cannot use its parent's
// driver state). Environment switches of the fake reach one daemon through ScopedEnv
// around its start; engines started afterwards do not see them.
//
// Thread-safety: none; one test thread.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "tests/integration/daemon_harness.h"

namespace kvtier::integration {

enum class CudaDriver { kFake, kReal };
CudaDriver cuda_driver_under_test();  // from KVTIER_TEST_CUDA
// /dev/nvidiactl exists or KVTIER_REQUIRE_GPU=1: a GPU test that cannot run fails.
bool gpu_required();

// Sets an environment variable for its lifetime, then restores the previous value.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, const std::string& value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> previous_;
};

// kvtierd on the CUDA backend with small tiers: hbm-bytes on every GPU it serves.
std::vector<std::string> cuda_daemon_flags(const std::string& hbm_bytes = "32MiB",
                                           const std::string& ram_bytes = "64MiB");
// The NVMe-tier flags of nvme_harness.h (idle thresholds 0) on the CUDA backend.
std::vector<std::string> cuda_nvme_daemon_flags();

// The example engine's shape in these tests: 4 layers of 32 KiB planes (256 KiB blocks),
// `num_blocks` engine blocks. Its layout digest does not depend on num_blocks.
PagedCacheShape gpu_engine_shape(uint64_t num_blocks = 64);
inline constexpr uint32_t kBlocksPerTurn = 4;

// One kvtier-example-engine --device cuda run: a session of turns × 4 blocks.
struct GpuEngineRun {
  enum class Mode { kSaveAndLoad, kSaveOnly, kVerifyOnly };
  int gpu = 0;
  std::string memory = "ipc";  // ipc or vmm
  std::string session = "gpu-session";
  Mode mode = Mode::kSaveAndLoad;
  uint32_t turns = 3;
  uint64_t num_blocks = 64;         // at least 2 × the session's blocks
  bool staging_kernels = false;     // --staging-kernels: packed by the GPU stager
  bool layer_wise = false;          // --layer-wise: one Load per layer
  uint64_t staging_ring_bytes = 0;  // --staging-ring-bytes; 0: the engine's default
  size_t session_blocks() const { return size_t{turns} * kBlocksPerTurn; }
  std::vector<std::string> args(const std::string& socket_path) const;  // argv, binary first
};

// A process started with posix_spawn whose stdout and stderr are captured, for engines
// that must run at the same time. The destructor SIGKILLs one never finished.
class BackgroundProcess {
 public:
  static Result<std::unique_ptr<BackgroundProcess>> start(const std::vector<std::string>& argv);
  ~BackgroundProcess();
  BackgroundProcess(const BackgroundProcess&) = delete;
  BackgroundProcess& operator=(const BackgroundProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Waits for the exit (SIGKILL after `timeout`); call once.
  ProcessResult finish(milliseconds timeout = kDeadline);

 private:
  BackgroundProcess(pid_t pid, UniqueFd out, UniqueFd err)
      : pid_(pid), out_(std::move(out)), err_(std::move(err)) {}
  pid_t pid_;
  UniqueFd out_;
  UniqueFd err_;
  bool finished_ = false;
};

ProcessResult run_gpu_engine(const std::string& socket_path, const GpuEngineRun& run);
// The engine exited 0 after saying that every byte matched (when it loaded) and that
// the canaries around its KV tensors are intact.
::testing::AssertionResult EngineRoundTripped(const ProcessResult& result, const GpuEngineRun& run);

// Hello as a cuda engine with gpu_engine_shape(): what the daemon serves (its GPUs,
// device name). Touches no CUDA in this process.
Result<HelloInfo> hello_as_cuda_engine(const std::string& socket_path);

// Polls ListSessions until `session` has `blocks` blocks in `tier`; what was last seen
// when the deadline passes.
Result<SessionInfo> wait_for_session_in_tier(const std::string& socket_path,
                                             const std::string& session, Tier tier, size_t blocks,
                                             milliseconds timeout = kDeadline);

// Whether /proc/<process>/maps holds fake-driver device memory that process `exporter`
// created (the memfd name carries the exporter's pid). Error when maps is unreadable.
Result<bool> maps_memory_of(pid_t process, pid_t exporter);

// Starts kvtierd with `flags` (which name --device cuda); nullptr after GTEST_SKIP()
// or a failure, per the rules at the top. On the fake driver it also checks that the
// daemon really runs on it. The caller returns at once on nullptr.
std::unique_ptr<Daemon> start_cuda_daemon(const std::vector<std::string>& flags);

}  // namespace kvtier::integration
