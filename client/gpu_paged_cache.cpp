#include "client/gpu_paged_cache.h"

#include "common/gpu_uuid.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <span>
#include <vector>

namespace kvtier {
namespace {

Status cuda_error(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return Status::ok();
  return internal_error("{}: {}", what, cudaGetErrorString(error));
}

std::string format_uuid(const cudaUUID_t& uuid) {
  return format_gpu_uuid(
      std::span<const uint8_t, 16>(reinterpret_cast<const uint8_t*>(uuid.bytes), 16));
}

}  // namespace

Result<std::unique_ptr<GpuPagedCache>> GpuPagedCache::create(const PagedCacheShape& shape,
                                                             uint32_t region_id) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return unavailable("no CUDA device");
  }
  std::unique_ptr<GpuPagedCache> cache(new GpuPagedCache());
  cache->shape_ = shape;
  cache->region_id_ = region_id;
  cache->size_bytes_ = shape.region_bytes();
  void* data = nullptr;
  KVTIER_RETURN_IF_ERROR(cuda_error(cudaMalloc(&data, cache->size_bytes_), "cudaMalloc KV cache"));
  cache->device_data_ = static_cast<std::byte*>(data);
  cudaIpcMemHandle_t handle{};
  KVTIER_RETURN_IF_ERROR(cuda_error(cudaIpcGetMemHandle(&handle, data), "cudaIpcGetMemHandle"));
  std::memcpy(cache->ipc_handle_.data(), &handle, sizeof(handle));
  int device = 0;
  cudaDeviceProp props{};
  KVTIER_RETURN_IF_ERROR(cuda_error(cudaGetDevice(&device), "cudaGetDevice"));
  KVTIER_RETURN_IF_ERROR(
      cuda_error(cudaGetDeviceProperties(&props, device), "cudaGetDeviceProperties"));
  cache->gpu_uuid_ = format_uuid(props.uuid);
  // The same layout description as the host cache: equal digests, shared blocks.
  cache->layout_ = PagedCache::make_layout(shape, region_id);
  return cache;
}

GpuPagedCache::~GpuPagedCache() {
  if (device_data_ != nullptr) cudaFree(device_data_);
}

Status GpuPagedCache::register_with(Client& client) const {
  return client.register_cuda_ipc_region(region_id_, ipc_handle_, size_bytes_, gpu_uuid_);
}

uint64_t GpuPagedCache::plane_offset(uint32_t plane, uint64_t block_id) const {
  return layout_.planes[plane].offset_bytes + block_id * layout_.planes[plane].stride_bytes;
}

Status GpuPagedCache::fill(uint64_t block_id, const BlockHash& hash) {
  std::vector<std::byte> plane_bytes(shape_.plane_bytes());
  for (uint32_t p = 0; p < layout_.planes.size(); ++p) {
    PagedCache::generate(hash, p, plane_bytes.data(), plane_bytes.size());
    KVTIER_RETURN_IF_ERROR(
        cuda_error(cudaMemcpy(device_data_ + plane_offset(p, block_id), plane_bytes.data(),
                              plane_bytes.size(), cudaMemcpyHostToDevice),
                   "fill block"));
  }
  return Status::ok();
}

Result<bool> GpuPagedCache::verify(uint64_t block_id, const BlockHash& hash) const {
  std::vector<std::byte> expected(shape_.plane_bytes()), actual(shape_.plane_bytes());
  for (uint32_t p = 0; p < layout_.planes.size(); ++p) {
    PagedCache::generate(hash, p, expected.data(), expected.size());
    KVTIER_RETURN_IF_ERROR(
        cuda_error(cudaMemcpy(actual.data(), device_data_ + plane_offset(p, block_id),
                              actual.size(), cudaMemcpyDeviceToHost),
                   "read block"));
    if (std::memcmp(expected.data(), actual.data(), actual.size()) != 0) return false;
  }
  return true;
}

Status GpuPagedCache::wipe() {
  return cuda_error(cudaMemset(device_data_, 0, size_bytes_), "wipe KV cache");
}

Status GpuPagedCache::synchronize() {
  return cuda_error(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

}  // namespace kvtier
