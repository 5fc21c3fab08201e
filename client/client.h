// kvtier::Client: what an engine links to talk to kvtierd.
//
// One Client is one connection. Typical use:
//   auto client = Client::connect(path);            // Unavailable if no daemon
//   client->hello(layout, "vllm-rank0");             // once, first
//   client->register_memfd_region(0, fd, size);      // per KV region
//   client->save("conv-42", blocks, /*end_of_turn=*/true);
//   client->lookup(hashes); client->load("conv-42", blocks);
//   client->load_async("conv-42", blocks, {2 * layer, 2});  // one layer's K and V planes
//   client->unregister_region(0);                    // before freeing the region
//
// Every call has a blocking form and an async form (`*_async`) returning a Pending<T>
// whose wait() blocks for the reply; requests may be pipelined and replies arrive in
// any order. Errors come back as kvtier::Status with the daemon's code, message and
// retryable flag.
//
// Thread-safety: all methods may be called from several threads at once; sends are
// serialized, and whichever thread waits reads replies for everyone.
//
// Daemon restarts (ClientOptions::reconnect, on by default). When the connection
// breaks (kvtierd stopped, crashed or restarted), every reply still owed fails at once
// with Unavailable (retryable), and so does every call made while kvtierd is away: no
// call waits for it. The next call after the backoff delay (exponential from
// initial_backoff to max_backoff, with jitter; reset by a success) connects again,
// repeats the Hello the engine made and registers again every region it has
// registered (with the same ids; the client keeps a duplicate of each region's
// descriptors for this), and then goes out on the new connection. A request whose
// send found the connection broken (the usual first call after a restart) is sent
// again once, at once, when kvtierd is already back. Calls made meanwhile
// on other threads wait for that one attempt, which is the only one at a time; it
// gives up after 2 s when the daemon accepts the connection but does not answer the
// replay (stopped, deadlocked), which counts as still away (Unavailable). When
// kvtierd is back but refuses the replay (another layout digest, the engine now in
// another namespace, a refused region), calls get its error, not Unavailable, until a
// later attempt succeeds. unregister_region() needs no connection: while kvtierd is
// away the region is already gone there, so it only forgets the region. An engine keeps serving
// while the daemon is away by recomputing what it would have loaded; its later turns hit the blocks
// the daemon kept (NVMe survives a restart). reconnects() counts the connections made again.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "common/block_key.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "ipc/client_transport.h"
#include "schema/kvtier.capnp.h"

