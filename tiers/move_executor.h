// MoveExecutor: carries out the planner's moves between any two tiers. The daemon
// hands it moves; it never names a tier itself.
//
// Where a block goes when it moves, and who frees its old slot:
//  1. BlockStore::begin_move reserves the destination slot (a PendingMove, which rides
//     with the copy); the block stays readable where it is (pinned) while its bytes are
//     copied.
//  2. The bytes go by the first way that fits the pair of tiers (tier.h):
//     both are memory   → one Device copy (CopyBatch, background priority);
//     source in host memory (RAM, host HBM) → the destination tier's write();
//     destination in host memory → the source tier's read() (verified; a block whose
//       bytes are bad is dropped and reported lost);
//     otherwise (GPU HBM ↔ NVMe) → two hops through RAM: the first now, the second
//       when it lands (HBM → NVMe is planned as HBM → RAM → NVMe by the planner).
//  3. PendingMove::commit publishes the new place, or abort (a failure, or a copy that
//     never ran) frees the destination and leaves the block where it was (the planner
//     is told: revisit).
//  4. The old slot: BlockStore frees it as soon as no reader pins it. In a tier whose
//     releases are durable (NVMe: its index may still name the slot), BlockStore
//     holds it as a pending release; the executor hands those to the tier's release()
//     at the end of every apply() and evict() and after its own writes and reads, and
//     frees them when that is done (a failed release is retried). Nobody else does.
// Evictions remove the block from BlockStore (step 4 for its slot) and are reported
// back to the daemon, which cuts the sessions that held it.
//
// Spills: with a key-addressed tier below the local ones (the remote tier,
// attach_spill_tier), a planned eviction out of a tier that is not memory (NVMe: the
// block is leaving the node) is a move into it. The blocks the tier lacks (probe) are
// pinned, read out of NVMe into a buffer and written there; then each is evicted, unless
// it was read up or used meanwhile (the planner decides about it again). Their bytes
// count as leaving (leaving_bytes) until then. Blocks the tier holds already are evicted
// without a write; with the tier unreachable, its bound full, or spills stopped, at once.
//
// Copies out (copy_out; the remote tier's write-behind): copies of blocks that stay where
// they are, written into the key-addressed tier. A block's bytes are read where they lie
// when that is host memory (under a pin), copied by the Device into a staging slot first
// when it is GPU memory (attach_spill_tier's staging memory), or read into a buffer
// first when it is a tier that is not memory (NVMe; buffers within the in-flight bound).
// The pins go as soon as the bytes are staged or read; the slots and buffer when the
// tier is done with them.
//
// Copies in (copy_in; the remote tier's fetch): blocks this node lacks, read out of the
// key-addressed tier into new slots of the host-addressable memory tiers (RAM first;
// room made at once by evicting, as for a Save), verified by the tier, and published
// (PendingWrite::commit) only then. Reads of the same block join; a prefix of any length
// is read in chunks, slots reserved only as their chunk starts, within the bound.
//
// Copies in a durable tier (NVMe is inclusive below RAM; block_store.h):
//  - A block read up out of NVMe keeps its NVMe slot as a copy (step 4 does not give
//    it up); its index entry stays, so a crash does not lose the block.
//  - Demoting a block onto a tier that holds its copy, from any tier (GPU HBM too),
//    writes nothing: BlockStore::demote_onto_copy makes the copy its place at once and
//    frees the old slot (counted as bytes_demoted_onto_copy, not bytes_demoted).
//  - Capacity: copies are redundant, so they go before any block that lives only in
//    the tier. A write that finds no room first drops copies (durable releases, as for
//    evictions), then asks room_by_demotion for what is still missing; the daemon's planner
//    view counts copy bytes as free, so its watermark plans never evict a block for
//    room that dropping copies would give.
//  - Evicting a block gives up its copy too (durably).
//
// Writes into a tier are paused with exponential backoff after a failure (a full or
// failing disk is not hammered every plan), except while draining; none start into a
// tier that is not writable() (a degraded NVMe tier) until it is again.
//
// Thread-safety: none; the control thread owns it. Tier workers and the Device report
// back through Hooks, which post to the control thread.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/block_key.h"
#include "common/log.h"
#include "common/status.h"
#include "device/device.h"
#include "policy/planner.h"
#include "tiers/block_store.h"
#include "tiers/staging.h"
#include "tiers/tier.h"

