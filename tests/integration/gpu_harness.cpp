#include "tests/integration/gpu_harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/integration/nvme_harness.h"

namespace kvtier::integration {
namespace {

bool contains(const std::string& text, std::string_view fragment) {
  return text.find(fragment) != std::string::npos;
}

// GTEST_SKIP returns from the function it is in: a void one here.
void skip_or_fail(const std::string& why) {
  if (cuda_driver_under_test() == CudaDriver::kFake) {
    ADD_FAILURE() << "on the fake driver every GPU test must run: " << why;
  } else if (gpu_required()) {
    ADD_FAILURE() << "/dev/nvidiactl exists or KVTIER_REQUIRE_GPU=1, so this must run: " << why;
  } else {
    GTEST_SKIP() << "no usable CUDA driver or GPU: " << why;
  }
}

}  // namespace

CudaDriver cuda_driver_under_test() {
  const char* mode = std::getenv("KVTIER_TEST_CUDA");
  return mode != nullptr && std::string_view(mode) == "fake" ? CudaDriver::kFake
                                                             : CudaDriver::kReal;
}

bool gpu_required() {
  const char* require = std::getenv("KVTIER_REQUIRE_GPU");
  if (require != nullptr && std::string_view(require) == "1") return true;
  std::error_code ignored;
  return std::filesystem::exists("/dev/nvidiactl", ignored);
}

ScopedEnv::ScopedEnv(std::string name, const std::string& value) : name_(std::move(name)) {
  if (const char* old = std::getenv(name_.c_str())) previous_ = old;
  ::setenv(name_.c_str(), value.c_str(), 1);
}

ScopedEnv::~ScopedEnv() {
  if (previous_) {
    ::setenv(name_.c_str(), previous_->c_str(), 1);
  } else {
    ::unsetenv(name_.c_str());
  }
}

std::vector<std::string> cuda_daemon_flags(const std::string& hbm_bytes,
                                           const std::string& ram_bytes) {
  return {"--device",     "cuda", "--hbm-bytes",    hbm_bytes, "--ram-bytes",    ram_bytes,
          "--slab-bytes", "1MiB", "--copy-threads", "2",       "--metrics-addr", "off"};
}

std::vector<std::string> cuda_nvme_daemon_flags() {
  std::vector<std::string> flags = nvme_tier_flags();
  flags.insert(flags.begin(), {"--device", "cuda"});
  return flags;
}

PagedCacheShape gpu_engine_shape(uint64_t num_blocks) {
  PagedCacheShape shape;
  shape.model_id = "integration/gpu";
  shape.num_layers = 4;
  shape.num_kv_heads = 8;
  shape.head_dim = 128;
  shape.tokens_per_block = 16;
  shape.num_blocks = num_blocks;
  return shape;
}

std::vector<std::string> GpuEngineRun::args(const std::string& socket_path) const {
  const PagedCacheShape shape = gpu_engine_shape(num_blocks);
  std::vector<std::string> argv = {binary_path("kvtier-example-engine"),
                                   "--socket",
                                   socket_path,
                                   "--device",
                                   "cuda",
                                   "--gpu",
                                   std::to_string(gpu),
                                   "--gpu-memory",
                                   memory,
                                   "--session",
                                   session,
                                   "--turns",
                                   std::to_string(turns),
                                   "--blocks-per-turn",
                                   std::to_string(kBlocksPerTurn),
                                   "--model-id",
                                   shape.model_id,
                                   "--layers",
                                   std::to_string(shape.num_layers),
                                   "--kv-heads",
                                   std::to_string(shape.num_kv_heads),
                                   "--head-dim",
                                   std::to_string(shape.head_dim),
                                   "--tokens-per-block",
                                   std::to_string(shape.tokens_per_block),
                                   "--num-blocks",
                                   std::to_string(shape.num_blocks)};
  if (mode == Mode::kSaveOnly) argv.emplace_back("--save-only");
  if (mode == Mode::kVerifyOnly) argv.emplace_back("--verify-only");
  if (staging_kernels) argv.emplace_back("--staging-kernels");
  if (layer_wise) argv.emplace_back("--layer-wise");
  if (staging_ring_bytes != 0) {
    argv.emplace_back("--staging-ring-bytes");
    argv.emplace_back(std::to_string(staging_ring_bytes));
  }
  return argv;
}

Result<std::unique_ptr<BackgroundProcess>> BackgroundProcess::start(
    const std::vector<std::string>& argv) {
  UniqueFd out(::memfd_create("stdout", MFD_CLOEXEC));
  UniqueFd err(::memfd_create("stderr", MFD_CLOEXEC));
  if (!out.valid() || !err.valid()) return errno_status(errno, "memfd_create");
  auto pid = spawn(argv, out.get(), err.get());
  if (!pid.is_ok()) return pid.status();
  return std::unique_ptr<BackgroundProcess>(
      new BackgroundProcess(*pid, std::move(out), std::move(err)));
}

BackgroundProcess::~BackgroundProcess() {
  if (finished_) return;
  ::kill(pid_, SIGKILL);
  (void)wait_for_exit(pid_);
}

ProcessResult BackgroundProcess::finish(milliseconds timeout) {
  ProcessResult result;
  result.status = wait_for_exit(pid_, timeout);
  finished_ = true;
  result.stdout_text = read_all(out_.get());
  result.stderr_text = read_all(err_.get());
  return result;
}

ProcessResult run_gpu_engine(const std::string& socket_path, const GpuEngineRun& run) {
  return run_process(run.args(socket_path));
}

::testing::AssertionResult EngineRoundTripped(const ProcessResult& result,
                                              const GpuEngineRun& run) {
  if (!result.status.ok()) {
    return ::testing::AssertionFailure()
           << "engine on GPU " << run.gpu << " (" << run.memory << ") " << result.describe();
  }
  const bool loads = run.mode != GpuEngineRun::Mode::kSaveOnly;
  if (loads && !contains(result.stdout_text, "OK: every byte matched")) {
    return ::testing::AssertionFailure()
           << "exit 0 without 'every byte matched': " << result.describe();
  }
  if (run.staging_kernels && !contains(result.stdout_text, "data path: staging kernels")) {
    return ::testing::AssertionFailure()
           << "exit 0 without 'data path: staging kernels': " << result.describe();
  }
  if (!contains(result.stdout_text, "canaries around the KV cache intact")) {
    return ::testing::AssertionFailure()
           << "exit 0 without 'canaries ... intact': " << result.describe();
  }
  return ::testing::AssertionSuccess();
}

Result<HelloInfo> hello_as_cuda_engine(const std::string& socket_path) {
  auto client = Client::connect(socket_path);
  if (!client.is_ok()) return client.status();
  return (*client)->hello(PagedCache::make_layout(gpu_engine_shape(), 0), "gpu-harness-probe", 0,
                          DeviceKind::kCuda);
}

Result<SessionInfo> wait_for_session_in_tier(const std::string& socket_path,
                                             const std::string& session, Tier tier, size_t blocks,
                                             milliseconds timeout) {
  auto client = Client::connect(socket_path);
  if (!client.is_ok()) return client.status();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last = "not listed";
  while (true) {
    auto sessions = (*client)->list_sessions();
    if (!sessions.is_ok()) return sessions.status();
    for (const SessionInfo& info : *sessions) {
      if (info.session_id != session) continue;
      const auto index = static_cast<size_t>(tier);
      if (index < info.blocks_per_tier.size() && info.blocks_per_tier[index] == blocks) {
        return info;
      }
      last.clear();
      for (size_t t = 0; t < info.blocks_per_tier.size(); ++t) {
        last +=
            fmt::format("{}{} blocks in tier {}", t == 0 ? "" : ", ", info.blocks_per_tier[t], t);
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return unavailable("session '{}' never had {} blocks in {} within {} ms; last seen: {}",
                         session, blocks, tier_name(tier), timeout.count(), last);
    }
    std::this_thread::sleep_for(milliseconds{5});  // re-check interval, not a sync point
  }
}

Result<bool> maps_memory_of(pid_t process, pid_t exporter) {
  const std::string path = "/proc/" + std::to_string(process) + "/maps";
  std::ifstream in(path);
  if (!in) return errno_status(errno, "open " + path);
  std::stringstream text;
  text << in.rdbuf();
  return contains(text.str(), "kvtier-fakecuda:pid=" + std::to_string(exporter) + ":");
}

std::unique_ptr<Daemon> start_cuda_daemon(const std::vector<std::string>& flags) {
  auto daemon = Daemon::start(flags);
  if (!daemon.is_ok()) {
    skip_or_fail("kvtierd --device cuda did not start: " + daemon.status().to_string());
    return nullptr;
  }
  auto hello = hello_as_cuda_engine((*daemon)->socket_path());
  if (!hello.is_ok()) {
    ADD_FAILURE() << "Hello as a cuda engine: " << hello.status().to_string();
    return nullptr;
  }
  if (hello->device_kind != DeviceKind::kCuda || hello->gpu_uuids.empty()) {
    ADD_FAILURE() << "kvtierd --device cuda does not report a CUDA device: " << hello->device_name;
    return nullptr;
  }
  if (cuda_driver_under_test() == CudaDriver::kFake &&
      !contains(hello->device_name, "kvtier fake GPU")) {
    ADD_FAILURE() << "KVTIER_TEST_CUDA=fake but kvtierd runs on '" << hello->device_name
                  << "': is LD_LIBRARY_PATH pointing at tests/fakecuda?";
    return nullptr;
  }
  return std::move(*daemon);
}

}  // namespace kvtier::integration
