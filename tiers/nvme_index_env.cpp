#include "tiers/nvme_index_env.h"

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/log.h"

namespace kvtier {
namespace {

std::string format(const char* format, va_list ap) {
  char line[1024];
  va_list copy;
  va_copy(copy, ap);
  const int n = std::vsnprintf(line, sizeof(line), format, copy);
  va_end(copy);
  if (n < 0) return format;
  return std::string(line, std::min<size_t>(static_cast<size_t>(n), sizeof(line) - 1));
}

// A file whose syncs fail while its file system injects an error: what was appended
// reaches the file (as on a device whose fsync reports EIO), but is not durable as far as
// RocksDB knows.
class FaultFile final : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  FaultFile(std::unique_ptr<rocksdb::FSWritableFile> file, const IndexFaultFileSystem& fs)
      : rocksdb::FSWritableFileOwnerWrapper(std::move(file)), fs_(fs) {}

  rocksdb::IOStatus Sync(const rocksdb::IOOptions& options,
                         rocksdb::IODebugContext* debug) override {
    if (auto error = fs_.injected(); !error.ok()) return error;
    return FSWritableFileOwnerWrapper::Sync(options, debug);
  }
  rocksdb::IOStatus Fsync(const rocksdb::IOOptions& options,
                          rocksdb::IODebugContext* debug) override {
    if (auto error = fs_.injected(); !error.ok()) return error;
    return FSWritableFileOwnerWrapper::Fsync(options, debug);
  }

 private:
  const IndexFaultFileSystem& fs_;
};

}  // namespace

void IndexLogger::Logv(const char* format_text, va_list ap) {
  Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format_text, ap);
}

void IndexLogger::Logv(const rocksdb::InfoLogLevel level, const char* format_text, va_list ap) {
  const LogLevel ours = level >= rocksdb::InfoLogLevel::ERROR_LEVEL  ? LogLevel::kError
                        : level >= rocksdb::InfoLogLevel::WARN_LEVEL ? LogLevel::kWarn
                                                                     : LogLevel::kDebug;
  if (!log_enabled(ours)) return;
  log_line(ours, "NVMe index (RocksDB): " + format(format_text, ap));
}

rocksdb::IOStatus IndexFaultFileSystem::injected() const {
  const int error = failing_.load(std::memory_order_relaxed);
  if (error == 0) return rocksdb::IOStatus::OK();
  const std::string what = std::string(std::strerror(error)) + " (injected fault)";
  return error == ENOSPC ? rocksdb::IOStatus::NoSpace(what) : rocksdb::IOStatus::IOError(what);
}

template <typename Open>
rocksdb::IOStatus IndexFaultFileSystem::open_wrapped(
    std::unique_ptr<rocksdb::FSWritableFile>* result, Open&& open) {
  if (auto error = injected(); !error.ok()) return error;
  std::unique_ptr<rocksdb::FSWritableFile> file;
  rocksdb::IOStatus opened = open(&file);
  if (opened.ok()) *result = std::make_unique<FaultFile>(std::move(file), *this);
  return opened;
}

rocksdb::IOStatus IndexFaultFileSystem::NewWritableFile(
    const std::string& name, const rocksdb::FileOptions& options,
    std::unique_ptr<rocksdb::FSWritableFile>* result, rocksdb::IODebugContext* debug) {
  return open_wrapped(result, [&](std::unique_ptr<rocksdb::FSWritableFile>* file) {
    return target()->NewWritableFile(name, options, file, debug);
  });
}

rocksdb::IOStatus IndexFaultFileSystem::ReopenWritableFile(
    const std::string& name, const rocksdb::FileOptions& options,
    std::unique_ptr<rocksdb::FSWritableFile>* result, rocksdb::IODebugContext* debug) {
  return open_wrapped(result, [&](std::unique_ptr<rocksdb::FSWritableFile>* file) {
    return target()->ReopenWritableFile(name, options, file, debug);
  });
}

}  // namespace kvtier