namespace kvtier {

class MoveExecutor {
 public:
  struct Hooks {
    // Submits a Device copy; `done` runs on the control thread.
    std::function<Status(CopyBatch, std::function<void(Status)>)> copy;
    // Returns a function that runs its argument on the control thread, keeping the
    // event loop alive until it has (call it when the work starts, not when it ends).
    std::function<std::function<void(std::function<void()>)>()> control_thread;
    // Moves out of `tier` so that `bytes` fit, room that may come later: demotions whose
    // room comes when they land (RAM with NVMe below), evictions where nothing can go
    // down (the daemon's Placement::room_by_demotion). For a block read up into RAM, and
    // for writes into a full tier.
    std::function<std::vector<policy::Move>(Tier, uint64_t)> room_by_demotion;
    // A planned move of the block did not happen (the planner revisits its holders).
    std::function<void(const BlockKey&)> not_moved;
    // Blocks that left the store: evicted (lost = false) or dropped because their bytes
    // were bad (lost = true). The daemon cuts the sessions that held them.
    std::function<void(const std::vector<BlockKey>&, bool lost)> removed;
    // Before blocks are written into a persistent tier (the daemon writes the session
    // records first, so an index entry never comes without the record naming it).
    std::function<void()> before_persistent_write;
    // After any move, read or release finished (drain and unregister bookkeeping).
    std::function<void()> settled;
    // Moves out of `tier` that make `bytes` of room at once, evicting (the planner's
    // make_room): for a block copy_in reads from the remote tier.
    std::function<std::vector<policy::Move>(Tier, uint64_t)> room_by_eviction;
    // A block copy_in had reserved was published (ok) or given up: what waits for a
    // block being written (a Save of it) goes on.
    std::function<void(const BlockKey&, bool ok)> inserted;
    // The steady clock (ms) and the wall clock (ms), for persisted access times.
    std::function<uint64_t()> now_ms;
    std::function<uint64_t(uint64_t steady_ms)> wall_ms_of;
  };
  struct Counters {
    uint64_t bytes_demoted = 0;            // copied down a tier (written)
    uint64_t bytes_demoted_onto_copy = 0;  // moved down onto a copy (nothing written)
    uint64_t bytes_copied_down = 0;        // copies written below blocks that stay (copy_down)
    uint64_t bytes_promoted = 0;
    // Bytes the moves wrote into each tier, by Tier (Saves are not moves).
    std::array<uint64_t, kTierCount> bytes_written{};
    uint64_t copy_bytes_dropped = 0;  // copies given up for room
    uint64_t blocks_evicted = 0;
    uint64_t blocks_lost = 0;   // dropped: their bytes were bad
    uint64_t write_errors = 0;  // blocks whose write into a tier failed
    uint64_t read_errors = 0;   // blocks whose read failed for a reason that may pass
    // Spills: blocks written to the spill tier on their way out, blocks it held already,
    // and blocks evicted unwritten (bound full, unreachable, a read or write failed).
    uint64_t spilled_blocks = 0;
    uint64_t spill_present_blocks = 0;
    uint64_t spill_unwritten_blocks = 0;
    // Copies out: blocks copied out of GPU memory into staging slots to be written.
    uint64_t staged_blocks = 0;
    // Copies in: blocks read into memory (verified), and blocks asked for and not had
    // (not there, not verified, unreachable, no room, the bound full).
    uint64_t copied_in_blocks = 0;
    uint64_t copy_in_misses = 0;
  };
  // How a copy_out ended: `sent` of the blocks it took were handed to the tier (those
  // before the first whose bytes could not be had), and the first `written` of them were
  // written (in a row); `declined` when the tier's bound declined the whole batch (then
  // none was sent).
  struct CopyOutResult {
    size_t sent = 0;
    size_t written = 0;
    bool declined = false;
  };

