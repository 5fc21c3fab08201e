// Service: kvtierd's request handlers and the state they share — the block index,
// the session table, the planner and the Device — wired to the IPC server.
//
// Thread-safety: every method runs on the control thread (the io_context's one
// thread). Device copies run on device threads; their completions are posted back
// here, so no state is ever touched from two threads. An executor work guard rides
// with every copy, so io_context::run() returns only after the last copy finished.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cuda/device.h"
#include "daemon/config.h"
#include "daemon/engines.h"
#include "daemon/layout.h"
#include "daemon/metrics.h"
#include "daemon/requests.h"
#include "ipc/server.h"
#include "policy/clock.h"
#include "policy/planner.h"
#include "policy/session_table.h"
#include "tiers/block_store.h"
#include "tiers/move_executor.h"
#include "tiers/nvme_format.h"
#include "tiers/tier.h"

namespace kvtier::daemon {

namespace asio = boost::asio;

struct Counters {
  uint64_t lookup_hits = 0;
  uint64_t lookup_misses = 0;
  uint64_t bytes_saved = 0;
  uint64_t bytes_loaded = 0;
  uint64_t copies_in_flight = 0;  // moves' copies too (MoveExecutor counts its own work)
};

// The planner's settings from the daemon's (at start and on every SIGHUP reload).
policy::PlannerConfig planner_config(const DaemonConfig& config);

// Writes a non-OK status into a wire Error: code (StatusCode and wire ErrorCode share
// their numbers), message and retryable flag. Every error the daemon sends goes through it.
void set_wire_error(wire::Error::Builder out, const Status& status);

struct NvmeState;           // persistence.h
struct StartupState;        // startup.h
class RegionWorker;         // region_worker.h
class CopyCompletionDelay;  // copy_delay.h

// The server's per-connection and connection-count limits from the configuration.
ipc::ConnectionLimits connection_limits(const DaemonConfig& config);

class Service final : public ipc::RequestHandler {
 public:
  // `clock` is the policy's time (idle thresholds, turn gaps); nullptr: an owned
  // SteadyClock. An injected clock is borrowed: it must outlive the Service and is read
  // only on the control thread, so a test's ManualClock must be advanced there too.
  Service(asio::io_context& io, DaemonConfig config, std::unique_ptr<Device> device,
          const policy::Clock* clock = nullptr);
  ~Service() override;

  // kvtierd's exit code after a fatal device error (docs/operations.md).
  static constexpr int kExitDeviceLost = 3;
  static constexpr int kExitCannotStart = 1;

  // Reserves the tiers' memory (the HBM arena: hbm-bytes on every GPU), opens and
  // recovers the NVMe tier, registers the device's fatal-error handler, and starts
  // filling the memory on background threads (startup.cpp); returns without waiting
  // for the fill. Requests are served at once, except those that copy bytes (Save,
  // Load, BeginTurn, Drain): they wait until the fill is done, then `ready` runs (on
  // the control thread) and the planner starts. A failed fill stops the daemon with
  // kExitCannotStart.
  Status start();
  void set_ready_callback(std::function<void()> ready) { ready_callback_ = std::move(ready); }
  // The tiers' memory is filled: data requests are served.
  bool ready() const { return ready_; }
  // Stops the planner timer; in-flight copies still complete. With an NVMe tier it
  // first drains the RAM/HBM blocks of live sessions to NVMe and writes the session
  // table, for at most drain-timeout; `stopped` runs once that is over (at once
  // without an NVMe tier). A second stop() gives up on the drain: `stopped` runs now.
  void stop(std::function<void()> stopped = {});
  // The server whose connections Stats, status and /metrics count; it outlives the
  // Service's serving (main and the in-process harness stop it first).
  void attach_server(const ipc::Server* server) { server_ = server; }
  // What main does when the device is lost (stop the server, the metrics endpoint,
  // the signal handlers); called on the control thread with the exit code, after the
  // session table was written and before the event loop is stopped.
  void set_fatal_exit(std::function<void(int exit_code)> exit) { fatal_exit_ = std::move(exit); }
  // 0, kExitCannotStart when the tier memory could not be filled, or kExitDeviceLost
  // once the device was lost.
  int exit_code() const { return exit_code_; }
  // admin.cpp: takes the reloadable settings (thresholds, watermarks, planner period)
  // of `fresh`; the caller logs what else changed and needs a restart.
  void apply_reloaded_config(const DaemonConfig& fresh);
  const DaemonConfig& config() const { return config_; }
  // One line for systemd's STATUS=: tier occupancy, sessions, connections.
  std::string status_line() const;
  // service_metrics.cpp: the Prometheus text for /metrics. Aggregates only: no
  // session ids, namespaces or content.
  std::string render_metrics() const;
  void count_config_reload(bool ok) { request_metrics_.count_reload(ok); }

