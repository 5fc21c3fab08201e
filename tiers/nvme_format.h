// The NVMe tier's on-disk format, version 2 (kNvmeFormatVersion). Everything the tier
// persists is described here; change it only together with the version number.
//
// Files under the tier's directory (<--data-dir>/nvme):
//   index/      RocksDB, WAL on. Column families "blocks", "sessions", "meta" (and the
//               unused "default").
//   slabs.dat   block payloads. Preallocated to the tier capacity; carved into slabs of
//               `slab_bytes`, each slab holding slots of one size (one block size). A
//               slot holds exactly one block's bytes, written and read with O_DIRECT.
//
// Integers are little-endian, fixed width. A "name" is a u8 length (1..255) followed
// by that many bytes.
//
// meta:
//   "format_version"            → u32   this format's number; a store with a newer
//                                       number is refused; version 1 (the same records
//                                       without session deltas) is upgraded in place
//   "slab_bytes"                → u64   carving unit of slabs.dat, fixed at creation
//   "layout" ‖ name(namespace) ‖ u64 layout digest
//                               → u64   block bytes of that layout
// blocks:
//   key:   name(namespace) ‖ u64 layout digest ‖ block hash (1..32 bytes, the rest of
//          the key)
//   value: u64 slot offset in slabs.dat ‖ u64 payload bytes ‖ u64 xxHash3-64 of the
//          payload ‖ u64 last access (wall clock, ms since the Unix epoch)   — 32 bytes
// sessions:
//   key:   name(namespace) ‖ session id (1..256 bytes, the rest of the key)
//   value: u64 layout digest ‖ u64 created (wall ms) ‖ u64 last active (wall ms) ‖
//          u32 turns ‖ u8 state (0 active, 1 idle) ‖ u8 retention priority (0: the
//          default, else 1..100) ‖ u32 returns ‖
//          f64 Σ ln(gap ms + 1) over the returns (IEEE-754 bits as a u64) ‖
//          u32 block count ‖ block count × name(block hash)
//   merge operands (RocksDB Merge; version 2): a session delta, so that a turn writes
//   what it added, not the whole conversation again:
//          the same header as the value (layout digest … Σ ln) ‖ u32 base count ‖
//          u32 appended count ‖ appended count × name(block hash)
//   Applied in order to the value: the header replaces the value's, and the appended
//   hashes go after the value's first `base count` blocks. A value shorter than `base
//   count` (a write that never landed) keeps what it has: a session is a prefix, so it
//   ends where its stored blocks stop.
//
// Namespaces are stored by name ("uid:1000", or a shared namespace's name), never by
// the daemon's in-memory namespace number, which is assigned afresh at every start.
//
// An index entry exists only for a payload that was durable when the entry was
// committed, and is deleted durably before its slot is written again (nvme_tier.h).
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/block_key.h"
#include "common/status.h"

namespace kvtier {

inline constexpr uint32_t kNvmeFormatVersion = 2;
// The older format a store may be upgraded from (it lacks only session deltas).
inline constexpr uint32_t kNvmeUpgradableFormatVersion = 1;

inline constexpr char kNvmeBlocksFamily[] = "blocks";
inline constexpr char kNvmeSessionsFamily[] = "sessions";
inline constexpr char kNvmeMetaFamily[] = "meta";
inline constexpr char kNvmeFormatVersionKey[] = "format_version";
inline constexpr char kNvmeSlabBytesKey[] = "slab_bytes";

// A block's persistent identity: like BlockKey, but with the namespace's name.
struct NvmeBlockKey {
  std::string namespace_name;
  uint64_t layout_digest = 0;
  BlockHash hash;
  friend bool operator==(const NvmeBlockKey&, const NvmeBlockKey&) = default;
};

struct NvmeBlockRecord {
  uint64_t offset = 0;  // slot offset in slabs.dat
  uint64_t bytes = 0;   // payload bytes (the layout's block size)
  uint64_t checksum = 0;
  uint64_t last_access_wall_ms = 0;
};

struct NvmeLayoutRecord {
  std::string namespace_name;
  uint64_t layout_digest = 0;
  uint64_t block_bytes = 0;
};

struct NvmeSessionRecord {
  std::string namespace_name;
  std::string session_id;
  uint64_t layout_digest = 0;
  uint64_t created_wall_ms = 0;
  uint64_t last_active_wall_ms = 0;
  uint32_t turns = 0;
  uint8_t state = 0;  // 0 active, 1 idle (policy::SessionState numbering)
  uint8_t priority = 0;
  uint32_t returns = 0;    // idle periods that ended with a return (the turn rhythm)
  double sum_log_gap = 0;  // Σ ln(gap ms + 1) over those returns
  std::vector<BlockHash> blocks;
  // Writing only: the stored record already holds the first `*append_from` blocks, so
  // the write is a session delta (the header and the blocks from there on) instead of
  // the whole record.
  std::optional<uint32_t> append_from;
};

// xxHash3-64 of a payload: the checksum stored in a block record.
uint64_t nvme_payload_checksum(std::span<const std::byte> payload);

std::string encode_block_key(const NvmeBlockKey& key);
std::optional<NvmeBlockKey> decode_block_key(std::string_view bytes);
std::string encode_block_record(const NvmeBlockRecord& record);
std::optional<NvmeBlockRecord> decode_block_record(std::string_view bytes);

std::string encode_layout_key(const std::string& namespace_name, uint64_t layout_digest);
std::optional<NvmeLayoutRecord> decode_layout(std::string_view key, std::string_view value);
std::string encode_u64(uint64_t value);
std::optional<uint64_t> decode_u64(std::string_view bytes);
std::string encode_u32(uint32_t value);
std::optional<uint32_t> decode_u32(std::string_view bytes);

std::string encode_session_key(const std::string& namespace_name, const std::string& session_id);
std::string encode_session_value(const NvmeSessionRecord& record);
// nullopt when either part is malformed.
std::optional<NvmeSessionRecord> decode_session(std::string_view key, std::string_view value);
// A session delta (merge operand): `record`'s header and its blocks from `base_count` on.
// REQUIRES: base_count <= record.blocks.size().
std::string encode_session_delta(const NvmeSessionRecord& record, uint32_t base_count);
// Applies a delta to `record` (see the format above); false when it is malformed.
bool apply_session_delta(NvmeSessionRecord& record, std::string_view delta);

// The layout key prefix ("layout"), for iterating layout records in meta.
std::string_view nvme_layout_prefix();

}  // namespace kvtier