namespace kvtier {

struct PlaneSpec {
  uint32_t region_id = 0;
  uint64_t offset_bytes = 0;
  uint64_t stride_bytes = 0;
  uint64_t bytes_per_block = 0;
};

struct LayoutSpec {
  std::string model_id;
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  std::string dtype = "fp16";
  uint32_t tokens_per_block = 16;
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;
  uint64_t num_blocks = 0;
  std::vector<PlaneSpec> planes;
  std::string extra_key;
};

// What kind of regions an engine registers; must match the daemon's backend.
enum class DeviceKind : uint8_t {
  kHost,  // memfd regions (the daemon runs the host backend)
  kCuda,  // GPU regions: CUDA IPC or VMM handles (the daemon runs the cuda backend)
};

// How the engine moves its blocks' bytes (schema: DataPath), said in the Hello.
enum class DataPath : uint8_t {
  kPlaneCopies,     // kvtierd copies each plane from and to the engine's paged cache
  kStagingKernels,  // the engine packs blocks into a staging region with GPU kernels
  kStagingHost,     // the same, packed by the engine's CPU
};

// A staged Save or Load (schema: Staging): staged block i of the request at
// offset_bytes + i × row bytes of region `region_id` (row bytes: the block's bytes, or a
// Load's plane range of them), engine block ids unused. The engine packs before a Save
// and unpacks after a Load's reply (client/gpu_stager.h does both on a GPU).
struct StagingRef {
  uint32_t region_id = 0;
  uint64_t offset_bytes = 0;
};

struct HelloInfo {
  uint32_t protocol_version = 0;
  uint64_t layout_digest = 0;
  uint64_t block_bytes = 0;
  std::string namespace_name;
  uint32_t max_blocks_per_request = 0;
  DeviceKind device_kind = DeviceKind::kHost;  // the daemon's backend
  std::vector<std::string> gpu_uuids;          // cuda: the GPUs it serves ("GPU-…")
  std::string device_name;                     // "host" or the GPU models, for logs
  bool retention_priorities = false;           // Save's SaveOptions are honoured
  bool load_plane_ranges = false;              // Load's PlaneRange is honoured
  bool staging = false;                        // Save's and Load's StagingRef are honoured
};

// One chunk of a CUDA VMM region: the POSIX fd of one cuMemCreate handle (the caller
// keeps owning it) and the chunk's size in bytes.
struct VmmChunkFd {
  int fd = -1;
  uint64_t bytes = 0;
};

struct BlockRef {
  BlockHash hash;
  uint64_t engine_block_id;
};

// How long kvtierd keeps a session's blocks (schema: Retention): priority 1..100 on
// TensorRT-LLM's scale, higher kept longer, 35 when nobody gave one. Under pressure every
// policy gives up the lowest priority first; above 35 a session is durable (not demoted
// for being idle). After `duration_ms` the priority returns to 35.
struct Retention {
  uint8_t priority = 0;      // 1..100; 0: not given (a session's) or clear (a range's)
  uint64_t duration_ms = 0;  // 0: until changed
};
// A priority for blocks [first, first + count) of one Save's list, overriding the
// session's (a system prompt kept, a failed tool call let go first).
struct RangeRetention {
  uint32_t first = 0;
  uint32_t count = 0;
  Retention retention;
};
struct SaveOptions {
  Retention retention;                          // the session's; priority 0 leaves it as is
  std::vector<RangeRetention> block_retention;  // later ranges win where they overlap
  std::optional<StagingRef> staging;            // packed blocks there (HelloInfo::staging)
};

// stored + deduplicated: the leading blocks of the Save the daemon holds now. Fewer than
// the Save's blocks when room ran out (the daemon's tiers were full of blocks sessions
// hold): a partial Save kept the longest prefix that fit, perhaps none; the rest is
// recomputed next turn. A turn saved in several Saves stops at the first short one.
struct SaveResult {
  uint32_t stored;        // blocks copied into the daemon
  uint32_t deduplicated;  // blocks it already held
  uint32_t saved() const { return stored + deduplicated; }
};

struct LookupResult {
  uint32_t hit_count;
  std::vector<Tier> tiers;  // of the first hit_count blocks
};

// Tier notices (schema: WatchTiers): blocks of this engine's layout that changed place,
// each with where it is now (Tier::kNone: no longer on this node).
struct TierChange {
  BlockHash hash;
  Tier tier = Tier::kNone;
};
struct TierNotices {
  std::vector<TierChange> changes;
  bool resync = false;  // notices were dropped: look the blocks up again
};

// Which of the layout's planes a Load copies into each engine block: planes
// [begin, begin + count) of LayoutSpec::planes. count 0 (the default) is every plane
// (begin must then be 0). A layer-wise load pipelines one range per layer for the same
// blocks and waits for each reply on its own (schema: Load).
struct PlaneRange {
  uint32_t begin = 0;
  uint32_t count = 0;
};

struct LoadResult {
  uint32_t loaded_count;
  Status stop_reason;  // OK when every requested block was restored
};

struct BeginTurnResult {
  uint32_t known_blocks;
  uint32_t promoted_blocks;
};

struct TierStatsInfo {
  Tier tier;
  uint64_t capacity_bytes;
  uint64_t used_bytes;  // copies included
  uint64_t blocks;
  uint64_t copy_bytes = 0;     // of used_bytes: copies of blocks living above (NVMe)
  uint64_t written_bytes = 0;  // written into the tier by the policy's moves since start
};

struct StatsInfo {
  std::vector<TierStatsInfo> tiers;
  uint64_t sessions_active, sessions_idle;
  uint64_t lookup_hits, lookup_misses;
  uint64_t bytes_saved, bytes_loaded, bytes_demoted, bytes_promoted;
  uint64_t pinned_blocks, copies_in_flight;
  uint32_t connections;
  uint64_t blocks_evicted, data_loss_blocks;
  // Saves that kept only a prefix (no room: the tiers full of blocks sessions hold), and
  // the blocks past those prefixes.
  uint64_t partial_saves = 0, blocks_not_saved = 0;
  std::string device_name;
  uint64_t uptime_ms;
  // The daemon is still filling its memory pools (fill_bytes of them): data requests
  // wait for that (docs/protocol.md).
  bool starting = false;
  uint64_t fill_bytes = 0;
  uint64_t admin_pinned_blocks = 0;  // held in place by kvtierctl pin (not in pinned_blocks)
  uint32_t pinned_sessions = 0;
  // The planner's latest decisions, oldest first, and the placement policy's name.
  struct PlannerMovesInfo {
    uint64_t ago_ms;
    std::string kind;  // "demote", "promote", "evict"
    Tier from, to;
    std::string reason;  // "idle", "watermark", ...
    uint32_t blocks;
    uint64_t bytes;
  };
  std::vector<PlannerMovesInfo> recent_moves;
  std::string policy;
  // The CUDA backend's GPUs and their parts of the HBM arena (empty on the host backend).
  struct GpuStatsInfo {
    std::string uuid;
    std::string name;
    uint64_t hbm_capacity_bytes;
    uint64_t hbm_used_bytes;
  };
  std::vector<GpuStatsInfo> gpus;
  // The remote tier (a Redis Cluster); configured false without remote-nodes.
  struct RemoteStatsInfo {
    bool configured = false, connected = false, degraded = false;
    uint32_t masters = 0;
    uint64_t stored_bytes = 0, budget_bytes = 0, in_flight_bytes = 0, write_lag_ms = 0;
    uint64_t written_blocks = 0, fetched_blocks = 0, lookup_hits = 0, corrupt_values = 0;
    uint64_t errors = 0, resumed_sessions = 0, deferred_blocks = 0;
    uint64_t spilled_blocks = 0, spill_unwritten = 0;
  };
  RemoteStatsInfo remote;
  // The NVMe tier's health; configured false without one.
  struct NvmeStatsInfo {
    bool configured = false, degraded = false;
    std::string reason;  // while degraded: why
    uint64_t degraded_ms = 0, degradations = 0, heals = 0, heal_attempts = 0;
  };
  NvmeStatsInfo nvme;
  // Tenants (namespaces) holding blocks: an admin sees every one, an engine its own.
  struct TenantStatsInfo {
    std::string tenant;
    std::array<uint64_t, 3> used_bytes{};   // hbm, ram, nvme (copies not counted)
    std::array<uint64_t, 3> quota_bytes{};  // tenant-quota there; UINT64_MAX: none
  };
  std::vector<TenantStatsInfo> tenants;
  // Connected engines that said Hello (an admin sees every namespace's, an engine its own).
  struct EngineStatsInfo {
    std::string engine_name;
    uint32_t pid = 0;
    std::string namespace_name;
    std::string model_id;  // what its blocks are keyed by (the model fingerprint's id)
    uint64_t layout_digest = 0;
    uint32_t tp_rank = 0, tp_size = 1;
    std::string data_path;  // "planeCopies", "stagingKernels" or "stagingHost"
  };
  std::vector<EngineStatsInfo> engines;
};

struct SessionInfo {
  std::string session_id;
  std::string namespace_name;
  bool active;
  uint64_t idle_ms;
  uint32_t turns;
  uint32_t blocks;
  std::vector<uint32_t> blocks_per_tier;  // hbm, ram, nvme, none
  uint64_t layout_digest;
  uint64_t bytes = 0;                  // of the blocks held, any tier
  bool pinned = false;                 // an admin pinned it
  double return_probability = 1;       // P(it comes back at all); 1 while active
  uint64_t return_in_ms = 0;           // median time to its next turn; UINT64_MAX: not expected
  uint8_t priority = 35;               // retention priority (Retention)
  uint64_t priority_remaining_ms = 0;  // until it returns to 35; 0: no end
};

// One page of a session listing (Client::list_sessions_page).
enum class SessionOrder : uint8_t { kIdle, kBytes };  // longest idle / most bytes first
struct ListSessionsOptions {
  bool all_namespaces = false;
  uint32_t limit = 0;  // sessions per page; 0: the daemon's default (1000; at most 10000)
  SessionOrder order = SessionOrder::kIdle;
  std::string after;  // the previous page's `next`; empty: from the start
};
struct SessionPage {
  std::vector<SessionInfo> sessions;
  std::string next;    // pass as `after` for the next page; empty: this was the last
  uint32_t total = 0;  // sessions the listing covers, all pages together
};

// Operator requests (kvtierctl). Admin ones fail with PermissionDenied for others.
struct EvictResult {
  uint32_t sessions;
  uint64_t blocks_evicted;
  uint64_t bytes_freed;
  uint64_t blocks_kept;  // shared with other sessions or being read
};

struct DrainResult {
  uint64_t blocks_queued;
  uint64_t bytes_queued;
};

struct ConfigEntryInfo {
  std::string key;
  std::string value;  // a TOML value
  bool reloadable;
};

class Client;

// How a Client behaves when kvtierd goes away (see the top of this file).
struct ClientOptions {
  bool reconnect = true;
  std::chrono::milliseconds initial_backoff{20};
  std::chrono::milliseconds max_backoff{2000};
};

// A reply not yet waited for. wait() may be called once. One thread at a time per
// Pending; the Client must outlive it.
template <typename T>
class Pending {
 public:
  Result<T> wait();
  // Never blocks: true when wait() would return without waiting (the reply, or the
  // connection's failure, has arrived, or the request was never sent). May read
  // replies that arrived for others; safe alongside any other thread's calls.
  bool ready();
  // OK once the request went out; otherwise why it was not sent (wait() returns it).
  const Status& send_status() const { return id_.status(); }
  // Gives the reply up: it is dropped when it arrives. wait() may not follow.
  void abandon();