  // `tiers`: the configured tiers (at most one per Tier). The store and the tiers must
  // outlive the executor.
  MoveExecutor(BlockStore& store, std::vector<StorageTier*> tiers, Hooks hooks);

  // Carries the moves out (evictions at once, copies started); moves into HBM go to
  // `hbm_part` where it has room.
  void apply(const std::vector<policy::Move>& moves, int hbm_part = SlabAllocator::kAnyPart);
  // Removes ready, unpinned blocks (counted as evictions, or as lost); reports them.
  void evict(const std::vector<BlockKey>& keys, bool lost = false);

  // The key-addressed tier evictions out of NVMe spill into and copies out go to (see the
  // top of this file), with at most `max_in_flight_bytes` of spills, and of copies out's
  // read buffers, on their way at once. `staging` (optional): pinned host memory, in
  // slots of `staging_slot_bytes`, that blocks in GPU memory are copied into to be
  // written. The tier and the memory must outlive the executor. Optional; once.
  void attach_spill_tier(StorageTier& tier, uint64_t max_in_flight_bytes,
                         std::shared_ptr<Memory> staging = nullptr,
                         uint64_t staging_slot_bytes = 0);
  // Copies of `keys`, in order, written into the spill tier; the blocks stay where they
  // are. Takes keys from the first until one cannot start now: not held; the batch would
  // pass half the in-flight bound (a first block alone may take all of it); or its bytes
  // must be staged or read first while the tier is unreachable, no staging slot is free,
  // or read buffers would pass the bound. Returns how many it took; then `done` runs
  // once, later, on the control thread (never when 0 were taken).
  size_t copy_out(std::span<const BlockKey> keys, std::function<void(CopyOutResult)> done);
  // Reads `keys` this node lacks out of the spill tier into memory, joining reads already
  // running. `done(i, status)` runs once per key on the control thread, maybe before this
  // returns: OK once keys[i] is held here (visible to lookup and pin), or why not
  // (NotFound, DataLoss, Unavailable, ResourceExhausted).
  void copy_in(const std::vector<BlockKey>& keys, std::function<void(size_t, const Status&)> done);
  // Whether `key` is being read in by copy_in.
  bool copying_in(const BlockKey& key) const { return copying_in_.contains(key); }
  // The most bytes one copy_in chunk asks the tier for.
  static constexpr uint64_t kCopyInChunkBytes = 32ull << 20;
  // A stop: the spills under way end now (their blocks evicted, written there or not)
  // and evictions from now on are not spilled.
  void stop_spills();
  // Bytes of `tier` on their way out (spilling); the planner's view counts them as free.
  uint64_t leaving_bytes(Tier tier) const;

  // Writes copies of `keys` into `to` (a durable tier that keeps copies, below them;
  // block_store.h), the blocks staying where they are, so that a crash does not lose
  // them: blocks in host memory, ready, without a copy, while `to` has room without
  // making any (a copy never takes room a block needs) and takes writes. Returns how
  // many started; each becomes the block's copy when its write lands.
  size_t copy_down(std::span<const BlockKey> keys, Tier to);

