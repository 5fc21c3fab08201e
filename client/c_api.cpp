// The C boundary of libkvtier.so: status and messages, connection, Hello, regions,
// Stats. The data path is in c_api_data.cpp, CUDA pointers in c_api_cuda.cpp.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "client/c_api_internal.h"
#include "client/kvtier.h"

#define KVTIER_EXPORT extern "C" __attribute__((visibility("default")))

// The structs' layout is ABI version 0 (FFI users such as ctypes mirror it field by
// field); a change here must bump the soname.
static_assert(sizeof(kvtier_status) == 4 && sizeof(kvtier_tier) == 4);
static_assert(sizeof(kvtier_plane) == 32);
static_assert(sizeof(kvtier_layout) == 72 && offsetof(kvtier_layout, planes) == 56);
static_assert(sizeof(kvtier_hash) == 16 && sizeof(kvtier_block_ref) == 24);
static_assert(sizeof(kvtier_hello_info) ==
              32 + 2 * KVTIER_NAME_BYTES + KVTIER_MAX_GPUS * KVTIER_GPU_UUID_BYTES);
static_assert(sizeof(kvtier_load_result) == 8 + KVTIER_MESSAGE_BYTES);
static_assert(sizeof(kvtier_stats_info) == 3 * 24 + 13 * 8 + 8 + 2 * KVTIER_NAME_BYTES);

namespace kvtier::c_api {
namespace {

// The message behind kvtier_last_error(). A string per thread: the pointer handed out
// stays valid until this thread stores the next one.
thread_local std::string last_error;
thread_local bool last_error_retryable = false;  // behind kvtier_last_error_retryable()

}  // namespace

kvtier_status finish(const Status& status) noexcept {
  last_error_retryable = status.retryable();
  try {
    last_error = status.message();
  } catch (...) {
    // Out of memory for the message itself: keep the code, say nothing false.
    last_error.clear();
  }
  return static_cast<kvtier_status>(status.code());
}

kvtier_status finish_exception(std::exception_ptr exception) noexcept {
  std::string what = "unknown exception";
  try {
    std::rethrow_exception(exception);
  } catch (const std::bad_alloc&) {
    return finish(Status(StatusCode::kResourceExhausted, "out of memory"));
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    // kj::Exception and anything else that is not a std::exception.
  }
  try {
    return finish(internal_error("unexpected exception in libkvtier: {}", what));
  } catch (...) {
    last_error.clear();
    last_error_retryable = false;
    return KVTIER_INTERNAL;
  }
}

Status require(const void* pointer, std::string_view name) {
  if (pointer == nullptr) return invalid_argument("{} is NULL", name);
  return Status::ok();
}

Status require_array(const void* pointer, uint32_t count, std::string_view name) {
  if (pointer == nullptr && count > 0) {
    return invalid_argument("{} is NULL but count is {}", name, count);
  }
  return Status::ok();
}

namespace {

Status check_hash(const uint8_t* bytes, uint32_t length, std::string_view array, uint32_t index) {
  if (length == 0 || length > BlockHash::kMaxBytes) {
    return invalid_argument("{}[{}].hash_len is {}; a block hash is 1..{} bytes", array, index,
                            length, BlockHash::kMaxBytes);
  }
  if (bytes == nullptr) return invalid_argument("{}[{}].hash is NULL", array, index);
  return Status::ok();
}

}  // namespace

Result<std::vector<BlockRef>> to_block_refs(const kvtier_block_ref* refs, uint32_t count) {
  KVTIER_RETURN_IF_ERROR(require_array(refs, count, "refs"));
  std::vector<BlockRef> blocks;
  blocks.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    KVTIER_RETURN_IF_ERROR(check_hash(refs[i].hash, refs[i].hash_len, "refs", i));
    blocks.push_back(
        {BlockHash(std::span(refs[i].hash, refs[i].hash_len)), refs[i].engine_block_id});
  }
  return blocks;
}

