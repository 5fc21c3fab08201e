// StagingKernels: the embedded gather/scatter kernels (cuda/staging_kernels.cu, index
// math in cuda/staging_index.h) loaded into a CUDA context and launched through the
// driver API. GpuStager drives them for an engine; kvtier-bench gpu times them.
//
// The fatbin is linked into the library as bytes (cuda/CMakeLists.txt) and loaded with
// cuModuleLoadData: nothing links cudart, and a build without nvcc embeds no image
// (built() is false; load() is Unavailable).
//
// Contexts: load() uses the calling thread's current context; every later call must
// run with that context current (launches on a stream of it), and so must the
// destructor, which unloads the module.
// Thread-safety: copy() may be called from several threads with that context current.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <span>

#include "common/status.h"
#include "cuda/driver_api.h"
#include "cuda/staging_index.h"

namespace kvtier {

class StagingKernels {
 public:
  // Whether this library embeds the kernels (it was built with nvcc).
  static bool built();
  // Unavailable without an image, or when the driver cannot load it here (no machine
  // code for this GPU and PTX newer than the driver): the plane-copy path it is then.
  static Result<std::unique_ptr<StagingKernels>> load(const cuda::DriverApi& api);
  ~StagingKernels();
  StagingKernels(const StagingKernels&) = delete;
  StagingKernels& operator=(const StagingKernels&) = delete;

  // Queues, on `stream`, the copy of planes [plane_begin, plane_begin + plane_count) of
  // the engine blocks `block_ids` between the cache the device-resident plane table
  // `plane_table` describes and rows of `row_bytes` from `staging` (staged block j at
  // staging + j × row_bytes): kGather packs, kScatter unpacks. One launch per
  // staging::kMaxBlocksPerLaunch blocks; returns how many. REQUIRES: the ids are in the
  // cache's blocks (the kernel does not check; out of range is an illegal address),
  // row_bytes is the range's planes' bytes, plane_count ≥ 1.
  Result<uint32_t> copy(CUdeviceptr plane_table, uint32_t plane_begin, uint32_t plane_count,
                        uint64_t row_bytes, std::span<const uint32_t> block_ids,
                        CUdeviceptr staging, staging::Direction direction, CUstream stream) const;

 private:
  StagingKernels(const cuda::DriverApi& api, CUmodule module, CUfunction kernel)
      : api_(api), module_(module), kernel_(kernel) {}
  const cuda::DriverApi& api_;
  CUmodule module_;
  CUfunction kernel_;
};

}  // namespace kvtier
