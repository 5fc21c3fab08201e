// NvmeTier: the third tier — block payloads in a preallocated slab file written and
// read with io_uring (O_DIRECT, straight from/to the daemon's RAM pool), and a RocksDB
// index of blocks, sessions and layouts (formats: nvme_format.h). It moves bytes and
// keeps the index; which block goes where, and which slot it gets, is decided by the
// caller (the daemon, over BlockStore's slot allocation).
//
// Crash safety comes from the order of operations, which this class enforces:
//   write:   payload written → fdatasync → index entry committed (WAL synced) → done
//   release: index entry deleted (WAL synced) → done → only then may the caller reuse
//            the slot
// so after any crash every index entry names a slot holding exactly the bytes it was
// committed with; checksums (xxHash3-64, verified on every read) catch the rest (a
// flipped bit on the medium, a torn sector), and a read never returns unverified bytes.
//
// Threading: two worker threads — a writer (payload writes, syncs, every index write,
// in submission order) and a reader (payload reads and checksum checks), each with
// its own io_uring ring — so a Load's reads do not queue behind a long demotion. The
// public methods may be called from any thread; they queue a job and return at once.
// Each `done` callback runs exactly once, on a worker thread, unless the tier is
// destroyed before the job started (then it is dropped, never called); it must only
// hand the result back (the daemon posts it to its control thread).
//
// Degraded: after a write fails (a payload write or sync, an index write, or the file
// system short of room for the index) the tier is read-only. write_blocks() fails every
// item at once (Unavailable, retryable) without touching the disk; reads, releases and
// session records go on as the index allows. The writer retries healing in the
// background — the file system has room, the index writes again (NvmeIndex::heal), the
// slab file syncs — after heal_first_delay_ms, doubling up to heal_max_delay_ms, and the
// tier takes writes again when that works. Nothing acknowledged is lost on the way:
// payloads and index entries that were acknowledged were synced before the error.
//
// Ownership: the caller keeps every item's memory alive and unchanged (writes) or
// unused by others (reads) until `done` runs; the daemon pins the blocks for that.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "tiers/nvme_format.h"
#include "tiers/nvme_index.h"
#include "tiers/nvme_io.h"
#include "tiers/tier.h"

namespace kvtier {

class NvmeWorker;

// The tier keeps `index_reserve_bytes` of its file system (at most a quarter of its
// capacity, at least 16 MiB) in a file of its own
// (index.reserve) and deletes it before opening the index: RocksDB cannot open (Debian's
// build aborts) on a file system with no room for a new manifest and log, and a full
// disk must not keep kvtierd from starting. After opening, the reserve is made again
// where there is room. With less than `index_open_min_free_bytes` free once the reserve
// is gone, open is refused (ResourceExhausted, naming the free bytes) before RocksDB is
// touched.
struct NvmeTierOptions {
  std::string dir;  // the tier's directory (index/ and slabs.dat inside)
  uint64_t index_reserve_bytes = 64ull << 20;
  uint64_t index_open_min_free_bytes = 16ull << 20;
  uint64_t capacity_bytes = 0;        // size of slabs.dat; the tier never holds more
  uint64_t slab_bytes = 64ull << 20;  // carving unit for a new tier (an existing one keeps its own)
  unsigned queue_depth = 32;          // payload I/Os in flight per worker
  std::vector<std::span<std::byte>> io_buffers;  // memory to register for fixed-buffer I/O
  bool allow_direct_io = true;
  std::vector<SlabIoFault> faults;      // when non-empty, the slab I/O is wrapped to inject these
  uint64_t heal_first_delay_ms = 1000;  // after degrading, the first try at healing
  uint64_t heal_max_delay_ms = 30'000;  // the longest wait between tries
};

// Whether the tier takes writes, and its history since it opened.
struct NvmeHealth {
  bool degraded = false;
  Status reason;               // why it degraded (OK while not degraded)
  uint64_t degraded_ms = 0;    // how long it has been degraded
  uint64_t degradations = 0;   // times it degraded
  uint64_t heals = 0;          // times it healed
  uint64_t heal_attempts = 0;  // tries at healing, failed ones included
};

// What the index held at start-up. Records are as stored; the caller checks them
// against its configuration (capacity, slot carving, layouts) and releases the ones
// it cannot use.
struct NvmeRecovery {
  struct Block {
    NvmeBlockKey key;
    NvmeBlockRecord record;
  };
  std::vector<NvmeLayoutRecord> layouts;
  std::vector<Block> blocks;
  std::vector<NvmeSessionRecord> sessions;
  uint64_t malformed_records = 0;  // undecodable records found (and deleted)
};

class NvmeTier {
 public:
  // Opens (creating when missing) the index and the slab file, and reads the index
  // into `recovered`. Fails when the index has another format version
  // (InvalidArgument naming both), is damaged, or the slab file cannot be created at
  // its size (ResourceExhausted on a full file system).
  static Result<std::unique_ptr<NvmeTier>> open(const NvmeTierOptions& options,
                                                NvmeRecovery* recovered);
  ~NvmeTier();  // finishes the job each worker is running, drops queued ones
  NvmeTier(const NvmeTier&) = delete;
  NvmeTier& operator=(const NvmeTier&) = delete;

