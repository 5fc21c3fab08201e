#include "cuda/driver_api.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>

namespace kvtier::cuda {
namespace {

// The oldest driver kvtier supports: cuGetProcAddress_v2 and the VMM/IPC entry points
// with the signatures below all exist from 12.0 on.
constexpr int kMinimumDriverVersion = 12000;

using GetProcAddress = PFN_cuGetProcAddress_v12000;

// Set once the table loaded; driver_status reads error names through it.
std::atomic<const DriverApi*> loaded_api{nullptr};

Status status_from(const DriverApi* api, CUresult result, std::string_view what);

class Loader {
 public:
  explicit Loader(GetProcAddress get_proc_address) : get_proc_address_(get_proc_address) {}

  // Resolves `symbol` with the ABI of CUDA `version` into `fn`; remembers the first
  // failure so that load() can report it once with the symbol's name.
  template <typename Fn>
  void resolve(const char* symbol, int version, Fn& fn, bool optional = false) {
    void* address = nullptr;
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult result =
        get_proc_address_(symbol, &address, version, CU_GET_PROC_ADDRESS_DEFAULT, &found);
    if (result == CUDA_SUCCESS && found == CU_GET_PROC_ADDRESS_SUCCESS && address != nullptr) {
      fn = reinterpret_cast<Fn>(address);
      return;
    }
    fn = nullptr;
    if (!optional && status_.is_ok()) {
      status_ = unavailable("no CUDA driver: entry point {} (CUDA {}.{} ABI) not found", symbol,
                            version / 1000, version % 1000 / 10);
    }
  }
  const Status& status() const { return status_; }

