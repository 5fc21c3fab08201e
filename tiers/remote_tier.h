// RemoteStorageTier: the remote tier (a Redis Cluster behind a RemoteWorker,
// remote_worker.h) as a StorageTier (tier.h): key-addressed, so each block is stored
// under its key (namespace name, layout digest, hash) and the block store keeps no
// slots for it. Writes and reads are bounded by the worker's in-flight bytes and may be
// declined (try_write, try_read); write() and read() answer a declined batch with
// ResourceExhausted for every item. What the tier keeps is what the cluster keeps: values
// expire (remote-ttl) and give way to the node's budget (remote-bytes), so release()
// has nothing to forget.
//
// Sessions' records are not blocks: they go to the worker directly (daemon/remote_path.h).
//
// Thread-safety: methods on the control thread; `done` runs where the worker's post
// function runs it (the daemon's control thread), once per accepted call.
#pragma once

#include <functional>
#include <vector>

#include "tiers/remote_worker.h"
#include "tiers/tier.h"

namespace kvtier {

class RemoteStorageTier final : public StorageTier {
 public:
  // The cluster's name of a block (its namespace's name for the key's id).
  using Namer = std::function<remote::RemoteBlockId(const BlockKey&)>;
  // `worker` must outlive the tier.
  RemoteStorageTier(remote::RemoteWorker& worker, Namer id_of, uint64_t capacity_bytes)
      : worker_(worker), id_of_(std::move(id_of)), capacity_bytes_(capacity_bytes) {}

  Tier id() const override { return Tier::kRemote; }
  uint64_t capacity_bytes() const override { return capacity_bytes_; }
  bool key_addressed() const override { return true; }
  bool reachable() const override { return worker_.connected(); }
  void write(std::vector<WriteItem> items, std::function<void(std::vector<Status>)> done) override;
  void read(std::vector<ReadItem> items,
            std::function<void(std::vector<ReadOutcome>)> done) override;
  bool try_write(std::vector<WriteItem> items,
                 std::function<void(std::vector<Status>)> done) override;
  bool try_read(std::vector<ReadItem> items,
                std::function<void(std::vector<ReadOutcome>)> done) override;
  void probe(std::vector<Slot> slots, std::function<void(std::vector<Result<bool>>)> done) override;

 private:
  remote::RemoteWorker& worker_;
  Namer id_of_;
  uint64_t capacity_bytes_;
};

}  // namespace kvtier
