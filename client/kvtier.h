/* kvtier.h: the C interface to kvtierd (libkvtier.so, soname libkvtier.so.0).
 *
 * What an engine written in C, or in a language with a C FFI (Python ctypes, Rust,
 * Go), links to talk to the kvtier daemon. It wraps the C++ kvtier::Client: one
 * kvtier_client is one connection to kvtierd. Typical use:
 *
 *   kvtier_client* c;
 *   if (kvtier_connect(NULL, &c) != KVTIER_OK) die(kvtier_last_error());
 *   kvtier_hello(c, &layout, "my-engine", KVTIER_DEVICE_HOST, 0, &info);
 *   kvtier_register_memfd(c, 0, fd, size);            per KV region
 *   kvtier_save(c, "conv-42", refs, n, 1, &saved);    end of a turn
 *   kvtier_begin_turn(c, "conv-42", NULL);            a new message arrived
 *   kvtier_lookup(c, hashes, n, &hits, NULL);         how much of the prefix is held
 *   kvtier_load(c, "conv-42", refs, hits, &loaded);   restore it into engine blocks
 *   kvtier_unregister_region(c, 0);                   before freeing the region
 *   kvtier_close(c);
 *
 * ERRORS. Every call returns a kvtier_status; its codes mirror the daemon's and say
 * what the caller should do (see kvtier_status below). The message of the calling
 * thread's latest call is kvtier_last_error(): thread-local, "" after a success,
 * valid until the same thread's next kvtier_* call; kvtier_last_error_retryable() says
 * whether that same call, repeated unchanged, may succeed later. Out-parameters are written only
 * on KVTIER_OK unless a function says otherwise. A NULL where a pointer is required is
 * KVTIER_INVALID_ARGUMENT naming the parameter, never a crash. No C++ exception
 * crosses this interface; an unexpected one becomes KVTIER_INTERNAL.
 *
 * OWNERSHIP. kvtier_connect creates a kvtier_client that the caller owns and releases
 * with kvtier_close; each *_async call creates a kvtier_pending that the caller owns
 * and releases with kvtier_pending_free (whether or not it was waited for). All other
 * pointers passed in are borrowed for the duration of the call only: arrays, strings
 * and structs may be freed or reused as soon as the call returns, including after a
 * *_async call (the request is serialized before it returns). File descriptors passed
 * in are sent to the daemon and stay owned by the caller. Strings are NUL-terminated
 * UTF-8. Strings returned (kvtier_version, kvtier_status_name) are static.
 *
 * THREAD-SAFETY. A kvtier_client may be used by several threads at once (requests are
 * pipelined on the one connection; replies may complete in any order), except that
 * kvtier_close must not run concurrently with, or be followed by, any other call on
 * that client. A kvtier_pending belongs to one thread at a time. A pending keeps its
 * connection alive: after kvtier_close the socket stays open until the client's last
 * pending is freed, so waiting for and freeing pendings after closing their client is
 * allowed.
 *
 * COMPATIBILITY. Structs are plain data with fixed-width fields; their layout, the
 * enums' values and every function's signature are part of ABI version 0 (symbols
 * versioned KVTIER_0). Additions are appended only: new enum values (a caller must
 * treat an unknown kvtier_status like KVTIER_INTERNAL) and new functions, each in a
 * later version node (KVTIER_0.2: kvtier_last_error_retryable; KVTIER_0.3:
 * kvtier_connect_with_options, kvtier_reconnects; KVTIER_0.4:
 * kvtier_save_with_retention, kvtier_save_with_retention_async; KVTIER_0.5:
 * kvtier_load_planes, kvtier_load_planes_async; KVTIER_0.6: kvtier_hello_with_data_path
 * and the kvtier_gpu_stager_* functions). Any incompatible change bumps the soname.
 */
#ifndef KVTIER_H_
#define KVTIER_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Status ------------------------------------------------------------------- */

/* Values equal kvtier::StatusCode and the wire ErrorCode. */
typedef enum kvtier_status {
  KVTIER_OK = 0,
  KVTIER_INVALID_ARGUMENT = 1,   /* fix the request; the message names the bad field */
  KVTIER_NOT_FOUND = 2,          /* the session or region named does not exist */
  KVTIER_RESOURCE_EXHAUSTED = 3, /* retry later, or with a smaller request */
  KVTIER_PERMISSION_DENIED = 4,  /* the caller may not do this */
  KVTIER_UNAVAILABLE = 5,        /* the daemon or a device is not answering: reconnect/retry */
  KVTIER_DATA_LOSS = 6,          /* the bytes are known gone or corrupt: recompute them */
  KVTIER_INTERNAL = 7,           /* a bug */
  KVTIER_NOT_SUPPORTED = 8,      /* not implemented by this daemon or library build (e.g.
                                    CUDA regions on a host-backend kvtierd): do it another way */
  KVTIER_STATUS_FORCE_32BIT = 0x7fffffff /* not a status: keeps the enum 32-bit wide */
} kvtier_status;

