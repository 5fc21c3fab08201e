// What kvtierd's parts share: the block index, the tiers' executor, the session table,
// the planner, the clock and the connected engines.
//
// The daemon is a Service (dispatch and wiring, service.h) and these parts, each with
// its own header and its own fields (docs/architecture.md draws who calls whom):
//   Replies         replies.h         answers, and what each request cost (metrics)
//   Copies          copies.h          Device copy batches between engines and tiers
//   Placement       placement.h       room for new blocks, the planner's runs
//   SavePath        save_path.h       Save: reserve, copy in, publish, park when full
//   LoadPath        load_path.h       Lookup and Load: pin, read up from NVMe, scatter
//   TurnPath        turn_path.h       BeginTurn and CloseSession
//   EngineSetup     engine_setup.h    Hello and engine regions in and out
//   AdminService    admin_service.h   kvtierctl: Stats, listings, Evict, Pin, Drain
//   StartupGate     startup_gate.h    filling tier memory; requests that must wait
//   SessionJournal  session_journal.h the NVMe tier's index, session records, the drain
//   RemotePath      remote_path.h     the Redis Cluster tier: write-behind, fetch, spill
// A part reads and changes the shared state below and its own fields; another part's
// state it reaches only through that part's methods, by a reference its constructor
// takes (the Service builds the parts in the order of those references: no part uses
// one built after it, and no two use each other). What a part must hear from one it does
// not use (a copy finished, a plan ran, a session changed) it hears through a
// subscription the Service makes.
//
// Thread-safety: every field, and every part's, belongs to the control thread (the
// io_context's one thread); Device and tier workers post their results back to it. A
// clang build checks this (common/control_thread.h): the fields are
// KVTIER_GUARDED_BY(control_thread), and what touches them requires it.
#pragma once

#include <array>

#include <boost/asio/io_context.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/control_thread.h"
#include "common/tier_topology.h"
#include "daemon/config.h"
#include "daemon/engines.h"
#include "device/device.h"
#include "ipc/server.h"
#include "policy/clock.h"
#include "policy/planner.h"
#include "policy/session_table.h"
#include "schema/kvtier.capnp.h"
#include "tiers/block_store.h"
#include "tiers/move_executor.h"
#include "tiers/tier.h"

namespace kvtier::daemon {

namespace asio = boost::asio;

class Replies;

struct Counters {
  uint64_t lookup_hits = 0;
  uint64_t lookup_misses = 0;
  uint64_t bytes_saved = 0;
  uint64_t partial_saves = 0;     // Saves that stored a prefix: no room for the rest
  uint64_t blocks_not_saved = 0;  // ... the blocks past it
  uint64_t bytes_loaded = 0;
  uint64_t copies_in_flight = 0;  // moves' copies too (MoveExecutor counts its own work)
  uint64_t staged_saves = 0;      // Saves and Loads with `staging` (packed by the engine)
  uint64_t staged_loads = 0;
  std::array<uint64_t, 3> hellos_by_data_path{};  // Hello.dataPath: planeCopies, kernels, host
};

// The planner's settings from the daemon's (at start and on every SIGHUP reload).
policy::PlannerConfig planner_config(const DaemonConfig& config);

// The store's count of session references per block, kept by the session table
// (policy::SessionTable::set_references): no part adds or drops one by hand.
class StoreReferences final : public policy::BlockReferences {
 public:
  explicit StoreReferences(const std::unique_ptr<BlockStore>& store) : store_(store) {}
  void add_reference(const BlockKey& key) override {
    if (store_) store_->add_session_ref(key);
  }
  void drop_reference(const BlockKey& key) override {
    if (store_) store_->drop_session_ref(key);
  }

 private:
  const std::unique_ptr<BlockStore>& store_;
};

struct DaemonContext {
  // `clock` is the policy's time; nullptr: an owned SteadyClock.
  DaemonContext(asio::io_context& io, DaemonConfig config, std::unique_ptr<Device> device,
                const policy::Clock* clock);
  DaemonContext(const DaemonContext&) = delete;
  DaemonContext& operator=(const DaemonContext&) = delete;

  uint64_t now_ms() const { return clock.now_ms(); }

  // Constant after construction, and not guarded: workers post through `io` and call
  // `device` (device/device.h: any thread).
  asio::io_context& io;
  // Its reloadable settings change on SIGHUP (Service::apply_reloaded_config).
  DaemonConfig config KVTIER_GUARDED_BY(control_thread);
  std::unique_ptr<Device> device;
  policy::SteadyClock steady_clock;
  const policy::Clock& clock;  // steady_clock unless the constructor was given one

  // Set by Service::start(): the backend engines must match (Hello), the GPUs regions
  // may name, the tiers, the planner's window on them, and the executor of moves.
  wire::DeviceKind backend_kind KVTIER_GUARDED_BY(control_thread) = wire::DeviceKind::HOST;
  std::vector<GpuInfo> gpus KVTIER_GUARDED_BY(control_thread);
  std::unique_ptr<BlockStore> store KVTIER_GUARDED_BY(control_thread);
  // The tiers that run (remote from open_remote), what each can do.
  TierTopology topology KVTIER_GUARDED_BY(control_thread);
  std::unique_ptr<policy::PlacementView> view KVTIER_GUARDED_BY(control_thread);
  // As the executor sees them.
  std::vector<std::unique_ptr<StorageTier>> storage_tiers KVTIER_GUARDED_BY(control_thread);
  std::unique_ptr<MoveExecutor> mover KVTIER_GUARDED_BY(control_thread);
  uint64_t started_ms KVTIER_GUARDED_BY(control_thread) = 0;

  StoreReferences store_references{store};
  // Tells store_references of every reference it changes.
  policy::SessionTable sessions KVTIER_GUARDED_BY(control_thread);
  policy::Planner planner KVTIER_GUARDED_BY(control_thread);
  // Connections' contexts and the namespaces.
  EngineRegistry engines KVTIER_GUARDED_BY(control_thread){config};
  Counters counters KVTIER_GUARDED_BY(control_thread);
  // The server whose connections Stats, status and /metrics count (Service::attach_server).
  const ipc::Server* server KVTIER_GUARDED_BY(control_thread) = nullptr;
  // The tier memory is filled: data requests are served.
  bool ready KVTIER_GUARDED_BY(control_thread) = false;
  // stop() was called, or the device was lost.
  bool stopping KVTIER_GUARDED_BY(control_thread) = false;
};

// What every part is built on: the context, and the Replies its handlers answer through
// (borrowed; Replies itself passes itself).
class Part {
 public:
  Part(const Part&) = delete;
  Part& operator=(const Part&) = delete;

 protected:
  using ConnectionPtr = std::shared_ptr<ipc::Connection>;
  using Fill = std::function<void(wire::Response::Builder)>;

  Part(DaemonContext& ctx, Replies& replies) : ctx_(ctx), replies_(replies) {}
  ~Part() = default;

  // Replies::reply and Replies::reply_error (replies.h).
  void reply(const ConnectionPtr& connection, uint64_t id, const Fill& fill) const
      KVTIER_REQUIRES(control_thread);
  void reply_error(const ConnectionPtr& connection, uint64_t id, const Status& status) const
      KVTIER_REQUIRES(control_thread);
  uint64_t now_ms() const { return ctx_.now_ms(); }

  DaemonContext& ctx_;
  Replies& replies_;
};

}  // namespace kvtier::daemon
