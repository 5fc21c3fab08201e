#include "client/cuda_regions.h"

#include <cstring>
#include <span>
#include <utility>

#include "common/gpu_uuid.h"
#include "cuda/driver_api.h"

namespace kvtier {
namespace {

using cuda::driver_status;
using cuda::DriverApi;

static_assert(sizeof(CUipcMemHandle) == 64, "RegisterRegion.ipcHandle carries 64 bytes");

// Makes `device`'s primary context current for one call's duration unless the thread
// already has a context on that device, and puts the thread back as it was afterwards:
// the caller may be an engine thread whose own context choice must survive the call.
class ScopedDeviceContext {
 public:
  static Result<ScopedDeviceContext> enter(const DriverApi& api, CUdevice device) {
    ScopedDeviceContext scope(api, device);
    KVTIER_RETURN_IF_ERROR(driver_status(api.ctx_get_current(&scope.previous_), "cuCtxGetCurrent"));
    if (scope.previous_ != nullptr) {
      CUdevice current = 0;
      KVTIER_RETURN_IF_ERROR(driver_status(api.ctx_get_device(&current), "cuCtxGetDevice"));
      if (current == device) return scope;
    }
    CUcontext primary = nullptr;
    KVTIER_RETURN_IF_ERROR(
        driver_status(api.primary_ctx_retain(&primary, device), "cuDevicePrimaryCtxRetain"));
    scope.retained_ = true;
    KVTIER_RETURN_IF_ERROR(driver_status(api.ctx_set_current(primary), "cuCtxSetCurrent"));
    return scope;
  }

  ScopedDeviceContext(ScopedDeviceContext&& other) noexcept
      : api_(other.api_),
        device_(other.device_),
        previous_(other.previous_),
        retained_(std::exchange(other.retained_, false)) {}
  ScopedDeviceContext& operator=(ScopedDeviceContext&&) = delete;
  ~ScopedDeviceContext() {
    if (!retained_) return;
    (void)api_->ctx_set_current(previous_);
    (void)api_->primary_ctx_release(device_);
  }

 private:
  ScopedDeviceContext(const DriverApi& api, CUdevice device) : api_(&api), device_(device) {}

  const DriverApi* api_;
  CUdevice device_;
  CUcontext previous_ = nullptr;
  bool retained_ = false;  // the primary context is ours to release
};

// The ordinal of the GPU holding `ptr`. With unified addressing the driver answers
// without a current context; should it insist on one, each GPU's primary context is
// tried in turn (any context resolves any pointer of the process).
Result<int> device_ordinal_of(const DriverApi& api, CUdeviceptr ptr) {
  int ordinal = -1;
  CUresult result = api.pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr);
  if (result == CUDA_SUCCESS) return ordinal;
  if (result != CUDA_ERROR_INVALID_CONTEXT) {
    return driver_status(result, fmt::format("pointer 0x{:x}: not device memory", ptr));
  }
  int count = 0;
  KVTIER_RETURN_IF_ERROR(driver_status(api.device_get_count(&count), "cuDeviceGetCount"));
  for (int candidate = 0; candidate < count; ++candidate) {
    CUdevice device = 0;
    KVTIER_RETURN_IF_ERROR(driver_status(api.device_get(&device, candidate), "cuDeviceGet"));
    auto scope = ScopedDeviceContext::enter(api, device);
    if (!scope.is_ok()) return scope.status();
    result = api.pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr);
    if (result == CUDA_SUCCESS) return ordinal;
  }
  return driver_status(result, fmt::format("pointer 0x{:x}: not device memory", ptr));
}