 private:
  friend class Client;
  using Decode = std::function<Result<T>(wire::Response::Reader)>;
  Pending(Client* client, Result<uint64_t> id, Decode decode)
      : client_(client), id_(std::move(id)), decode_(std::move(decode)) {}
  // Settled without a request: wait() returns `value`.
  explicit Pending(T value) : client_(nullptr), id_(uint64_t{0}), settled_(std::move(value)) {}
  Client* client_;
  Result<uint64_t> id_;  // an error here means the request was never sent
  Decode decode_;
  std::optional<T> settled_;
};

class Client {
 public:
  static Result<std::unique_ptr<Client>> connect(const std::string& socket_path,
                                                 const ClientOptions& options = {});
  // Default socket path, as kvtierd chooses it: $KVTIER_SOCKET, else
  // $XDG_RUNTIME_DIR/kvtier/kvtierd.sock, else ./var/kvtierd.sock.
  static std::string default_socket_path();

  // `device_kind` must match the daemon's backend (InvalidArgument otherwise, naming
  // the backend the daemon runs).
  // `data_path` says how this engine moves bytes; a staging path lets it register
  // regions no plane names (its staging regions).
  Result<HelloInfo> hello(const LayoutSpec& layout, const std::string& engine_name = "engine",
                          double prefill_tokens_per_second = 0,
                          DeviceKind device_kind = DeviceKind::kHost,
                          DataPath data_path = DataPath::kPlaneCopies) KVTIER_EXCLUDES(send_mutex_);
  Status register_memfd_region(uint32_t region_id, int memfd, uint64_t size_bytes);
  // GPU regions for a daemon on the CUDA backend. `gpu_uuid` names the GPU ("GPU-…");
  // empty means the daemon's only GPU (InvalidArgument when it serves several). The
  // engine synchronizes its writes to the blocks it names before each Save.
  //
  // Legacy IPC: `ipc_handle` (a CUipcMemHandle) exports the whole allocation; the region
  // is `size_bytes` starting `offset_bytes` from the allocation's base (find both from
  // any device pointer with cuMemGetAddressRange).
  Status register_cuda_ipc_region(uint32_t region_id, std::span<const std::byte, 64> ipc_handle,
                                  uint64_t offset_bytes, uint64_t size_bytes,
                                  const std::string& gpu_uuid);
  // CUDA VMM (PyTorch expandable segments): the chunks' shareable fds in address order
  // (at most ipc::kMaxFdsPerRequest; the daemon maps them back to back), and the region
  // `size_bytes` starting `offset_bytes` into the first chunk. The fds are sent, not
  // taken: the caller still owns them.
  Status register_cuda_vmm_region(uint32_t region_id, std::span<const VmmChunkFd> chunks,
                                  uint64_t offset_bytes, uint64_t size_bytes,
                                  const std::string& gpu_uuid);
  // Before the engine frees (or stops sharing) a region: the reply comes once every
  // daemon copy touching it has finished and the daemon's mapping is closed, so the
  // memory may be freed then. NotFound for a region not registered on this connection.
  // Save and Load fail (InvalidArgument) while a plane's region is unregistered; the id
  // may be registered again after the reply.
  Status unregister_region(uint32_t region_id) {
    return unregister_region_async(region_id).wait().status();
  }