  void on_connect(const std::shared_ptr<ipc::Connection>& connection) override;
  void on_frame(const std::shared_ptr<ipc::Connection>& connection, ipc::Frame frame) override;
  void on_disconnect(const std::shared_ptr<ipc::Connection>& connection) override;

 private:
  using ConnectionPtr = std::shared_ptr<ipc::Connection>;
  using Fill = std::function<void(wire::Response::Builder)>;

  // service.cpp: dispatch and the control requests.
  Status claim_descriptors(const ConnectionPtr& connection, wire::Request::Reader request,
                           std::vector<UniqueFd>& fds);
  Status dispatch(const ConnectionPtr& connection, EngineContext& engine,
                  wire::Request::Reader request, std::vector<UniqueFd> fds);
  // startup.cpp: filling the tier memory, and requests that wait for something.
  void start_fill(std::vector<UnfilledMemory> fills);
  void on_fill_done(const Status& status, double seconds);
  void cancel_fill();
  // Whether a request of `which` arriving now must queue behind earlier work.
  bool must_defer(const EngineContext& engine, wire::Request::Which which) const;
  Status defer_request(const ConnectionPtr& c, EngineContext& engine, ipc::Frame frame,
                       std::vector<UniqueFd> fds);
  // Serves `c`'s deferred requests, in order, until one must still wait.
  void resume_deferred(const ConnectionPtr& c);
  void resume_all_deferred();
  void arm_deferred_expiry();
  // regions.cpp: hands a region's last daemon reference to the region worker, which
  // closes the mapping there; `closed` then runs on the control thread.
  void close_region_off_thread(std::shared_ptr<Memory> memory, std::function<void()> closed = {});
  void finish_register_region(const ConnectionPtr& c, uint64_t id, uint32_t region_id,
                              int gpu_index, Result<std::shared_ptr<Memory>> memory);
  Status handle_hello(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                      HelloRequest hello);
  // regions.cpp: engine regions in and out.
  Status handle_register_region(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                                uint32_t region_id, RegionHandle region);
  // Replies once the daemon's mapping of the region is closed: at once when no copy
  // holds it, else when the last copy that does has completed.
  Status handle_unregister_region(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                                  uint32_t region_id);
  // Runs after every copy completion: replies to the Unregisters whose region is no
  // longer held by any copy.
  void reply_to_finished_unregisters();
  // The device hit an error that leaves it unusable (device.h): log, write the session
  // table, and stop with kExitDeviceLost. RAM and HBM are not drained: after a lost
  // context their bytes cannot be trusted.
  void on_device_lost(const Status& status);
  Status handle_begin_turn(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                           const std::string& session_id);
  Status handle_close_session(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                              const std::string& session_id);
  Status handle_stats(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                      bool all_namespaces);
  Status handle_list_sessions(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                              bool all_namespaces);
  void reply(const ConnectionPtr& connection, uint64_t id, const Fill& fill);
  void reply_error(const ConnectionPtr& connection, uint64_t id, const Status& status);

  // service_metrics.cpp: latency, errors and hits by tier, per request.
  void record_request(EngineContext& engine, uint64_t id, wire::Request::Reader request);
  void record_reply(const ConnectionPtr& c, uint64_t id, wire::Response::Reader response);

  // admin.cpp: kvtierctl's requests; the admin ones refuse non-admins.
  Status handle_get_session(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                            const SessionTarget& request);
  Status handle_evict(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                      const EvictRequest& request);
  Status handle_pin(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                    const PinRequest& request);
  Status handle_drain(const ConnectionPtr& c, EngineContext& engine, uint64_t id);
  Status handle_get_config(const ConnectionPtr& c, EngineContext& engine, uint64_t id);
  // The session an admin request names: in `namespace_name`, or wherever the id is
  // when that is empty (NotFound / InvalidArgument when absent or ambiguous).
  Result<policy::Session*> find_session_for_admin(const std::string& session_id,
                                                  const std::string& namespace_name);
  // Makes the admin pins match the pinned sessions' current blocks (new blocks get
  // pinned, blocks a session no longer has and closed sessions get unpinned).
  void refresh_admin_pins();
  uint64_t admin_pinned_blocks() const;
  // Blocks pinned by copies in flight only (admin pins left out).
  uint64_t copy_pinned_blocks() const;
  void fill_session_info(const policy::Session& session, wire::SessionInfo::Builder out) const;
  // The same with a return-predictor snapshot taken once for a whole listing.
  void fill_session_info(const policy::Session& session, wire::SessionInfo::Builder out,
                         const policy::ReturnPredictor& predictor) const;