/* The message of the calling thread's latest kvtier_* call ("" after a success).
 * Never NULL; valid until the same thread's next kvtier_* call. */
const char* kvtier_last_error(void);

/* 1 when the calling thread's latest kvtier_* call failed and the same call, unchanged,
 * may succeed later (after a wait, or for KVTIER_UNAVAILABLE a reconnect); else 0 (also
 * after a success). The daemon decides per error: by default UNAVAILABLE and
 * RESOURCE_EXHAUSTED are retryable and the rest are not, but e.g. the per-connection
 * region limit is RESOURCE_EXHAUSTED and not retryable (unregister a region first).
 * A kvtier_load_result's stop_code has no flag here. Added in version node KVTIER_0.2. */
int kvtier_last_error_retryable(void);

/* "OK", "INVALID_ARGUMENT", ...; "UNKNOWN" for a value outside the enum. Static. */
const char* kvtier_status_name(kvtier_status status);

/* The library's version, "MAJOR.MINOR.PATCH" (the kvtier release). Static. */
const char* kvtier_version(void);

/* ---- Values ------------------------------------------------------------------- */

/* Where a block is held. Values equal kvtier::Tier and the wire enum. */
typedef enum kvtier_tier {
  KVTIER_TIER_HBM = 0,                 /* the daemon's GPU arena (host backend: its "HBM" budget) */
  KVTIER_TIER_RAM = 1,                 /* pinned host RAM pool */
  KVTIER_TIER_NVME = 2,                /* slab files on NVMe */
  KVTIER_TIER_NONE = 3,                /* not held */
  KVTIER_TIER_REMOTE = 4,              /* lookup: in the remote tier (Redis Cluster) */
  KVTIER_TIER_FORCE_32BIT = 0x7fffffff /* not a tier: keeps the enum 32-bit wide */
} kvtier_tier;
#define KVTIER_TIER_COUNT 3 /* tiers that hold bytes (HBM, RAM, NVME) */

/* What kind of regions an engine registers; must match the daemon's backend. */
typedef enum kvtier_device_kind {
  KVTIER_DEVICE_HOST = 0,                /* memfd regions (kvtierd --device host) */
  KVTIER_DEVICE_CUDA = 1,                /* CUDA IPC or VMM regions (kvtierd --device cuda) */
  KVTIER_DEVICE_FORCE_32BIT = 0x7fffffff /* not a kind: keeps the enum 32-bit wide */
} kvtier_device_kind;

#define KVTIER_MAX_HASH_BYTES 32   /* a block hash is 1..32 opaque bytes */
#define KVTIER_NAME_BYTES 256      /* fixed char arrays below, NUL included */
#define KVTIER_GPU_UUID_BYTES 64   /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" + NUL */
#define KVTIER_MAX_GPUS 64         /* GPU UUIDs a kvtier_hello_info holds */
#define KVTIER_MESSAGE_BYTES 512   /* kvtier_load_result.stop_message, NUL included */
#define KVTIER_IPC_HANDLE_BYTES 64 /* sizeof(CUipcMemHandle) */

/* One per-block slice of engine memory: block b's bytes of this plane are
 * [offset_bytes + b * stride_bytes, + bytes_per_block) of region region_id. */
typedef struct kvtier_plane {
  uint32_t region_id;
  uint32_t reserved; /* 0 */
  uint64_t offset_bytes;
  uint64_t stride_bytes;
  uint64_t bytes_per_block;
} kvtier_plane;

/* The shape of the engine's KV cache. Blocks are shared only between equal layouts
 * (model_id, shape, dtype, planes and extra_key all count). NULL strings mean "",
 * except dtype: NULL means "fp16". The daemon validates everything and names the bad
 * field (e.g. "layout.planes[2].bytesPerBlock") in KVTIER_INVALID_ARGUMENT. */
