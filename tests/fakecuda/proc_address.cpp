// cuGetProcAddress_v2: the entry-point table.
//
// Each row is one ABI of a driver symbol, named by the CUDA version that introduced it
// (the suffix of its PFN type in cudaTypedefs.h). Rows with no function are ABIs the
// real driver has but the fake does not implement: asking for one must not silently
// hand out another ABI's function.
#include <string_view>
#include <type_traits>
#include <vector>

#include "tests/fakecuda/fake_cuda.h"

namespace kvtier::fakecuda {
namespace {

struct Entry {
  std::string_view symbol;
  int version;
  void* function;           // nullptr: not implemented by the fake
  bool per_thread_variant;  // the real driver has a _ptsz/_ptds variant
};

template <typename Pfn, typename Function>
void* entry_point(Function* function) {
  static_assert(std::is_same_v<Pfn, Function*>, "signature differs from the PFN type");
  return reinterpret_cast<void*>(function);
}

#define FAKECUDA_ABI(symbol, version, function, per_thread)                           \
  Entry {                                                                             \
#symbol, version, entry_point < PFN_##symbol##_v##version>(&function), per_thread \
  }
#define FAKECUDA_MISSING(symbol, version, per_thread) \
  Entry {                                             \
#symbol, version, nullptr, per_thread             \
  }

const std::vector<Entry>& entries() {
  static const std::vector<Entry>* table = new std::vector<Entry>{
      FAKECUDA_ABI(cuInit, 2000, cuInit, false),
      FAKECUDA_ABI(cuDriverGetVersion, 2020, cuDriverGetVersion, false),
      FAKECUDA_ABI(cuDeviceGetCount, 2000, cuDeviceGetCount, false),
      FAKECUDA_ABI(cuDeviceGet, 2000, cuDeviceGet, false),
      FAKECUDA_ABI(cuDeviceGetName, 2000, cuDeviceGetName, false),
      FAKECUDA_MISSING(cuDeviceGetUuid, 9020, false),
      FAKECUDA_ABI(cuDeviceGetUuid, 11040, cuDeviceGetUuid_v2, false),
      FAKECUDA_ABI(cuDeviceGetAttribute, 2000, cuDeviceGetAttribute, false),
      FAKECUDA_ABI(cuDeviceCanAccessPeer, 4000, cuDeviceCanAccessPeer, false),
      FAKECUDA_ABI(cuDeviceGetPCIBusId, 4010, cuDeviceGetPCIBusId, false),
      FAKECUDA_MISSING(cuDeviceTotalMem, 2000, false),
      FAKECUDA_ABI(cuDeviceTotalMem, 3020, cuDeviceTotalMem_v2, false),
      FAKECUDA_ABI(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain, false),
      FAKECUDA_MISSING(cuDevicePrimaryCtxRelease, 7000, false),
      FAKECUDA_ABI(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2, false),
      FAKECUDA_ABI(cuCtxSetCurrent, 4000, cuCtxSetCurrent, false),
      FAKECUDA_ABI(cuCtxGetCurrent, 4000, cuCtxGetCurrent, false),
      FAKECUDA_ABI(cuCtxGetDevice, 2000, cuCtxGetDevice, false),
      FAKECUDA_MISSING(cuCtxGetDevice, 13000, false),
      FAKECUDA_ABI(cuCtxSynchronize, 2000, cuCtxSynchronize, false),
      FAKECUDA_MISSING(cuCtxSynchronize, 13000, false),
      FAKECUDA_ABI(cuCtxGetStreamPriorityRange, 5050, cuCtxGetStreamPriorityRange, false),
      FAKECUDA_ABI(cuGetErrorName, 6000, cuGetErrorName, false),
      FAKECUDA_ABI(cuGetErrorString, 6000, cuGetErrorString, false),
      FAKECUDA_MISSING(cuMemAlloc, 2000, false),
      FAKECUDA_ABI(cuMemAlloc, 3020, cuMemAlloc_v2, false),
      FAKECUDA_MISSING(cuMemFree, 2000, false),
      FAKECUDA_ABI(cuMemFree, 3020, cuMemFree_v2, false),
      FAKECUDA_MISSING(cuMemGetAddressRange, 2000, false),
      FAKECUDA_ABI(cuMemGetAddressRange, 3020, cuMemGetAddressRange_v2, false),
      FAKECUDA_ABI(cuPointerGetAttribute, 4000, cuPointerGetAttribute, false),
      FAKECUDA_MISSING(cuMemHostRegister, 4000, false),
      FAKECUDA_ABI(cuMemHostRegister, 6050, cuMemHostRegister_v2, false),
      FAKECUDA_ABI(cuMemHostUnregister, 4000, cuMemHostUnregister, false),
      FAKECUDA_MISSING(cuMemcpyHtoD, 2000, true),
      FAKECUDA_ABI(cuMemcpyHtoD, 3020, cuMemcpyHtoD_v2, true),
      FAKECUDA_MISSING(cuMemcpyDtoH, 2000, true),
      FAKECUDA_ABI(cuMemcpyDtoH, 3020, cuMemcpyDtoH_v2, true),
      FAKECUDA_MISSING(cuMemsetD8, 2000, true),
      FAKECUDA_ABI(cuMemsetD8, 3020, cuMemsetD8_v2, true),
      FAKECUDA_ABI(cuIpcGetMemHandle, 4010, cuIpcGetMemHandle, false),
      FAKECUDA_MISSING(cuIpcOpenMemHandle, 4010, false),
      FAKECUDA_ABI(cuIpcOpenMemHandle, 11000, cuIpcOpenMemHandle_v2, false),
      FAKECUDA_ABI(cuIpcCloseMemHandle, 4010, cuIpcCloseMemHandle, false),
      FAKECUDA_ABI(cuMemCreate, 10020, cuMemCreate, false),
      FAKECUDA_ABI(cuMemRelease, 10020, cuMemRelease, false),
      FAKECUDA_ABI(cuMemExportToShareableHandle, 10020, cuMemExportToShareableHandle, false),
      FAKECUDA_ABI(cuMemImportFromShareableHandle, 10020, cuMemImportFromShareableHandle, false),
      FAKECUDA_ABI(cuMemGetAllocationGranularity, 10020, cuMemGetAllocationGranularity, false),
      FAKECUDA_ABI(cuMemGetAllocationPropertiesFromHandle, 10020,
                   cuMemGetAllocationPropertiesFromHandle, false),
      FAKECUDA_ABI(cuMemAddressReserve, 10020, cuMemAddressReserve, false),
      FAKECUDA_ABI(cuMemAddressFree, 10020, cuMemAddressFree, false),
      FAKECUDA_ABI(cuMemMap, 10020, cuMemMap, false),
      FAKECUDA_ABI(cuMemUnmap, 10020, cuMemUnmap, false),
      FAKECUDA_ABI(cuMemSetAccess, 10020, cuMemSetAccess, false),
      FAKECUDA_ABI(cuMemRetainAllocationHandle, 11000, cuMemRetainAllocationHandle, false),
      FAKECUDA_ABI(cuStreamCreateWithPriority, 5050, cuStreamCreateWithPriority, false),
      FAKECUDA_MISSING(cuStreamDestroy, 2000, false),
      FAKECUDA_ABI(cuStreamDestroy, 4000, cuStreamDestroy_v2, false),
      FAKECUDA_ABI(cuStreamSynchronize, 2000, cuStreamSynchronize, true),
      FAKECUDA_ABI(cuEventCreate, 2000, cuEventCreate, false),
      FAKECUDA_ABI(cuEventRecord, 2000, cuEventRecord, true),
      FAKECUDA_ABI(cuEventSynchronize, 2000, cuEventSynchronize, false),
      FAKECUDA_ABI(cuEventQuery, 2000, cuEventQuery, false),
      FAKECUDA_MISSING(cuEventDestroy, 2000, false),
      FAKECUDA_ABI(cuEventDestroy, 4000, cuEventDestroy_v2, false),
      FAKECUDA_ABI(cuMemcpyAsync, 4000, cuMemcpyAsync, true),
      FAKECUDA_ABI(cuMemcpyPeerAsync, 4000, cuMemcpyPeerAsync, true),
      FAKECUDA_MISSING(cuMemcpy2DAsync, 2000, true),
      FAKECUDA_ABI(cuMemcpy2DAsync, 3020, cuMemcpy2DAsync_v2, true),
      FAKECUDA_ABI(cuModuleLoadData, 2000, cuModuleLoadData, false),
      FAKECUDA_ABI(cuModuleUnload, 2000, cuModuleUnload, false),
      FAKECUDA_ABI(cuModuleGetFunction, 2000, cuModuleGetFunction, false),
      FAKECUDA_ABI(cuLaunchKernel, 4000, cuLaunchKernel, true),
      FAKECUDA_ABI(cuMemcpyBatchAsync, 12080, cuMemcpyBatchAsync, true),
      FAKECUDA_ABI(cuMemcpyBatchAsync, 13000, cuMemcpyBatchAsync_v2, true),
      FAKECUDA_MISSING(cuGetProcAddress, 11030, false),
      FAKECUDA_ABI(cuGetProcAddress, 12000, cuGetProcAddress_v2, false),
  };
  return *table;
}

#undef FAKECUDA_ABI
#undef FAKECUDA_MISSING

CUresult lookup(std::string_view symbol, int cuda_version, cuuint64_t flags, void** pfn,
                CUdriverProcAddressQueryResult* status) {
  *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  constexpr cuuint64_t kKnownFlags =
      CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  if ((flags & ~kKnownFlags) != 0) return CUDA_ERROR_INVALID_VALUE;
  const int driver_version = config().driver_version;
  // Documented: a CUDA version greater than the driver's is an invalid value.
  if (cuda_version > driver_version) {
    *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    return CUDA_ERROR_INVALID_VALUE;
  }
  // The newest ABI the caller's version asks for. A symbol whose every ABI is newer than
  // the driver does not exist in that driver (the batch copy below 12.8).
  const Entry* known = nullptr;
  const Entry* best = nullptr;
  for (const Entry& entry : entries()) {
    if (entry.symbol != symbol || entry.version > driver_version) continue;
    known = &entry;
    if (entry.version <= cuda_version && (best == nullptr || entry.version > best->version)) {
      best = &entry;
    }
  }
  if (known == nullptr) return CUDA_ERROR_NOT_FOUND;
  if (best == nullptr) {
    *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    return CUDA_ERROR_NOT_FOUND;
  }
  // The fake has no per-thread default stream, nor this ABI: say so rather than return
  // a function with other semantics.
  if (best->function == nullptr ||
      (best->per_thread_variant && (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0)) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  *pfn = best->function;
  *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace kvtier::fakecuda

using namespace kvtier::fakecuda;

FAKECUDA_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                             cuuint64_t flags,
                                             CUdriverProcAddressQueryResult* symbolStatus) {
  if (pfn != nullptr) *pfn = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const CUresult result = symbol == nullptr || pfn == nullptr
                              ? CUDA_ERROR_INVALID_VALUE
                              : lookup(symbol, cudaVersion, flags, pfn, &status);
  if (symbolStatus != nullptr) *symbolStatus = status;
  return result;
}
