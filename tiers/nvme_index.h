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
// writer thread.
// Errors: every rocksdb::Status goes through rocksdb_status() (tiers/rocksdb_status.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

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
  uint64_t estimated_blocks() const;

  // nullopt when there is no (well-formed) record for `key`.
  Result<std::optional<NvmeBlockRecord>> get_block(const NvmeBlockKey& key) const;

  // ---- durable writes (WAL synced) ----
  //
  // A full disk is an error to the caller, never a crash: a write is refused
  // (ResourceExhausted, retryable, naming the free bytes) while the file system has less
  // than kMinFreeBytes free, before RocksDB sees it. After RocksDB fails a write the
  // index is stopped (stop_reason()) until heal().
  static constexpr uint64_t kMinFreeBytes = 32ull << 20;

  // OK while writing; the error that stopped writes otherwise.
  Status stop_reason() const;
  // Brings a stopped index back: Resume(), or a reopen when RocksDB will not resume.
  // OK when it writes again (or was not stopped) and its file system has kMinFreeBytes;
  // the error otherwise (short of room, the error persisting). A failed reopen leaves the index
  // closed: reads are then Unavailable until a later heal() opens it.
  Status heal();

  // Puts the block records and layout records in one atomic batch.
  Status commit_blocks(std::span<const std::pair<NvmeBlockKey, NvmeBlockRecord>> blocks,
                       std::span<const NvmeLayoutRecord> layouts);
  // Deletes each block record that still names the given slot offset (a record that
  // names another slot belongs to a later write of the same key and stays), and writes a
  // delete for a key with no record (a failed commit's record, still in the log, would
  // come back on a reopen). While stopped: the stop reason, nothing deleted.
  Status delete_blocks_at(std::span<const std::pair<NvmeBlockKey, uint64_t>> blocks);
  // Deletes block records by raw key (malformed or unusable records found at start-up).
  Status delete_raw_block_keys(std::span<const std::string> keys);

  // Session records: puts (a record with append_from is written as a session delta,
  // merged into the stored one), then deletes (namespace name, session id), one batch.
  Status write_sessions(std::span<const NvmeSessionRecord> puts,
                        std::span<const std::pair<std::string, std::string>> deletes, bool sync);

  // Rewrites the stored format version. For tests of the version check (and a
  // future migration tool); never called by the daemon.
  static Status overwrite_format_version(const std::string& dir, uint32_t version);

 private:
  NvmeIndex() = default;
  Status load_or_init_meta(uint64_t new_slab_bytes, const std::string& dir);
  // Opens the store (creating it when missing); the families and handles.
  Status open_db();
  void close_db();
  // The room check of every write and heal.
  Status check_room(std::string_view what) const;
  // Counts an index operation and arms the injected fault that applies to it, if any.
  void count_operation();
  // Every write goes through here (the room check and the stop after an I/O error).
  Status write(const rocksdb::WriteOptions& options, rocksdb::WriteBatch& batch,
               std::string_view what);

  // Constant after open. Declared before db_: the DB must go first.
  std::shared_ptr<IndexFaultFileSystem> file_system_;
  std::unique_ptr<rocksdb::Env> env_;
  std::shared_ptr<IndexLogger> logger_;
  std::vector<SlabIoFault> faults_;  // kIndex ones
  std::atomic<uint64_t> operations_{0};

  // Replaced only by heal()'s reopen, under the unique lock; every use holds it shared.
  mutable std::shared_mutex db_mutex_;
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;  // owned by db_; destroyed before it
  rocksdb::ColumnFamilyHandle* blocks_ = nullptr;
  rocksdb::ColumnFamilyHandle* sessions_ = nullptr;
  rocksdb::ColumnFamilyHandle* meta_ = nullptr;
  uint64_t slab_bytes_ = 0;
  bool created_ = false;
  std::string dir_;
  std::vector<std::string> family_names_;

  mutable std::mutex failure_mutex_;
  Status write_failure_;  // the error that stopped writes; OK while writing
};

}  // namespace kvtier