typedef struct kvtier_layout {
  /* Names the KV's producer, not the model's path: everything that changes a
   * token's KV must change it (the weights, their quantization, the KV dtype, rope and
   * position settings, the attention). The key scheme (client/python/kvtier/fingerprint.py):
   * "kvtier-model:" and 32 hex digits of a SHA-256 over the checkpoint's digest and
   * those settings. A name of the operator's own is a promise that every engine
   * given it computes the same KV. */
  const char* model_id;
  const char* dtype;     /* "fp16", "bf16", "fp8_e4m3", ... */
  const char* extra_key; /* anything else that makes blocks incompatible (LoRA id) */
  uint32_t num_layers;
  uint32_t num_kv_heads; /* on this rank */
  uint32_t head_dim;
  uint32_t tokens_per_block;
  uint32_t tp_rank;
  uint32_t tp_size;
  uint64_t num_blocks;        /* engine block ids are 0..num_blocks-1 */
  const kvtier_plane* planes; /* plane_count entries, in the order a block concatenates them */
  uint32_t plane_count;
  uint32_t reserved; /* 0 */
} kvtier_layout;

/* What the daemon answered to kvtier_hello. Strings are NUL-terminated and cut to
 * fit their arrays. */
typedef struct kvtier_hello_info {
  uint32_t protocol_version;
  uint32_t max_blocks_per_request;        /* longer save/lookup/load lists are refused */
  uint64_t layout_digest;                 /* equal digests share blocks */
  uint64_t block_bytes;                   /* one logical block: the sum of plane bytes */
  uint32_t device_kind;                   /* a kvtier_device_kind: the daemon's backend */
  uint32_t gpu_count;                     /* GPUs the daemon serves (only the first
                                             KVTIER_MAX_GPUS are in gpu_uuids) */
  char namespace_name[KVTIER_NAME_BYTES]; /* where this connection's blocks live */
  char device_name[KVTIER_NAME_BYTES];    /* "host" or the GPU models, for logs */
  char gpu_uuids[KVTIER_MAX_GPUS][KVTIER_GPU_UUID_BYTES];
} kvtier_hello_info;

/* A block hash: hash_len (1..KVTIER_MAX_HASH_BYTES) bytes at hash. */
typedef struct kvtier_hash {
  const uint8_t* hash;
  uint32_t hash_len;
} kvtier_hash;

/* A block hash and the engine block that holds (save) or receives (load) its bytes. */
typedef struct kvtier_block_ref {
  const uint8_t* hash;
  uint32_t hash_len;
  uint64_t engine_block_id;
} kvtier_block_ref;

/* How long the daemon keeps blocks (ABI 0.4): priority 1..100 on TensorRT-LLM's scale,
 * higher kept longer, 35 when none was given. Under pressure every policy gives up the
 * lowest priority first; above 35 a session is durable (not demoted for being idle).
 * After duration_ms (0: until changed) the priority returns to 35. */
typedef struct kvtier_retention {
  uint32_t priority; /* 1..100; 0: not given (a session's) / clear (a range's) */
  uint32_t reserved; /* 0 */
  uint64_t duration_ms;
} kvtier_retention;

/* A priority for refs[first .. first + count) of one save, overriding the session's
 * (keep a system prompt, let a failed tool call go first). Later ranges win. */
typedef struct kvtier_range_retention {
  uint32_t first;
  uint32_t count;
  kvtier_retention retention;
} kvtier_range_retention;

/* stored + deduplicated: the leading blocks of the Save the daemon holds now. Fewer
 * than the Save's blocks when room ran out (its tiers full of blocks sessions hold): a
 * partial Save kept the longest prefix that fit, perhaps none, and the engine recomputes
 * the rest next turn. A turn saved in several Saves stops at the first short one. */
typedef struct kvtier_save_result {
  uint32_t stored;       /* blocks copied into the daemon */
  uint32_t deduplicated; /* blocks the daemon already held */
} kvtier_save_result;

typedef struct kvtier_load_result {
  uint32_t loaded_count; /* leading blocks restored into the engine's blocks */
  uint32_t stop_code;    /* a kvtier_status: KVTIER_OK when every block was restored;
                            else why the prefix ended (NOT_FOUND: not held, DATA_LOSS:
                            corrupt or lost, RESOURCE_EXHAUSTED: ...) */
  char stop_message[KVTIER_MESSAGE_BYTES]; /* "" when stop_code is KVTIER_OK */
} kvtier_load_result;

