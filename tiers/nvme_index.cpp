#include "tiers/nvme_index.h"

#include <sys/statvfs.h>

#include <rocksdb/db.h>
#include <rocksdb/merge_operator.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "common/log.h"
#include "tiers/rocksdb_status.h"

namespace kvtier {
namespace {

rocksdb::Slice slice(std::string_view bytes) {
  return {bytes.data(), bytes.size()};
}
std::string_view view(const rocksdb::Slice& s) {
  return {s.data(), s.size()};
}

rocksdb::WriteOptions durable() {
  rocksdb::WriteOptions options;
  options.sync = true;
  return options;
}

rocksdb::ReadOptions scan_options() {
  rocksdb::ReadOptions options;
  options.fill_cache = false;  // a start-up scan must not evict what serving reads cached
  options.readahead_size = 2 << 20;
  return options;
}

rocksdb::DBOptions db_options() {
  rocksdb::DBOptions options;
  options.create_if_missing = true;
  options.create_missing_column_families = true;
  options.keep_log_file_num = 4;
  options.max_log_file_size = 16 << 20;
  // Sessions change rarely, so without a cap an idle family would pin old WAL files.
  options.max_total_wal_size = 64 << 20;
  options.max_background_jobs = 2;
  return options;
}

// Session deltas (nvme_format.h) folded into the session record, in order. A record
// or delta that does not decode makes the result undecodable, so start-up counts the
// record as malformed and deletes it instead of failing the whole scan.
class SessionDeltaMerge final : public rocksdb::MergeOperator {
 public:
  bool FullMergeV2(const MergeOperationInput& in, MergeOperationOutput* out) const override {
    NvmeSessionRecord record;
    bool ok = true;
    if (in.existing_value != nullptr) {
      auto stored =
          decode_session(std::string_view(in.key.data(), in.key.size()),
                         std::string_view(in.existing_value->data(), in.existing_value->size()));
      if (stored) {
        record = std::move(*stored);
      } else {
        ok = false;
      }
    }
    for (const rocksdb::Slice& operand : in.operand_list) {
      ok = ok && apply_session_delta(record, std::string_view(operand.data(), operand.size()));
    }
    out->new_value = ok ? encode_session_value(record) : std::string();
    return true;
  }
  const char* Name() const override { return "kvtier.SessionDelta"; }
};

rocksdb::ColumnFamilyOptions family_options(const std::string& name) {
  rocksdb::ColumnFamilyOptions options;
  // Small memtables: index records are ~60 bytes, and memory per indexed block is a
  // target (docs/benchmarks.md, nvme); 8 MiB holds ~100k recent records.
  options.write_buffer_size = 8 << 20;
  options.max_write_buffer_number = 2;
  if (name == kNvmeSessionsFamily) options.merge_operator = std::make_shared<SessionDeltaMerge>();
  return options;
}

template <typename Fn>
Status scan(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* family, std::string_view prefix,
            const char* what, Fn&& fn) {
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(scan_options(), family));
  for (it->Seek(slice(prefix)); it->Valid(); it->Next()) {
    if (!it->key().starts_with(slice(prefix))) break;
    fn(view(it->key()), view(it->value()));
  }
  return rocksdb_status(it->status(), what);
}

}  // namespace

Result<std::unique_ptr<NvmeIndex>> NvmeIndex::open(const std::string& dir, uint64_t new_slab_bytes,
                                                   std::span<const SlabIoFault> faults) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return errno_status(ec.value(), "create " + dir);
  std::unique_ptr<NvmeIndex> index(new NvmeIndex());
  index->dir_ = dir;
  index->created_ = !std::filesystem::exists(dir + "/CURRENT");
  for (const SlabIoFault& fault : faults) {
    if (fault.kind == SlabIoFault::Kind::kIndex) index->faults_.push_back(fault);
  }
  index->file_system_ = std::make_shared<IndexFaultFileSystem>(rocksdb::FileSystem::Default());
  index->env_ = rocksdb::NewCompositeEnv(index->file_system_);
  index->logger_ = std::make_shared<IndexLogger>();

  index->family_names_ = {rocksdb::kDefaultColumnFamilyName, kNvmeBlocksFamily, kNvmeSessionsFamily,
                          kNvmeMetaFamily};
  if (!index->created_) {
    // Every existing family must be opened; a newer format may have added some.
    std::vector<std::string> existing;
    Status listed = rocksdb_status(
        rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), dir, &existing), "list families");
    if (!listed.is_ok()) return listed;
    for (const std::string& name : existing) {
      if (std::find(index->family_names_.begin(), index->family_names_.end(), name) ==
          index->family_names_.end()) {
        index->family_names_.push_back(name);
      }
    }
  }
  {
    // No other thread can reach the index yet: the lock is uncontended.
    WriterLock db_lock(index->db_mutex_);
    KVTIER_RETURN_IF_ERROR(index->open_db());
  }
  KVTIER_RETURN_IF_ERROR(index->load_or_init_meta(new_slab_bytes, dir));
  return index;
}

