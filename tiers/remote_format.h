// What the remote tier stores in the Redis Cluster, format version 1
// (kRemoteFormatVersion). Every node of a fleet reads what the others wrote, so change
// it only together with the version number.
//
// Keys (the namespace by name, never by a daemon's in-memory number; its byte length
// first, so that no two (namespace, rest) pairs make the same key; no hash tags, so
// blocks spread over every master):
//   block:    kvtier:<len>:<namespace>:b:<layout digest, 16 hex>:<block hash, hex>
//   session:  kvtier:<len>:<namespace>:s:<session id>
// '{', '}' and '%' in a namespace or session id are written %7B, %7D, %25 (the length
// is the written one), so keys have no hash tags. A node only ever builds keys for the
// namespace of the engine it serves, so it cannot name another namespace's blocks.
//
// Block values: a 40-byte header, then the payload. Integers little-endian.
//   u32 magic "KVRB" ‖ u16 format version ‖ u16 header bytes (40) ‖
//   u64 payload bytes ‖ u64 xxHash3-64 of the payload ‖ u64 xxHash3-64 of the key ‖
//   u64 written (wall ms since the Unix epoch)
// A value is served only when every header field verifies against the key it was read
// under and the size the layout expects, and the payload's checksum matches: a value
// truncated, overwritten, or copied under another key is DataLoss, never bytes.
//
// Session values: an NvmeSessionRecord's value encoding (nvme_format.h) behind the same
// kind of header with magic "KVRS" (its payload checksum covers the record).
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "common/block_key.h"
#include "common/status.h"

namespace kvtier::remote {

inline constexpr uint16_t kRemoteFormatVersion = 1;
inline constexpr size_t kRemoteHeaderBytes = 40;

std::string block_key(std::string_view namespace_name, uint64_t layout_digest,
                      const BlockHash& hash);
std::string session_key(std::string_view namespace_name, std::string_view session_id);

// Header + payload, for `key`.
std::string encode_block_value(std::string_view key, std::span<const std::byte> payload,
                               uint64_t written_wall_ms);
std::string encode_session_value(std::string_view key, std::string_view record);

// The payload inside `value` read under `key`, verified; DataLoss saying what did not
// verify (magic, length, key, checksum); NotSupported for another format version (a
// node of another release wrote it: not corrupt). `expected_bytes` 0: any length.
Result<std::string_view> verify_block_value(std::string_view key, std::string_view value,
                                            uint64_t expected_bytes);
Result<std::string_view> verify_session_value(std::string_view key, std::string_view value);

}  // namespace kvtier::remote
