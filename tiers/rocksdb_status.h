// The one conversion from rocksdb::Status to kvtier::Status (docs/protocol.md: errors carry a code
// named for what to do).
//
// Every RocksDB call in the project hands its status to rocksdb_status(); no other
// file decides what a RocksDB error means for the caller. The table is in the .cpp.
//
// Thread-safety: a pure function.
#pragma once

#include <string_view>

#include "common/status.h"

namespace rocksdb {
class Status;
}  // namespace rocksdb

namespace kvtier {

// OK for an OK status; else a Status whose message is "<what>: rocksdb: <RocksDB's text>".
Status rocksdb_status(const rocksdb::Status& status, std::string_view what);

}  // namespace kvtier