NvmeIndex::WriterView NvmeIndex::writer_view() const {
  return {db_.get(), blocks_, sessions_, meta_};
}

Status NvmeIndex::open_db() {
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  for (const std::string& name : family_names_) families.emplace_back(name, family_options(name));
  rocksdb::DBOptions options = db_options();
  options.env = env_.get();
  options.info_log = logger_;
  rocksdb::DB* db = nullptr;
  handles_.clear();
  KVTIER_RETURN_IF_ERROR(
      rocksdb_status(rocksdb::DB::Open(options, dir_, families, &handles_, &db), "open " + dir_));
  db_.reset(db);
  blocks_ = handles_[1];
  sessions_ = handles_[2];
  meta_ = handles_[3];
  return Status::ok();
}

void NvmeIndex::close_db() {
  if (!db_) return;
  for (rocksdb::ColumnFamilyHandle* handle : handles_) {
    (void)db_->DestroyColumnFamilyHandle(handle);
  }
  handles_.clear();
  blocks_ = sessions_ = meta_ = nullptr;
  // After a failed write Close reports that error again; what was acknowledged is synced.
  Status closed = rocksdb_status(db_->Close(), "close the NVMe index");
  if (!closed.is_ok()) KVTIER_LOG_DEBUG("{}", closed.message());
  db_.reset();
}

void NvmeIndex::count_operation() {
  if (faults_.empty()) return;
  const uint64_t count = ++operations_;
  int error = 0;
  for (const SlabIoFault& fault : faults_) {
    if (fault.applies_to(count)) error = fault.error;
  }
  file_system_->set_failing(error);
}

Status NvmeIndex::check_room(std::string_view what) const {
  struct statvfs fs {};
  if (::statvfs(dir_.c_str(), &fs) == 0) {
    const uint64_t free_bytes = uint64_t{fs.f_bavail} * fs.f_frsize;
    if (free_bytes < kMinFreeBytes) {
      return resource_exhausted(
          "{}: the file system holding the NVMe index {} has {} bytes free; it writes only with "
          "at least {} free",
          what, dir_, free_bytes, kMinFreeBytes);
    }
  }
  return Status::ok();
}

Status NvmeIndex::stop_reason() const {
  MutexLock lock(failure_mutex_);
  return write_failure_;
}

Status NvmeIndex::write(const rocksdb::WriteOptions& options, rocksdb::WriteBatch& batch,
                        std::string_view what) {
  if (Status stopped = stop_reason(); !stopped.is_ok()) return stopped;
  KVTIER_RETURN_IF_ERROR(check_room(what));
  count_operation();
  ReaderLock db_lock(db_mutex_);
  if (!db_) return unavailable("{}: the NVMe index {} is closed until it heals", what, dir_);
  rocksdb::Status written = db_->Write(options, &batch);
  Status status = rocksdb_status(written, std::string(what));
  // Any failed write: RocksDB keeps refusing writes after most of them (its background
  // error), and heal() resumes or reopens whatever the cause.
  if (!written.ok()) {
    MutexLock lock(failure_mutex_);
    if (write_failure_.is_ok()) {
      KVTIER_LOG_ERROR("NVMe index {}: {}; it writes nothing more until it heals", dir_,
                       status.message());
      write_failure_ = Status(status.code(),
                              fmt::format("the NVMe index stopped writing after an error ({}); "
                                          "it heals by itself once {} can be written again",
                                          status.message(), dir_),
                              /*retryable=*/true);
    }
  }
  return status;
}

Status NvmeIndex::heal() {
  KVTIER_RETURN_IF_ERROR(check_room("heal"));
  if (stop_reason().is_ok()) return Status::ok();
  count_operation();
  Status resumed;
  {
    ReaderLock db_lock(db_mutex_);
    if (db_) {
      // Busy: RocksDB is recovering by itself (no space); give it a moment.
      rocksdb::Status status = db_->Resume();
      for (int waited = 0; status.IsBusy() && waited < 20; ++waited) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        status = db_->Resume();
      }
      resumed = rocksdb_status(status, "resume the NVMe index");
    } else {
      resumed = unavailable("the NVMe index {} is closed", dir_);
    }
  }
  if (!resumed.is_ok()) {
    // RocksDB will not resume after errors it cannot tell are passing (an EIO in its
    // log): start again from what is durable, as a restart would.
    KVTIER_LOG_INFO("NVMe index {}: {}; reopening it", dir_, resumed.message());
    WriterLock db_lock(db_mutex_);
    close_db();
    resumed = open_db();
    if (!resumed.is_ok()) {
      close_db();
      return resumed;
    }
  }
  MutexLock lock(failure_mutex_);
  write_failure_ = Status::ok();
  return Status::ok();
}