  Result<SaveResult> save(const std::string& session_id, std::span<const BlockRef> blocks,
                          bool end_of_turn, const SaveOptions& options = {}) {
    return save_async(session_id, blocks, end_of_turn, options).wait();
  }
  Result<LookupResult> lookup(std::span<const BlockHash> hashes) {
    return lookup_async(hashes).wait();
  }
  // Restores the leading held blocks into the engine blocks named: the planes of
  // `planes` (default: all of them). InvalidArgument (from the daemon) for a range
  // outside the layout's planes; NotSupported for a range when the daemon joined
  // predates plane ranges (it would copy every plane).
  Result<LoadResult> load(const std::string& session_id, std::span<const BlockRef> blocks,
                          PlaneRange planes = {}) {
    return load_async(session_id, blocks, planes).wait();
  }
  Result<BeginTurnResult> begin_turn(const std::string& session_id) {
    return begin_turn_async(session_id).wait();
  }
  // The reply's value is the number of blocks the session referenced.
  Result<uint32_t> close_session(const std::string& session_id) {
    return close_session_async(session_id).wait();
  }
  Result<StatsInfo> stats(bool all_namespaces = false);
  // Every session, longest idle first, read page by page (the daemon describes one page
  // per request, so it is never held by a long listing).
  Result<std::vector<SessionInfo>> list_sessions(bool all_namespaces = false);
  Result<SessionPage> list_sessions_page(const ListSessionsOptions& options);
  // One session; `namespace_name` empty means the caller's (another one needs admin).
  Result<SessionInfo> get_session(const std::string& session_id,
                                  const std::string& namespace_name = "");
  // Admin: drop one session (empty namespace: wherever the id is) or, with an empty
  // session_id, every session idle longer than idle_over_ms.
  Result<EvictResult> evict(const std::string& session_id, const std::string& namespace_name,
                            uint64_t idle_over_ms = 0);
  // Admin: pin (or unpin) a session's blocks in place; returns the blocks held.
  Result<uint32_t> pin(const std::string& session_id, const std::string& namespace_name,
                       bool pinned);
  Result<DrainResult> drain();                        // admin: RAM/HBM → NVMe
  Result<std::vector<ConfigEntryInfo>> get_config();  // admin: effective configuration

