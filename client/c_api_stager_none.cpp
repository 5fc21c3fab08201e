// kvtier_gpu_stager_* in a library built without the CUDA toolkit's headers: each call
// is NotSupported (no stager can be made, so none is ever passed in).
#include "client/c_api_internal.h"
#include "client/kvtier.h"

#define KVTIER_EXPORT extern "C" __attribute__((visibility("default")))

using namespace kvtier;
using namespace kvtier::c_api;

struct kvtier_gpu_stager {};

namespace {

kvtier_status no_cuda() {
  return finish(not_supported(
      "this libkvtier was built without CUDA support (no CUDA toolkit headers at build time): "
      "no staging kernels; use the plane-copy path"));
}

}  // namespace

KVTIER_EXPORT kvtier_status kvtier_gpu_stager_probe(uint64_t) {
  return no_cuda();
}
KVTIER_EXPORT kvtier_status kvtier_gpu_stager_create(kvtier_client*, const kvtier_layout*,
                                                     const uint32_t*, const uint64_t*, uint32_t,
                                                     uint64_t, uint32_t, kvtier_gpu_stager**) {
  return no_cuda();
}
KVTIER_EXPORT kvtier_status kvtier_gpu_stager_save(kvtier_gpu_stager*, const char*,
                                                   const kvtier_block_ref*, uint32_t, int, uint64_t,
                                                   kvtier_save_result*) {
  return no_cuda();
}
KVTIER_EXPORT kvtier_status kvtier_gpu_stager_load(kvtier_gpu_stager*, const char*,
                                                   const kvtier_block_ref*, uint32_t, uint32_t,
                                                   uint32_t, uint64_t, kvtier_load_result*) {
  return no_cuda();
}
KVTIER_EXPORT kvtier_status kvtier_gpu_stager_begin_load(kvtier_gpu_stager*, const char*,
                                                         const kvtier_block_ref*, uint32_t,
                                                         const uint32_t*, const uint32_t*,
                                                         uint32_t) {
  return no_cuda();
}
KVTIER_EXPORT kvtier_status kvtier_gpu_stager_finish_range(kvtier_gpu_stager*, uint32_t, uint64_t,
                                                           kvtier_load_result*) {
  return no_cuda();
}
KVTIER_EXPORT kvtier_status kvtier_gpu_stager_end_load(kvtier_gpu_stager*) {
  return no_cuda();
}
KVTIER_EXPORT void kvtier_gpu_stager_destroy(kvtier_gpu_stager* stager) {
  delete stager;
}