Result<std::vector<BlockHash>> to_hashes(const kvtier_hash* hashes, uint32_t count) {
  KVTIER_RETURN_IF_ERROR(require_array(hashes, count, "hashes"));
  std::vector<BlockHash> out;
  out.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    KVTIER_RETURN_IF_ERROR(check_hash(hashes[i].hash, hashes[i].hash_len, "hashes", i));
    out.emplace_back(std::span(hashes[i].hash, hashes[i].hash_len));
  }
  return out;
}

void copy_string(std::string_view text, char* out, size_t out_bytes) {
  if (out_bytes == 0) return;
  const size_t n = std::min(text.size(), out_bytes - 1);
  std::memcpy(out, text.data(), n);
  std::memset(out + n, 0, out_bytes - n);
}

Result<LayoutSpec> to_layout(const kvtier_layout& layout) {
  if (layout.reserved != 0) return invalid_argument("layout.reserved is not 0");
  KVTIER_RETURN_IF_ERROR(require_array(layout.planes, layout.plane_count, "layout.planes"));
  LayoutSpec spec;
  spec.model_id = layout.model_id != nullptr ? layout.model_id : "";
  spec.dtype = layout.dtype != nullptr ? layout.dtype : "fp16";
  spec.extra_key = layout.extra_key != nullptr ? layout.extra_key : "";
  spec.num_layers = layout.num_layers;
  spec.num_kv_heads = layout.num_kv_heads;
  spec.head_dim = layout.head_dim;
  spec.tokens_per_block = layout.tokens_per_block;
  spec.tp_rank = layout.tp_rank;
  spec.tp_size = layout.tp_size;
  spec.num_blocks = layout.num_blocks;
  for (uint32_t i = 0; i < layout.plane_count; ++i) {
    const kvtier_plane& plane = layout.planes[i];
    if (plane.reserved != 0) return invalid_argument("layout.planes[{}].reserved is not 0", i);
    spec.planes.push_back(
        {plane.region_id, plane.offset_bytes, plane.stride_bytes, plane.bytes_per_block});
  }
  return spec;
}

namespace {

void write_hello_info(const HelloInfo& info, kvtier_hello_info* out) {
  std::memset(out, 0, sizeof(*out));
  out->protocol_version = info.protocol_version;
  out->max_blocks_per_request = info.max_blocks_per_request;
  out->layout_digest = info.layout_digest;
  out->block_bytes = info.block_bytes;
  out->device_kind =
      info.device_kind == DeviceKind::kCuda ? KVTIER_DEVICE_CUDA : KVTIER_DEVICE_HOST;
  out->gpu_count = static_cast<uint32_t>(info.gpu_uuids.size());
  copy_string(info.namespace_name, out->namespace_name, sizeof(out->namespace_name));
  copy_string(info.device_name, out->device_name, sizeof(out->device_name));
  for (size_t i = 0; i < info.gpu_uuids.size() && i < KVTIER_MAX_GPUS; ++i) {
    copy_string(info.gpu_uuids[i], out->gpu_uuids[i], sizeof(out->gpu_uuids[i]));
  }
}

void write_stats(const StatsInfo& info, kvtier_stats_info* out) {
  std::memset(out, 0, sizeof(*out));
  for (const TierStatsInfo& tier : info.tiers) {
    const auto index = static_cast<size_t>(c_tier(tier.tier));
    if (index >= KVTIER_TIER_COUNT) continue;
    out->tiers[index] = {tier.capacity_bytes, tier.used_bytes, tier.blocks};
  }
  out->sessions_active = info.sessions_active;
  out->sessions_idle = info.sessions_idle;
  out->lookup_hits = info.lookup_hits;
  out->lookup_misses = info.lookup_misses;
  out->bytes_saved = info.bytes_saved;
  out->bytes_loaded = info.bytes_loaded;
  out->bytes_demoted = info.bytes_demoted;
  out->bytes_promoted = info.bytes_promoted;
  out->pinned_blocks = info.pinned_blocks;
  out->copies_in_flight = info.copies_in_flight;
  out->blocks_evicted = info.blocks_evicted;
  out->data_loss_blocks = info.data_loss_blocks;
  out->uptime_ms = info.uptime_ms;
  out->connections = info.connections;
  out->pinned_sessions = info.pinned_sessions;
  copy_string(info.device_name, out->device_name, sizeof(out->device_name));
  copy_string(info.policy, out->policy, sizeof(out->policy));
}

}  // namespace
}  // namespace kvtier::c_api