  Pending<SaveResult> save_async(const std::string& session_id, std::span<const BlockRef> blocks,
                                 bool end_of_turn, const SaveOptions& options = {});
  Pending<LookupResult> lookup_async(std::span<const BlockHash> hashes);
  // With `staging`, the blocks' planes in `planes` go packed into that region
  // (NotSupported when the daemon joined does not honour staging).
  Pending<LoadResult> load_async(const std::string& session_id, std::span<const BlockRef> blocks,
                                 PlaneRange planes = {},
                                 std::optional<StagingRef> staging = std::nullopt);
  Pending<BeginTurnResult> begin_turn_async(const std::string& session_id);
  Pending<uint32_t> close_session_async(const std::string& session_id);
  // Tier notices: the first call subscribes this connection (a reconnect's new one is
  // not: call again, and look up what was believed, since notices were lost with the
  // old one). Answered at once with what changed since the last answer, else at the
  // first change, else empty after max_wait_ms (at most 60000). One may wait at a time.
  // max_changes 0: the daemon's maxBlocksPerRequest.
  Pending<TierNotices> watch_tiers_async(uint32_t max_wait_ms, uint32_t max_changes = 0);
  // The reply's value is the region id.
  Pending<uint32_t> unregister_region_async(uint32_t region_id) KVTIER_EXCLUDES(send_mutex_);