NvmeIndex::~NvmeIndex() {
  WriterLock db_lock(db_mutex_);
  close_db();
}

Status NvmeIndex::load_or_init_meta(uint64_t new_slab_bytes, const std::string& dir) {
  const WriterView store = writer_view();
  std::string version_bytes;
  rocksdb::Status got =
      store.db->Get(rocksdb::ReadOptions(), store.meta, kNvmeFormatVersionKey, &version_bytes);
  if (got.IsNotFound()) {
    // No version: a fresh store, or one whose creation was interrupted before the meta
    // write. Anything else without a version is not ours to interpret.
    std::unique_ptr<rocksdb::Iterator> blocks(
        store.db->NewIterator(rocksdb::ReadOptions(), store.blocks));
    blocks->SeekToFirst();
    std::unique_ptr<rocksdb::Iterator> sessions(
        store.db->NewIterator(rocksdb::ReadOptions(), store.sessions));
    sessions->SeekToFirst();
    if (blocks->Valid() || sessions->Valid()) {
      return data_loss("NVMe index {} has records but no format version; refusing to use it", dir);
    }
    rocksdb::WriteBatch batch;
    (void)batch.Put(store.meta, kNvmeFormatVersionKey, encode_u32(kNvmeFormatVersion));
    (void)batch.Put(store.meta, kNvmeSlabBytesKey, encode_u64(new_slab_bytes));
    KVTIER_RETURN_IF_ERROR(
        rocksdb_status(store.db->Write(durable(), &batch), "write the NVMe index format version"));
    slab_bytes_ = new_slab_bytes;
    created_ = true;
    return Status::ok();
  }
  KVTIER_RETURN_IF_ERROR(rocksdb_status(got, "read the NVMe index format version"));
  auto version = decode_u32(version_bytes);
  if (!version) return data_loss("NVMe index {}: the stored format version is malformed", dir);
  if (*version == kNvmeUpgradableFormatVersion) {
    // Version 1 is version 2 without session deltas: every record reads the same.
    KVTIER_RETURN_IF_ERROR(rocksdb_status(
        store.db->Put(durable(), store.meta, kNvmeFormatVersionKey, encode_u32(kNvmeFormatVersion)),
        "upgrade the NVMe index format version"));
    KVTIER_LOG_INFO("NVMe index {}: format version {} upgraded to {} (session deltas)", dir,
                    *version, kNvmeFormatVersion);
    version = kNvmeFormatVersion;
  }
  if (*version != kNvmeFormatVersion) {
    return invalid_argument(
        "NVMe index {} has format version {}, but this kvtierd reads format version {}{}", dir,
        *version, kNvmeFormatVersion,
        *version > kNvmeFormatVersion
            ? ": it was written by a newer kvtierd; run that version or use another --data-dir"
            : ": no migration exists; move the directory away to start empty");
  }
  std::string slab_bytes;
  KVTIER_RETURN_IF_ERROR(rocksdb_status(
      store.db->Get(rocksdb::ReadOptions(), store.meta, kNvmeSlabBytesKey, &slab_bytes),
      "read slab_bytes"));
  auto parsed = decode_u64(slab_bytes);
  if (!parsed || *parsed == 0) return data_loss("NVMe index {}: slab_bytes is malformed", dir);
  slab_bytes_ = *parsed;
  return Status::ok();
}

Status NvmeIndex::for_each_layout(const std::function<void(const NvmeLayoutRecord&)>& fn) const {
  const WriterView store = writer_view();
  return scan(store.db, store.meta, nvme_layout_prefix(), "scan layouts",
              [&](std::string_view key, std::string_view value) {
                if (auto record = decode_layout(key, value)) fn(*record);
              });
}

Status NvmeIndex::for_each_block(
    const std::function<void(NvmeBlockKey&&, const NvmeBlockRecord&)>& fn,
    std::vector<std::string>* malformed) const {
  const WriterView store = writer_view();
  return scan(store.db, store.blocks, "", "scan blocks",
              [&](std::string_view key, std::string_view value) {
                auto decoded_key = decode_block_key(key);
                auto record = decode_block_record(value);
                if (decoded_key && record) {
                  fn(std::move(*decoded_key), *record);
                } else if (malformed != nullptr) {
                  malformed->emplace_back(key);
                }
              });
}