using namespace kvtier;
using namespace kvtier::c_api;

KVTIER_EXPORT const char* kvtier_last_error(void) {
  return last_error.c_str();
}

KVTIER_EXPORT int kvtier_last_error_retryable(void) {
  return last_error_retryable ? 1 : 0;
}

KVTIER_EXPORT const char* kvtier_status_name(kvtier_status status) {
  switch (status) {
    case KVTIER_OK:
      return "OK";
    case KVTIER_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case KVTIER_NOT_FOUND:
      return "NOT_FOUND";
    case KVTIER_RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case KVTIER_PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case KVTIER_UNAVAILABLE:
      return "UNAVAILABLE";
    case KVTIER_DATA_LOSS:
      return "DATA_LOSS";
    case KVTIER_INTERNAL:
      return "INTERNAL";
    case KVTIER_NOT_SUPPORTED:
      return "NOT_SUPPORTED";
    case KVTIER_STATUS_FORCE_32BIT:
      break;
  }
  return "UNKNOWN";
}

KVTIER_EXPORT const char* kvtier_version(void) {
  return KVTIER_VERSION_STRING;
}

KVTIER_EXPORT kvtier_status kvtier_connect(const char* socket_path, kvtier_client** out) {
  return kvtier_connect_with_options(socket_path, nullptr, out);
}

KVTIER_EXPORT kvtier_status kvtier_connect_with_options(const char* socket_path,
                                                        const kvtier_client_options* options,
                                                        kvtier_client** out) {
  if (out != nullptr) *out = nullptr;
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    ClientOptions client_options;
    if (options != nullptr) {
      if (options->reserved != 0) return invalid_argument("options->reserved must be 0");
      client_options.reconnect = options->reconnect != 0;
      if (options->initial_backoff_ms != 0) {
        client_options.initial_backoff = std::chrono::milliseconds(options->initial_backoff_ms);
      }
      if (options->max_backoff_ms != 0) {
        client_options.max_backoff = std::chrono::milliseconds(options->max_backoff_ms);
      }
      if (client_options.initial_backoff > client_options.max_backoff) {
        return invalid_argument("options->initial_backoff_ms ({}) is above max_backoff_ms ({})",
                                client_options.initial_backoff.count(),
                                client_options.max_backoff.count());
      }
    }
    const std::string path = socket_path != nullptr && *socket_path != '\0'
                                 ? std::string(socket_path)
                                 : Client::default_socket_path();
    auto connected = Client::connect(path, client_options);
    if (!connected.is_ok()) return connected.status();
    *out = new kvtier_client{std::shared_ptr<Client>(std::move(*connected)), std::nullopt};
    return Status::ok();
  });
}

KVTIER_EXPORT uint64_t kvtier_reconnects(const kvtier_client* client) {
  return client == nullptr || !client->client ? 0 : client->client->reconnects();
}

KVTIER_EXPORT void kvtier_close(kvtier_client* client) {
  // Deleting drops a shared_ptr and closes a socket: nothing here throws.
  delete client;
}

KVTIER_EXPORT kvtier_status kvtier_hello(kvtier_client* client, const kvtier_layout* layout,
                                         const char* engine_name, kvtier_device_kind device_kind,
                                         double prefill_tokens_per_second, kvtier_hello_info* out) {
  return kvtier_hello_with_data_path(client, layout, engine_name, device_kind,
                                     prefill_tokens_per_second, KVTIER_DATA_PATH_PLANE_COPIES, out);
}

