// The remote tier's state inside the Service (remote_*.cpp): the worker that owns
// the Redis Cluster connections, and how far each session has been written there.
// Control thread only, like the rest of the Service.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "daemon/service.h"
#include "policy/session_table.h"
#include "tiers/remote_worker.h"
#include "tiers/slab_allocator.h"

namespace kvtier::daemon {

// Blocks read out of NVMe for the remote tier (write-behind, spills) go into
// O_DIRECT-friendly buffers, in reads of the executor's job size.
constexpr uint64_t kNvmeBufferAlignment = 4096;
constexpr size_t kNvmeBlocksPerRead = 32;
// The size of such a buffer for `bytes` of blocks (rounded up to the alignment).
constexpr uint64_t nvme_buffer_bytes(uint64_t bytes) {
  return (bytes + kNvmeBufferAlignment - 1) / kNvmeBufferAlignment * kNvmeBufferAlignment;
}
// A buffer of `bytes` (a nvme_buffer_bytes() size); null when memory is short.
std::shared_ptr<std::byte> allocate_nvme_buffer(uint64_t bytes);

// One write-behind: a session's blocks from `from` on. Blocks in host memory are read in
// place, under their pins; blocks in GPU memory from the staging slots the Device copies
// them into, and blocks on NVMe from `nvme_buffer` once read into it (their pins go once
// the copy or read is done).
struct Service::WriteBehind {
  static constexpr uint64_t kNoSlot = UINT64_MAX;
  policy::SessionKey key;
  std::string namespace_name;
  uint32_t from = 0;
  uint64_t block_bytes = 0;
  std::vector<remote::RemoteStore::BlockWrite> writes;
  std::vector<PinnedBlock> pins;  // parallel to writes
  std::vector<uint64_t> slots;    // parallel to writes: the staging slot, or kNoSlot
  size_t blocks = 0;              // writes.size() before any were cut off
  std::vector<size_t> staged;     // indices in writes, copied out of GPU memory
  std::vector<size_t> from_nvme;  // indices in writes, read out of NVMe
  std::shared_ptr<std::byte> nvme_buffer;
  uint64_t buffered_bytes = 0;  // nvme_buffer's size (in RemoteState::buffered_bytes)
  size_t waiting = 0;           // stages still running (the staging copy, the NVMe reads)
  size_t readable = SIZE_MAX;   // writes before the first whose bytes could not be had
};

struct Service::RemoteState {
  // The worker goes first: its thread may still be reading the staging memory.
  ~RemoteState() { worker.reset(); }
  std::unique_ptr<remote::RemoteWorker> worker;
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
  std::optional<SlabAllocator> staging_slots;
  uint64_t staged_blocks = 0;  // copied out of GPU memory to be written behind
  // Bytes of the buffers NVMe blocks are read into to be written behind (at most
  // remote-max-in-flight).
  uint64_t buffered_bytes = 0;
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
  // NVMe evictions (spill_evictions): bytes pinned on their way to the cluster (at
  // most remote-max-in-flight), blocks written there on their way out, blocks found
  // there already, and blocks evicted unwritten (bound full, not connected, a read or
  // write that failed).
  uint64_t spilling_bytes = 0;
  // The spills under way (each until its last block is finished): a stop gives them up.
  std::unordered_set<std::shared_ptr<Spill>> spills;
  uint64_t spilled_blocks = 0;
  uint64_t spill_present = 0;
  uint64_t spill_unwritten = 0;
};

}  // namespace kvtier::daemon