  // data_path.cpp: blocks in and out, and moves between tiers.
  // Starts the Save, or parks it (behind the Saves already parked) while every tier is
  // full of blocks being copied or read: a copy finishing makes room.
  Status handle_save(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                     BlockListRequest request);
  // Reserves the Save's slots and starts its copy; false when no room could be made
  // (nothing reserved then; `request` is left as it was).
  Result<bool> start_save(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                          BlockListRequest& request);
  // Starts the parked Saves that fit now, in arrival order; answers those whose wait
  // (save-room-wait-ms) is over, and all of them once the daemon is stopping.
  void resume_parked_saves();
  Status handle_lookup(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                       const std::vector<BlockHash>& hashes);
  // Lookup's reply: `tiers` (where each block of the prefix found is), of `asked`.
  void reply_lookup(const ConnectionPtr& c, uint64_t id, size_t asked,
                    const std::vector<Tier>& tiers);
  Status handle_load(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                     BlockListRequest request);
  struct SaveInProgress;  // data_path.cpp
  // Replies once the Save's copy and the blocks it waited for (written by another
  // Save) are done; records the session's blocks when every one landed.
  void finish_save(const ConnectionPtr& c, uint64_t id, const EngineContext& engine,
                   SaveInProgress& save);
  // A Save's copy of `key` finished: Saves that found it being written go on.
  void wake_write_waiters(const BlockKey& key, bool landed);
  // Reserves a slot for a new block, evicting cold blocks if every tier is full: room
  // for `room_bytes` (the rest of the request) at once when it can be had.
  Result<std::optional<PendingWrite>> reserve_block(const BlockKey& key, uint64_t block_bytes,
                                                    int gpu_part, uint64_t room_bytes);
  // Room in RAM for `wanted_bytes` (at least `least_bytes`) by moving its coldest blocks
  // down to NVMe instead of evicting them (`rule`: whether a full NVMe evicts its own
  // coldest to take them): `moves` to apply, or `coming` when blocks already on their
  // way out make enough, or none can go now but blocks are arriving in RAM. Neither when
  // there is no NVMe tier, `tier` is not RAM, NVMe writes are paused after a failure, or
  // NVMe cannot take them (the caller then evicts).
  struct DemotionRoom {
    bool coming = false;
    std::vector<policy::Move> moves;
  };
  DemotionRoom plan_room_by_demotion(Tier tier, uint64_t wanted_bytes, uint64_t least_bytes,
                                     policy::Room rule);
  // Segments copying engine block `engine_block_id` to or from its stored block at
  // `slot`: one per plane of `planes` (count 0: every plane), each at its own offset in
  // the stored block, so a range of planes moves only those planes' bytes.
  void add_plane_segments(CopyBatch& batch, const EngineContext& engine, uint64_t engine_block_id,
                          const BlockLocation& slot, bool to_engine, BlockPlanes planes = {});
  // Submits `batch`; `done` runs later on the control thread.
  Status submit_copy(CopyBatch batch, std::function<void(Status)> done);
  // Plans and applies the moves; a periodic plan also arms the next one.
  void run_planner(policy::Planner::PlanKind kind);
  // Runs the planner once the current handlers are done (coalesces post-Save plans).
  // A Save's retention priorities, for its session and ranges of its blocks.
  void apply_retention(policy::Session& session, const BlockListRequest& request);
  void plan_soon();
  // The moves' executor reports blocks that left the store (evicted, or lost: their
  // bytes were bad): the sessions holding them are cut there.
  void on_blocks_removed(const std::vector<BlockKey>& keys, bool lost);
  // The tiers behind the executor, built once the store exists (start()).
  void make_mover();