  // Connections made again after the daemon went away.
  uint64_t reconnects() const { return reconnects_.load(); }
  // Whether the connection is up (false from a break until the next reconnect).
  bool connected() KVTIER_EXCLUDES(receive_mutex_);

 private:
  // What a reconnect repeats: the engine's Hello and its regions.
  struct HelloRecord {
    LayoutSpec layout;
    std::string engine_name;
    double prefill_tokens_per_second = 0;
    DeviceKind device_kind = DeviceKind::kHost;
    DataPath data_path = DataPath::kPlaneCopies;
    uint64_t layout_digest = 0;
    std::string namespace_name;         // a daemon that moved the engine is not joined
    bool retention_priorities = false;  // of the daemon last joined
    bool load_plane_ranges = false;     // likewise
    bool staging = false;               // likewise
  };
  struct RegionRecord {
    std::function<void(wire::RegisterRegion::Builder)> fill;  // owns what it writes
    std::vector<UniqueFd> fds;                                // duplicates, sent again
  };

  template <typename T>
  friend class Pending;
  Client(ipc::ClientTransport transport, std::string socket_path, const ClientOptions& options)
      : transport_(std::move(transport)), socket_path_(std::move(socket_path)), options_(options) {}

  // OK when the connection is up, else reconnects when the backoff allows (Unavailable
  // when it does not, or the attempt's failure).
  Status ensure_connected_locked() KVTIER_REQUIRES(send_mutex_) KVTIER_EXCLUDES(receive_mutex_);
  Status reconnect_locked() KVTIER_REQUIRES(send_mutex_) KVTIER_EXCLUDES(receive_mutex_);
  // reconnect_locked's replay on the new `transport`, before `deadline`: the engine's
  // Hello (the daemon must answer with the same layout and namespace), then each region.
  Status replay_hello(ipc::ClientTransport& transport,
                      std::chrono::steady_clock::time_point deadline) KVTIER_REQUIRES(send_mutex_);
  Status replay_regions(ipc::ClientTransport& transport,
                        std::chrono::steady_clock::time_point deadline)
      KVTIER_REQUIRES(send_mutex_);
  // The stream broke (a failed send): replies still owed fail with `why`.
  void mark_broken(const Status& why) KVTIER_EXCLUDES(receive_mutex_);
  // Sends a request built by `fill` (which gets the Request builder with its id set).
  Result<uint64_t> send(const std::function<void(wire::Request::Builder)>& fill,
                        std::span<const int> fds = {}) KVTIER_EXCLUDES(send_mutex_, receive_mutex_);
  // Blocks until the reply to `id` arrives.
  Result<ipc::Frame> wait_for(uint64_t id) KVTIER_EXCLUDES(receive_mutex_);
  // Reads what has arrived without blocking; true when wait_for(id) would not block.
  bool reply_ready(uint64_t id) KVTIER_EXCLUDES(receive_mutex_);
  // The reply to `id` will not be waited for: drop it (now or when it arrives).
  void abandon_reply(uint64_t id) KVTIER_EXCLUDES(receive_mutex_);
  // Files one received frame (or the stream's failure).
  void file_frame_locked(Result<ipc::Frame> frame) KVTIER_REQUIRES(receive_mutex_);
  // OK, or NotSupported (`missing`) when the daemon joined lacks `feature`.
  Status require_feature(bool HelloRecord::*feature, const char* missing)
      KVTIER_EXCLUDES(send_mutex_);
  // `fill` must own what it writes: it is kept to register the region again.
  Status register_region(uint32_t region_id,
                         std::function<void(wire::RegisterRegion::Builder)> fill,
                         std::span<const int> fds) KVTIER_EXCLUDES(send_mutex_);
  template <typename T>
  Result<T> call(const std::function<void(wire::Request::Builder)>& fill,
                 const std::function<Result<T>(wire::Response::Reader)>& decode,
                 std::span<const int> fds = {});

