// NvmeIndex: the NVMe tier's RocksDB — the block index, the session table and the meta
// family, in the format nvme_format.h documents. It knows nothing about payloads.
//
// Every write that must survive a crash (block commits, block deletes) is one atomic
// WriteBatch with the WAL synced before the call returns; session writes may skip
// the sync (the next synced write makes them durable too, and a process crash alone
// never loses the WAL's page-cache copy).
//
// Thread-safety: every method may be called from any thread at the same time
// (RocksDB's own guarantees). delete_blocks_at's check-then-delete is atomic only
// against other writers that go through one thread; NvmeTier calls every writing
// method from its one writer thread.
// Errors: every rocksdb::Status goes through rocksdb_status() (tiers/rocksdb_status.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "tiers/nvme_format.h"

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
  static Result<std::unique_ptr<NvmeIndex>> open(const std::string& dir, uint64_t new_slab_bytes);
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
  // than kMinFreeBytes free, before RocksDB sees it. After RocksDB fails a write with an
  // I/O error the index writes nothing more (each write returns that error) and is not
  // closed at exit: Debian's RocksDB asserts when a log writer that failed is used again.
  // Restart kvtierd once the file system has room.
  static constexpr uint64_t kMinFreeBytes = 32ull << 20;

  // Puts the block records and layout records in one atomic batch.
  Status commit_blocks(std::span<const std::pair<NvmeBlockKey, NvmeBlockRecord>> blocks,
                       std::span<const NvmeLayoutRecord> layouts);
  // Deletes each block record that still names the given slot offset (a record that
  // names another slot belongs to a later write of the same key and stays).
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
  // Every write goes through here (the room check and the stop after an I/O error).
  Status write(const rocksdb::WriteOptions& options, rocksdb::WriteBatch& batch,
               std::string_view what);

  // Constant after open.
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;  // owned by db_; destroyed before it
  rocksdb::ColumnFamilyHandle* blocks_ = nullptr;
  rocksdb::ColumnFamilyHandle* sessions_ = nullptr;
  rocksdb::ColumnFamilyHandle* meta_ = nullptr;
  uint64_t slab_bytes_ = 0;
  bool created_ = false;
  std::string dir_;

  mutable std::mutex failure_mutex_;
  Status write_failure_;  // the I/O error that stopped writes; OK while writing
};

}  // namespace kvtier
