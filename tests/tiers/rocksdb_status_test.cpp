// The rocksdb::Status table: every RocksDB error the NVMe index can see, with the code
// and retryable flag the caller gets.
#include "tiers/rocksdb_status.h"

#include <rocksdb/io_status.h>
#include <rocksdb/status.h>

#include <string>

#include <gtest/gtest.h>

namespace kvtier {
namespace {

struct Row {
  rocksdb::Status from;
  StatusCode code;
  bool retryable;
};

TEST(RocksdbStatus, OkIsOk) {
  EXPECT_TRUE(rocksdb_status(rocksdb::Status::OK(), "get").is_ok());
}

TEST(RocksdbStatus, Table) {
  const Row rows[] = {
      {rocksdb::Status::NotFound("k"), StatusCode::kNotFound, false},
      // A failed checksum or a mangled file: the bytes are known wrong.
      {rocksdb::Status::Corruption("block checksum mismatch"), StatusCode::kDataLoss, false},
      {rocksdb::Status::NotSupported("x"), StatusCode::kNotSupported, false},
      {rocksdb::Status::InvalidArgument("x"), StatusCode::kInvalidArgument, false},
      // The device failed the call; the stored bytes are not known to be wrong.
      {rocksdb::Status::IOError("write failed"), StatusCode::kUnavailable, true},
      {rocksdb::Status::NoSpace("disk full"), StatusCode::kResourceExhausted, true},
      {rocksdb::Status::SpaceLimit("sst limit"), StatusCode::kResourceExhausted, true},
      {rocksdb::Status::PathNotFound("/x"), StatusCode::kNotFound, false},
      {rocksdb::IOStatus::IOFenced("fenced"), StatusCode::kUnavailable, false},
      {rocksdb::Status::Busy("x"), StatusCode::kResourceExhausted, true},
      {rocksdb::Status::TryAgain("x"), StatusCode::kResourceExhausted, true},
      {rocksdb::Status::MemoryLimit("x"), StatusCode::kResourceExhausted, true},
      {rocksdb::Status::TimedOut("x"), StatusCode::kUnavailable, true},
      {rocksdb::Status::ShutdownInProgress("x"), StatusCode::kUnavailable, true},
      {rocksdb::Status::Aborted("x"), StatusCode::kUnavailable, true},
      {rocksdb::Status::Incomplete("x"), StatusCode::kUnavailable, true},
      {rocksdb::Status::CompactionTooLarge("x"), StatusCode::kResourceExhausted, false},
      {rocksdb::Status::ColumnFamilyDropped("x"), StatusCode::kNotFound, false},
      {rocksdb::Status::MergeInProgress("x"), StatusCode::kInternal, false},
      {rocksdb::Status::Expired("x"), StatusCode::kInternal, false},
  };
  for (const Row& row : rows) {
    const Status status = rocksdb_status(row.from, "op");
    SCOPED_TRACE(status.to_string());
    EXPECT_EQ(status.code(), row.code);
    EXPECT_EQ(status.retryable(), row.retryable);
  }
}

TEST(RocksdbStatus, MessageNamesTheCallAndKeepsRocksdbText) {
  const Status status = rocksdb_status(rocksdb::Status::IOError("fsync wal"), "commit blocks");
  EXPECT_EQ(status.message().rfind("commit blocks: rocksdb: ", 0), 0u) << status.message();
  EXPECT_NE(status.message().find("fsync wal"), std::string::npos) << status.message();
}

}  // namespace
}  // namespace kvtier
