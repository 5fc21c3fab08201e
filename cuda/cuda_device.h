// CudaDevice: the Device backend for NVIDIA GPUs (built when the CUDA toolkit is
// found; see KVTIER_HAVE_CUDA).
//
// Regions: legacy CUDA IPC handles (cudaIpcOpenMemHandle) and CUDA VMM POSIX-fd
// shareable handles (cuMemImportFromShareableHandle + map), which is what PyTorch's
// expandable segments produce. The engine names its GPU by UUID ("GPU-…"); an empty
// UUID means the daemon's device. The "HBM" arena is one cudaMalloc; the RAM pool is
// mmap + parallel first touch + cudaHostRegister (pinned, so the copy engines DMA
// straight into it).
//
// Copies: one non-default stream per direction (D2H, H2D, D2D); the segments of a
// batch for one direction go out as one cudaMemcpyBatchAsync (falling back to one
// cudaMemcpyAsync per segment where the driver lacks it). Completion: an event per
// used stream; a completion thread waits on them in submission order and calls `done`.
//
// The driver API (VMM import, address ranges) is reached through
// cudaGetDriverEntryPointByVersion, and the runtime is linked statically, so kvtierd
// starts on machines without an NVIDIA driver and simply reports no CUDA device.
//
// Thread-safety: as Device. Ownership: regions close their handles (cudaIpcCloseMemHandle,
// cuMemUnmap/Release) when their last shared_ptr goes — after in-flight copies.
#pragma once

#include <memory>
#include <string>

#include "cuda/device.h"

namespace kvtier {

struct CudaDeviceOptions {
  int device_ordinal = 0;      // which GPU the daemon serves
  int pool_touch_threads = 4;  // parallel first touch of the pinned pool
};

// Unavailable ("no CUDA device: …") when there is no driver or no GPU.
Result<std::unique_ptr<Device>> make_cuda_device(const CudaDeviceOptions& options);

// The one cudaError_t conversion. Defined only in CUDA builds.
Status cuda_status(int cuda_error, std::string_view what);

}  // namespace kvtier