  // Whether `key` is being read into memory from a tier that is not memory.
  bool reading(const BlockKey& key) const { return reads_.contains(key); }
  // Whether writes are paused after a failure (never while draining): moves into a
  // tier that is not memory are refused until then.
  bool writes_paused() const { return !draining_ && hooks_.now_ms() < write_paused_until_ms_; }
  // Whether a move into `tier` would start now: writes not paused, and the tier takes
  // writes (a degraded NVMe tier does not until it heals; tier.h).
  bool accepts_writes(Tier tier) const;
  // Starts reading `keys`, held in a tier the Device cannot copy from, into RAM (or
  // host HBM); returns those whose read started or was already running.
  std::vector<BlockKey> read_into_memory(const std::vector<BlockKey>& keys);
  // `waiter` runs once `key` is readable from memory (starting its read when none is
  // running, making room in RAM if needed), or with why it is not. When neither RAM
  // nor HBM has a slot to read into, not even by evicting (every slot is a block being
  // copied or read), it waits for one: it is tried again whenever a copy, move, read,
  // release or eviction finishes (the caller bounds the wait). Past kMaxRoomWaiters
  // waiting, it is refused at once (ResourceExhausted, retryable).
  void await_readable(const BlockKey& key, std::function<void(const Status&)> waiter);
  static constexpr size_t kMaxRoomWaiters = 1 << 16;
  // Tries the reads waiting for room again (the owner calls it when pins it held are
  // gone; the executor itself after its copies, moves, releases and evictions).
  void retry_room_waiters();
  size_t room_waiters() const { return room_waiters_.size(); }

  // While draining, writes ignore the backoff and a block whose write failed is not
  // tried again (failed_in_drain).
  void set_draining(bool draining);
  bool failed_in_drain(const BlockKey& key) const { return drain_failed_.contains(key); }

  // Tier jobs (writes, reads, releases) and Device copies of moves in flight.
  bool busy() const { return jobs_ > 0 || copies_ > 0; }
  uint64_t tier_jobs() const { return jobs_; }  // writes, reads and releases in flight
  const Counters& counters() const { return counters_; }
  StorageTier* tier(Tier id) const;

 private:
  struct DeviceMove;  // move_executor.cpp
  struct MoveRoutes;  // move_executor.cpp
  // Sorts one of apply()'s moves into `routes` by the way its bytes go (step 2): an
  // eviction, a move onto its copy, a tier's write or read, or a Device copy, whose
  // destination slot it reserves (step 1). Skips a move whose block is gone or already
  // there, or whose destination tier is not configured.
  void route_move(const policy::Move& move, int hbm_part, MoveRoutes& routes);
  // Spills the blocks of `evictions` that leave the node's last local tier (one that is
  // not memory): they leave `evictions`, and those to evict at once come back at its end.
  void spill_leaving(std::vector<BlockKey>& evictions);
  // Submits apply()'s Device copies as one batch; each move is committed when its copy
  // lands (going on to its second hop), or aborted and reported not moved (step 3).
  void submit_device_moves(CopyBatch batch, std::vector<DeviceMove> copying);
  struct Spill;    // move_executor_spill.cpp
  struct CopyOut;  // move_executor_copy_out.cpp
  // A stage of the copy out ended (the staging copy, a read); after the last one the
  // blocks it could read are written.
  void copy_out_staged(const std::shared_ptr<CopyOut>& batch);
  // Copies the batch's blocks in GPU memory into their staging slots (`staging_copy`,
  // parallel to its staged) by the Device.
  void stage_for_copy_out(const std::shared_ptr<CopyOut>& batch, CopyBatch staging_copy);
  // Reads the batch's blocks in `from` (`reads`, parallel to its buffered) into a buffer.
  void read_for_copy_out(const std::shared_ptr<CopyOut>& batch, StorageTier& from,
                         std::vector<StorageTier::ReadItem> reads);
  // Lets go of the batch's pins, slots and buffer, then tells its caller `result`.
  void finish_copy_out(const std::shared_ptr<CopyOut>& batch, CopyOutResult result);
  struct CopyIn;  // move_executor_copy_in.cpp
  // Starts the next chunks of `copy` while it has fewer than its window at the tier.
  void pump_copy_in(const std::shared_ptr<CopyIn>& copy);
  // A block's copy in ended: its slot (nullptr: none was reserved) committed when
  // `status` is OK, else given back; its waiters told.
  void settle_copy_in(const BlockKey& key, PendingWrite* slot, const Status& status);
  // A slot in a host-addressable memory tier for a block copy_in reads, making room
  // at once. nullopt when the block is present already (being written).
  Result<std::optional<PendingWrite>> reserve_for_copy_in(const BlockKey& key, uint64_t bytes);
  // Spills what of `keys` it can; returns the keys to evict at once.
  std::vector<BlockKey> spill(std::vector<BlockKey> keys);
  void spill_missing(const std::shared_ptr<Spill>& spill, std::vector<size_t> missing);
  // The spill's blocks at `indices` are done with: unpinned, and evicted when they are
  // still where they were and unused since.
  void finish_spill(const std::shared_ptr<Spill>& spill, const std::vector<size_t>& indices);
  // Hands the slots the store gave up in durable-release tiers to those tiers.
  void release_slots();
  // Moves `key` onto its copy when its copy is in `to`: true when it did (or tried and
  // reported the block not moved), false when the block has no copy there.
  bool move_onto_copy(const BlockKey& key, Tier to);
  // Counts a block read up out of a tier that is not memory, now where it landed.
  void count_read_up(const BlockKey& key);
  // The two ways bytes move that are not a Device copy.
  void write_into(StorageTier& to, const std::vector<BlockKey>& keys);
  // Hands `items` to the tier in jobs and settles `writing` (parallel to it) as each job
  // lands: moves (write_into) or copies (copy_down).
  void submit_writes(StorageTier& to, std::vector<StorageTier::WriteItem> items,
                     std::vector<PendingMove> writing, bool copies);
  void read_from(StorageTier& from, const std::vector<BlockKey>& keys, Tier target);
  bool in_host_memory(Tier tier) const;
  bool copies_by_device(Tier tier) const;
  // Tries the reads waiting for room again, then tells the hooks something settled.
  void settled();

