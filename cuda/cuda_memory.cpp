#include "cuda/cuda_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "common/log.h"
#include "cuda/cuda_device.h"

namespace kvtier {

Status cuda_status(int cuda_error, std::string_view what) {
  auto error = static_cast<cudaError_t>(cuda_error);
  if (error == cudaSuccess) return Status::ok();
  StatusCode code = StatusCode::kInternal;
  switch (error) {
    case cudaErrorMemoryAllocation:
    case cudaErrorHostMemoryAlreadyRegistered:
      code = StatusCode::kResourceExhausted;
      break;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorMapBufferObjectFailed:
      code = StatusCode::kInvalidArgument;
      break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      code = StatusCode::kUnavailable;
      break;
    case cudaErrorECCUncorrectable:
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
      // The bytes of this copy cannot be trusted; the context may be gone too.
      code = StatusCode::kDataLoss;
      break;
    default:
      break;
  }
  return Status(
      code, fmt::format("{}: {} ({})", what, cudaGetErrorString(error), cudaGetErrorName(error)));
}

namespace cuda_internal {

Status driver_status(CUresult result, std::string_view what) {
  if (result == CUDA_SUCCESS) return Status::ok();
  StatusCode code = result == CUDA_ERROR_OUT_OF_MEMORY ? StatusCode::kResourceExhausted
                    : result == CUDA_ERROR_INVALID_VALUE || result == CUDA_ERROR_INVALID_HANDLE
                        ? StatusCode::kInvalidArgument
                        : StatusCode::kInternal;
  return Status(code, fmt::format("{}: CUresult {}", what, static_cast<int>(result)));
}

Status DriverApi::load() {
  auto resolve = [](const char* symbol, auto& fn) -> Status {
    void* address = nullptr;
    cudaDriverEntryPointQueryResult found{};
    cudaError_t error =
        cudaGetDriverEntryPointByVersion(symbol, &address, 12000, cudaEnableDefault, &found);
    if (error != cudaSuccess || found != cudaDriverEntryPointSuccess || address == nullptr) {
      return unavailable("CUDA driver entry point {} not found", symbol);
    }
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(address);
    return Status::ok();
  };
  KVTIER_RETURN_IF_ERROR(resolve("cuMemImportFromShareableHandle", mem_import));
  KVTIER_RETURN_IF_ERROR(resolve("cuMemGetAllocationPropertiesFromHandle", mem_properties));
  KVTIER_RETURN_IF_ERROR(resolve("cuMemGetAllocationGranularity", mem_granularity));
  KVTIER_RETURN_IF_ERROR(resolve("cuMemAddressReserve", address_reserve));
  KVTIER_RETURN_IF_ERROR(resolve("cuMemAddressFree", address_free));
  KVTIER_RETURN_IF_ERROR(resolve("cuMemMap", mem_map));
  KVTIER_RETURN_IF_ERROR(resolve("cuMemUnmap", mem_unmap));
  KVTIER_RETURN_IF_ERROR(resolve("cuMemSetAccess", mem_set_access));
  KVTIER_RETURN_IF_ERROR(resolve("cuMemRelease", mem_release));
  KVTIER_RETURN_IF_ERROR(resolve("cuMemGetAddressRange", address_range));
  return Status::ok();
}

DeviceAllocation::~DeviceAllocation() {
  cudaSetDevice(ordinal_);
  cudaFree(data_);
}

IpcRegion::~IpcRegion() {
  cudaSetDevice(ordinal_);
  cudaIpcCloseMemHandle(data_);
}

VmmRegion::~VmmRegion() {
  driver_.mem_unmap(address_, mapped_bytes_);
  driver_.address_free(address_, mapped_bytes_);
  driver_.mem_release(handle_);
}

PinnedPool::~PinnedPool() {
  cudaHostUnregister(data_);
  ::munmap(data_, bytes_);
}

std::byte* copy_address(Memory& memory) {
  if (auto* m = dynamic_cast<DeviceAllocation*>(&memory)) return m->device_data();
  if (auto* m = dynamic_cast<IpcRegion*>(&memory)) return m->device_data();
  if (auto* m = dynamic_cast<VmmRegion*>(&memory)) return m->device_data();
  if (auto* m = dynamic_cast<PinnedPool*>(&memory)) return m->host_data();
  return nullptr;
}

Result<std::shared_ptr<Memory>> open_ipc_region(RegionHandle& handle, int ordinal,
                                                const DriverApi& driver) {
  cudaIpcMemHandle_t ipc{};
  static_assert(sizeof(ipc) == sizeof(handle.ipc_handle));
  std::memcpy(&ipc, handle.ipc_handle.data(), sizeof(ipc));
  void* data = nullptr;
  KVTIER_RETURN_IF_ERROR(cuda_status(cudaSetDevice(ordinal), "cudaSetDevice"));
  // A handle from another machine, of a freed allocation, or garbage fails here.
  KVTIER_RETURN_IF_ERROR(cuda_status(
      cudaIpcOpenMemHandle(&data, ipc, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle"));
  auto region = std::make_shared<IpcRegion>(data, handle.size_bytes, ordinal);
  CUdeviceptr base = 0;
  size_t size = 0;
  KVTIER_RETURN_IF_ERROR(
      driver_status(driver.address_range(&base, &size, reinterpret_cast<CUdeviceptr>(data)),
                    "cuMemGetAddressRange"));
  const uint64_t available = base + size - reinterpret_cast<CUdeviceptr>(data);
  if (handle.size_bytes > available) {
    return invalid_argument("sizeBytes {} exceeds the {} bytes the IPC allocation holds",
                            handle.size_bytes, available);
  }
  return std::shared_ptr<Memory>(std::move(region));
}

Result<std::shared_ptr<Memory>> open_vmm_region(RegionHandle& handle, int ordinal,
                                                const DriverApi& driver) {
  CUmemGenericAllocationHandle allocation{};
  KVTIER_RETURN_IF_ERROR(driver_status(
      driver.mem_import(&allocation,
                        reinterpret_cast<void*>(static_cast<uintptr_t>(handle.fd.get())),
                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
      "cuMemImportFromShareableHandle"));
  CUmemAllocationProp prop{};
  Status status = driver_status(driver.mem_properties(&prop, allocation),
                                "cuMemGetAllocationPropertiesFromHandle");
  size_t granularity = 0;
  if (status.is_ok()) {
    status =
        driver_status(driver.mem_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                      "cuMemGetAllocationGranularity");
  }
  if (status.is_ok() && prop.location.id != ordinal) {
    status = invalid_argument("the VMM allocation lives on GPU {}, not on the daemon's GPU {}",
                              prop.location.id, ordinal);
  }
  const uint64_t mapped =
      granularity ? (handle.size_bytes + granularity - 1) / granularity * granularity : 0;
  CUdeviceptr address = 0;
  if (status.is_ok())
    status = driver_status(driver.address_reserve(&address, mapped, granularity, 0, 0),
                           "cuMemAddressReserve");
  if (status.is_ok()) {
    // Fails when the allocation is smaller than the size the engine declared.
    status = driver_status(driver.mem_map(address, mapped, 0, allocation, 0),
                           "cuMemMap (is sizeBytes right?)");
    if (!status.is_ok()) driver.address_free(address, mapped);
  }
  if (!status.is_ok()) {
    driver.mem_release(allocation);
    return status;
  }
  auto region = std::make_shared<VmmRegion>(driver, address, mapped, handle.size_bytes, allocation);
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = ordinal;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  KVTIER_RETURN_IF_ERROR(
      driver_status(driver.mem_set_access(address, mapped, &access, 1), "cuMemSetAccess"));
  return std::shared_ptr<Memory>(std::move(region));
}

Result<std::shared_ptr<Memory>> allocate_pinned(uint64_t bytes, int touch_threads) {
  if (bytes == 0) return invalid_argument("ram pool: bytes is 0");
  void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) return errno_status(errno, "mmap ram pool");
  auto* data = static_cast<std::byte*>(mapped);
  (void)::madvise(mapped, bytes, MADV_HUGEPAGE);
  // First touch from several threads: faulting in tens of GiB is CPU-bound in the
  // kernel, and cudaHostRegister on untouched memory would fault it in on one thread.
  const int threads = std::max(1, touch_threads);
  const uint64_t chunk = (bytes / threads + 4095) & ~uint64_t{4095};
  std::vector<std::thread> touchers;
  for (int t = 0; t < threads; ++t) {
    touchers.emplace_back([=] {
      const uint64_t begin = std::min(bytes, chunk * t), end = std::min(bytes, begin + chunk);
      for (uint64_t offset = begin; offset < end; offset += 4096) data[offset] = std::byte{0};
    });
  }
  for (auto& toucher : touchers) toucher.join();
  Status registered =
      cuda_status(cudaHostRegister(mapped, bytes, cudaHostRegisterDefault), "cudaHostRegister");
  if (!registered.is_ok()) {
    ::munmap(mapped, bytes);
    return registered;
  }
  return std::shared_ptr<Memory>(std::make_shared<PinnedPool>(data, bytes));
}

}  // namespace cuda_internal
}  // namespace kvtier
