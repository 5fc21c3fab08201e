// kvtier_register_cuda_pointer: through client/cuda_regions.h where the library was
// built with the CUDA toolkit's headers, a clear Unavailable where it was not.
#include "client/c_api_internal.h"
#include "client/kvtier.h"

#if KVTIER_HAVE_CUDA
#include "client/cuda_regions.h"
#endif

#define KVTIER_EXPORT extern "C" __attribute__((visibility("default")))

using namespace kvtier;
using namespace kvtier::c_api;

KVTIER_EXPORT kvtier_status kvtier_register_cuda_pointer(kvtier_client* client, uint32_t region_id,
                                                         uint64_t device_ptr, uint64_t bytes) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(client, "client"));
    if (device_ptr == 0) return invalid_argument("device_ptr is 0");
    if (bytes == 0) return invalid_argument("bytes is 0");
#if KVTIER_HAVE_CUDA
    auto registered = register_cuda_region(*client->client, region_id,
                                           static_cast<CUdeviceptr>(device_ptr), bytes);
    return registered.status();
#else
    (void)region_id;
    return not_supported(
        "kvtier_register_cuda_pointer: this libkvtier was built without CUDA support (no CUDA "
        "toolkit headers at build time); export the region yourself and use "
        "kvtier_register_cuda_ipc or kvtier_register_cuda_vmm");
#endif
  });
}
