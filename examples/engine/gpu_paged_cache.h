// GpuPagedCache: the example engine's paged KV cache in GPU memory (CUDA builds only),
// on the driver API (cuda/driver_api.h). Same planes and block contents as PagedCache
// (PagedCache::generate, plane p = layer p/2, K for even p and V for odd), so a block
// saved by a host engine or another GPU loads here bit for bit.
//
// Memory, chosen at creation, shaped like what real engines hand the daemon:
//   kIpc  one cuMemAlloc holding [canary | K | canary | V | canary], as PyTorch's
//         caching allocator places K and V in one segment. K ([layers, blocks, plane])
//         is region `first_region_id`, V the next id; each starts at a non-zero,
//         unaligned offset inside the allocation.
//   kVmm  ≥ 8 chunks of the allocation granularity (cuMemCreate, POSIX-fd exportable)
//         mapped back to back in one reserved range, as PyTorch's expandable segments;
//         the cache ([2 × layers, blocks, plane], like PagedCache) is one region starting
//         granularity/2 + 4 KiB into the first chunk and spanning ≥ 8 chunks — num_blocks
//         is raised to make it so (layout().num_blocks says how many there are).
// Canaries (a fixed byte pattern) sit around every tensor; the daemon must never touch
// them, and verify() checks them.
//
// Contents are made on the host and copied with the synchronous driver copies; the
// pointer's GPU's primary context (retained for the cache's lifetime) is made current
// on the calling thread by every method.
//
// Ownership and order: the cache owns its GPU memory and frees it when destroyed. A
// cache registered with a daemon must be unregistered (unregister()) before it is
// destroyed, or the connection closed first: the daemon may still map the memory.
// Thread-safety: none; one owner.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/cuda_regions.h"
#include "client/paged_cache.h"

namespace kvtier {
namespace cuda {
struct DriverApi;
}

enum class GpuMemoryMode : uint8_t {
  kIpc,  // one cuMemAlloc, K and V as two regions (legacy CUDA IPC)
  kVmm,  // cuMemCreate chunks mapped contiguously, one region (POSIX fds)
};

class GpuPagedCache {
 public:
  // On GPU `gpu_index` (0 .. cuDeviceGetCount − 1). Unavailable without a CUDA driver
  // or device; InvalidArgument for an index past the last GPU.
  static Result<std::unique_ptr<GpuPagedCache>> create(const PagedCacheShape& shape, int gpu_index,
                                                       GpuMemoryMode mode,
                                                       uint32_t first_region_id = 0);
  ~GpuPagedCache();
  GpuPagedCache(const GpuPagedCache&) = delete;
  GpuPagedCache& operator=(const GpuPagedCache&) = delete;

  const LayoutSpec& layout() const { return layout_; }
  const std::string& gpu_uuid() const { return gpu_uuid_; }
  GpuMemoryMode mode() const { return mode_; }

  // Registers every tensor as a region through cuda_regions.h. REQUIRES: not yet
  // registered. What was registered is in regions() afterwards.
  Status register_with(Client& client);
  const std::vector<CudaRegionInfo>& regions() const { return registered_; }
  // The device address of each region the layout names (GpuStager::create).
  std::map<uint32_t, CUdeviceptr> region_bases() const;
  // UnregisterRegion for each registered region, checking each reply names it; the
  // memory may be freed once this returned OK.
  Status unregister(Client& client);

  Status fill(uint64_t block_id, const BlockHash& hash);
  // Whether the block holds exactly the content derived from `hash` and every canary
  // is intact.
  Result<bool> verify(uint64_t block_id, const BlockHash& hash) const;
  // One line per canary whose bytes changed ("after V: 12 bytes changed, first at
  // +0x40"); empty when all are intact.
  Result<std::vector<std::string>> damaged_canaries() const;
  // Zeroes every tensor (not the canaries).
  Status wipe();
  // Waits for every fill/wipe: the daemon reads the blocks only after this (the
  // ordering contract in schema/kvtier.capnp).
  Status synchronize();

 private:
  class Memory;  // the allocation of either mode; frees it when destroyed
  struct Tensor {
    uint32_t region_id;
    uint64_t offset_bytes;  // from the start of the memory
    uint64_t bytes;
  };
  struct Canary {
    std::string name;
    uint64_t offset_bytes;  // from the start of the memory
    uint64_t bytes;
  };

  GpuPagedCache() = default;
  Status make_current() const;
  CUdeviceptr plane_address(uint32_t plane, uint64_t block_id) const;
  Status place_tensors();  // fills tensors_, canaries_, layout_ for mode_
  Status write_canaries();

  // Constant after create().
  PagedCacheShape shape_;
  GpuMemoryMode mode_ = GpuMemoryMode::kIpc;
  uint32_t first_region_id_ = 0;
  const cuda::DriverApi* api_ = nullptr;
  int ordinal_ = 0;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;  // retained primary context of device_
  std::string gpu_uuid_;
  std::unique_ptr<Memory> memory_;
  std::vector<Tensor> tensors_;
  std::vector<Canary> canaries_;
  LayoutSpec layout_;

  std::vector<CudaRegionInfo> registered_;
};

}  // namespace kvtier