typedef struct kvtier_begin_turn_result {
  uint32_t known_blocks;    /* blocks the session references */
  uint32_t promoted_blocks; /* of those, moves toward HBM started */
} kvtier_begin_turn_result;

typedef struct kvtier_tier_stats {
  uint64_t capacity_bytes;
  uint64_t used_bytes;
  uint64_t blocks;
} kvtier_tier_stats;

/* The caller's namespace's view of the daemon (kvtierctl status shows the same). */
typedef struct kvtier_stats_info {
  kvtier_tier_stats tiers[KVTIER_TIER_COUNT]; /* indexed by kvtier_tier */
  uint64_t sessions_active;
  uint64_t sessions_idle;
  uint64_t lookup_hits;
  uint64_t lookup_misses;
  uint64_t bytes_saved;
  uint64_t bytes_loaded;
  uint64_t bytes_demoted;
  uint64_t bytes_promoted;
  uint64_t pinned_blocks;
  uint64_t copies_in_flight;
  uint64_t blocks_evicted;
  uint64_t data_loss_blocks;
  uint64_t uptime_ms;
  uint32_t connections;
  uint32_t pinned_sessions;
  char device_name[KVTIER_NAME_BYTES];
  char policy[KVTIER_NAME_BYTES]; /* "lru", "session", "predictive" */
} kvtier_stats_info;

typedef struct kvtier_client kvtier_client;   /* opaque: one connection */
typedef struct kvtier_pending kvtier_pending; /* opaque: one reply not yet waited for */

/* ---- Connection ---------------------------------------------------------------- */

/* Connects to kvtierd at socket_path; NULL or "" means the default: $KVTIER_SOCKET,
 * else $XDG_RUNTIME_DIR/kvtier/kvtierd.sock, else ./var/kvtierd.sock.
 * On KVTIER_OK *out is a new client (release with kvtier_close); otherwise *out is
 * set to NULL. KVTIER_UNAVAILABLE when no daemon answers there. */
kvtier_status kvtier_connect(const char* socket_path, kvtier_client** out);

/* How a client behaves when kvtierd goes away (ABI 0.3). Zero-initialize it, then set
 * what you need; kvtier_connect uses the defaults (reconnect on, 20 ms to 2 s).
 * reconnect != 0: after the connection breaks, replies owed fail at once with
 * KVTIER_UNAVAILABLE (retryable), calls made while kvtierd is away fail the same way
 * without waiting, and the next call after the backoff delay (doubling from
 * initial_backoff_ms to max_backoff_ms, with jitter) connects again, repeats the Hello
 * and registers every region again (the library keeps duplicates of their
 * descriptors), then goes out. reconnect == 0: the client stays disconnected.
 * A backoff of 0 means the default. */
typedef struct kvtier_client_options {
  int32_t reconnect;
  uint32_t initial_backoff_ms;
  uint32_t max_backoff_ms;
  uint32_t reserved; /* 0 */
} kvtier_client_options;

/* kvtier_connect with options (NULL: the defaults). ABI 0.3. */
kvtier_status kvtier_connect_with_options(const char* socket_path,
                                          const kvtier_client_options* options,
                                          kvtier_client** out);

/* How many times the client connected again after kvtierd went away; 0 for NULL.
 * ABI 0.3. */
uint64_t kvtier_reconnects(const kvtier_client* client);

/* Closes the connection (once no pending of it is left) and frees the client.
 * NULL is a no-op. The daemon drops the connection's regions; sessions stay. */
void kvtier_close(kvtier_client* client);

/* Says who the engine is; must come first, once per connection. device_kind must
 * match the daemon's backend (KVTIER_INVALID_ARGUMENT naming the backend it runs).
 * prefill_tokens_per_second: the engine's prefill speed, 0 if unknown.
 * engine_name: for logs; NULL means "engine". out may be NULL. */
kvtier_status kvtier_hello(kvtier_client* client, const kvtier_layout* layout,
                           const char* engine_name, kvtier_device_kind device_kind,
                           double prefill_tokens_per_second, kvtier_hello_info* out);

/* ---- Regions --------------------------------------------------------------------
 * A region is engine memory the daemon maps; layout planes name regions by id. The
 * memory must stay allocated until kvtier_unregister_region returned for it. */

/* Host backend: a memfd of exactly size_bytes, created with MFD_ALLOW_SEALING (the
 * daemon seals it against shrinking, or the engine did: F_SEAL_SHRINK). fd stays the
 * caller's. */
