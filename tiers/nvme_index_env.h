// What the NVMe index's RocksDB runs on besides the default file system: its info log
// goes to kvtierd's log, and tests (and the daemon's hidden --fault-nvme flag) can make
// its file layer fail, so that RocksDB itself meets the error and the tier has to heal
// (nvme_index.h).
//
// The info log matters for more than tidiness: RocksDB writes it to a LOG file in the
// index directory, and Debian's RocksDB (7.8, built with assertions) aborts the process
// when it logs again after a write of that file failed — which a full disk makes happen
// on the first error it reports. With no LOG file, a full disk is an error to handle.
//
// Thread-safety: both classes may be used from any thread (RocksDB's background threads
// log and write files).
#pragma once

#include <atomic>
#include <memory>

#include <rocksdb/env.h>
#include <rocksdb/file_system.h>

namespace kvtier {

// Forwards RocksDB's warnings and errors to the kvtierd log ("NVMe index: ..."), its
// informational lines at debug level.
class IndexLogger final : public rocksdb::Logger {
 public:
  IndexLogger() : rocksdb::Logger(rocksdb::InfoLogLevel::INFO_LEVEL) {}
  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override;
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override;
};

// The default file system, except that while failing(errno) is set, creating a file and
// syncing one fail with that errno (ENOSPC as RocksDB's "no space", anything else as an
// I/O error). Appends still reach the file: a record whose sync failed is in the log, as
// after a real fsync error, and comes back when the index is reopened.
class IndexFaultFileSystem final : public rocksdb::FileSystemWrapper {
 public:
  explicit IndexFaultFileSystem(std::shared_ptr<rocksdb::FileSystem> base)
      : rocksdb::FileSystemWrapper(std::move(base)) {}
  const char* Name() const override { return "kvtier.IndexFaults"; }

  void set_failing(int error) { failing_.store(error, std::memory_order_relaxed); }  // 0: none
  // OK, or the injected error when one is set.
  rocksdb::IOStatus injected() const;

  rocksdb::IOStatus NewWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* debug) override;
  rocksdb::IOStatus ReopenWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                                       std::unique_ptr<rocksdb::FSWritableFile>* result,
                                       rocksdb::IODebugContext* debug) override;

 private:
  // Opens a file through `open` (unless a fault is set) and wraps it.
  template <typename Open>
  rocksdb::IOStatus open_wrapped(std::unique_ptr<rocksdb::FSWritableFile>* result, Open&& open);

  std::atomic<int> failing_{0};
};

}  // namespace kvtier