Status NvmeIndex::for_each_session(const std::function<void(NvmeSessionRecord&&)>& fn,
                                   std::vector<std::string>* malformed) const {
  const WriterView store = writer_view();
  return scan(store.db, store.sessions, "", "scan sessions",
              [&](std::string_view key, std::string_view value) {
                if (auto record = decode_session(key, value)) {
                  fn(std::move(*record));
                } else if (malformed != nullptr) {
                  malformed->emplace_back(key);
                }
              });
}

uint64_t NvmeIndex::estimated_blocks() const {
  ReaderLock db_lock(db_mutex_);
  uint64_t keys = 0;
  if (!db_) return 0;
  if (!db_->GetIntProperty(blocks_, "rocksdb.estimate-num-keys", &keys)) return 0;
  return keys;
}

Result<std::optional<NvmeBlockRecord>> NvmeIndex::get_block(const NvmeBlockKey& key) const {
  ReaderLock db_lock(db_mutex_);
  if (!db_) return unavailable("the NVMe index {} is closed until it heals", dir_);
  std::string value;
  rocksdb::Status got = db_->Get(rocksdb::ReadOptions(), blocks_, encode_block_key(key), &value);
  if (got.IsNotFound()) return std::optional<NvmeBlockRecord>();
  KVTIER_RETURN_IF_ERROR(rocksdb_status(got, "read a block record"));
  return decode_block_record(value);
}

Status NvmeIndex::commit_blocks(std::span<const std::pair<NvmeBlockKey, NvmeBlockRecord>> blocks,
                                std::span<const NvmeLayoutRecord> layouts) {
  const WriterView store = writer_view();
  rocksdb::WriteBatch batch;
  for (const NvmeLayoutRecord& layout : layouts) {
    (void)batch.Put(store.meta, encode_layout_key(layout.namespace_name, layout.layout_digest),
                    encode_u64(layout.block_bytes));
  }
  for (const auto& [key, record] : blocks) {
    (void)batch.Put(store.blocks, encode_block_key(key), encode_block_record(record));
  }
  return write(durable(), batch, "commit block records");
}

Status NvmeIndex::delete_blocks_at(std::span<const std::pair<NvmeBlockKey, uint64_t>> blocks) {
  // Stopped: the release waits for the heal (the caller retries it), since what a write
  // that failed left in the log may come back when the index reopens.
  if (Status stopped = stop_reason(); !stopped.is_ok()) return stopped;
  const WriterView store = writer_view();
  rocksdb::WriteBatch batch;
  for (const auto& [key, offset] : blocks) {
    auto record = get_block(key);
    if (!record.is_ok()) return record.status();
    if (record->has_value() && (*record)->offset != offset) continue;
    // No record: deleted anyway. A commit whose WAL sync failed is in the log though
    // never acknowledged, and a later reopen replays it; the delete outranks it.
    (void)batch.Delete(store.blocks, encode_block_key(key));
  }
  if (batch.Count() == 0) return Status::ok();
  return write(durable(), batch, "delete block records");
}

Status NvmeIndex::delete_raw_block_keys(std::span<const std::string> keys) {
  const WriterView store = writer_view();
  rocksdb::WriteBatch batch;
  for (const std::string& key : keys) (void)batch.Delete(store.blocks, key);
  return write(durable(), batch, "delete unusable block records");
}

Status NvmeIndex::write_sessions(std::span<const NvmeSessionRecord> puts,
                                 std::span<const std::pair<std::string, std::string>> deletes,
                                 bool sync) {
  const WriterView store = writer_view();
  rocksdb::WriteBatch batch;
  for (const NvmeSessionRecord& record : puts) {
    const std::string key = encode_session_key(record.namespace_name, record.session_id);
    if (record.append_from && *record.append_from <= record.blocks.size()) {
      (void)batch.Merge(store.sessions, key, encode_session_delta(record, *record.append_from));
    } else {
      (void)batch.Put(store.sessions, key, encode_session_value(record));
    }
  }
  for (const auto& [namespace_name, session_id] : deletes) {
    (void)batch.Delete(store.sessions, encode_session_key(namespace_name, session_id));
  }
  rocksdb::WriteOptions options;
  options.sync = sync;
  return write(options, batch, "write session records");
}

Status NvmeIndex::overwrite_format_version(const std::string& dir, uint32_t version) {
  auto index = open(dir, 1);
  if (!index.is_ok() && index.status().code() != StatusCode::kInvalidArgument) {
    return index.status();
  }
  if (!index.is_ok()) return invalid_argument("{} cannot be opened to rewrite", dir);
  const WriterView store = (*index)->writer_view();
  return rocksdb_status(
      store.db->Put(durable(), store.meta, kNvmeFormatVersionKey, encode_u32(version)),
      "overwrite the format version");
}

}  // namespace kvtier
