#include "client/staging_kernels.h"

#include <algorithm>

// The embedded fatbin (cuda/CMakeLists.txt); size 0 in a build without nvcc.
extern "C" {
extern const unsigned char kvtier_staging_fatbin[];
extern const unsigned long kvtier_staging_fatbin_size;
}

namespace kvtier {

using cuda::driver_status;

bool StagingKernels::built() {
  return kvtier_staging_fatbin_size > 0;
}

Result<std::unique_ptr<StagingKernels>> StagingKernels::load(const cuda::DriverApi& api) {
  if (!built()) return unavailable("this libkvtier was built without nvcc: no staging kernels");
  CUmodule module = nullptr;
  if (CUresult loaded = api.module_load_data(&module, kvtier_staging_fatbin);
      loaded != CUDA_SUCCESS) {
    return unavailable("the driver cannot load the staging kernels: {}",
                       driver_status(loaded, "cuModuleLoadData").message());
  }
  CUfunction kernel = nullptr;
  if (CUresult found = api.module_get_function(&kernel, module, staging::kKernelName);
      found != CUDA_SUCCESS) {
    (void)api.module_unload(module);
    return driver_status(found, "cuModuleGetFunction (staging copy)");
  }
  return std::unique_ptr<StagingKernels>(new StagingKernels(api, module, kernel));
}

StagingKernels::~StagingKernels() {
  (void)api_.module_unload(module_);
}

Result<uint32_t> StagingKernels::copy(CUdeviceptr plane_table, uint32_t plane_begin,
                                      uint32_t plane_count, uint64_t row_bytes,
                                      std::span<const uint32_t> block_ids, CUdeviceptr staging,
                                      staging::Direction direction, CUstream stream) const {
  uint32_t launches = 0;
  for (size_t at = 0; at < block_ids.size(); at += staging::kMaxBlocksPerLaunch) {
    const size_t count = std::min<size_t>(staging::kMaxBlocksPerLaunch, block_ids.size() - at);
    staging::Launch params{};
    params.planes = plane_table;
    params.staging = staging + at * row_bytes;
    params.row_bytes = row_bytes;
    params.plane_begin = plane_begin;
    params.plane_count = plane_count;
    params.block_count = static_cast<uint32_t>(count);
    params.direction = direction;
    std::copy_n(block_ids.begin() + static_cast<std::ptrdiff_t>(at), count, params.block_ids);
    void* args[] = {&params};
    // One CUDA block per plane slice, up to a bound past which blocks loop over units.
    const auto grid =
        static_cast<unsigned>(std::min<uint64_t>(staging::unit_count(params), uint64_t{1} << 20));
    KVTIER_RETURN_IF_ERROR(
        driver_status(api_.launch_kernel(kernel_, grid, 1, 1, staging::kThreadsPerBlock, 1, 1, 0,
                                         stream, args, nullptr),
                      "cuLaunchKernel (staging copy)"));
    ++launches;
  }
  return launches;
}

}  // namespace kvtier
