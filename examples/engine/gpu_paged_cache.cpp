#include "examples/engine/gpu_paged_cache.h"

#include <cstring>
#include <span>
#include <utility>

#include "common/gpu_uuid.h"
#include "cuda/driver_api.h"

namespace kvtier {
namespace {

using cuda::driver_status;
using cuda::DriverApi;

// Canary sizes: a few KiB, and multiples of 512 bytes so that the tensors keep the
// alignment PyTorch gives them while sitting at offsets no 2 MiB boundary explains.
constexpr uint64_t kIpcCanaryBytes = 5 * 1024;
constexpr uint64_t kVmmCanaryBytes = 4 * 1024;
constexpr uint64_t kMinimumVmmChunks = 8;

std::byte canary_byte(size_t canary, uint64_t i) {
  return static_cast<std::byte>((i * 131 + canary * 29 + 0x5a) & 0xff);
}

std::vector<std::byte> canary_pattern(size_t canary, uint64_t bytes) {
  std::vector<std::byte> pattern(bytes);
  for (uint64_t i = 0; i < bytes; ++i) pattern[i] = canary_byte(canary, i);
  return pattern;
}

uint64_t round_up(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

CUmemAllocationProp exportable_chunk_properties(int ordinal) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  // What lets cuda_regions export each chunk as an fd for the daemon to import.
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

}  // namespace

// Either one cuMemAlloc, or chunks mapped into a reserved range. Built step by step so
// that a failure half-way frees what was made. The owner makes the context current
// before destroying it.
class GpuPagedCache::Memory {
 public:
  explicit Memory(const DriverApi& api) : api_(api) {}
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;
  ~Memory() {
    if (!vmm_) {
      if (address_ != 0) (void)api_.mem_free(address_);
      return;
    }
    for (size_t i = 0; i < mapped_; ++i)
      (void)api_.mem_unmap(address_ + i * chunk_bytes_, chunk_bytes_);
    for (CUmemGenericAllocationHandle handle : handles_) (void)api_.mem_release(handle);
    if (address_ != 0) (void)api_.mem_address_free(address_, bytes_);
  }

  Status allocate_legacy(uint64_t bytes) {
    KVTIER_RETURN_IF_ERROR(driver_status(api_.mem_alloc(&address_, bytes), "cuMemAlloc KV cache"));
    bytes_ = bytes;
    return Status::ok();
  }

  Status allocate_vmm(int ordinal, uint64_t chunk_bytes, uint64_t chunks) {
    vmm_ = true;
    chunk_bytes_ = chunk_bytes;
    const uint64_t bytes = chunk_bytes * chunks;
    KVTIER_RETURN_IF_ERROR(driver_status(
        api_.mem_address_reserve(&address_, bytes, chunk_bytes, 0, 0), "cuMemAddressReserve"));
    bytes_ = bytes;
    const CUmemAllocationProp prop = exportable_chunk_properties(ordinal);
    for (uint64_t i = 0; i < chunks; ++i) {
      CUmemGenericAllocationHandle handle{};
      KVTIER_RETURN_IF_ERROR(
          driver_status(api_.mem_create(&handle, chunk_bytes, &prop, 0), "cuMemCreate"));
      handles_.push_back(handle);
      // One mapping per handle, as expandable segments grow: each chunk is its own
      // address range, which is what cuda_regions walks.
      KVTIER_RETURN_IF_ERROR(driver_status(
          api_.mem_map(address_ + i * chunk_bytes, chunk_bytes, 0, handle, 0), "cuMemMap"));
      ++mapped_;
    }
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = ordinal;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return driver_status(api_.mem_set_access(address_, bytes, &access, 1), "cuMemSetAccess");
  }

  CUdeviceptr address() const { return address_; }

