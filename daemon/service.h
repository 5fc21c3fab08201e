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

#include <map>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "cuda/device.h"
#include "daemon/config.h"
#include "daemon/layout.h"
#include "ipc/server.h"
#include "policy/clock.h"
#include "policy/planner.h"
#include "policy/session_table.h"
#include "tiers/block_store.h"

namespace kvtier::daemon {

namespace asio = boost::asio;

struct Counters {
  uint64_t lookup_hits = 0;
  uint64_t lookup_misses = 0;
  uint64_t bytes_saved = 0;
  uint64_t bytes_loaded = 0;
  uint64_t bytes_demoted = 0;
  uint64_t bytes_promoted = 0;
  uint64_t blocks_evicted = 0;
  uint64_t data_loss_blocks = 0;
  uint64_t copies_in_flight = 0;
};

// What the daemon knows about one connected engine (or admin tool).
struct EngineContext {
  uint32_t namespace_id = 0;
  std::string namespace_name;
  bool is_admin = false;
  bool hello_done = false;
  std::string engine_name;
  EngineLayout layout;
  LayoutKey layout_key;
  std::map<uint32_t, std::shared_ptr<Memory>> regions;  // region id → opened memory
};

enum class BlockListKind { kSave, kLoad };

// A validated Save or Load, copied out of the wire message before any work starts.
struct BlockListRequest {
  std::string session_id;
  std::vector<BlockHash> hashes;
  std::vector<uint64_t> engine_block_ids;
  bool end_of_turn = false;
};

class Service final : public ipc::RequestHandler {
 public:
  Service(asio::io_context& io, DaemonConfig config, std::unique_ptr<Device> device);
  ~Service() override;

  // Allocates the tiers' memory and starts the planner timer.
  Status start();
  // Stops the planner timer; in-flight copies still complete.
  void stop();
  void set_connection_count_source(std::function<size_t()> source) {
    connection_count_ = std::move(source);
  }

  void on_connect(const std::shared_ptr<ipc::Connection>& connection) override;
  void on_frame(const std::shared_ptr<ipc::Connection>& connection, ipc::Frame frame) override;
  void on_disconnect(const std::shared_ptr<ipc::Connection>& connection) override;

 private:
  using ConnectionPtr = std::shared_ptr<ipc::Connection>;
  using Fill = std::function<void(wire::Response::Builder)>;

  // service.cpp: dispatch and the control requests.
  Status dispatch(const ConnectionPtr& connection, EngineContext& engine,
                  wire::Request::Reader request);
  Status handle_hello(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                      wire::Hello::Reader hello);
  Status handle_register_region(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                                wire::RegisterRegion::Reader region, std::vector<UniqueFd> fds);
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
  uint32_t namespace_for(uid_t uid, std::string* name);
  bool is_admin(const ipc::PeerCredentials& peer) const;

  // data_path.cpp: blocks in and out, and moves between tiers.
  Result<BlockListRequest> parse_block_list(const EngineContext& engine,
                                            capnp::Text::Reader session,
                                            capnp::List<wire::BlockRef>::Reader blocks,
                                            BlockListKind kind);
  Status handle_save(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                     BlockListRequest request);
  Status handle_lookup(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                       capnp::List<capnp::Data>::Reader hashes);
  Status handle_load(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                     BlockListRequest request);
  void finish_save(const ConnectionPtr& c, uint64_t id, const EngineContext& engine,
                   const BlockListRequest& request, const std::vector<BlockKey>& written,
                   uint32_t deduplicated, const Status& copy_status);
  // Reserves a slot for a new block, evicting cold blocks if every tier is full.
  Result<std::optional<BlockLocation>> reserve_block(const BlockKey& key, uint64_t block_bytes);
  void add_plane_segments(CopyBatch& batch, const EngineContext& engine, uint64_t engine_block_id,
                          const BlockLocation& slot, bool to_engine);
  // Submits `batch`; `done` runs later on the control thread.
  Status submit_copy(CopyBatch batch, std::function<void(Status)> done);
  void run_planner();
  void apply_moves(const std::vector<policy::Move>& moves);
  void evict_blocks(const std::vector<BlockKey>& keys);
  uint64_t now_ms() const { return clock_.now_ms(); }
  static std::unique_ptr<policy::PlacementView> make_placement_view(const BlockStore& store);

  asio::io_context& io_;
  const DaemonConfig config_;
  std::unique_ptr<Device> device_;
  policy::SteadyClock clock_;
  std::unique_ptr<BlockStore> store_;
  std::unique_ptr<policy::PlacementView> view_;  // the planner's window on store_
  policy::SessionTable sessions_;
  policy::Planner planner_;
  asio::steady_timer plan_timer_;
  Counters counters_;
  std::function<size_t()> connection_count_;
  std::map<std::string, uint32_t> namespace_ids_;
  std::vector<std::string> namespace_names_;  // index = namespace id
  uint64_t started_ms_ = 0;
  bool stopping_ = false;
};

}  // namespace kvtier::daemon