Status export_legacy_ipc(const DriverApi& api, CUdeviceptr ptr, uint64_t bytes,
                         CudaRegionExport& out) {
  CUdeviceptr base = 0;
  size_t allocation_bytes = 0;
  KVTIER_RETURN_IF_ERROR(driver_status(api.mem_get_address_range(&base, &allocation_bytes, ptr),
                                       "cuMemGetAddressRange"));
  out.info.offset_bytes = ptr - base;
  out.info.allocation_bytes = allocation_bytes;
  if (out.info.offset_bytes + bytes > allocation_bytes) {
    return invalid_argument(
        "device range [0x{:x}, +{}) ends past its allocation [0x{:x}, +{}): a region must lie "
        "inside one cuMemAlloc allocation",
        ptr, bytes, base, allocation_bytes);
  }
  CUipcMemHandle handle{};
  // The handle exports the allocation, not the pointer: the daemon opens the base and
  // adds offset_bytes itself.
  KVTIER_RETURN_IF_ERROR(driver_status(api.ipc_get_mem_handle(&handle, base), "cuIpcGetMemHandle"));
  std::memcpy(out.ipc_handle.data(), &handle, sizeof(handle));
  return Status::ok();
}

// A handle from cuMemRetainAllocationHandle, released when it goes.
class RetainedAllocation {
 public:
  RetainedAllocation(const DriverApi& api, CUmemGenericAllocationHandle handle)
      : api_(api), handle_(handle) {}
  RetainedAllocation(const RetainedAllocation&) = delete;
  RetainedAllocation& operator=(const RetainedAllocation&) = delete;
  ~RetainedAllocation() { (void)api_.mem_release(handle_); }
  CUmemGenericAllocationHandle get() const { return handle_; }

 private:
  const DriverApi& api_;
  CUmemGenericAllocationHandle handle_;
};

// Walks the range one mapped chunk at a time: each cuMemMap'ed handle is its own
// address range to cuMemGetAddressRange, which is how expandable segments look.
Status export_vmm(const DriverApi& api, CUdeviceptr ptr, uint64_t bytes, CudaRegionExport& out) {
  const CUdeviceptr end = ptr + bytes;
  CUdeviceptr address = ptr;
  CUdeviceptr expected_base = 0;
  while (address < end) {
    CUmemGenericAllocationHandle raw_handle{};
    CUresult retained =
        api.mem_retain_allocation_handle(&raw_handle, reinterpret_cast<void*>(address));
    if (retained != CUDA_SUCCESS) {
      if (out.chunks.empty()) {
        return invalid_argument(
            "device range at 0x{:x} is neither legacy-IPC-capable memory (cuMemAlloc) nor "
            "VMM-mapped memory (cuMemCreate + cuMemMap); managed memory and stream-ordered "
            "pools cannot be shared ({})",
            ptr, driver_status(retained, "cuMemRetainAllocationHandle").message());
      }
      return invalid_argument("device range [0x{:x}, +{}) has no memory mapped at 0x{:x}", ptr,
                              bytes, address);
    }
    RetainedAllocation handle(api, raw_handle);
    CUdeviceptr base = 0;
    size_t chunk_bytes = 0;
    KVTIER_RETURN_IF_ERROR(driver_status(api.mem_get_address_range(&base, &chunk_bytes, address),
                                         "cuMemGetAddressRange"));
    if (out.chunks.empty()) {
      out.info.offset_bytes = ptr - base;
    } else if (base != expected_base) {
      return invalid_argument(
          "device range [0x{:x}, +{}) is not contiguously mapped: a chunk ends at 0x{:x}, the "
          "next starts at 0x{:x}",
          ptr, bytes, expected_base, base);
    }
    CUmemAllocationProp prop{};
    KVTIER_RETURN_IF_ERROR(driver_status(api.mem_get_allocation_properties(&prop, handle.get()),
                                         "cuMemGetAllocationPropertiesFromHandle"));
    if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        prop.location.id != out.info.device_ordinal) {
      return invalid_argument(
          "device range [0x{:x}, +{}) spans memory outside GPU {} (chunk at 0x{:x}): a region "
          "lives on one GPU",
          ptr, bytes, out.info.device_ordinal, base);
    }
    if ((prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
      return invalid_argument(
          "VMM chunk at 0x{:x} was not created exportable as a POSIX file descriptor, so the "
          "daemon cannot import it. PyTorch: set "
          "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True with a PyTorch that creates "
          "shareable segments; own allocations: cuMemCreate with requestedHandleTypes = "
          "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR",
          base);
    }
    int fd = -1;
    KVTIER_RETURN_IF_ERROR(
        driver_status(api.mem_export_to_shareable_handle(
                          &fd, handle.get(), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                      fmt::format("cuMemExportToShareableHandle (chunk at 0x{:x})", base)));
    out.chunks.push_back(CudaVmmChunkExport{UniqueFd(fd), chunk_bytes});
    out.info.allocation_bytes += chunk_bytes;
    expected_base = base + chunk_bytes;
    address = expected_base;
  }
  out.info.chunk_count = static_cast<uint32_t>(out.chunks.size());
  return Status::ok();
}

}  // namespace

