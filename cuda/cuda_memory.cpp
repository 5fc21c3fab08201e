#include "cuda/cuda_memory.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "common/log.h"
#include "common/units.h"

namespace kvtier::cuda {

GpuSet::~GpuSet() {
  for (const GpuContext& gpu : gpus_) driver_.primary_ctx_release(gpu.device);
}

Status GpuSet::make_current(int index) const {
  return driver_status(driver_.ctx_set_current(gpus_[index].context), "cuCtxSetCurrent");
}

namespace {

// A reserved address range with chunks mapped into it; unmaps and frees on
// destruction. Physical memory is released with its last mapping (the handles are
// released right after mapping).
class MappedRange {
 public:
  MappedRange(GpuSetPtr gpus, int owner)
      : gpus_(std::move(gpus)), driver_(gpus_->driver()), owner_(owner) {}
  ~MappedRange() {
    if (base_ == 0) return;
    (void)gpus_->make_current(owner_);
    for (const auto& [offset, bytes] : mapped_) driver_.mem_unmap(base_ + offset, bytes);
    driver_.mem_address_free(base_, reserved_bytes_);
  }
  MappedRange(const MappedRange&) = delete;
  MappedRange& operator=(const MappedRange&) = delete;

  Status reserve(uint64_t bytes, uint64_t alignment) {
    KVTIER_RETURN_IF_ERROR(
        driver_status(driver_.mem_address_reserve(&base_, bytes, alignment, 0, 0),
                      fmt::format("cuMemAddressReserve {} bytes", bytes)));
    reserved_bytes_ = bytes;
    return Status::ok();
  }
  // Maps `handle` (`bytes` of it) at `offset`, then releases the handle: the mapping
  // holds the memory from now on.
  Status map_and_release(uint64_t offset, uint64_t bytes, CUmemGenericAllocationHandle handle) {
    Status mapped = driver_status(driver_.mem_map(base_ + offset, bytes, 0, handle, 0),
                                  fmt::format("cuMemMap {} bytes at +{}", bytes, offset));
    if (mapped.is_ok()) mapped_.emplace_back(offset, bytes);
    driver_.mem_release(handle);
    return mapped;
  }
  // Read/write access to [offset, offset + bytes) for the GPU holding it and every
  // served GPU that can reach that GPU's memory directly (cuDeviceCanAccessPeer); the
  // others copy through cuMemcpyPeerAsync, which the driver stages where it must.
  Status set_access(uint64_t offset, uint64_t bytes, int owner) {
    std::vector<CUmemAccessDesc> access;
    for (const GpuContext& gpu : gpus_->gpus()) {
      if (gpu.index != owner && (gpu.peers >> owner & 1) == 0) continue;
      CUmemAccessDesc desc{};
      desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      desc.location.id = gpu.ordinal;
      desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      access.push_back(desc);
    }
    return driver_status(
        driver_.mem_set_access(base_ + offset, bytes, access.data(), access.size()),
        "cuMemSetAccess");
  }
  CUdeviceptr base() const { return base_; }

 private:
  const GpuSetPtr gpus_;
  const DriverApi& driver_;
  const int owner_;
  CUdeviceptr base_ = 0;
  uint64_t reserved_bytes_ = 0;
  std::vector<std::pair<uint64_t, uint64_t>> mapped_;  // (offset, bytes)
};

Result<uint64_t> granularity(const DriverApi& driver, const GpuContext& gpu,
                             CUmemAllocationGranularity_flags which) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = gpu.ordinal;
  size_t bytes = 0;
  KVTIER_RETURN_IF_ERROR(driver_status(driver.mem_get_allocation_granularity(&bytes, &prop, which),
                                       "cuMemGetAllocationGranularity"));
  if (bytes == 0) return internal_error("cuMemGetAllocationGranularity returned 0");
  return uint64_t{bytes};
}

class Arena final : public CudaMemory {
 public:
  Arena(std::unique_ptr<MappedRange> range, uint64_t part_bytes, size_t parts)
      : range_(std::move(range)), part_bytes_(part_bytes), parts_(parts) {}
  uint64_t size_bytes() const override { return part_bytes_ * parts_; }
  MemoryLocation location() const override { return MemoryLocation::kGpu; }
  std::string describe() const override {
    return fmt::format("hbm arena ({} on each of {} GPUs)", format_bytes(part_bytes_), parts_);
  }
  CUdeviceptr address() const override { return range_->base(); }
  int gpu_at(uint64_t offset) const override { return static_cast<int>(offset / part_bytes_); }

