// The CUDA backend's RAM pool: host memory near the GPUs, faulted in up front, pinned.
#include <linux/mempolicy.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "common/units.h"
#include "cuda/cuda_memory.h"

// Linux 5.14; older C libraries lack the name.
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace kvtier::cuda {
namespace {

class PinnedPool final : public CudaMemory {
 public:
  PinnedPool(GpuSetPtr gpus, std::byte* data, uint64_t bytes)
      : gpus_(std::move(gpus)), data_(data), bytes_(bytes) {}
  ~PinnedPool() override {
    (void)gpus_->make_current(0);
    gpus_->driver().mem_host_unregister(data_);
    ::munmap(data_, bytes_);
  }
  uint64_t size_bytes() const override { return bytes_; }
  MemoryLocation location() const override { return MemoryLocation::kHost; }
  std::byte* host_data() override { return data_; }
  std::string describe() const override { return "ram pool (pinned)"; }
  CUdeviceptr address() const override { return reinterpret_cast<CUdeviceptr>(data_); }
  int gpu_at(uint64_t) const override { return -1; }

 private:
  const GpuSetPtr gpus_;
  std::byte* data_;
  uint64_t bytes_;
};

// What this process may still take: the machine's MemAvailable, and the cgroup's
// headroom where a memory.max is set. Faulting in more than that gets the daemon (or a
// neighbour) OOM-killed instead of an error, so the pool asks first.
uint64_t available_memory_bytes() {
  uint64_t available = UINT64_MAX;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") {
      available = kib * 1024;
      break;
    }
  }
  std::ifstream max_file("/sys/fs/cgroup/memory.max"),
      current_file("/sys/fs/cgroup/memory.current");
  std::string max_text;
  uint64_t current = 0;
  if (max_file >> max_text && max_text != "max" && current_file >> current) {
    const uint64_t limit = std::stoull(max_text);
    available = std::min(available, limit > current ? limit - current : 0);
  }
  return available;
}

// Binds [data, data + bytes) to the NUMA nodes: preferred for one (falls back to other
// nodes when it is full rather than failing), interleaved for several.
void bind_to_nodes(void* data, uint64_t bytes, const std::vector<int>& nodes) {
  if (nodes.empty()) return;
  unsigned long mask = 0;
  for (int node : nodes) {
    if (node >= 0 && node < static_cast<int>(8 * sizeof(mask))) mask |= 1ul << node;
  }
  if (mask == 0) return;
  const int mode = nodes.size() == 1 ? MPOL_PREFERRED : MPOL_INTERLEAVE;
  if (::syscall(SYS_mbind, data, bytes, mode, &mask, 8 * sizeof(mask) + 1, 0) != 0) {
    KVTIER_LOG_WARN("ram pool: mbind to NUMA nodes failed ({}); using the default policy",
                    std::strerror(errno));
  }
}

// Faults the pages in from several threads: faulting tens of GiB is CPU-bound in the
// kernel, and registering untouched memory would fault it on one thread. Returns the
// first error (MADV_POPULATE_WRITE reports ENOMEM where a plain touch would SIGBUS).
Status fault_in(std::byte* data, uint64_t bytes, int touch_threads) {
  const int threads = std::max(1, touch_threads);
  const uint64_t chunk = (bytes / threads + 4095) & ~uint64_t{4095};
  std::vector<int> errors(threads, 0);
  std::vector<std::thread> touchers;
  for (int t = 0; t < threads; ++t) {
    touchers.emplace_back([=, &errors] {
      const uint64_t begin = std::min(bytes, chunk * t), end = std::min(bytes, begin + chunk);
      if (begin == end) return;
      if (::madvise(data + begin, end - begin, MADV_POPULATE_WRITE) == 0) return;
      if (errno != EINVAL) {  // EINVAL: a kernel older than 5.14; touch instead
        errors[t] = errno;
        return;
      }
      for (uint64_t offset = begin; offset < end; offset += 4096) data[offset] = std::byte{0};
    });
  }
  for (auto& toucher : touchers) toucher.join();
  for (int error : errors) {
    if (error != 0) return errno_status(error, "ram pool: faulting in the pages");
  }
  return Status::ok();
}

}  // namespace

Result<std::shared_ptr<Memory>> allocate_pinned_pool(const GpuSetPtr& gpus, uint64_t bytes,
                                                     const std::vector<int>& numa_nodes,
                                                     int touch_threads) {
  if (bytes == 0) return invalid_argument("ram pool: bytes is 0");
  const uint64_t available = available_memory_bytes();
  if (bytes > available) {
    // Not retryable: a configuration to change, not a moment to wait out.
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("ram pool: {} requested but only {} of memory is available "
                              "(MemAvailable, cgroup memory.max); lower ram-bytes",
                              format_bytes(bytes), format_bytes(available)),
                  /*retryable=*/false);
  }
  const auto started = std::chrono::steady_clock::now();
  void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) return errno_status(errno, "mmap ram pool");
  auto* data = static_cast<std::byte*>(mapped);
  (void)::madvise(mapped, bytes, MADV_HUGEPAGE);
  bind_to_nodes(mapped, bytes, numa_nodes);
  if (Status touched = fault_in(data, bytes, touch_threads); !touched.is_ok()) {
    ::munmap(mapped, bytes);
    return touched;
  }
  Status registered = gpus->make_current(0);
  if (registered.is_ok()) {
    // Portable: pinned for every context, so each GPU's copy engines DMA straight in.
    registered =
        driver_status(gpus->driver().mem_host_register(mapped, bytes, CU_MEMHOSTREGISTER_PORTABLE),
                      "cuMemHostRegister");
  }
  if (!registered.is_ok()) {
    ::munmap(mapped, bytes);
    return registered;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  KVTIER_LOG_INFO("ram pool: {} pinned in {:.2f} s ({:.2f} s/GiB){}", format_bytes(bytes), seconds,
                  seconds / (static_cast<double>(bytes) / (1ull << 30)),
                  numa_nodes.empty()
                      ? std::string()
                      : fmt::format(" on NUMA node(s) {}", fmt::join(numa_nodes, ",")));
  return std::shared_ptr<Memory>(std::make_shared<PinnedPool>(gpus, data, bytes));
}

}  // namespace kvtier::cuda
