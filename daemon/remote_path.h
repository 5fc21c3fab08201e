// RemotePath: the daemon's side of the remote tier (a Redis Cluster, tiers/remote_*.h):
// the worker that owns the cluster connections, and how far each session has been
// written there (remote_*.cpp).
//
// At the end of a turn the session's blocks not yet written there are written behind
// the turn, and then its record: blocks in host memory (RAM; HBM on the host backend)
// read in place under pins the completion drops on this thread, blocks in GPU memory
// copied into pinned staging slots first (a background Device copy), blocks on NVMe read
// into a buffer first.
//
// Reading: a Lookup that misses here asks the cluster which of the rest exist there
// (they are reported as Tier::kRemote); a Load that misses here reads the rest of its
// prefix into RAM slots (fetch_remote) and scatters from there; a BeginTurn of a
// session this node does not know fetches its record, creates the session from the
// blocks it has, and prefetches the others. Every wait is bounded by remote-timeout.
//
// Spilling: the tier is the executor's spill tier (tiers/move_executor.h): blocks it
// evicts out of NVMe that the cluster lacks are read from NVMe and written there first,
// so a block leaving this node stays in the fleet.
//
// Without remote-nodes every method is a no-op and enabled() is false.
//
// Thread-safety: control thread only (daemon_context.h); the worker posts back.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "daemon/daemon_context.h"
#include "daemon/metrics.h"
#include "daemon/requests.h"
#include "policy/session_table.h"
#include "tiers/nvme_format.h"
#include "tiers/remote_tier.h"
#include "tiers/remote_worker.h"
#include "tiers/slab_allocator.h"

namespace kvtier::daemon {

// A slot of the write-behind staging memory, given back to its allocator when the handle
// goes (nothing is given back once the allocator is gone: a completion dropped unrun at
// stop). Move-only; control thread only.
class StagingSlot {
 public:
  StagingSlot() = default;
  StagingSlot(const std::shared_ptr<SlabAllocator>& slots, uint64_t offset, uint64_t bytes)
      : slots_(slots), offset_(offset), bytes_(bytes), held_(true) {}
  StagingSlot(StagingSlot&& other) noexcept
      : slots_(std::move(other.slots_)),
        offset_(other.offset_),
        bytes_(other.bytes_),
        held_(std::exchange(other.held_, false)) {}
  StagingSlot& operator=(StagingSlot&& other) noexcept {
    if (this != &other) {
      reset();
      slots_ = std::move(other.slots_);
      offset_ = other.offset_;
      bytes_ = other.bytes_;
      held_ = std::exchange(other.held_, false);
    }
    return *this;
  }
  StagingSlot(const StagingSlot&) = delete;
  StagingSlot& operator=(const StagingSlot&) = delete;
  ~StagingSlot() { reset(); }

  explicit operator bool() const { return held_; }
  uint64_t offset() const { return offset_; }
  void reset() {
    if (!std::exchange(held_, false)) return;
    if (auto slots = slots_.lock()) slots->free(offset_, bytes_);
  }