 private:
  std::unique_ptr<MappedRange> range_;
  uint64_t part_bytes_;
  size_t parts_;
};

class IpcRegion final : public CudaMemory {
 public:
  IpcRegion(GpuSetPtr gpus, int gpu, CUdeviceptr base, uint64_t offset, uint64_t bytes)
      : gpus_(std::move(gpus)), gpu_(gpu), base_(base), offset_(offset), bytes_(bytes) {}
  ~IpcRegion() override {
    (void)gpus_->make_current(gpu_);
    gpus_->driver().ipc_close_mem_handle(base_);
  }
  uint64_t size_bytes() const override { return bytes_; }
  MemoryLocation location() const override { return MemoryLocation::kGpu; }
  std::string describe() const override {
    return fmt::format("cuda ipc region {} at +{} on {}", format_bytes(bytes_), offset_,
                       gpus_->gpu(gpu_).info.uuid);
  }
  CUdeviceptr address() const override { return base_ + offset_; }
  int gpu_at(uint64_t) const override { return gpu_; }

 private:
  const GpuSetPtr gpus_;
  const int gpu_;
  CUdeviceptr base_;
  uint64_t offset_;
  uint64_t bytes_;
};

class VmmRegion final : public CudaMemory {
 public:
  VmmRegion(std::unique_ptr<MappedRange> range, std::string uuid, int gpu, uint64_t offset,
            uint64_t bytes, size_t chunks)
      : range_(std::move(range)),
        uuid_(std::move(uuid)),
        gpu_(gpu),
        offset_(offset),
        bytes_(bytes),
        chunks_(chunks) {}
  uint64_t size_bytes() const override { return bytes_; }
  MemoryLocation location() const override { return MemoryLocation::kGpu; }
  std::string describe() const override {
    return fmt::format("cuda vmm region {} in {} chunks at +{} on {}", format_bytes(bytes_),
                       chunks_, offset_, uuid_);
  }
  CUdeviceptr address() const override { return range_->base() + offset_; }
  int gpu_at(uint64_t) const override { return gpu_; }

 private:
  std::unique_ptr<MappedRange> range_;
  const std::string uuid_;
  const int gpu_;
  uint64_t offset_;
  uint64_t bytes_;
  size_t chunks_;
};

}  // namespace

