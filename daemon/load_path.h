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
                       const std::vector<BlockHash>& hashes);
  // Lookup's reply: `tiers` (where each block of the prefix found is), of `asked`.
  void reply_lookup(const ConnectionPtr& c, uint64_t id, size_t asked,
                    const std::vector<Tier>& tiers);
  Status handle_load(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                     BlockListRequest request);

 private:
  Copies& copies_;
  RemotePath& remote_;
};

}  // namespace kvtier::daemon