  // Replaced by a reconnect, with send_mutex_ and receive_mutex_ held and no reader
  // active. Sends hold send_mutex_; the reader (reader_active_) receives with neither
  // held. A field one thread reads by holding a role rather than a mutex is beyond the
  // analysis, so this one carries no annotation.
  ipc::ClientTransport transport_;
  const std::string socket_path_;
  const ClientOptions options_;
  Mutex send_mutex_;
  uint64_t next_id_ KVTIER_GUARDED_BY(send_mutex_) = 1;
  // Reconnecting.
  std::optional<HelloRecord> hello_ KVTIER_GUARDED_BY(send_mutex_);
  std::map<uint32_t, RegionRecord> regions_ KVTIER_GUARDED_BY(send_mutex_);
  std::chrono::steady_clock::time_point next_attempt_ KVTIER_GUARDED_BY(send_mutex_) = {};
  std::chrono::milliseconds backoff_ KVTIER_GUARDED_BY(send_mutex_) = std::chrono::milliseconds{0};
  uint64_t jitter_state_ KVTIER_GUARDED_BY(send_mutex_) = 0x9e3779b97f4a7c15ull;
  std::atomic<uint64_t> reconnects_{0};
  // Replies are read by one thread at a time (the reader, `reader_active_`), which
  // reads the socket without holding receive_mutex_, files what it read, and wakes
  // the others; waiters not reading sleep on reply_filed_.
  Mutex receive_mutex_;
  CondVar reply_filed_;
  bool reader_active_ KVTIER_GUARDED_BY(receive_mutex_) = false;
  // Replies not yet claimed.
  std::map<uint64_t, ipc::Frame> arrived_ KVTIER_GUARDED_BY(receive_mutex_);
  // Replies nobody will claim.
  std::set<uint64_t> abandoned_ KVTIER_GUARDED_BY(receive_mutex_);
  // Sticky once the stream broke.
  Status connection_error_ KVTIER_GUARDED_BY(receive_mutex_);
  // Replies to ids below this were owed by an earlier connection; they fail with lost_.
  uint64_t first_live_id_ KVTIER_GUARDED_BY(receive_mutex_) = 1;
  Status lost_ KVTIER_GUARDED_BY(receive_mutex_);
};

// Converts an Error reply into a Status: its code, message and retryable flag. A code
// this client does not know (or OK inside an Error) is Internal.
Status status_from_wire(wire::Error::Reader error);

}  // namespace kvtier