  // remote_*.cpp: the remote tier (a Redis Cluster; nullptr without remote-nodes).
  // At the end of a turn the session's blocks not yet written there are written behind
  // the turn, and then its record: blocks in host memory (RAM; HBM on the host
  // backend) read in place under pins the completion drops on this thread, blocks in
  // GPU memory copied into pinned staging slots first (a background Device copy).
  //
  // Reading: a Lookup that misses here asks the cluster which of the rest exist there
  // (they are reported as Tier::kRemote); a Load that misses here reads the rest of its
  // prefix into RAM slots (fetch_remote) and scatters from there; a BeginTurn of a
  // session this node does not know fetches its record, creates the session from the
  // blocks it has, and prefetches the others. Every wait is bounded by remote-timeout.
  Status open_remote();
  void write_behind(const policy::Session& session, bool sweeping = false);
  struct WriteBehind;
  // A stage of the batch ended (the staging copy, the NVMe read); after the last one
  // the blocks it could read are sent.
  void write_behind_staged(const std::shared_ptr<WriteBehind>& batch);
  // Reads the batch's NVMe blocks (`reads`, parallel to its from_nvme) into a buffer.
  void read_write_behind(const std::shared_ptr<WriteBehind>& batch,
                         std::vector<StorageTier::ReadItem> reads);
  // One of those reads ended: the blocks from `begin` on in from_nvme.
  void write_behind_read(const std::shared_ptr<WriteBehind>& batch, size_t begin,
                         const std::vector<StorageTier::ReadOutcome>& outcomes);
  void send_write_behind(const std::shared_ptr<WriteBehind>& batch);
  // Only the batch's first `written` blocks were written (a declined batch: none was
  // and `declined` is set): the session's mark goes back to the first that was not,
  // and the sweep tries again. Then the batch is released.
  void fail_write_behind(WriteBehind& batch, size_t written, bool declined);
  // Drops the batch's pins and gives its staging slots and buffer back.
  void release_write_behind(WriteBehind& batch);
  // Writes behind again for sessions left with blocks to write (at most once a second).
  void sweep_write_behind();
  void render_remote_metrics(PrometheusText& out) const;
  void fill_remote_stats(wire::RemoteStats::Builder out) const;
  void note_remote_cut(const policy::Session& session);
  void note_remote_closed(uint32_t namespace_id, const std::string& session_id);
  // Reads `keys` (all of one namespace) from the remote tier into RAM (host HBM when
  // there is no RAM tier), joining reads already running. `done(i, status)` runs once
  // per key on the control thread, maybe before this returns: OK once keys[i] is held
  // here (visible to lookup and pin), or why not (NotFound, DataLoss, Unavailable,
  // ResourceExhausted).
  void fetch_remote(const std::string& namespace_name, const std::vector<BlockKey>& keys,
                    std::function<void(size_t, const Status&)> done);
  struct RemoteFetch;
  // Starts the next chunks of `fetch` while it has fewer than its window at the worker.
  void pump_fetch(const std::shared_ptr<RemoteFetch>& fetch);
  // A fetched block's end: its slot (nullptr: none was reserved) committed when
  // `status` is OK, else given back; Saves and fetch waiters told.
  void settle_fetch(const BlockKey& key, PendingWrite* slot, const Status& status);
  // A RAM (or host HBM) slot for a block read from the remote tier, making room the way
  // a Save does. nullopt when the block is present already.
  Result<std::optional<PendingWrite>> reserve_staging(const BlockKey& key, uint64_t block_bytes);
  // Planned evictions out of NVMe (the executor's take_evictions): the blocks the
  // cluster lacks are read from NVMe and written there before they are evicted, so a
  // block leaving this node stays in the fleet. Returns the keys not taken (evicted at
  // once: no remote tier, not connected, the spill bound full). Taken blocks are pinned
  // until written, and their bytes count as leaving in the planner's view.
  std::vector<BlockKey> spill_evictions(std::vector<BlockKey> keys);
  struct Spill;
  void spill_missing(const std::shared_ptr<Spill>& spill, std::vector<size_t> missing);
  // The spill's blocks at `indices` are done with: unpinned, and evicted when they are
  // still where they were.
  void finish_spill(const std::shared_ptr<Spill>& spill, const std::vector<size_t>& indices);
  // At stop: every spill under way is finished now, its blocks unpinned and evicted.
  void abandon_spills();
  // Bytes of `tier` on their way out (spilled to the remote tier); the planner's view
  // counts them as free.
  uint64_t leaving_bytes(Tier tier) const;
  // Lookup's tail: how many of `hashes` from `first` on the cluster holds, in a row.
  void lookup_remote(const ConnectionPtr& c, const EngineContext& engine, uint64_t id,
                     std::vector<BlockHash> hashes, std::vector<Tier> tiers);
  // BeginTurn of a session not known here: its record from the remote tier, then the turn.
  void resume_from_remote(const ConnectionPtr& c, const EngineContext& engine, uint64_t id,
                          const std::string& session_id);
  // BeginTurn of a known session: active, promotions planned, answered. `fetching`:
  // blocks being read from the remote tier for it (reported as known and promoted).
  void begin_turn(const ConnectionPtr& c, const EngineContext& engine, uint64_t id,
                  policy::Session& session, uint32_t fetching);