  BlockStore& store_;
  std::vector<StorageTier*> tiers_;  // by Tier; nullptr when not configured
  Hooks hooks_;
  Counters counters_;
  uint64_t jobs_ = 0;
  uint64_t copies_ = 0;
  // Blocks being read into memory, each with the waiters for it.
  std::unordered_map<BlockKey, std::vector<std::function<void(const Status&)>>, BlockKeyHasher>
      reads_;
  // After a read into RAM, blocks that go on up to HBM (GPU HBM: the second hop).
  std::unordered_set<BlockKey, BlockKeyHasher> continue_to_hbm_;
  // Releases whose tier failed them: retried with the next ones.
  std::vector<BlockStore::PendingRelease> failed_releases_;
  LogThrottle release_warnings_;  // a full disk fails every release
  // Reads waiting for a RAM/HBM slot (await_readable), oldest first.
  std::deque<std::pair<BlockKey, std::function<void(const Status&)>>> room_waiters_;
  bool retrying_room_waiters_ = false;
  uint64_t write_paused_until_ms_ = 0;
  uint64_t write_backoff_ms_ = 0;
  bool draining_ = false;
  std::unordered_set<BlockKey, BlockKeyHasher> drain_failed_;
  // Spills (attach_spill_tier).
  StorageTier* spill_tier_ = nullptr;
  uint64_t max_in_flight_bytes_ = 0;
  uint64_t spilling_bytes_ = 0;  // pinned in NVMe on their way out
  bool spills_stopped_ = false;
  std::unordered_set<std::shared_ptr<Spill>> spills_;  // each until its last block is done
  // Copies out (copy_out): staging memory for blocks in GPU memory, and the bytes of the
  // read buffers of blocks in tiers that are not memory.
  std::shared_ptr<Memory> staging_;
  std::shared_ptr<SlabAllocator> staging_slots_;
  std::shared_ptr<uint64_t> buffered_bytes_ = std::make_shared<uint64_t>(0);
  // Copies in: blocks being read into memory, each with who waits for it.
  std::unordered_map<BlockKey, std::vector<std::function<void(const Status&)>>, BlockKeyHasher>
      copying_in_;
};

}  // namespace kvtier
