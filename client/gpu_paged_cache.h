// GpuPagedCache: the example engine's paged KV cache in GPU memory (CUDA builds only).
// Same plane layout and block contents as PagedCache, but the region is one
// cudaMalloc shared with kvtierd through a legacy CUDA IPC handle. Contents are made
// on the host and copied up; verification copies them back.
// Thread-safety: none; one owner.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <string>

#include "client/client.h"
#include "client/paged_cache.h"

namespace kvtier {

class GpuPagedCache {
 public:
  // Unavailable when there is no CUDA device.
  static Result<std::unique_ptr<GpuPagedCache>> create(const PagedCacheShape& shape,
                                                       uint32_t region_id = 0);
  ~GpuPagedCache();

  const LayoutSpec& layout() const { return layout_; }
  uint64_t size_bytes() const { return size_bytes_; }
  const std::string& gpu_uuid() const { return gpu_uuid_; }
  Status register_with(Client& client) const;

  Status fill(uint64_t block_id, const BlockHash& hash);
  Result<bool> verify(uint64_t block_id, const BlockHash& hash) const;
  Status wipe();
  // Waits for every fill/wipe: the daemon reads the blocks only after this (the
  // ordering contract in schema/kvtier.capnp).
  Status synchronize();

 private:
  GpuPagedCache() = default;
  uint64_t plane_offset(uint32_t plane, uint64_t block_id) const;

  PagedCacheShape shape_;
  LayoutSpec layout_;
  uint32_t region_id_ = 0;
  std::byte* device_data_ = nullptr;
  uint64_t size_bytes_ = 0;
  std::array<std::byte, 64> ipc_handle_{};
  std::string gpu_uuid_;
};

}  // namespace kvtier
