// NvmeIndex: the NVMe tier's RocksDB — the block index, the session table and the meta
// family, in the format nvme_format.h documents. It knows nothing about payloads.
//
// Every write that must survive a crash (block commits, block deletes) is one atomic
// WriteBatch with the WAL synced before the call returns; session writes may skip
// the sync (the next synced write makes them durable too, and a process crash alone
// never loses the WAL's page-cache copy).
//
// After a write fails inside RocksDB (a full disk past the room check, an I/O error) the
// index is stopped: every write returns that error until heal() brings it back — by
// RocksDB's DB::Resume() where RocksDB can recover by itself (no space, once there is
// room), else by closing and reopening the store, which replays what its log holds. What
// was acknowledged was synced before the error, so both keep it.
//
// Thread-safety: every method may be called from any thread at the same time
// (RocksDB's own guarantees; heal()'s reopen waits for reads in progress).
// delete_blocks_at's check-then-delete is atomic only against other writers that go
// through one thread; NvmeTier calls every writing method, and heal(), from its one
// writer thread (and the recovery visits from the thread that opens it, before that
// writer starts). The writing methods and the visits read the store without the lock
// that guards its replacement, so they must not overlap heal().
// Errors: every rocksdb::Status goes through rocksdb_status() (tiers/rocksdb_status.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "tiers/nvme_format.h"
#include "tiers/nvme_index_env.h"
#include "tiers/nvme_io.h"

namespace rocksdb {
class WriteBatch;
struct WriteOptions;
class DB;
class ColumnFamilyHandle;
}  // namespace rocksdb

namespace kvtier {

class NvmeIndex {
 public:
  // Opens the RocksDB in `dir`, creating it when missing (then its format version is
  // kNvmeFormatVersion and its slab size `new_slab_bytes`). InvalidArgument, naming
  // both numbers, when the store has another format version; DataLoss when it is
  // damaged beyond what RocksDB's WAL recovery repairs.
  // `faults` of kind kIndex (nvme_io.h) fail RocksDB's file writes during the index
  // operations they count (writes and heal attempts); other kinds are ignored.
  static Result<std::unique_ptr<NvmeIndex>> open(const std::string& dir, uint64_t new_slab_bytes,
                                                 std::span<const SlabIoFault> faults = {});
  ~NvmeIndex();
  NvmeIndex(const NvmeIndex&) = delete;
  NvmeIndex& operator=(const NvmeIndex&) = delete;

  uint64_t slab_bytes() const { return slab_bytes_; }
  bool created() const { return created_; }  // this open created the store

  // ---- recovery: visit every record. Malformed records are not visited; their raw
  // keys are appended to `malformed` so the caller can delete them.
  Status for_each_layout(const std::function<void(const NvmeLayoutRecord&)>& fn) const;
  Status for_each_block(const std::function<void(NvmeBlockKey&&, const NvmeBlockRecord&)>& fn,
                        std::vector<std::string>* malformed) const;
  Status for_each_session(const std::function<void(NvmeSessionRecord&&)>& fn,
                          std::vector<std::string>* malformed) const;

  // RocksDB's estimate of the number of block records (to size containers).
  uint64_t estimated_blocks() const KVTIER_EXCLUDES(db_mutex_);

  // nullopt when there is no (well-formed) record for `key`.
  Result<std::optional<NvmeBlockRecord>> get_block(const NvmeBlockKey& key) const
      KVTIER_EXCLUDES(db_mutex_);

  // ---- durable writes (WAL synced) ----
  //
  // A full disk is an error to the caller, never a crash: a write is refused
  // (ResourceExhausted, retryable, naming the free bytes) while the file system has less
  // than kMinFreeBytes free, before RocksDB sees it. After RocksDB fails a write the
  // index is stopped (stop_reason()) until heal().
  static constexpr uint64_t kMinFreeBytes = 32ull << 20;

  // OK while writing; the error that stopped writes otherwise.
  Status stop_reason() const KVTIER_EXCLUDES(failure_mutex_);
  // Brings a stopped index back: Resume(), or a reopen when RocksDB will not resume.
  // OK when it writes again (or was not stopped) and its file system has kMinFreeBytes;
  // the error otherwise (short of room, the error persisting). A failed reopen leaves the index
  // closed: reads are then Unavailable until a later heal() opens it.
  Status heal() KVTIER_EXCLUDES(db_mutex_, failure_mutex_);