Result<std::shared_ptr<Memory>> allocate_arena(const GpuSetPtr& gpu_set, uint64_t bytes_per_gpu,
                                               uint64_t part_alignment) {
  const DriverApi& driver = gpu_set->driver();
  const std::vector<GpuContext>& gpus = gpu_set->gpus();
  if (gpus.empty()) return internal_error("hbm arena: no GPU to allocate it on");
  uint64_t reserve_alignment = 1;  // a power of two, as cuMemAddressReserve requires
  for (const GpuContext& gpu : gpus) {
    auto unit = granularity(driver, gpu, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (!unit.is_ok()) return unit.status();
    reserve_alignment = std::max(reserve_alignment, *unit);
  }
  // Parts are whole granules and whole slabs (so no slab straddles two GPUs).
  const uint64_t alignment = std::lcm(reserve_alignment, std::max<uint64_t>(part_alignment, 1));
  const uint64_t part = bytes_per_gpu / alignment * alignment;
  if (part == 0) {
    return invalid_argument("hbm arena: {} bytes per GPU is less than one unit of {} bytes",
                            bytes_per_gpu, alignment);
  }
  KVTIER_RETURN_IF_ERROR(gpu_set->make_current(0));
  auto range = std::make_unique<MappedRange>(gpu_set, 0);
  KVTIER_RETURN_IF_ERROR(range->reserve(part * gpus.size(), reserve_alignment));
  for (const GpuContext& gpu : gpus) {
    KVTIER_RETURN_IF_ERROR(gpu_set->make_current(gpu.index));
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = gpu.ordinal;
    CUmemGenericAllocationHandle handle{};
    KVTIER_RETURN_IF_ERROR(driver_status(
        driver.mem_create(&handle, part, &prop, 0),
        fmt::format("cuMemCreate {} of HBM on {}", format_bytes(part), gpu.info.uuid)));
    const uint64_t offset = part * static_cast<uint64_t>(gpu.index);
    KVTIER_RETURN_IF_ERROR(range->map_and_release(offset, part, handle));
    KVTIER_RETURN_IF_ERROR(range->set_access(offset, part, gpu.index));
  }
  return std::shared_ptr<Memory>(std::make_shared<Arena>(std::move(range), part, gpus.size()));
}

Result<std::shared_ptr<Memory>> open_ipc_region(const GpuSetPtr& gpus, int gpu,
                                                RegionHandle& handle) {
  const DriverApi& driver = gpus->driver();
  CUipcMemHandle ipc{};
  static_assert(sizeof(ipc) == sizeof(handle.ipc_handle));
  std::memcpy(&ipc, handle.ipc_handle.data(), sizeof(ipc));
  KVTIER_RETURN_IF_ERROR(gpus->make_current(gpu));
  CUdeviceptr base = 0;
  // A handle from another machine, of a freed allocation, or garbage fails here.
  KVTIER_RETURN_IF_ERROR(
      driver_status(driver.ipc_open_mem_handle(&base, ipc, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                    "cuIpcOpenMemHandle"));
  auto region =
      std::make_shared<IpcRegion>(gpus, gpu, base, handle.offset_bytes, handle.size_bytes);
  CUdeviceptr allocation_base = 0;
  size_t allocation_bytes = 0;
  KVTIER_RETURN_IF_ERROR(
      driver_status(driver.mem_get_address_range(&allocation_base, &allocation_bytes, base),
                    "cuMemGetAddressRange"));
  if (allocation_base != base) {
    return invalid_argument(
        "ipcHandle: the driver opened the handle at +{} inside an allocation, "
        "not at its base",
        base - allocation_base);
  }
  if (handle.offset_bytes > allocation_bytes ||
      handle.size_bytes > allocation_bytes - handle.offset_bytes) {
    return invalid_argument(
        "offsetBytes {} + sizeBytes {} exceed the {} bytes of the allocation the IPC handle "
        "exports",
        handle.offset_bytes, handle.size_bytes, allocation_bytes);
  }
  return std::shared_ptr<Memory>(std::move(region));
}

Result<std::shared_ptr<Memory>> open_vmm_region(const GpuSetPtr& gpus, int gpu_index,
                                                RegionHandle& handle) {
  const DriverApi& driver = gpus->driver();
  const GpuContext& gpu = gpus->gpu(gpu_index);
  if (handle.vmm_chunks.empty()) return invalid_argument("a VMM region needs at least one chunk");
  // What cuMemMap insists on: the minimum granularity (the engine allocated the chunks).
  auto unit = granularity(driver, gpu, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (!unit.is_ok()) return unit.status();
  uint64_t total = 0;
  for (size_t i = 0; i < handle.vmm_chunks.size(); ++i) {
    const uint64_t bytes = handle.vmm_chunks[i].bytes;
    if (bytes == 0 || bytes % *unit != 0) {
      return invalid_argument(
          "chunkBytes[{}] = {} is not a positive multiple of the allocation "
          "granularity ({} bytes)",
          i, bytes, *unit);
    }
    if (bytes > (uint64_t{1} << 44) - total)
      return invalid_argument("chunkBytes add up past 16 TiB");
    total += bytes;
  }
  if (handle.offset_bytes > total || handle.size_bytes > total - handle.offset_bytes) {
    return invalid_argument("offsetBytes {} + sizeBytes {} exceed the {} bytes of the chunks",
                            handle.offset_bytes, handle.size_bytes, total);
  }
  KVTIER_RETURN_IF_ERROR(gpus->make_current(gpu_index));
  auto range = std::make_unique<MappedRange>(gpus, gpu_index);
  KVTIER_RETURN_IF_ERROR(range->reserve(total, *unit));
  uint64_t offset = 0;
  for (size_t i = 0; i < handle.vmm_chunks.size(); ++i) {
    VmmChunk& chunk = handle.vmm_chunks[i];
    CUmemGenericAllocationHandle imported{};
    KVTIER_RETURN_IF_ERROR(driver_status(
        driver.mem_import_from_shareable_handle(
            &imported, reinterpret_cast<void*>(static_cast<uintptr_t>(chunk.fd.get())),
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
        fmt::format("chunk {}: cuMemImportFromShareableHandle", i)));
    chunk.fd.reset();  // the handle holds the memory now
    CUmemAllocationProp prop{};
    Status checked = driver_status(driver.mem_get_allocation_properties(&prop, imported),
                                   "cuMemGetAllocationPropertiesFromHandle");
    if (checked.is_ok() &&
        (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != gpu.ordinal)) {
      checked = invalid_argument("chunk {} lives on device ordinal {}, not on {} (ordinal {})", i,
                                 prop.location.id, gpu.info.uuid, gpu.ordinal);
    }
    if (!checked.is_ok()) {
      driver.mem_release(imported);
      return checked;
    }
    // Fails when the chunk is smaller than the engine declared.
    Status mapped = range->map_and_release(offset, chunk.bytes, imported);
    if (!mapped.is_ok()) {
      return mapped.with_context(fmt::format("chunk {} (is chunkBytes right?)", i));
    }
    offset += chunk.bytes;
  }
  // Access once, for the whole range.
  KVTIER_RETURN_IF_ERROR(range->set_access(0, total, gpu_index));  // once, for all chunks
  return std::shared_ptr<Memory>(
      std::make_shared<VmmRegion>(std::move(range), gpu.info.uuid, gpu_index, handle.offset_bytes,
                                  handle.size_bytes, handle.vmm_chunks.size()));
}

}  // namespace kvtier::cuda