 private:
  GetProcAddress get_proc_address_;
  Status status_;
};

// The entry points past cuInit and cuDriverGetVersion, in DriverApi's groups; the loader
// remembers the first one missing.
void resolve_devices_and_contexts(Loader& loader, DriverApi& api) {
  loader.resolve("cuDeviceGetCount", 2000, api.device_get_count);
  loader.resolve("cuDeviceGet", 2000, api.device_get);
  loader.resolve("cuDeviceGetName", 2000, api.device_get_name);
  loader.resolve("cuDeviceGetUuid", 11040, api.device_get_uuid);
  loader.resolve("cuDeviceGetAttribute", 2000, api.device_get_attribute);
  loader.resolve("cuDeviceTotalMem", 3020, api.device_total_mem);
  loader.resolve("cuDeviceCanAccessPeer", 4000, api.device_can_access_peer);
  loader.resolve("cuDeviceGetPCIBusId", 4010, api.device_get_pci_bus_id);
  loader.resolve("cuDevicePrimaryCtxRetain", 7000, api.primary_ctx_retain);
  loader.resolve("cuDevicePrimaryCtxRelease", 11000, api.primary_ctx_release);
  loader.resolve("cuCtxSetCurrent", 4000, api.ctx_set_current);
  loader.resolve("cuCtxGetCurrent", 4000, api.ctx_get_current);
  loader.resolve("cuCtxGetDevice", 2000, api.ctx_get_device);
  loader.resolve("cuCtxSynchronize", 2000, api.ctx_synchronize);
  loader.resolve("cuCtxGetStreamPriorityRange", 5050, api.ctx_get_stream_priority_range);
  loader.resolve("cuGetErrorName", 6000, api.get_error_name);
  loader.resolve("cuGetErrorString", 6000, api.get_error_string);
}

void resolve_memory(Loader& loader, DriverApi& api) {
  loader.resolve("cuMemAlloc", 3020, api.mem_alloc);
  loader.resolve("cuMemFree", 3020, api.mem_free);
  loader.resolve("cuMemGetAddressRange", 3020, api.mem_get_address_range);
  loader.resolve("cuPointerGetAttribute", 4000, api.pointer_get_attribute);
  loader.resolve("cuMemHostRegister", 6050, api.mem_host_register);
  loader.resolve("cuMemHostUnregister", 4000, api.mem_host_unregister);
  loader.resolve("cuMemcpyHtoD", 3020, api.memcpy_htod);
  loader.resolve("cuMemcpyDtoH", 3020, api.memcpy_dtoh);
  loader.resolve("cuMemsetD8", 3020, api.memset_d8);
}

void resolve_ipc(Loader& loader, DriverApi& api) {
  loader.resolve("cuIpcGetMemHandle", 4010, api.ipc_get_mem_handle);
  loader.resolve("cuIpcOpenMemHandle", 11000, api.ipc_open_mem_handle);
  loader.resolve("cuIpcCloseMemHandle", 4010, api.ipc_close_mem_handle);
}

void resolve_virtual_memory(Loader& loader, DriverApi& api) {
  loader.resolve("cuMemCreate", 10020, api.mem_create);
  loader.resolve("cuMemRelease", 10020, api.mem_release);
  loader.resolve("cuMemExportToShareableHandle", 10020, api.mem_export_to_shareable_handle);
  loader.resolve("cuMemImportFromShareableHandle", 10020, api.mem_import_from_shareable_handle);
  loader.resolve("cuMemGetAllocationGranularity", 10020, api.mem_get_allocation_granularity);
  loader.resolve("cuMemGetAllocationPropertiesFromHandle", 10020,
                 api.mem_get_allocation_properties);
  loader.resolve("cuMemAddressReserve", 10020, api.mem_address_reserve);
  loader.resolve("cuMemAddressFree", 10020, api.mem_address_free);
  loader.resolve("cuMemMap", 10020, api.mem_map);
  loader.resolve("cuMemUnmap", 10020, api.mem_unmap);
  loader.resolve("cuMemSetAccess", 10020, api.mem_set_access);
  loader.resolve("cuMemRetainAllocationHandle", 11000, api.mem_retain_allocation_handle);
}

// Needs api.driver_version: which cuMemcpyBatchAsync to resolve depends on it.
void resolve_streams_copies_and_launches(Loader& loader, DriverApi& api) {
  loader.resolve("cuStreamCreateWithPriority", 5050, api.stream_create_with_priority);
  loader.resolve("cuStreamDestroy", 4000, api.stream_destroy);
  loader.resolve("cuStreamSynchronize", 2000, api.stream_synchronize);
  loader.resolve("cuEventCreate", 2000, api.event_create);
  loader.resolve("cuEventRecord", 2000, api.event_record);
  loader.resolve("cuEventSynchronize", 2000, api.event_synchronize);
  loader.resolve("cuEventQuery", 2000, api.event_query);
  loader.resolve("cuEventDestroy", 4000, api.event_destroy);
  loader.resolve("cuMemcpyAsync", 4000, api.memcpy_async);
  loader.resolve("cuMemcpyPeerAsync", 4000, api.memcpy_peer_async);
  loader.resolve("cuMemcpy2DAsync", 3020, api.memcpy_2d_async);
  loader.resolve("cuModuleLoadData", 2000, api.module_load_data);
  loader.resolve("cuModuleUnload", 2000, api.module_unload);
  loader.resolve("cuModuleGetFunction", 2000, api.module_get_function);
  loader.resolve("cuLaunchKernel", 4000, api.launch_kernel);
  // By version, not by trying: the 12.8 and 13.0 signatures differ, and calling one
  // through the other's type would pass garbage.
  if (api.driver_version >= 13000) {
    loader.resolve("cuMemcpyBatchAsync", 13000, api.memcpy_batch_v13000);
  } else if (api.driver_version >= 12080) {
    loader.resolve("cuMemcpyBatchAsync", 12080, api.memcpy_batch_v12080);
  }
}

Status load_into(DriverApi& api) {
  // Never dlclose'd: see the header.
  void* library = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = ::dlerror();
    return unavailable("no CUDA driver: {}", why != nullptr ? why : "libcuda.so.1 not found");
  }
  auto get_proc_address = reinterpret_cast<GetProcAddress>(::dlsym(library, "cuGetProcAddress_v2"));
  if (get_proc_address == nullptr) {
    return unavailable(
        "no CUDA driver: libcuda.so.1 has no cuGetProcAddress_v2 (driver older "
        "than CUDA 12.0)");
  }
  Loader loader(get_proc_address);
  loader.resolve("cuInit", 2000, api.init);
  loader.resolve("cuDriverGetVersion", 2020, api.driver_get_version);
  KVTIER_RETURN_IF_ERROR(loader.status());
  KVTIER_RETURN_IF_ERROR(
      status_from(nullptr, api.driver_get_version(&api.driver_version), "cuDriverGetVersion"));
  if (api.driver_version < kMinimumDriverVersion) {
    return unavailable("no CUDA driver: the driver supports CUDA {}.{}; kvtier needs 12.0 or newer",
                       api.driver_version / 1000, api.driver_version % 1000 / 10);
  }

