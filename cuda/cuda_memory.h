// Memory kinds of the CUDA backend. Internal to cuda/; the daemon sees only
// cuda_device.h.
//
// Every kind knows the address copies use (a device virtual address, or a host
// pointer for the pinned pool; with unified addressing both are CUdeviceptr values)
// and which served GPU holds each byte. Destructors close what the constructor's
// factory opened, with the owning GPU's context made current first: the last
// reference may be dropped on any thread.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "cuda/driver_api.h"
#include "device/device.h"

namespace kvtier::cuda {

// One GPU the device serves: constant after start-up.
struct GpuContext {
  int index = 0;  // position among the served GPUs (and of its arena part)
  int ordinal = 0;
  CUdevice device = 0;
  CUcontext context = nullptr;  // the retained primary context
  GpuInfo info;
  uint64_t peers = 0;  // bit i: this GPU can access served GPU i's memory directly
  // CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: the pinned pool's host
  // addresses may go into batch copies (not so on some paravirtualized GPUs).
  bool host_pointers_in_batches = true;
  // CU_DEVICE_ATTRIBUTE_MAX_PITCH: the largest row pitch of a strided copy.
  uint64_t max_pitch = 0;
};

// The served GPUs with their retained primary contexts, released when the last
// holder goes. The device and every memory it opened hold it, so a region closed
// after the device is gone still finds its context (and the driver table, which
// lives as long as the process).
class GpuSet {
 public:
  GpuSet(const DriverApi& driver, std::vector<GpuContext> gpus)
      : driver_(driver), gpus_(std::move(gpus)) {}
  ~GpuSet();
  GpuSet(const GpuSet&) = delete;
  GpuSet& operator=(const GpuSet&) = delete;

  const DriverApi& driver() const { return driver_; }
  const std::vector<GpuContext>& gpus() const { return gpus_; }
  const GpuContext& gpu(int index) const { return gpus_[index]; }
  // Makes GPU `index`'s context current on the calling thread.
  Status make_current(int index) const;

 private:
  const DriverApi& driver_;
  std::vector<GpuContext> gpus_;
};
using GpuSetPtr = std::shared_ptr<const GpuSet>;

class CudaMemory : public Memory {
 public:
  // The address copies use for byte 0.
  virtual CUdeviceptr address() const = 0;
  // Index (GpuContext::index) of the served GPU holding the byte at `offset`; -1 for
  // host memory.
  virtual int gpu_at(uint64_t offset) const = 0;
  std::byte* host_data() override { return nullptr; }
};

// The HBM arena: `part_bytes` from each served GPU, mapped back to back in one
// reserved address range.
Result<std::shared_ptr<Memory>> allocate_arena(const GpuSetPtr& gpus, uint64_t bytes_per_gpu,
                                               uint64_t part_alignment);

// An engine's legacy IPC allocation, opened on `gpu`, starting `handle.offset_bytes`
// from the allocation base.
Result<std::shared_ptr<Memory>> open_ipc_region(const GpuSetPtr& gpus, int gpu,
                                                RegionHandle& handle);

// An engine's VMM chunks, imported and mapped back to back; the region starts
// `handle.offset_bytes` into the first chunk. Every served GPU gets read/write access
// where the machine allows peer access; `gpu` always does.
Result<std::shared_ptr<Memory>> open_vmm_region(const GpuSetPtr& gpus, int gpu,
                                                RegionHandle& handle);

// The pinned RAM pool: checked against the memory the machine (and the cgroup) has
// left, bound to `numa_nodes` (preferred for one node, interleaved for several, left
// alone for none), faulted in by `touch_threads` threads, then registered with the
// driver as portable pinned memory.
Result<std::shared_ptr<Memory>> allocate_pinned_pool(const GpuSetPtr& gpus, uint64_t bytes,
                                                     const std::vector<int>& numa_nodes,
                                                     int touch_threads);
// The same in two steps: checked, mapped and bound now; faulted in and registered by
// `fill` (on the thread that calls it: it makes GPU 0's context current there).
Result<UnfilledMemory> reserve_pinned_pool(const GpuSetPtr& gpus, uint64_t bytes,
                                           const std::vector<int>& numa_nodes);

}  // namespace kvtier::cuda
