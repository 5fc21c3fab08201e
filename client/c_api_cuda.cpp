// kvtier_register_cuda_pointer and the kvtier_gpu_stager_* functions: through
// client/cuda_regions.h and client/gpu_stager.h where the library was built with the CUDA
// toolkit's headers, a clear NotSupported where it was not.
#include "client/c_api_internal.h"
#include "client/kvtier.h"

#include <map>
#include <memory>
#include <vector>

#if KVTIER_HAVE_CUDA
#include "client/cuda_regions.h"
#include "client/gpu_stager.h"
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

// ---- The staging kernels (kvtier::GpuStager) ----

#if KVTIER_HAVE_CUDA
struct kvtier_gpu_stager {
  std::shared_ptr<Client> client;  // kept alive: the stager uses it
  std::unique_ptr<GpuStager> stager;
};
#else
struct kvtier_gpu_stager {};
#endif

namespace {

#if !KVTIER_HAVE_CUDA
Status no_cuda() {
  return not_supported(
      "this libkvtier was built without CUDA support (no CUDA toolkit headers at build time): "
      "no staging kernels; use the plane-copy path");
}
#endif

}  // namespace

KVTIER_EXPORT kvtier_status kvtier_gpu_stager_probe(uint64_t device_ptr) {
  return guarded([&]() -> Status {
    if (device_ptr == 0) return invalid_argument("device_ptr is 0");
#if KVTIER_HAVE_CUDA
    return GpuStager::probe(static_cast<CUdeviceptr>(device_ptr));
#else
    return no_cuda();
#endif
  });
}

KVTIER_EXPORT kvtier_status kvtier_gpu_stager_create(
    kvtier_client* client, const kvtier_layout* layout, const uint32_t* region_ids,
    const uint64_t* region_device_ptrs, uint32_t region_count, uint64_t ring_bytes,
    uint32_t staging_region_id, kvtier_gpu_stager** out) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(client, "client"));
    KVTIER_RETURN_IF_ERROR(require(layout, "layout"));
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    KVTIER_RETURN_IF_ERROR(require_array(region_ids, region_count, "region_ids"));
    KVTIER_RETURN_IF_ERROR(require_array(region_device_ptrs, region_count, "region_device_ptrs"));
#if KVTIER_HAVE_CUDA
    if (!client->hello) return invalid_argument("kvtier_hello_with_data_path comes first");
    auto spec = to_layout(*layout);
    if (!spec.is_ok()) return spec.status();
    std::map<uint32_t, CUdeviceptr> bases;
    for (uint32_t i = 0; i < region_count; ++i) {
      if (!bases.emplace(region_ids[i], static_cast<CUdeviceptr>(region_device_ptrs[i])).second) {
        return invalid_argument("region_ids[{}] ({}) is named twice", i, region_ids[i]);
      }
    }
    GpuStagerOptions options;
    options.ring_bytes = ring_bytes;
    options.region_id = staging_region_id;
    auto stager = GpuStager::create(*client->client, *client->hello, *spec, bases, options);
    if (!stager.is_ok()) return stager.status();
    *out = new kvtier_gpu_stager{client->client, std::move(*stager)};
    return Status::ok();
#else
    (void)ring_bytes;
    (void)staging_region_id;
    return no_cuda();
#endif
  });
}

KVTIER_EXPORT kvtier_status kvtier_gpu_stager_save(kvtier_gpu_stager* stager,
                                                   const char* session_id,
                                                   const kvtier_block_ref* refs, uint32_t count,
                                                   int end_of_turn, uint64_t stream,
                                                   kvtier_save_result* out) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(stager, "stager"));
    KVTIER_RETURN_IF_ERROR(require(session_id, "session_id"));
    auto blocks = to_block_refs(refs, count);
    if (!blocks.is_ok()) return blocks.status();
#if KVTIER_HAVE_CUDA
    auto saved = stager->stager->save(session_id, *blocks, end_of_turn != 0,
                                      reinterpret_cast<CUstream>(stream));
    if (!saved.is_ok()) return saved.status();
    write_save_result(*saved, out);
    return Status::ok();
#else
    (void)end_of_turn;
    (void)stream;
    (void)out;
    return no_cuda();
#endif
  });
}

KVTIER_EXPORT kvtier_status kvtier_gpu_stager_load(kvtier_gpu_stager* stager,
                                                   const char* session_id,
                                                   const kvtier_block_ref* refs, uint32_t count,
                                                   uint32_t plane_begin, uint32_t plane_count,
                                                   uint64_t stream, kvtier_load_result* out) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(stager, "stager"));
    KVTIER_RETURN_IF_ERROR(require(session_id, "session_id"));
    auto blocks = to_block_refs(refs, count);
    if (!blocks.is_ok()) return blocks.status();
#if KVTIER_HAVE_CUDA
    auto loaded = stager->stager->load(session_id, *blocks, reinterpret_cast<CUstream>(stream),
                                       PlaneRange{plane_begin, plane_count});
    if (!loaded.is_ok()) return loaded.status();
    write_load_result(*loaded, out);
    return Status::ok();
#else
    (void)plane_begin;
    (void)plane_count;
    (void)stream;
    (void)out;
    return no_cuda();
#endif
  });
}

KVTIER_EXPORT kvtier_status kvtier_gpu_stager_begin_load(
    kvtier_gpu_stager* stager, const char* session_id, const kvtier_block_ref* refs, uint32_t count,
    const uint32_t* plane_begins, const uint32_t* plane_counts, uint32_t range_count) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(stager, "stager"));
    KVTIER_RETURN_IF_ERROR(require(session_id, "session_id"));
    KVTIER_RETURN_IF_ERROR(require_array(plane_begins, range_count, "plane_begins"));
    KVTIER_RETURN_IF_ERROR(require_array(plane_counts, range_count, "plane_counts"));
    auto blocks = to_block_refs(refs, count);
    if (!blocks.is_ok()) return blocks.status();
#if KVTIER_HAVE_CUDA
    std::vector<PlaneRange> ranges;
    for (uint32_t i = 0; i < range_count; ++i) ranges.push_back({plane_begins[i], plane_counts[i]});
    return stager->stager->begin_load(session_id, *blocks, std::move(ranges));
#else
    return no_cuda();
#endif
  });
}

KVTIER_EXPORT kvtier_status kvtier_gpu_stager_finish_range(kvtier_gpu_stager* stager,
                                                           uint32_t range, uint64_t stream,
                                                           kvtier_load_result* out) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(stager, "stager"));
#if KVTIER_HAVE_CUDA
    auto loaded = stager->stager->finish_range(range, reinterpret_cast<CUstream>(stream));
    if (!loaded.is_ok()) return loaded.status();
    write_load_result(*loaded, out);
    return Status::ok();
#else
    (void)range;
    (void)stream;
    (void)out;
    return no_cuda();
#endif
  });
}

KVTIER_EXPORT kvtier_status kvtier_gpu_stager_end_load(kvtier_gpu_stager* stager) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(stager, "stager"));
#if KVTIER_HAVE_CUDA
    return stager->stager->end_load();
#else
    return no_cuda();
#endif
  });
}

KVTIER_EXPORT void kvtier_gpu_stager_destroy(kvtier_gpu_stager* stager) {
  try {
    delete stager;
  } catch (...) {  // nothing may cross the C boundary
  }
}