KVTIER_EXPORT kvtier_status kvtier_hello_with_data_path(
    kvtier_client* client, const kvtier_layout* layout, const char* engine_name,
    kvtier_device_kind device_kind, double prefill_tokens_per_second, kvtier_data_path data_path,
    kvtier_hello_info* out) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(client, "client"));
    KVTIER_RETURN_IF_ERROR(require(layout, "layout"));
    if (device_kind != KVTIER_DEVICE_HOST && device_kind != KVTIER_DEVICE_CUDA) {
      return invalid_argument(
          "device_kind is {}; expected KVTIER_DEVICE_HOST (0) or "
          "KVTIER_DEVICE_CUDA (1)",
          static_cast<int>(device_kind));
    }
    DataPath path = DataPath::kPlaneCopies;
    switch (data_path) {
      case KVTIER_DATA_PATH_PLANE_COPIES:
        break;
      case KVTIER_DATA_PATH_STAGING_KERNELS:
        path = DataPath::kStagingKernels;
        break;
      case KVTIER_DATA_PATH_STAGING_HOST:
        path = DataPath::kStagingHost;
        break;
      default:
        return invalid_argument("data_path is {}; expected a kvtier_data_path (0..2)",
                                static_cast<int>(data_path));
    }
    auto spec = to_layout(*layout);
    if (!spec.is_ok()) return spec.status();
    auto info = client->client->hello(
        *spec, engine_name != nullptr ? engine_name : "engine", prefill_tokens_per_second,
        device_kind == KVTIER_DEVICE_CUDA ? DeviceKind::kCuda : DeviceKind::kHost, path);
    if (!info.is_ok()) return info.status();
    client->hello = *info;
    if (out != nullptr) write_hello_info(*info, out);
    return Status::ok();
  });
}

KVTIER_EXPORT kvtier_status kvtier_register_memfd(kvtier_client* client, uint32_t region_id, int fd,
                                                  uint64_t size_bytes) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(client, "client"));
    if (fd < 0) return invalid_argument("fd is {}; expected an open memfd", fd);
    return client->client->register_memfd_region(region_id, fd, size_bytes);
  });
}

KVTIER_EXPORT kvtier_status kvtier_register_cuda_ipc(kvtier_client* client, uint32_t region_id,
                                                     const uint8_t handle[KVTIER_IPC_HANDLE_BYTES],
                                                     uint64_t offset_bytes, uint64_t size_bytes,
                                                     const char* gpu_uuid) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(client, "client"));
    KVTIER_RETURN_IF_ERROR(require(handle, "handle"));
    std::span<const std::byte, KVTIER_IPC_HANDLE_BYTES> bytes(
        reinterpret_cast<const std::byte*>(handle), KVTIER_IPC_HANDLE_BYTES);
    return client->client->register_cuda_ipc_region(region_id, bytes, offset_bytes, size_bytes,
                                                    gpu_uuid != nullptr ? gpu_uuid : "");
  });
}

KVTIER_EXPORT kvtier_status kvtier_register_cuda_vmm(kvtier_client* client, uint32_t region_id,
                                                     const int* fds, const uint64_t* chunk_bytes,
                                                     uint32_t count, uint64_t offset_bytes,
                                                     uint64_t size_bytes, const char* gpu_uuid) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(client, "client"));
    KVTIER_RETURN_IF_ERROR(require_array(fds, count, "fds"));
    KVTIER_RETURN_IF_ERROR(require_array(chunk_bytes, count, "chunk_bytes"));
    std::vector<VmmChunkFd> chunks;
    chunks.reserve(count);
    for (uint32_t i = 0; i < count; ++i) {
      if (fds[i] < 0)
        return invalid_argument("fds[{}] is {}; expected an open descriptor", i, fds[i]);
      chunks.push_back({fds[i], chunk_bytes[i]});
    }
    return client->client->register_cuda_vmm_region(region_id, chunks, offset_bytes, size_bytes,
                                                    gpu_uuid != nullptr ? gpu_uuid : "");
  });
}

KVTIER_EXPORT kvtier_status kvtier_unregister_region(kvtier_client* client, uint32_t region_id) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(client, "client"));
    return client->client->unregister_region(region_id);
  });
}

KVTIER_EXPORT kvtier_status kvtier_stats(kvtier_client* client, kvtier_stats_info* out) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(client, "client"));
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    auto stats = client->client->stats();
    if (!stats.is_ok()) return stats.status();
    write_stats(*stats, out);
    return Status::ok();
  });
}
