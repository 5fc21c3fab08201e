// The CUDA backend's RAM pool: host memory near the GPUs, faulted in up front on several
// threads (device/page_fill.h), then pinned.
#include <linux/mempolicy.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stop_token>
#include <string>
#include <vector>

#include "common/log.h"
#include "common/units.h"
#include "cuda/cuda_memory.h"
#include "device/page_fill.h"

namespace kvtier::cuda {
namespace {

class PinnedPool final : public CudaMemory {
 public:
  PinnedPool(GpuSetPtr gpus, std::byte* data, uint64_t bytes)
      : gpus_(std::move(gpus)), data_(data), bytes_(bytes) {}
  ~PinnedPool() override {
    if (registered_.load(std::memory_order_acquire)) {
      (void)gpus_->make_current(0);
      gpus_->driver().mem_host_unregister(data_);
    }
    ::munmap(data_, bytes_);
  }
  uint64_t size_bytes() const override { return bytes_; }
  MemoryLocation location() const override { return MemoryLocation::kHost; }
  std::byte* host_data() override { return data_; }
  std::string describe() const override { return "ram pool (pinned)"; }
  CUdeviceptr address() const override { return reinterpret_cast<CUdeviceptr>(data_); }
  int gpu_at(uint64_t) const override { return -1; }

  // Faults the pages in, then registers them with the driver (on the calling thread,
  // with GPU 0's context made current there). Registering untouched memory would
  // fault it in on one thread.
  Status fill(int threads, std::stop_token stop, const std::vector<int>& numa_nodes) {
    const auto started = std::chrono::steady_clock::now();
    KVTIER_RETURN_IF_ERROR(fill_pages(data_, bytes_, threads, std::move(stop)));
    KVTIER_RETURN_IF_ERROR(gpus_->make_current(0));
    // Portable: pinned for every context, so each GPU's copy engines DMA straight in.
    KVTIER_RETURN_IF_ERROR(
        driver_status(gpus_->driver().mem_host_register(data_, bytes_, CU_MEMHOSTREGISTER_PORTABLE),
                      "cuMemHostRegister"));
    registered_.store(true, std::memory_order_release);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    KVTIER_LOG_INFO("ram pool: {} faulted in and pinned in {:.2f} s ({:.2f} s/GiB, {} threads){}",
                    format_bytes(bytes_), seconds,
                    seconds / (static_cast<double>(bytes_) / (1ull << 30)), threads,
                    numa_nodes.empty()
                        ? std::string()
                        : fmt::format(" on NUMA node(s) {}", fmt::join(numa_nodes, ",")));
    return Status::ok();
  }

 private:
  const GpuSetPtr gpus_;
  std::byte* data_;
  uint64_t bytes_;
  std::atomic<bool> registered_{false};
};

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

}  // namespace

Result<UnfilledMemory> reserve_pinned_pool(const GpuSetPtr& gpus, uint64_t bytes,
                                           const std::vector<int>& numa_nodes) {
  if (bytes == 0) return invalid_argument("ram pool: bytes is 0");
  KVTIER_RETURN_IF_ERROR(check_memory_available(bytes, "ram pool", "ram-bytes"));
  auto data = map_pool_memory(bytes, "ram pool");
  if (!data.is_ok()) return data.status();
  bind_to_nodes(*data, bytes, numa_nodes);
  auto pool = std::make_shared<PinnedPool>(gpus, *data, bytes);
  PinnedPool* const raw = pool.get();
  return UnfilledMemory{std::move(pool), [raw, numa_nodes](int threads, std::stop_token stop) {
                          return raw->fill(threads, std::move(stop), numa_nodes);
                        }};
}

Result<std::shared_ptr<Memory>> allocate_pinned_pool(const GpuSetPtr& gpus, uint64_t bytes,
                                                     const std::vector<int>& numa_nodes,
                                                     int touch_threads) {
  auto reserved = reserve_pinned_pool(gpus, bytes, numa_nodes);
  if (!reserved.is_ok()) return reserved.status();
  KVTIER_RETURN_IF_ERROR(reserved->fill(touch_threads, {}));
  return std::move(reserved->memory);
}

}  // namespace kvtier::cuda
