#include "tiers/rocksdb_status.h"

#include <rocksdb/status.h>

namespace kvtier {
namespace {

struct RocksdbClass {
  StatusCode code;
  bool retryable;
};

// What the caller should do. An I/O error is the device or file system failing the
// call, not the stored bytes proving wrong, so it is Unavailable and worth a retry,
// like EIO in errno_status; Corruption is RocksDB's checksum or format check failing,
// the bytes known wrong: DataLoss.
RocksdbClass classify(const rocksdb::Status& status) {
  constexpr bool kRetry = true;
  constexpr bool kFinal = false;
  using Code = rocksdb::Status::Code;
  using SubCode = rocksdb::Status::SubCode;
  switch (status.code()) {
    case Code::kOk:
      return {StatusCode::kOk, kFinal};
    case Code::kNotFound:
      return {StatusCode::kNotFound, kFinal};
    case Code::kCorruption:
      return {StatusCode::kDataLoss, kFinal};
    case Code::kNotSupported:
      return {StatusCode::kNotSupported, kFinal};
    case Code::kInvalidArgument:
      return {StatusCode::kInvalidArgument, kFinal};
    case Code::kIOError:
      switch (status.subcode()) {
        case SubCode::kNoSpace:
        case SubCode::kSpaceLimit:
          return {StatusCode::kResourceExhausted, kRetry};
        case SubCode::kPathNotFound:
          return {StatusCode::kNotFound, kFinal};
        case SubCode::kIOFenced:  // another process owns the database now
          return {StatusCode::kUnavailable, kFinal};
        default:
          return {StatusCode::kUnavailable, kRetry};
      }
    case Code::kBusy:
    case Code::kTryAgain:
      return {StatusCode::kResourceExhausted, kRetry};
    case Code::kAborted:
      if (status.subcode() == SubCode::kMemoryLimit)
        return {StatusCode::kResourceExhausted, kRetry};
      return {StatusCode::kUnavailable, kRetry};
    case Code::kIncomplete:  // e.g. a read that would have to block
    case Code::kTimedOut:
    case Code::kShutdownInProgress:
      return {StatusCode::kUnavailable, kRetry};
    case Code::kCompactionTooLarge:
      return {StatusCode::kResourceExhausted, kFinal};
    case Code::kColumnFamilyDropped:
      return {StatusCode::kNotFound, kFinal};
    default:  // MergeInProgress, Expired and codes newer than this table: ours to fix
      return {StatusCode::kInternal, kFinal};
  }
}

}  // namespace

Status rocksdb_status(const rocksdb::Status& status, std::string_view what) {
  if (status.ok()) return Status::ok();
  const RocksdbClass c = classify(status);
  return Status(c.code, fmt::format("{}: rocksdb: {}", what, status.ToString()), c.retryable);
}

}  // namespace kvtier