  resolve_devices_and_contexts(loader, api);
  resolve_memory(loader, api);
  resolve_ipc(loader, api);
  resolve_virtual_memory(loader, api);
  resolve_streams_copies_and_launches(loader, api);
  KVTIER_RETURN_IF_ERROR(loader.status());
  return status_from(&api, api.init(0), "cuInit");
}

Status status_from(const DriverApi* api, CUresult result, std::string_view what) {
  if (result == CUDA_SUCCESS) return Status::ok();
  StatusCode code = StatusCode::kInternal;
  bool retryable = false;  // only a device another process holds may come free
  switch (result) {
    case CUDA_ERROR_OUT_OF_MEMORY:
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
    case CUDA_ERROR_TOO_MANY_PEERS:
      code = StatusCode::kResourceExhausted;
      break;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_NOT_FOUND:
    case CUDA_ERROR_ALREADY_MAPPED:
    case CUDA_ERROR_NOT_PERMITTED:
    case CUDA_ERROR_INVALID_DEVICE:
      code = StatusCode::kInvalidArgument;
      break;
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED:
      code = StatusCode::kNotSupported;
      break;
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
      code = StatusCode::kUnavailable;
      break;
    case CUDA_ERROR_DEVICE_UNAVAILABLE:  // exclusive-process mode: another process has it
      code = StatusCode::kUnavailable;
      retryable = true;
      break;
    default:
      if (is_sticky_error(result)) code = StatusCode::kDataLoss;
      break;
  }
  const char* name = nullptr;
  const char* text = nullptr;
  if (api != nullptr) {
    api->get_error_name(result, &name);
    api->get_error_string(result, &text);
  }
  return Status(
      code,
      fmt::format("{}: {} ({})", what, text != nullptr ? text : "CUDA error",
                  name != nullptr ? std::string(name) : "CUresult " + std::to_string(result)),
      retryable);
}

}  // namespace

Result<const DriverApi*> DriverApi::get() {
  static DriverApi api;
  static Status loaded;
  static std::once_flag once;
  std::call_once(once, [] {
    loaded = load_into(api);
    if (loaded.is_ok()) loaded_api.store(&api, std::memory_order_release);
  });
  if (!loaded.is_ok()) return loaded;
  return static_cast<const DriverApi*>(&api);
}

// The codes cuda.h documents as leaving the context (or the process) unusable: "the
// process must be terminated and relaunched".
bool is_sticky_error(CUresult result) {
  switch (result) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_CONTAINED:
    case CUDA_ERROR_NVLINK_UNCORRECTABLE:
    case CUDA_ERROR_TENSOR_MEMORY_LEAK:
    case CUDA_ERROR_MPS_CLIENT_TERMINATED:
    case CUDA_ERROR_EXTERNAL_DEVICE:
      return true;
    default:
      return false;
  }
}

Status driver_status(CUresult result, std::string_view what) {
  return status_from(loaded_api.load(std::memory_order_acquire), result, what);
}

}  // namespace kvtier::cuda
