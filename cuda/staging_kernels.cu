// The staging kernels (cuda/staging_index.h): built by nvcc into a fatbin that is
// embedded in the client library and loaded with cuModuleLoadData, so nothing links
// cudart. One kernel serves both directions; CUDA block b copies work units
// b, b + gridDim.x, … with all its threads.
#include "cuda/staging_index.h"

extern "C" __global__ void __launch_bounds__(kvtier::staging::kThreadsPerBlock)
    kvtier_staging_copy(const kvtier::staging::Launch launch) {
  const auto* planes = reinterpret_cast<const kvtier::staging::Plane*>(launch.planes);
  const uint64_t units = kvtier::staging::unit_count(launch);
  for (uint64_t unit = blockIdx.x; unit < units; unit += gridDim.x) {
    kvtier::staging::copy_lanes(kvtier::staging::unit_copy(launch, planes, unit), threadIdx.x,
                                blockDim.x);
  }
}
