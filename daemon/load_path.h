// LoadPath: Lookup and Load.
//
// Lookup reports where each block of the longest held prefix is (and, with a remote
// tier, how much more of it the cluster holds). Load scatters the leading held blocks
// of a prefix into the engine's blocks. Blocks on NVMe are never scattered from the
// disk: a Load first has them read into RAM (or host HBM) by the move executor
// (tiers/move_executor.h), waits for those reads — joining a read already running rather
// than reading twice — for at most nvme-load-wait-ms, and then scatters what is
// readable, in prefix order. A block whose bytes failed their checksum ends the prefix
// with DataLoss. With a remote tier, blocks not held here are read from the cluster into
// RAM slots (RemotePath::fetch_remote) for at most remote-timeout; the first that is not
// there ends the prefix the same way. Every block scattered is pinned (PinnedBlock) from
// the scan until its copy completed.
//
// A Load may name a range of planes (schema: Load.planeBegin/planeCount): everything
// above runs as for a whole block, and only the range's planes are scattered. An engine
// loading layer by layer sends one such Load per layer for the same blocks, so only the
// one whose range starts at plane 0 counts the blocks as lookup hits and misses;
// bytes_loaded counts what each copied.
//
// Thread-safety: control thread only (daemon_context.h).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/daemon_context.h"
#include "daemon/requests.h"

namespace kvtier::daemon {

class Copies;      // copies.h
class RemotePath;  // remote_path.h

class LoadPath final : public Part {
 public:
  // `copies` carries its Loads' bytes; `remote` answers for blocks only the cluster has.
  LoadPath(DaemonContext& ctx, Replies& replies, Copies& copies, RemotePath& remote)
      : Part(ctx, replies), copies_(copies), remote_(remote) {}

  Status handle_lookup(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                       const std::vector<BlockHash>& hashes) KVTIER_REQUIRES(control_thread);
  // Lookup's reply: `tiers` (where each block of the prefix found is), of `asked`.
  void reply_lookup(const ConnectionPtr& c, uint64_t id, size_t asked,
                    const std::vector<Tier>& tiers) KVTIER_REQUIRES(control_thread);
  Status handle_load(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                     BlockListRequest request) KVTIER_REQUIRES(control_thread);

 private:
  struct PendingLoad;   // load_path.cpp
  struct LoadScan;      // load_path.cpp
  struct LoadTarget;    // load_path.cpp
  struct FinishedLoad;  // load_path.cpp
  // finish_load bound to one Load, shared by its waits and its deadline.
  using Finish = std::shared_ptr<std::function<void()>>;

  // Records the named session's activity and, for the first Load after BeginTurn, how
  // long its promotions had to land.
  void record_load_activity(const EngineContext& engine, const std::string& session_id)
      KVTIER_REQUIRES(control_thread);
  // Pins each block of the prefix held in memory; counts the blocks to wait for (on
  // NVMe, or only in the remote tier) and stops at the first that cannot be loaded.
  LoadScan scan_prefix(const EngineContext& engine, const BlockListRequest& request)
      KVTIER_REQUIRES(control_thread);
  // Starts the scan's NVMe reads and remote fetches and the Load's deadline; `finish`
  // runs on the last answer or at the deadline.
  void wait_for_blocks(const LoadScan& scan, const Finish& finish, const LoadTarget& target)
      KVTIER_REQUIRES(control_thread);
  // The read of the Load's block `i` ended: pinned, or why not.
  void pin_landed_block(PendingLoad& load, size_t i, const Status& status)
      KVTIER_REQUIRES(control_thread);
  // While reads wait for room, scatters the leading blocks already read and not yet
  // served, and lets go of them.
  void scatter_ready_blocks(const std::shared_ptr<PendingLoad>& load, const Finish& finish,
                            const LoadTarget& target) KVTIER_REQUIRES(control_thread);
  // Scatters the leading readable blocks not yet served and replies; during a partial
  // scatter it only marks the Load to finish once that copy is done.
  void finish_load(const ConnectionPtr& c, uint64_t id, const std::shared_ptr<PendingLoad>& load,
                   const LoadTarget& target, size_t total) KVTIER_REQUIRES(control_thread);
  // The Load's last copy ended: its pins go, the blocks are counted, and the Load answered.
  void reply_load(const ConnectionPtr& c, uint64_t id, const FinishedLoad& finished,
                  const Status& status) KVTIER_REQUIRES(control_thread);

  Copies& copies_;
  RemotePath& remote_;
};

}  // namespace kvtier::daemon