kvtier_status kvtier_register_memfd(kvtier_client* client, uint32_t region_id, int fd,
                                    uint64_t size_bytes);

/* CUDA backend, legacy IPC: handle is a CUipcMemHandle of the allocation (64 bytes);
 * the region is size_bytes starting offset_bytes from the allocation's base.
 * gpu_uuid ("GPU-…") names the GPU; NULL or "" means the daemon's only GPU. */
kvtier_status kvtier_register_cuda_ipc(kvtier_client* client, uint32_t region_id,
                                       const uint8_t handle[KVTIER_IPC_HANDLE_BYTES],
                                       uint64_t offset_bytes, uint64_t size_bytes,
                                       const char* gpu_uuid);

/* CUDA backend, VMM (cuMemCreate chunks, e.g. PyTorch expandable segments): count
 * chunks in address order, fds[i] the POSIX fd of chunk i's handle (the caller keeps
 * owning it) and chunk_bytes[i] its size; the region is size_bytes starting
 * offset_bytes into the first chunk. At most 1024 chunks. gpu_uuid as above. */
kvtier_status kvtier_register_cuda_vmm(kvtier_client* client, uint32_t region_id, const int* fds,
                                       const uint64_t* chunk_bytes, uint32_t count,
                                       uint64_t offset_bytes, uint64_t size_bytes,
                                       const char* gpu_uuid);

/* CUDA backend, from a pointer: registers [device_ptr, device_ptr + bytes) of this
 * process's device memory (a CUdeviceptr, anywhere inside its allocation), choosing
 * legacy IPC or VMM by how it was allocated, on the GPU that holds it. The calling
 * thread needs no current context. KVTIER_UNAVAILABLE when this library was built
 * without CUDA support or no CUDA driver can be loaded; KVTIER_INVALID_ARGUMENT for
 * memory the daemon could not open (managed, pool, host), with the reason. */
kvtier_status kvtier_register_cuda_pointer(kvtier_client* client, uint32_t region_id,
                                           uint64_t device_ptr, uint64_t bytes);

/* ---- Staging kernels on a GPU (kvtier::GpuStager; docs/gpu.md) -------------------
 * The engine packs a request's blocks out of its paged cache into a staging buffer in
 * its own GPU memory with a gather kernel, and unpacks Loads with a scatter kernel, so
 * kvtierd moves each block in one contiguous copy instead of one per plane. Kernels run
 * on the engine's stream (a CUstream as uint64_t; 0: the legacy default stream).
 * Added in version node KVTIER_0.6. */

/* How the engine moves its blocks' bytes, said in its Hello. */
typedef enum kvtier_data_path {
  KVTIER_DATA_PATH_PLANE_COPIES = 0,    /* kvtierd copies each plane (the default) */
  KVTIER_DATA_PATH_STAGING_KERNELS = 1, /* kvtier_gpu_stager_* */
  KVTIER_DATA_PATH_STAGING_HOST = 2,    /* the engine packs blocks on its CPU */
} kvtier_data_path;

/* kvtier_hello that also says the engine's data path; a staging path lets it register
 * regions no plane names (its staging buffers). */
kvtier_status kvtier_hello_with_data_path(kvtier_client* client, const kvtier_layout* layout,
                                          const char* engine_name, kvtier_device_kind device_kind,
                                          double prefill_tokens_per_second,
                                          kvtier_data_path data_path, kvtier_hello_info* out);

typedef struct kvtier_gpu_stager kvtier_gpu_stager;

/* KVTIER_OK when the kernels run for a cache on the GPU holding device_ptr (this
 * library embeds them and the driver loads them there); KVTIER_UNAVAILABLE (with the
 * reason) otherwise: the engine then keeps the plane-copy path. Ask before the Hello. */
kvtier_status kvtier_gpu_stager_probe(uint64_t device_ptr);

/* After a kvtier_hello_with_data_path(..., KVTIER_DATA_PATH_STAGING_KERNELS, ...) on
 * client: allocates a ring_bytes staging buffer on the cache's GPU, registers it as
 * region staging_region_id (no plane may name it), loads the kernels. region_ids[i]'s
 * memory starts at device address region_device_ptrs[i], for every region the layout's
 * planes name (layout: the one the Hello sent). The client must outlive the stager. */
kvtier_status kvtier_gpu_stager_create(kvtier_client* client, const kvtier_layout* layout,
                                       const uint32_t* region_ids,
                                       const uint64_t* region_device_ptrs, uint32_t region_count,
                                       uint64_t ring_bytes, uint32_t staging_region_id,
                                       kvtier_gpu_stager** out);