  // persistence.cpp: the NVMe tier — opening and recovering it, session records, slot
  // releases, the SIGTERM drain (state in persistence.h; nullptr without the tier).
  Status open_nvme(std::vector<BlockStore::TierMemory>& tiers);
  Status recover_nvme();
  NvmeBlockKey nvme_key(const BlockKey& key) const;
  void note_session_changed(const policy::Session& session);
  // The session lost blocks (cut at an evicted or lost one): its record is rewritten
  // whole at the next flush instead of appended to.
  void note_session_cut(const policy::Session& session);
  void note_session_closed(uint32_t namespace_id, const std::string& session_id);
  // A session's statistics and state as a stored record has them (NVMe recovery and
  // remote resume).
  void restore_from_record(policy::Session& session, const NvmeSessionRecord& record,
                           uint64_t steady_now, uint64_t wall_now);
  void flush_sessions(bool sync);
  void start_drain(std::function<void()> stopped);
  void check_drain();
  uint64_t now_ms() const { return clock_.now_ms(); }
  static std::unique_ptr<policy::PlacementView> make_placement_view(
      const BlockStore& store, std::function<uint64_t(Tier)> leaving_bytes);

  asio::io_context& io_;
  DaemonConfig config_;  // reloadable settings change on SIGHUP (apply_reloaded_config)
  std::unique_ptr<Device> device_;
  policy::SteadyClock steady_clock_;
  const policy::Clock& clock_;  // steady_clock_ unless the constructor was given one
  std::unique_ptr<BlockStore> store_;
  std::unique_ptr<policy::PlacementView> view_;  // the planner's window on store_
  // The tiers as the executor sees them, and the executor that carries out moves.
  std::vector<std::unique_ptr<StorageTier>> storage_tiers_;
  std::unique_ptr<MoveExecutor> mover_;
  policy::SessionTable sessions_;
  policy::Planner planner_;
  asio::steady_timer plan_timer_;
  bool plan_posted_ = false;  // plan_soon() has a run queued
  // Blocks a Save is writing that other Saves also named: those wait for the bytes.
  std::unordered_map<BlockKey, std::vector<std::function<void(bool landed)>>, BlockKeyHasher>
      write_waiters_;
  // Saves waiting for room, oldest first (handle_save).
  struct ParkedSave {
    ConnectionPtr connection;
    uint64_t request_id;
    BlockListRequest request;
    std::chrono::steady_clock::time_point deadline;
  };
  std::deque<ParkedSave> parked_saves_;
  bool resuming_saves_ = false;  // resume_parked_saves() is running (no re-entry)
  Counters counters_;
  RequestMetrics request_metrics_;
  // fault-copy-delay-ms (tests only; nullptr when 0): holds the completions of Save and
  // Load copies. After store_: the completions it holds carry pins and pending writes.
  std::unique_ptr<CopyCompletionDelay> copy_delay_;
  // Admin-pinned sessions → one pin on each of their blocks. After store_: released
  // before it is destroyed.
  std::map<std::pair<uint32_t, std::string>, std::vector<PinnedBlock>> admin_pins_;
  const ipc::Server* server_ = nullptr;
  EngineRegistry engines_{config_};  // connections' contexts and the namespaces
  uint64_t started_ms_ = 0;
  bool stopping_ = false;
  // The backend engines must match (Hello) and the GPUs regions may name; set in start().
  wire::DeviceKind backend_kind_ = wire::DeviceKind::HOST;
  std::vector<GpuInfo> gpus_;
  // Unregisters waiting for copies that still use their region; the entry holds the
  // daemon's last reference, dropped (closing the mapping) just before the reply.
  struct ParkedUnregister {
    std::shared_ptr<Memory> memory;
    ConnectionPtr connection;
    uint64_t request_id;
    uint32_t region_id;
  };
  std::vector<ParkedUnregister> parked_unregisters_;
  std::function<void(int)> fatal_exit_;
  int exit_code_ = 0;
  // Start-up (startup.cpp): the fill thread, its progress, connections with deferred
  // requests. ready_ turns true once, when the tier memory is filled.
  std::unique_ptr<StartupState> startup_;
  bool ready_ = false;
  std::function<void()> ready_callback_;
  // Opens and closes engine regions off the control thread (regions.cpp).
  std::unique_ptr<RegionWorker> region_worker_;
  // Last: destroyed first, so the tier's workers stop before the memory they read
  // into and write from goes away.
  std::unique_ptr<NvmeState> nvme_;
  struct RemoteState;
  std::unique_ptr<RemoteState> remote_;  // after nvme_: its worker stops first of all
};

}  // namespace kvtier::daemon
