// The engine's half of sharing GPU memory with kvtierd: turns any range of the
// engine's device memory into a region the daemon can open, and registers it.
//
// A range [ptr, ptr + bytes) may start anywhere inside its allocation, as tensors of
// PyTorch's caching allocator do (K and V may share one segment). Two kinds exist:
//   - legacy CUDA IPC (cuMemAlloc / cudaMalloc memory): one cuIpcGetMemHandle of the
//     allocation, plus the offset of `ptr` from the allocation's base;
//   - CUDA VMM (cuMemCreate + cuMemMap, e.g. PyTorch expandable segments): one POSIX
//     file descriptor per mapped chunk the range touches, in address order, with each
//     chunk's size and the offset of `ptr` into the first chunk. The chunks must have
//     been created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR among their requested
//     handle types; otherwise the export fails with InvalidArgument saying so.
// Legacy IPC is used where the allocation supports it
// (CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE), VMM otherwise; anything else
// (managed memory, stream-ordered pools, host memory) is InvalidArgument.
//
// Contexts: the calling thread needs no current context. When it has none, or one on
// another GPU, the pointer's GPU's primary context is retained and made current for
// the duration of the call, then the thread's previous context is restored and the
// primary context released. The driver is reached through cuda::DriverApi (libcuda
// loaded at run time); Unavailable when there is none.
//
// Ownership: a CudaRegionExport owns the exported descriptors and closes them when
// destroyed; register_cuda_region closes them once sent. The engine keeps the memory
// alive until Client::unregister_region has returned, and must not free it before.
//
// Thread-safety: the functions may be called from any thread, concurrently; they touch
// no state but the calling thread's current context (restored before they return).
#pragma once

#include <cuda.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "client/client.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace kvtier {

enum class CudaRegionKind : uint8_t {
  kLegacyIpc,  // one cuIpcGetMemHandle handle + offset from the allocation base
  kVmm,        // one POSIX fd per chunk + offset into the first chunk
};

// Where a device range lives, without its handles: what logs and callers want to know.
struct CudaRegionInfo {
  CudaRegionKind kind = CudaRegionKind::kLegacyIpc;
  int device_ordinal = -1;        // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
  std::string gpu_uuid;           // "GPU-…" (common/gpu_uuid.h)
  uint64_t offset_bytes = 0;      // ptr − allocation base (IPC) or − first chunk's base (VMM)
  uint64_t size_bytes = 0;        // the range's size, as asked
  uint64_t allocation_bytes = 0;  // the allocation (IPC) or the chunks together (VMM)
  uint32_t chunk_count = 0;       // VMM chunks the range touches; 0 for IPC
};

struct CudaVmmChunkExport {
  UniqueFd fd;         // cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR) of the chunk
  uint64_t bytes = 0;  // the chunk's mapped size (cuMemGetAddressRange)
};

// A range ready to send: its description and the handles that open it.
struct CudaRegionExport {
  CudaRegionInfo info;
  std::array<std::byte, 64> ipc_handle{};  // kLegacyIpc: the CUipcMemHandle bytes
  std::vector<CudaVmmChunkExport> chunks;  // kVmm: in address order
};

// Describes [ptr, ptr + bytes) of this process's device memory and exports its handles.
// REQUIRES: bytes > 0 and the whole range inside one allocation (IPC) or inside
// contiguously mapped chunks of one GPU (VMM). Errors: InvalidArgument for a range the
// daemon could not open (message says why), Unavailable without a driver, the driver's
// error otherwise.
Result<CudaRegionExport> export_cuda_region(CUdeviceptr ptr, uint64_t bytes);

// Sends `region` as region `region_id` on `client` (register_cuda_ipc_region or
// register_cuda_vmm_region) and closes its descriptors, whatever the outcome.
Status register_cuda_region(Client& client, uint32_t region_id, CudaRegionExport region);

// export_cuda_region then register_cuda_region; returns what was registered.
Result<CudaRegionInfo> register_cuda_region(Client& client, uint32_t region_id, CUdeviceptr ptr,
                                            uint64_t bytes);

}  // namespace kvtier