/* kvtier_save through the stager: gathers on stream (behind the engine's writes there),
 * then the staged Saves; returns when kvtierd holds the bytes. */
kvtier_status kvtier_gpu_stager_save(kvtier_gpu_stager* stager, const char* session_id,
                                     const kvtier_block_ref* refs, uint32_t count, int end_of_turn,
                                     uint64_t stream, kvtier_save_result* out);
/* kvtier_load_planes through the stager (plane_count 0: every plane): returns once the
 * scatters are queued on stream; the engine's later work there sees the blocks. */
kvtier_status kvtier_gpu_stager_load(kvtier_gpu_stager* stager, const char* session_id,
                                     const kvtier_block_ref* refs, uint32_t count,
                                     uint32_t plane_begin, uint32_t plane_count, uint64_t stream,
                                     kvtier_load_result* out);
/* A layer-wise Load: range_count plane ranges (plane_begins[i], plane_counts[i]) for the
 * same blocks, sent ahead as the ring allows; kvtier_gpu_stager_finish_range(i) (in
 * order 0, 1, …) queues range i's scatter on stream before the layer needs it;
 * kvtier_gpu_stager_end_load when done (also after an error). */
kvtier_status kvtier_gpu_stager_begin_load(kvtier_gpu_stager* stager, const char* session_id,
                                           const kvtier_block_ref* refs, uint32_t count,
                                           const uint32_t* plane_begins,
                                           const uint32_t* plane_counts, uint32_t range_count);
kvtier_status kvtier_gpu_stager_finish_range(kvtier_gpu_stager* stager, uint32_t range,
                                             uint64_t stream, kvtier_load_result* out);
kvtier_status kvtier_gpu_stager_end_load(kvtier_gpu_stager* stager);
/* Unregisters the staging buffer and frees it. NULL is fine. */
void kvtier_gpu_stager_destroy(kvtier_gpu_stager* stager);

/* Returns once every daemon copy touching the region has finished and the daemon's
 * mapping is closed: the memory may be freed then. KVTIER_NOT_FOUND for a region not
 * registered on this connection. */
kvtier_status kvtier_unregister_region(kvtier_client* client, uint32_t region_id);

/* ---- Data path (blocking) -------------------------------------------------------
 * count may be 0 (the array may then be NULL); at most max_blocks_per_request. */

/* Hands the daemon a session's blocks; returns when their bytes were copied, after
 * which the engine may reuse those blocks. end_of_turn (0 or 1) starts the session's
 * idle clock. out may be NULL. */
kvtier_status kvtier_save(kvtier_client* client, const char* session_id,
                          const kvtier_block_ref* refs, uint32_t count, int end_of_turn,
                          kvtier_save_result* out);

/* kvtier_save with retention priorities (ABI 0.4): session_retention (NULL, or priority
 * 0: the session's priority stays as it is) and range_count ranges of refs (ranges may
 * be NULL when range_count is 0; they may overlap, later ones winning, but cover at
 * most count refs in total). A range never lowers a block other sessions hold too.
 * KVTIER_INVALID_ARGUMENT for a priority over 100, a duration without a priority, a
 * nonzero reserved field, or ranges outside refs or covering more than count;
 * KVTIER_NOT_SUPPORTED when the daemon predates retention priorities. */
kvtier_status kvtier_save_with_retention(kvtier_client* client, const char* session_id,
                                         const kvtier_block_ref* refs, uint32_t count,
                                         int end_of_turn, const kvtier_retention* session_retention,
                                         const kvtier_range_retention* ranges, uint32_t range_count,
                                         kvtier_save_result* out);

/* How many leading hashes the daemon holds (*hit_count) and, when tiers_out is not
 * NULL, where: tiers_out[i] for i < *hit_count (tiers_out holds at least count
 * entries; the ones from *hit_count on are set to KVTIER_TIER_NONE). */
kvtier_status kvtier_lookup(kvtier_client* client, const kvtier_hash* hashes, uint32_t count,
                            uint32_t* hit_count, kvtier_tier* tiers_out);

/* Restores the leading held blocks into the engine's blocks (session_id "" loads
 * without marking any session active). KVTIER_OK with
 * out->loaded_count < count and out->stop_code when the prefix ended early (a missing
 * or corrupt block); the bytes of blocks past loaded_count are unspecified. */
