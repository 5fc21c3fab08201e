// kvtier_gpu_stager_* and kvtier_hello_with_data_path's GPU half: the C face of
// kvtier::GpuStager (client/gpu_stager.h). Built where the library has the CUDA
// toolkit's headers; c_api_stager_none.cpp answers NotSupported elsewhere.
#include <map>
#include <memory>
#include <vector>

#include "client/c_api_internal.h"
#include "client/gpu_stager.h"
#include "client/kvtier.h"

#define KVTIER_EXPORT extern "C" __attribute__((visibility("default")))

using namespace kvtier;
using namespace kvtier::c_api;

struct kvtier_gpu_stager {
  std::shared_ptr<Client> client;  // kept alive: the stager uses it
  std::unique_ptr<GpuStager> stager;
};

namespace {

// The checks every per-request call makes: a stager, a session id, the refs.
Result<std::vector<BlockRef>> request_blocks(const kvtier_gpu_stager* stager,
                                             const char* session_id, const kvtier_block_ref* refs,
                                             uint32_t count) {
  KVTIER_RETURN_IF_ERROR(require(stager, "stager"));
  KVTIER_RETURN_IF_ERROR(require(session_id, "session_id"));
  return to_block_refs(refs, count);
}

CUstream as_stream(uint64_t stream) {
  return reinterpret_cast<CUstream>(stream);
}

}  // namespace

KVTIER_EXPORT kvtier_status kvtier_gpu_stager_probe(uint64_t device_ptr) {
  return guarded([&]() -> Status {
    if (device_ptr == 0) return invalid_argument("device_ptr is 0");
    return GpuStager::probe(static_cast<CUdeviceptr>(device_ptr));
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
  });
}

KVTIER_EXPORT kvtier_status kvtier_gpu_stager_save(kvtier_gpu_stager* stager,
                                                   const char* session_id,
                                                   const kvtier_block_ref* refs, uint32_t count,
                                                   int end_of_turn, uint64_t stream,
                                                   kvtier_save_result* out) {
  return guarded([&]() -> Status {
    auto blocks = request_blocks(stager, session_id, refs, count);
    if (!blocks.is_ok()) return blocks.status();
    auto saved = stager->stager->save(session_id, *blocks, end_of_turn != 0, as_stream(stream));
    if (!saved.is_ok()) return saved.status();
    write_save_result(*saved, out);
    return Status::ok();
  });
}

KVTIER_EXPORT kvtier_status kvtier_gpu_stager_load(kvtier_gpu_stager* stager,
                                                   const char* session_id,
                                                   const kvtier_block_ref* refs, uint32_t count,
                                                   uint32_t plane_begin, uint32_t plane_count,
                                                   uint64_t stream, kvtier_load_result* out) {
  return guarded([&]() -> Status {
    auto blocks = request_blocks(stager, session_id, refs, count);
    if (!blocks.is_ok()) return blocks.status();
    auto loaded = stager->stager->load(session_id, *blocks, as_stream(stream),
                                       PlaneRange{plane_begin, plane_count});
    if (!loaded.is_ok()) return loaded.status();
    write_load_result(*loaded, out);
    return Status::ok();
  });
}

KVTIER_EXPORT kvtier_status kvtier_gpu_stager_begin_load(
    kvtier_gpu_stager* stager, const char* session_id, const kvtier_block_ref* refs, uint32_t count,
    const uint32_t* plane_begins, const uint32_t* plane_counts, uint32_t range_count) {
  return guarded([&]() -> Status {
    auto blocks = request_blocks(stager, session_id, refs, count);
    if (!blocks.is_ok()) return blocks.status();
    KVTIER_RETURN_IF_ERROR(require_array(plane_begins, range_count, "plane_begins"));
    KVTIER_RETURN_IF_ERROR(require_array(plane_counts, range_count, "plane_counts"));
    std::vector<PlaneRange> ranges;
    for (uint32_t i = 0; i < range_count; ++i) ranges.push_back({plane_begins[i], plane_counts[i]});
    return stager->stager->begin_load(session_id, *blocks, std::move(ranges));
  });
}

KVTIER_EXPORT kvtier_status kvtier_gpu_stager_finish_range(kvtier_gpu_stager* stager,
                                                           uint32_t range, uint64_t stream,
                                                           kvtier_load_result* out) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(stager, "stager"));
    auto loaded = stager->stager->finish_range(range, as_stream(stream));
    if (!loaded.is_ok()) return loaded.status();
    write_load_result(*loaded, out);
    return Status::ok();
  });
}

KVTIER_EXPORT kvtier_status kvtier_gpu_stager_end_load(kvtier_gpu_stager* stager) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(stager, "stager"));
    return stager->stager->end_load();
  });
}

KVTIER_EXPORT void kvtier_gpu_stager_destroy(kvtier_gpu_stager* stager) {
  try {
    delete stager;
  } catch (...) {  // nothing may cross the C boundary
  }
}