 private:
  std::weak_ptr<SlabAllocator> slots_;
  uint64_t offset_ = 0;
  uint64_t bytes_ = 0;
  bool held_ = false;
};

// Bytes counted in a shared total (the NVMe read buffers of write-behinds, bounded by
// remote-max-in-flight) while the handle holds them; taken off when it goes. Move-only.
class CountedBytes {
 public:
  CountedBytes() = default;
  CountedBytes(const std::shared_ptr<uint64_t>& total, uint64_t bytes)
      : total_(total), bytes_(bytes) {
    *total += bytes;
  }
  CountedBytes(CountedBytes&& other) noexcept
      : total_(std::move(other.total_)), bytes_(std::exchange(other.bytes_, 0)) {}
  CountedBytes& operator=(CountedBytes&& other) noexcept {
    if (this != &other) {
      reset();
      total_ = std::move(other.total_);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  CountedBytes(const CountedBytes&) = delete;
  CountedBytes& operator=(const CountedBytes&) = delete;
  ~CountedBytes() { reset(); }

  void reset() {
    const uint64_t bytes = std::exchange(bytes_, 0);
    if (auto total = total_.lock(); total && bytes > 0) *total -= bytes;
  }

 private:
  std::weak_ptr<uint64_t> total_;
  uint64_t bytes_ = 0;
};

class RemotePath final : public Part {
 public:
  explicit RemotePath(DaemonContext& ctx);
  ~RemotePath();

  // Starts the worker (remote-nodes set); it connects in the background.
  Status open_remote();
  bool enabled() const { return remote_ != nullptr; }

  // remote_write_behind.cpp
  void write_behind(const policy::Session& session, bool sweeping = false);
  // Writes behind again for sessions left with blocks to write (at most once a second).
  void sweep_write_behind();
  void note_remote_cut(const policy::Session& session);
  void note_remote_closed(uint32_t namespace_id, const std::string& session_id);

  // remote_read_path.cpp
  // Reads `keys` (all of one namespace) from the remote tier into RAM (host HBM when
  // there is no RAM tier), joining reads already running. `done(i, status)` runs once
  // per key on the control thread, maybe before this returns: OK once keys[i] is held
  // here (visible to lookup and pin), or why not (NotFound, DataLoss, Unavailable,
  // ResourceExhausted).
  void fetch_remote(const std::string& namespace_name, const std::vector<BlockKey>& keys,
                    std::function<void(size_t, const Status&)> done);
  // Lookup's tail: how many of `hashes` from `tiers.size()` on the cluster holds, in a
  // row; answers the Lookup.
  void lookup_remote(const ConnectionPtr& c, const EngineContext& engine, uint64_t id,
                     std::vector<BlockHash> hashes, std::vector<Tier> tiers);
  // BeginTurn of a session not known here: its record from the remote tier, then the turn.
  void resume_from_remote(const ConnectionPtr& c, const EngineContext& engine, uint64_t id,
                          const std::string& session_id);

  // remote_path.cpp: what Stats and /metrics say of it.
  void render_remote_metrics(PrometheusText& out) const;
  void fill_remote_stats(wire::RemoteStats::Builder out) const;

 private:
  struct RemoteFetch;  // remote_read_path.cpp

  // One write-behind: a session's blocks from `from` on. Blocks in host memory are read in
  // place, under their pins; blocks in GPU memory from the staging slots the Device copies
  // them into, and blocks on NVMe from `nvme_buffer` once read into it (their pins go once
  // the copy or read is done).
  struct WriteBehind {
    policy::SessionKey key;
    std::string namespace_name;
    uint32_t from = 0;
    uint64_t block_bytes = 0;
    std::vector<StorageTier::WriteItem> writes;
    std::vector<PinnedBlock> pins;   // parallel to writes
    std::vector<StagingSlot> slots;  // parallel to writes: the staging slot, or empty
    size_t blocks = 0;               // writes.size() before any were cut off
    std::vector<size_t> staged;      // indices in writes, copied out of GPU memory
    std::vector<size_t> from_nvme;   // indices in writes, read out of NVMe
    std::shared_ptr<std::byte> nvme_buffer;
    CountedBytes buffered;       // nvme_buffer's size, in RemoteState::buffered_bytes
    size_t waiting = 0;          // stages still running (the staging copy, the NVMe reads)
    size_t readable = SIZE_MAX;  // writes before the first whose bytes could not be had
  };

  struct RemoteState {
    // The worker goes first: its thread may still be reading the staging memory.
    ~RemoteState() {
      tier.reset();
      worker.reset();
    }
    std::unique_ptr<remote::RemoteWorker> worker;
    // The cluster as a StorageTier: every block goes in and out through it (sessions'
    // records through the worker).
    std::unique_ptr<RemoteStorageTier> tier;
    // Per session: its first `synced` blocks were handed to the worker (lowered again to
    // the first that failed when a write-behind reports failures, and to a cut).
    std::unordered_map<policy::SessionKey, uint32_t, policy::SessionKeyHasher> synced;
    // Per session: blocks held here that its last end of turn could not write behind
    // (in GPU memory or on NVMe); `deferred_blocks` is their sum.
    std::unordered_map<policy::SessionKey, uint32_t, policy::SessionKeyHasher> deferred;
    uint64_t deferred_blocks = 0;
    // Sessions with blocks still to write behind (deferred, failed or declined): the
    // periodic sweep tries them again, a bounded number per second, so blocks saved into
    // GPU memory are written once the policy demoted them to RAM.
    // In order (oldest first; the set says which entries of the queue still count).
    std::unordered_set<policy::SessionKey, policy::SessionKeyHasher> unsynced;
    std::deque<policy::SessionKey> unsynced_order;
    void mark_unsynced(const policy::SessionKey& key) {
      if (unsynced.insert(key).second) unsynced_order.push_back(key);
    }
    uint64_t last_sweep_ms = 0;
    // Blocks in GPU memory are written behind from here: pinned host memory the Device
    // copies them into first (two slabs; only when HBM is GPU memory).
    std::shared_ptr<Memory> staging;
    std::shared_ptr<SlabAllocator> staging_slots;
    uint64_t staged_blocks = 0;  // copied out of GPU memory to be written behind
    // Bytes of the buffers NVMe blocks are read into to be written behind (at most
    // remote-max-in-flight).
    std::shared_ptr<uint64_t> buffered_bytes = std::make_shared<uint64_t>(0);
    // Blocks being read into RAM slots from the cluster, and who waits for each.
    std::unordered_map<BlockKey, std::vector<std::function<void(const Status&)>>, BlockKeyHasher>
        fetching;
    uint64_t written_blocks = 0;    // written behind, confirmed
    uint64_t failed_blocks = 0;     // written behind, refused or unreachable
    uint64_t declined_writes = 0;   // write-behinds the in-flight bound declined
    uint64_t fetched_blocks = 0;    // read into RAM, verified
    uint64_t fetch_misses = 0;      // asked for and not there (or not verified, or unreachable)
    uint64_t lookup_hits = 0;       // blocks a Lookup found only in the remote tier
    uint64_t resumed_sessions = 0;  // sessions a BeginTurn created from a remote record
  };
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
  // Starts the next chunks of `fetch` while it has fewer than its window at the worker.
  void pump_fetch(const std::shared_ptr<RemoteFetch>& fetch);
  // A fetched block's end: its slot (nullptr: none was reserved) committed when
  // `status` is OK, else given back; Saves and fetch waiters told.
  void settle_fetch(const BlockKey& key, PendingWrite* slot, const Status& status);
  // A RAM (or host HBM) slot for a block read from the remote tier, making room the way
  // a Save does. nullopt when the block is present already.
  Result<std::optional<PendingWrite>> reserve_staging(const BlockKey& key, uint64_t block_bytes);

  std::unique_ptr<RemoteState> remote_;  // null without remote-nodes
};

}  // namespace kvtier::daemon