kvtier_status kvtier_load(kvtier_client* client, const char* session_id,
                          const kvtier_block_ref* refs, uint32_t count, kvtier_load_result* out);

/* kvtier_load restricted to some of each block's planes: planes [plane_begin,
 * plane_begin + plane_count) of the layout's planes (kvtier_layout.planes order, e.g.
 * layer 0 K, layer 0 V, layer 1 K, ...) are copied into each engine block, the other
 * planes' bytes left as they are. plane_count 0 is every plane (plane_begin must then
 * be 0): kvtier_load. For layer-wise loading, send one kvtier_load_planes_async per
 * layer for the same refs and wait for each on its own: a layer's reply means its
 * bytes are in place while later layers still copy. Each load stands alone (its own
 * loaded_count; use the smallest). KVTIER_INVALID_ARGUMENT naming planeBegin or
 * planeCount and the layout's plane count for a range outside the layout;
 * KVTIER_NOT_SUPPORTED for a range when the daemon predates plane ranges. Added in
 * version node KVTIER_0.5. */
kvtier_status kvtier_load_planes(kvtier_client* client, const char* session_id,
                                 const kvtier_block_ref* refs, uint32_t count, uint32_t plane_begin,
                                 uint32_t plane_count, kvtier_load_result* out);

/* A new message arrived for the session: mark it active and promote its blocks
 * toward HBM ahead of the Load. KVTIER_NOT_FOUND for an unknown session. out may be
 * NULL. */
kvtier_status kvtier_begin_turn(kvtier_client* client, const char* session_id,
                                kvtier_begin_turn_result* out);

/* Drops the session's references (shared blocks stay while others use them).
 * *released_blocks (may be NULL): blocks the session referenced. KVTIER_NOT_FOUND for
 * an unknown session. */
kvtier_status kvtier_close_session(kvtier_client* client, const char* session_id,
                                   uint32_t* released_blocks);

/* Counters and tier occupancy of the caller's namespace. */
kvtier_status kvtier_stats(kvtier_client* client, kvtier_stats_info* out);

/* ---- Data path (non-blocking) ---------------------------------------------------
 * Each *_async call sends the request and returns at once with *out a new pending
 * (KVTIER_OK), or an error and *out = NULL when the request could not be sent (bad
 * arguments, daemon gone). Replies may complete in any order. */

kvtier_status kvtier_save_async(kvtier_client* client, const char* session_id,
                                const kvtier_block_ref* refs, uint32_t count, int end_of_turn,
                                kvtier_pending** out);
kvtier_status kvtier_save_with_retention_async(kvtier_client* client, const char* session_id,
                                               const kvtier_block_ref* refs, uint32_t count,
                                               int end_of_turn,
                                               const kvtier_retention* session_retention,
                                               const kvtier_range_retention* ranges,
                                               uint32_t range_count, kvtier_pending** out);
kvtier_status kvtier_lookup_async(kvtier_client* client, const kvtier_hash* hashes, uint32_t count,
                                  kvtier_pending** out);
kvtier_status kvtier_load_async(kvtier_client* client, const char* session_id,
                                const kvtier_block_ref* refs, uint32_t count, kvtier_pending** out);
/* kvtier_load_planes without waiting (wait with kvtier_pending_wait_load). Added in
 * version node KVTIER_0.5. */
kvtier_status kvtier_load_planes_async(kvtier_client* client, const char* session_id,
                                       const kvtier_block_ref* refs, uint32_t count,
                                       uint32_t plane_begin, uint32_t plane_count,
                                       kvtier_pending** out);
kvtier_status kvtier_begin_turn_async(kvtier_client* client, const char* session_id,
                                      kvtier_pending** out);
kvtier_status kvtier_close_session_async(kvtier_client* client, const char* session_id,
                                         kvtier_pending** out);

/* Tier notices (schema: WatchTiers), for an engine that tells routers where its blocks
 * are: blocks of its layout that changed place on this node, each with where it is now
 * (KVTIER_TIER_NONE: no longer on this node). The first call subscribes the connection
 * (after a reconnect, call again and look up what you believed: notices were lost).
 * Answered at once with what changed since the last answer, else at the first change,
 * else empty after max_wait_ms (at most 60000); one may wait per connection. At most
 * max_changes a reply (0: the daemon's max_blocks_per_request). Wait with
 * kvtier_pending_wait_tier_notices. Added in version node KVTIER_0.9. */