Result<CudaRegionExport> export_cuda_region(CUdeviceptr ptr, uint64_t bytes) {
  if (bytes == 0) return invalid_argument("device range at 0x{:x} is empty", ptr);
  auto api_or = DriverApi::get();
  if (!api_or.is_ok()) return api_or.status();
  const DriverApi& api = **api_or;

  CudaRegionExport out;
  out.info.size_bytes = bytes;
  auto ordinal = device_ordinal_of(api, ptr);
  if (!ordinal.is_ok()) return ordinal.status();
  out.info.device_ordinal = *ordinal;
  CUdevice device = 0;
  KVTIER_RETURN_IF_ERROR(driver_status(api.device_get(&device, *ordinal), "cuDeviceGet"));
  auto scope = ScopedDeviceContext::enter(api, device);
  if (!scope.is_ok()) return scope.status();

  CUuuid uuid{};
  KVTIER_RETURN_IF_ERROR(driver_status(api.device_get_uuid(&uuid, device), "cuDeviceGetUuid"));
  out.info.gpu_uuid = format_gpu_uuid(
      std::span<const uint8_t, 16>(reinterpret_cast<const uint8_t*>(uuid.bytes), 16));

  int legacy_ipc_capable = 0;  // the driver writes a bool; an int read of it stays 0/1
  KVTIER_RETURN_IF_ERROR(
      driver_status(api.pointer_get_attribute(&legacy_ipc_capable,
                                              CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, ptr),
                    "cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE)"));
  if (legacy_ipc_capable != 0) {
    out.info.kind = CudaRegionKind::kLegacyIpc;
    KVTIER_RETURN_IF_ERROR(export_legacy_ipc(api, ptr, bytes, out));
  } else {
    out.info.kind = CudaRegionKind::kVmm;
    KVTIER_RETURN_IF_ERROR(export_vmm(api, ptr, bytes, out));
  }
  return out;
}

Status register_cuda_region(Client& client, uint32_t region_id, CudaRegionExport region) {
  const CudaRegionInfo& info = region.info;
  if (info.kind == CudaRegionKind::kLegacyIpc) {
    return client.register_cuda_ipc_region(region_id, region.ipc_handle, info.offset_bytes,
                                           info.size_bytes, info.gpu_uuid);
  }
  std::vector<VmmChunkFd> chunks;
  chunks.reserve(region.chunks.size());
  for (const CudaVmmChunkExport& chunk : region.chunks) {
    chunks.push_back(VmmChunkFd{chunk.fd.get(), chunk.bytes});
  }
  // `region` is a by-value parameter: its descriptors close when this returns.
  return client.register_cuda_vmm_region(region_id, chunks, info.offset_bytes, info.size_bytes,
                                         info.gpu_uuid);
}

Result<CudaRegionInfo> register_cuda_region(Client& client, uint32_t region_id, CUdeviceptr ptr,
                                            uint64_t bytes) {
  auto exported = export_cuda_region(ptr, bytes);
  if (!exported.is_ok()) return exported.status();
  CudaRegionInfo info = exported->info;
  KVTIER_RETURN_IF_ERROR(register_cuda_region(client, region_id, std::move(*exported)));
  return info;
}

}  // namespace kvtier