 private:
  const DriverApi& api_;
  bool vmm_ = false;
  CUdeviceptr address_ = 0;
  uint64_t bytes_ = 0;
  uint64_t chunk_bytes_ = 0;
  std::vector<CUmemGenericAllocationHandle> handles_;
  size_t mapped_ = 0;
};

Result<std::unique_ptr<GpuPagedCache>> GpuPagedCache::create(const PagedCacheShape& shape,
                                                             int gpu_index, GpuMemoryMode mode,
                                                             uint32_t first_region_id) {
  auto api_or = DriverApi::get();
  if (!api_or.is_ok()) return api_or.status();
  const DriverApi& api = **api_or;
  int count = 0;
  KVTIER_RETURN_IF_ERROR(driver_status(api.device_get_count(&count), "cuDeviceGetCount"));
  if (count == 0) return unavailable("no CUDA device");
  if (gpu_index < 0 || gpu_index >= count) {
    return invalid_argument("GPU {} does not exist: this machine has {} (0 .. {})", gpu_index,
                            count, count - 1);
  }

  std::unique_ptr<GpuPagedCache> cache(new GpuPagedCache());
  cache->api_ = &api;
  cache->shape_ = shape;
  cache->mode_ = mode;
  cache->first_region_id_ = first_region_id;
  cache->ordinal_ = gpu_index;
  KVTIER_RETURN_IF_ERROR(driver_status(api.device_get(&cache->device_, gpu_index), "cuDeviceGet"));
  CUcontext context = nullptr;
  KVTIER_RETURN_IF_ERROR(
      driver_status(api.primary_ctx_retain(&context, cache->device_), "cuDevicePrimaryCtxRetain"));
  cache->context_ = context;
  KVTIER_RETURN_IF_ERROR(cache->make_current());
  CUuuid uuid{};
  KVTIER_RETURN_IF_ERROR(
      driver_status(api.device_get_uuid(&uuid, cache->device_), "cuDeviceGetUuid"));
  cache->gpu_uuid_ = format_gpu_uuid(
      std::span<const uint8_t, 16>(reinterpret_cast<const uint8_t*>(uuid.bytes), 16));
  KVTIER_RETURN_IF_ERROR(cache->place_tensors());
  KVTIER_RETURN_IF_ERROR(cache->write_canaries());
  KVTIER_RETURN_IF_ERROR(cache->wipe());
  KVTIER_RETURN_IF_ERROR(cache->synchronize());
  return cache;
}

Status GpuPagedCache::place_tensors() {
  memory_ = std::make_unique<Memory>(*api_);
  const uint64_t plane_bytes = shape_.plane_bytes();
  if (mode_ == GpuMemoryMode::kIpc) {
    // K and V as PyTorch would hold them: [layers, blocks, plane] each, one segment.
    const uint64_t tensor_bytes = uint64_t{shape_.num_layers} * shape_.num_blocks * plane_bytes;
    const uint64_t k_offset = kIpcCanaryBytes;
    const uint64_t v_offset = k_offset + tensor_bytes + kIpcCanaryBytes;
    tensors_ = {{first_region_id_, k_offset, tensor_bytes},
                {first_region_id_ + 1, v_offset, tensor_bytes}};
    canaries_ = {{"before K", 0, kIpcCanaryBytes},
                 {"between K and V", k_offset + tensor_bytes, kIpcCanaryBytes},
                 {"after V", v_offset + tensor_bytes, kIpcCanaryBytes}};
    layout_ = PagedCache::make_layout(shape_, first_region_id_);
    for (uint32_t p = 0; p < layout_.planes.size(); ++p) {
      PlaneSpec& plane = layout_.planes[p];
      plane.region_id = first_region_id_ + p % 2;
      plane.offset_bytes = uint64_t{p / 2} * shape_.num_blocks * plane_bytes;
    }
    return memory_->allocate_legacy(v_offset + tensor_bytes + kIpcCanaryBytes);
  }

  const CUmemAllocationProp prop = exportable_chunk_properties(ordinal_);
  size_t granularity = 0;
  KVTIER_RETURN_IF_ERROR(driver_status(
      api_->mem_get_allocation_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
      "cuMemGetAllocationGranularity"));
  // Enough blocks that the cache covers kMinimumVmmChunks whole chunks' worth of bytes,
  // so that, starting inside the first chunk, it touches more than that many.
  const uint64_t minimum_blocks =
      (kMinimumVmmChunks * granularity + shape_.block_bytes() - 1) / shape_.block_bytes();
  if (shape_.num_blocks < minimum_blocks) shape_.num_blocks = minimum_blocks;
  const uint64_t tensor_bytes = shape_.region_bytes();
  const uint64_t head = granularity / 2 + kVmmCanaryBytes;  // 1 MiB + 4 KiB for 2 MiB chunks
  tensors_ = {{first_region_id_, head, tensor_bytes}};
  canaries_ = {{"before the cache", head - kVmmCanaryBytes, kVmmCanaryBytes},
               {"after the cache", head + tensor_bytes, kVmmCanaryBytes}};
  layout_ = PagedCache::make_layout(shape_, first_region_id_);
  const uint64_t chunks =
      round_up(head + tensor_bytes + kVmmCanaryBytes, granularity) / granularity;
  return memory_->allocate_vmm(ordinal_, granularity, chunks);
}

Status GpuPagedCache::write_canaries() {
  for (size_t c = 0; c < canaries_.size(); ++c) {
    auto pattern = canary_pattern(c, canaries_[c].bytes);
    KVTIER_RETURN_IF_ERROR(
        driver_status(api_->memcpy_htod(memory_->address() + canaries_[c].offset_bytes,
                                        pattern.data(), pattern.size()),
                      fmt::format("write canary '{}'", canaries_[c].name)));
  }
  return Status::ok();
}

GpuPagedCache::~GpuPagedCache() {
  if (context_ == nullptr) return;
  CUcontext previous = nullptr;
  (void)api_->ctx_get_current(&previous);
  (void)make_current();
  memory_.reset();
  (void)api_->ctx_set_current(previous == context_ ? nullptr : previous);
  (void)api_->primary_ctx_release(device_);
}

Status GpuPagedCache::make_current() const {
  return driver_status(api_->ctx_set_current(context_), "cuCtxSetCurrent");
}

Status GpuPagedCache::register_with(Client& client) {
  if (!registered_.empty()) return invalid_argument("the GPU KV cache is already registered");
  for (const Tensor& tensor : tensors_) {
    auto info = register_cuda_region(client, tensor.region_id,
                                     memory_->address() + tensor.offset_bytes, tensor.bytes);
    if (!info.is_ok()) return info.status();
    registered_.push_back(std::move(*info));
  }
  return Status::ok();
}

Status GpuPagedCache::unregister(Client& client) {
  for (size_t i = 0; i < registered_.size(); ++i) {
    const uint32_t region_id = tensors_[i].region_id;
    auto reply = client.unregister_region_async(region_id).wait();
    if (!reply.is_ok()) return reply.status();
    if (*reply != region_id) {
      return internal_error("UnregisterRegion {}: the reply names region {}", region_id, *reply);
    }
  }
  registered_.clear();
  return Status::ok();
}

std::map<uint32_t, CUdeviceptr> GpuPagedCache::region_bases() const {
  std::map<uint32_t, CUdeviceptr> bases;
  for (const Tensor& tensor : tensors_)
    bases[tensor.region_id] = memory_->address() + tensor.offset_bytes;
  return bases;
}

CUdeviceptr GpuPagedCache::plane_address(uint32_t plane, uint64_t block_id) const {
  const PlaneSpec& spec = layout_.planes[plane];
  const Tensor& tensor = tensors_[spec.region_id - first_region_id_];
  return memory_->address() + tensor.offset_bytes + spec.offset_bytes +
         block_id * spec.stride_bytes;
}

Status GpuPagedCache::fill(uint64_t block_id, const BlockHash& hash) {
  KVTIER_RETURN_IF_ERROR(make_current());
  std::vector<std::byte> plane_bytes(shape_.plane_bytes());
  for (uint32_t p = 0; p < layout_.planes.size(); ++p) {
    PagedCache::generate(hash, p, plane_bytes.data(), plane_bytes.size());
    KVTIER_RETURN_IF_ERROR(driver_status(
        api_->memcpy_htod(plane_address(p, block_id), plane_bytes.data(), plane_bytes.size()),
        fmt::format("fill block {} plane {}", block_id, p)));
  }
  return Status::ok();
}

Result<bool> GpuPagedCache::verify(uint64_t block_id, const BlockHash& hash) const {
  KVTIER_RETURN_IF_ERROR(make_current());
  std::vector<std::byte> expected(shape_.plane_bytes()), actual(shape_.plane_bytes());
  for (uint32_t p = 0; p < layout_.planes.size(); ++p) {
    PagedCache::generate(hash, p, expected.data(), expected.size());
    KVTIER_RETURN_IF_ERROR(
        driver_status(api_->memcpy_dtoh(actual.data(), plane_address(p, block_id), actual.size()),
                      fmt::format("read block {} plane {}", block_id, p)));
    if (std::memcmp(expected.data(), actual.data(), actual.size()) != 0) return false;
  }
  auto damaged = damaged_canaries();
  if (!damaged.is_ok()) return damaged.status();
  return damaged->empty();
}

Result<std::vector<std::string>> GpuPagedCache::damaged_canaries() const {
  KVTIER_RETURN_IF_ERROR(make_current());
  std::vector<std::string> damaged;
  for (size_t c = 0; c < canaries_.size(); ++c) {
    const Canary& canary = canaries_[c];
    std::vector<std::byte> actual(canary.bytes);
    KVTIER_RETURN_IF_ERROR(driver_status(
        api_->memcpy_dtoh(actual.data(), memory_->address() + canary.offset_bytes, actual.size()),
        fmt::format("read canary '{}'", canary.name)));
    uint64_t changed = 0, first = 0;
    for (uint64_t i = 0; i < actual.size(); ++i) {
      if (actual[i] == canary_byte(c, i)) continue;
      if (changed++ == 0) first = i;
    }
    if (changed != 0) {
      damaged.push_back(
          fmt::format("{} (at +0x{:x} in the allocation): {} of {} bytes changed, "
                      "first at +0x{:x}",
                      canary.name, canary.offset_bytes, changed, canary.bytes, first));
    }
  }
  return damaged;
}

Status GpuPagedCache::wipe() {
  KVTIER_RETURN_IF_ERROR(make_current());
  for (const Tensor& tensor : tensors_) {
    KVTIER_RETURN_IF_ERROR(
        driver_status(api_->memset_d8(memory_->address() + tensor.offset_bytes, 0, tensor.bytes),
                      "wipe KV cache"));
  }
  return Status::ok();
}

Status GpuPagedCache::synchronize() {
  KVTIER_RETURN_IF_ERROR(make_current());
  return driver_status(api_->ctx_synchronize(), "cuCtxSynchronize");
}

}  // namespace kvtier