typedef struct kvtier_tier_change {
  uint8_t hash[32]; /* the block's hash, hash_len bytes (the rest zero) */
  uint32_t hash_len;
  kvtier_tier tier;
} kvtier_tier_change;
kvtier_status kvtier_watch_tiers_async(kvtier_client* client, uint32_t max_wait_ms,
                                       uint32_t max_changes, kvtier_pending** out);

/* Never blocks: *ready = 1 when the matching kvtier_pending_wait_* would return
 * without waiting (the reply, or the connection's failure, has arrived), else 0. */
kvtier_status kvtier_pending_poll(kvtier_pending* pending, int* ready);

/* Blocks until the reply arrives and returns its outcome, as the blocking call of the
 * same kind would. Exactly one wait per pending, of the kind that created it
 * (KVTIER_INVALID_ARGUMENT otherwise, with nothing consumed by a wrong-kind call).
 * Out-parameters as in the blocking forms (NULL allowed where they allow it);
 * kvtier_pending_wait_lookup's tiers_out holds at least the request's count. */
kvtier_status kvtier_pending_wait_save(kvtier_pending* pending, kvtier_save_result* out);
kvtier_status kvtier_pending_wait_lookup(kvtier_pending* pending, uint32_t* hit_count,
                                         kvtier_tier* tiers_out);
kvtier_status kvtier_pending_wait_load(kvtier_pending* pending, kvtier_load_result* out);
kvtier_status kvtier_pending_wait_begin_turn(kvtier_pending* pending,
                                             kvtier_begin_turn_result* out);
kvtier_status kvtier_pending_wait_close_session(kvtier_pending* pending, uint32_t* released_blocks);
/* Writes at most `capacity` changes into changes_out and their number into *count;
 * *resync = 1 when notices were dropped (by the daemon, or past `capacity`): look up
 * again what was believed of every block. Added in version node KVTIER_0.9. */
kvtier_status kvtier_pending_wait_tier_notices(kvtier_pending* pending,
                                               kvtier_tier_change* changes_out, uint32_t capacity,
                                               uint32_t* count, int* resync);

/* Frees a pending, waited for or not (a reply not waited for is discarded when it
 * arrives; the request itself still runs). NULL is a no-op. */
void kvtier_pending_free(kvtier_pending* pending);

/* ---- Block keys ----------------------------------------------------------------- */

/* kvtier's block keys (the Python package's kvtier.hashing documents the scheme): the
 * chained SHA-256 hashes of the full blocks of tokens[0..count), B = tokens_per_block:
 *   hash[0] = sha256(parent, or 32 zero bytes || tokens[0:B] as int64 LE || extra_keys)
 *   hash[i] = sha256(hash[i - 1] || tokens[iB:(i+1)B] || extra_keys)
 * A trailing partial block is not hashed. parent: NULL or the 32-byte hash of the block
 * just before tokens[0] (to extend a prefix hashed earlier). extra_keys (NULL when
 * extra_len is 0): whatever besides the tokens makes their KV differ — the model's
 * fingerprint, a LoRA adapter, a cache salt. Writes count / tokens_per_block hashes of
 * 32 bytes each to out (out_bytes must hold them) and their number to *blocks_out.
 * Needs no connection; any thread. Added in version node KVTIER_0.7. */
kvtier_status kvtier_block_hashes(const int64_t* tokens, size_t count, uint32_t tokens_per_block,
                                  const uint8_t* extra_keys, size_t extra_len,
                                  const uint8_t* parent, uint8_t* out, size_t out_bytes,
                                  size_t* blocks_out);

/* The checkpoint digest of the model fingerprint's key scheme
 * (client/python/kvtier/fingerprint.py documents it; this computes the same digest byte
 * for byte): of the weights folder's top level, every weight file's name and size, each
 * safetensors file's header and 64 bytes at the start, middle and end of every tensor,
 * 16 samples of 4 KiB across any other weight file, and the configuration and
 * quantization files whole. Writes 64 lowercase hex digits and a NUL to digest_hex
 * (digest_bytes >= 65) and, when tensors_sampled is not NULL, how many safetensors
 * tensors were sampled. KVTIER_NOT_FOUND when folder is not a directory. Hash it with
 * the settings that change the KV (see fingerprint.py) into the layout's model_id.
 * Needs no connection; any thread. Added in version node KVTIER_0.8. */
kvtier_status kvtier_checkpoint_digest(const char* folder, char* digest_hex, size_t digest_bytes,
                                       uint64_t* tensors_sampled);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVTIER_H_ */