  // Puts the block records and layout records in one atomic batch.
  Status commit_blocks(std::span<const std::pair<NvmeBlockKey, NvmeBlockRecord>> blocks,
                       std::span<const NvmeLayoutRecord> layouts)
      KVTIER_EXCLUDES(db_mutex_, failure_mutex_);
  // Deletes each block record that still names the given slot offset (a record that
  // names another slot belongs to a later write of the same key and stays), and writes a
  // delete for a key with no record (a failed commit's record, still in the log, would
  // come back on a reopen). While stopped: the stop reason, nothing deleted.
  Status delete_blocks_at(std::span<const std::pair<NvmeBlockKey, uint64_t>> blocks)
      KVTIER_EXCLUDES(db_mutex_, failure_mutex_);
  // Deletes block records by raw key (malformed or unusable records found at start-up).
  Status delete_raw_block_keys(std::span<const std::string> keys)
      KVTIER_EXCLUDES(db_mutex_, failure_mutex_);

  // Session records: puts (a record with append_from is written as a session delta,
  // merged into the stored one), then deletes (namespace name, session id), one batch.
  Status write_sessions(std::span<const NvmeSessionRecord> puts,
                        std::span<const std::pair<std::string, std::string>> deletes, bool sync)
      KVTIER_EXCLUDES(db_mutex_, failure_mutex_);

  // Rewrites the stored format version. For tests of the version check (and a
  // future migration tool); never called by the daemon.
  static Status overwrite_format_version(const std::string& dir, uint32_t version);

 private:
  // The store and its families as the writing thread reads them, without db_mutex_ (see
  // the top of this file): that thread is the only one that replaces them (open_db from
  // open() and heal()), so its own reads cannot race a replacement. writer_view() is not
  // analysed: a field written under a lock but read without it by the one thread that
  // writes it is beyond what the analysis can state.
  struct WriterView {
    rocksdb::DB* db;
    rocksdb::ColumnFamilyHandle* blocks;
    rocksdb::ColumnFamilyHandle* sessions;
    rocksdb::ColumnFamilyHandle* meta;
  };

  NvmeIndex() = default;
  WriterView writer_view() const KVTIER_NO_THREAD_SAFETY_ANALYSIS;
  Status load_or_init_meta(uint64_t new_slab_bytes, const std::string& dir);
  // Opens the store (creating it when missing); the families and handles.
  Status open_db() KVTIER_REQUIRES(db_mutex_);
  void close_db() KVTIER_REQUIRES(db_mutex_);
  // The room check of every write and heal.
  Status check_room(std::string_view what) const;
  // Counts an index operation and arms the injected fault that applies to it, if any.
  void count_operation();
  // Every write goes through here (the room check and the stop after an I/O error).
  Status write(const rocksdb::WriteOptions& options, rocksdb::WriteBatch& batch,
               std::string_view what) KVTIER_EXCLUDES(db_mutex_, failure_mutex_);

  // Constant after open. Declared before db_: the DB must go first.
  std::shared_ptr<IndexFaultFileSystem> file_system_;
  std::unique_ptr<rocksdb::Env> env_;
  std::shared_ptr<IndexLogger> logger_;
  std::vector<SlabIoFault> faults_;  // kIndex ones
  std::atomic<uint64_t> operations_{0};

  // Replaced only by open_db (open(), heal()'s reopen), under the unique lock; other
  // threads hold it shared, the writing thread reads through writer_view().
  mutable SharedMutex db_mutex_;
  std::unique_ptr<rocksdb::DB> db_ KVTIER_GUARDED_BY(db_mutex_);
  // Owned by db_; destroyed before it.
  std::vector<rocksdb::ColumnFamilyHandle*> handles_ KVTIER_GUARDED_BY(db_mutex_);
  rocksdb::ColumnFamilyHandle* blocks_ KVTIER_GUARDED_BY(db_mutex_) = nullptr;
  rocksdb::ColumnFamilyHandle* sessions_ KVTIER_GUARDED_BY(db_mutex_) = nullptr;
  rocksdb::ColumnFamilyHandle* meta_ KVTIER_GUARDED_BY(db_mutex_) = nullptr;

  // Constant after open.
  uint64_t slab_bytes_ = 0;
  bool created_ = false;
  std::string dir_;
  std::vector<std::string> family_names_;

  mutable Mutex failure_mutex_;
  // The error that stopped writes; OK while writing.
  Status write_failure_ KVTIER_GUARDED_BY(failure_mutex_);
};

}  // namespace kvtier