  uint64_t capacity_bytes() const { return capacity_bytes_; }
  uint64_t slab_bytes() const { return index_->slab_bytes(); }
  std::string describe() const { return io_->describe(); }
  // Registers memory for fixed-buffer I/O that was not ready at open (the daemon's
  // pools, filled after the tier opened; NvmeTierOptions::io_buffers otherwise).
  // REQUIRES: no write_blocks/read_blocks job queued or running until it returns.
  void register_io_buffers(std::vector<std::span<std::byte>> buffers) {
    io_->register_buffers(std::move(buffers));
  }

  struct WriteItem {
    NvmeBlockKey key;
    const std::byte* source;  // the block's bytes (in the RAM pool)
    uint64_t bytes;
    uint64_t offset;  // its slot in slabs.dat
    uint64_t last_access_wall_ms;
  };
  // Writes each payload to its slot, makes them durable and commits their index
  // entries; `done` gets one status per item (an item fails alone when its write
  // failed; a failed sync or commit fails every item). An OK item is readable.
  void write_blocks(std::vector<WriteItem> items, std::function<void(std::vector<Status>)> done);

  struct ReadItem {
    NvmeBlockKey key;
    std::byte* destination;
    uint64_t bytes;
    uint64_t offset;  // the slot the caller believes the block is in
  };
  struct ReadOutcome {
    Status status;
    // The stored block is known bad (checksum mismatch, short read, or no index entry
    // for that slot): drop it. False for errors that may pass (EIO).
    bool corrupt = false;
  };
  // Reads each payload and verifies it against its index entry's checksum. A block
  // whose bytes do not verify is DataLoss and its destination must not be used.
  void read_blocks(std::vector<ReadItem> items, std::function<void(std::vector<ReadOutcome>)> done);

  // Deletes, durably, the index entry of each (key, slot offset) that still names that
  // slot. After `done` with OK the caller may reuse the slots.
  void release_blocks(std::vector<std::pair<NvmeBlockKey, uint64_t>> slots,
                      std::function<void(Status)> done);

  // Session records: puts (a record with append_from is a session delta, merged into
  // the stored one) and deletes (namespace name, session id), one batch.
  void write_sessions(std::vector<NvmeSessionRecord> puts,
                      std::vector<std::pair<std::string, std::string>> deletes, bool sync,
                      std::function<void(Status)> done);

  // Blocks until every job queued before the call has finished. Not from a worker.
  void flush();

  bool degraded() const { return degraded_.load(std::memory_order_acquire); }
  NvmeHealth health() const KVTIER_EXCLUDES(health_mutex_);

 private:
  NvmeTier() = default;
  void run_write(std::vector<WriteItem>& items, std::vector<Status>& results);
  void run_read(std::vector<ReadItem>& items, std::vector<ReadOutcome>& outcomes);
  // On the writer: makes the tier read-only for `why` and schedules healing.
  void degrade(const Status& why) KVTIER_EXCLUDES(health_mutex_);
  // On the writer: one try at healing; schedules the next when it fails.
  void try_heal() KVTIER_EXCLUDES(health_mutex_);
  uint64_t degraded_ms_locked() const KVTIER_REQUIRES(health_mutex_);

  // Constant after open.
  std::unique_ptr<NvmeIndex> index_;
  std::unique_ptr<SlabIo> io_;
  uint64_t capacity_bytes_ = 0;
  std::string dir_;
  uint64_t heal_first_delay_ms_ = 0;
  uint64_t heal_max_delay_ms_ = 0;
  // Layouts with a record in meta; touched only by the writer thread after open.
  std::set<std::pair<std::string, uint64_t>> recorded_layouts_;
  uint64_t heal_delay_ms_ = 0;  // writer thread only: the wait before the next try

  std::atomic<bool> degraded_{false};
  mutable Mutex health_mutex_;
  NvmeHealth health_ KVTIER_GUARDED_BY(health_mutex_);  // its degraded_ms is filled on read
  std::chrono::steady_clock::time_point degraded_since_ KVTIER_GUARDED_BY(health_mutex_);
  // Declared last: destroyed first, so no job runs while the members above go away.
  std::unique_ptr<NvmeWorker> writer_;
  std::unique_ptr<NvmeWorker> reader_;
};

}  // namespace kvtier

namespace kvtier {

// The NVMe tier behind the StorageTier interface (tier.h). Blocks are named in the
// index by `name_of` (namespace names survive restarts; the daemon's namespace ids do
// not). The NvmeTier must outlive this.
class NvmeStorageTier final : public StorageTier {
 public:
  using Namer = std::function<NvmeBlockKey(const BlockKey&)>;
  NvmeStorageTier(NvmeTier& tier, Namer name_of) : tier_(tier), name_of_(std::move(name_of)) {}

  Tier id() const override { return Tier::kNvme; }
  uint64_t capacity_bytes() const override { return tier_.capacity_bytes(); }
  void write(std::vector<WriteItem> items, std::function<void(std::vector<Status>)> done) override;
  void read(std::vector<ReadItem> items,
            std::function<void(std::vector<ReadOutcome>)> done) override;
  bool release_is_durable() const override { return true; }
  bool writable() const override { return !tier_.degraded(); }
  void release(std::vector<Slot> slots, std::function<void(Status)> done) override;

 private:
  NvmeTier& tier_;
  Namer name_of_;
};

}  // namespace kvtier
