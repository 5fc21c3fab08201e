// DriverApi: the CUDA driver entry points kvtier uses, loaded at run time.
//
// kvtierd and the client library link no CUDA library at all. `DriverApi::get()` opens
// libcuda.so.1 with dlopen (honouring LD_LIBRARY_PATH, which is how the tests load the
// fake driver in tests/fakecuda), takes `cuGetProcAddress_v2` from it, and resolves
// every other entry point through that with the CUDA version whose ABI the pointer
// type below names (PFN_x_vNNNNN from cudaTypedefs.h). So one binary runs on any driver
// from CUDA 12.0 on, and a function whose signature changed in a later CUDA (e.g.
// cuMemcpyBatchAsync: 12.8 has a failIdx argument, 13.0 not) is called with the
// signature of the version that was asked for.
//
// The batch-copy entry point is chosen by the driver's version, never by an error
// code: `memcpy_batch_v13000` when the driver is ≥ 13.0, `memcpy_batch_v12080` when
// ≥ 12.8, neither (one cuMemcpyAsync per segment) below that.
//
// Lifetime and thread-safety: the table is loaded once per process, on first use,
// and never unloaded (the driver is process-global state; unloading it under live
// contexts is unsafe), so a pointer to it never dangles. `get()` may be called from
// any thread. Every CUresult is turned into a Status by `driver_status`, the one
// conversion of CUDA errors in kvtier.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <string_view>

#include "common/status.h"

namespace kvtier::cuda {

struct DriverApi {
  int driver_version = 0;  // cuDriverGetVersion: 12080 = 12.8

  // Initialization, devices, contexts.
  PFN_cuInit_v2000 init = nullptr;
  PFN_cuDriverGetVersion_v2020 driver_get_version = nullptr;
  PFN_cuDeviceGetCount_v2000 device_get_count = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetName_v2000 device_get_name = nullptr;
  PFN_cuDeviceGetUuid_v11040 device_get_uuid = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
  PFN_cuDeviceTotalMem_v3020 device_total_mem = nullptr;
  PFN_cuDeviceCanAccessPeer_v4000 device_can_access_peer = nullptr;
  PFN_cuDeviceGetPCIBusId_v4010 device_get_pci_bus_id = nullptr;
  PFN_cuDevicePrimaryCtxRetain_v7000 primary_ctx_retain = nullptr;
  PFN_cuDevicePrimaryCtxRelease_v11000 primary_ctx_release = nullptr;
  PFN_cuCtxSetCurrent_v4000 ctx_set_current = nullptr;
  PFN_cuCtxGetCurrent_v4000 ctx_get_current = nullptr;
  PFN_cuCtxGetDevice_v2000 ctx_get_device = nullptr;
  PFN_cuCtxSynchronize_v2000 ctx_synchronize = nullptr;
  PFN_cuCtxGetStreamPriorityRange_v5050 ctx_get_stream_priority_range = nullptr;
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;

  // Device memory, pointers, host registration.
  PFN_cuMemAlloc_v3020 mem_alloc = nullptr;
  PFN_cuMemFree_v3020 mem_free = nullptr;
  PFN_cuMemGetAddressRange_v3020 mem_get_address_range = nullptr;
  PFN_cuPointerGetAttribute_v4000 pointer_get_attribute = nullptr;
  PFN_cuMemHostRegister_v6050 mem_host_register = nullptr;
  PFN_cuMemHostUnregister_v4000 mem_host_unregister = nullptr;
  PFN_cuMemcpyHtoD_v3020 memcpy_htod = nullptr;  // synchronous; engines' helpers and tests
  PFN_cuMemcpyDtoH_v3020 memcpy_dtoh = nullptr;
  PFN_cuMemsetD8_v3020 memset_d8 = nullptr;

  // Legacy IPC.
  PFN_cuIpcGetMemHandle_v4010 ipc_get_mem_handle = nullptr;
  PFN_cuIpcOpenMemHandle_v11000 ipc_open_mem_handle = nullptr;
  PFN_cuIpcCloseMemHandle_v4010 ipc_close_mem_handle = nullptr;

  // Virtual memory management (VMM).
  PFN_cuMemCreate_v10020 mem_create = nullptr;
  PFN_cuMemRelease_v10020 mem_release = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 mem_export_to_shareable_handle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 mem_import_from_shareable_handle = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 mem_get_allocation_granularity = nullptr;
  PFN_cuMemGetAllocationPropertiesFromHandle_v10020 mem_get_allocation_properties = nullptr;
  PFN_cuMemAddressReserve_v10020 mem_address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 mem_address_free = nullptr;
  PFN_cuMemMap_v10020 mem_map = nullptr;
  PFN_cuMemUnmap_v10020 mem_unmap = nullptr;
  PFN_cuMemSetAccess_v10020 mem_set_access = nullptr;
  PFN_cuMemRetainAllocationHandle_v11000 mem_retain_allocation_handle = nullptr;

  // Streams, events, asynchronous copies.
  PFN_cuStreamCreateWithPriority_v5050 stream_create_with_priority = nullptr;
  PFN_cuStreamDestroy_v4000 stream_destroy = nullptr;
  PFN_cuStreamSynchronize_v2000 stream_synchronize = nullptr;
  PFN_cuEventCreate_v2000 event_create = nullptr;
  PFN_cuEventRecord_v2000 event_record = nullptr;
  PFN_cuEventSynchronize_v2000 event_synchronize = nullptr;
  PFN_cuEventQuery_v2000 event_query = nullptr;
  PFN_cuEventDestroy_v4000 event_destroy = nullptr;
  PFN_cuMemcpyAsync_v4000 memcpy_async = nullptr;
  PFN_cuMemcpyPeerAsync_v4000 memcpy_peer_async = nullptr;  // between two GPUs' contexts
  PFN_cuMemcpy2DAsync_v3020 memcpy_2d_async = nullptr;      // rows at a pitch: one DMA operation
  PFN_cuMemcpyBatchAsync_v12080 memcpy_batch_v12080 = nullptr;  // driver 12.8 – 12.9
  PFN_cuMemcpyBatchAsync_v13000 memcpy_batch_v13000 = nullptr;  // driver ≥ 13.0

  // Modules and kernel launches: the client's staging kernels (client/gpu_stager.h).
  PFN_cuModuleLoadData_v2000 module_load_data = nullptr;
  PFN_cuModuleUnload_v2000 module_unload = nullptr;
  PFN_cuModuleGetFunction_v2000 module_get_function = nullptr;
  PFN_cuLaunchKernel_v4000 launch_kernel = nullptr;

  // The process's table: loads libcuda.so.1 on first call and cuInit(0)s it.
  // Unavailable ("no CUDA driver: …") when there is no driver, it is older than 12.0,
  // or an entry point kvtier needs is missing. The result (and the error) is cached.
  static Result<const DriverApi*> get();
};

// The one conversion of CUresult into Status. Codes: out of memory → ResourceExhausted;
// bad values, handles and pointers → InvalidArgument; no device or driver, too old a
// driver → Unavailable; sticky errors (below) → DataLoss; the rest → Internal. The
// message is "<what>: <error string> (<error name>)".
Status driver_status(CUresult result, std::string_view what);

// Whether `result` is a sticky error: the context is unusable from now on (illegal
// address, launch failure, uncorrectable ECC, hardware stack error, ...), and so is
// everything in its device memory. The process must be restarted to use the GPU again.
bool is_sticky_error(CUresult result);

}  // namespace kvtier::cuda
