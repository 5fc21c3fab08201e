#include "tiers/nvme_format.h"

#include <xxhash.h>

#include <bit>
#include <cstring>

namespace kvtier {
namespace {

constexpr std::string_view kLayoutPrefix = "layout";
constexpr size_t kMaxSessionIdBytes = 256;

void put_u8(std::string& out, uint8_t value) {
  out.push_back(static_cast<char>(value));
}

template <typename T>
void put_le(std::string& out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i)
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void put_name(std::string& out, std::string_view name) {
  put_u8(out, static_cast<uint8_t>(name.size()));
  out.append(name);
}

// Reads fixed-width fields off the front of a byte string; any read past the end
// sets failed() and returns zeros, so decoders check once at the end.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  template <typename T>
  T le() {
    if (bytes_.size() < sizeof(T)) return fail<T>();
    T value = 0;
    for (size_t i = 0; i < sizeof(T); ++i) {
      value |= static_cast<T>(static_cast<uint8_t>(bytes_[i])) << (8 * i);
    }
    bytes_.remove_prefix(sizeof(T));
    return value;
  }
  // A u8-length-prefixed name of 1..255 bytes.
  std::string_view name() {
    const uint8_t length = le<uint8_t>();
    if (failed_ || length == 0 || bytes_.size() < length) return fail<std::string_view>();
    std::string_view out = bytes_.substr(0, length);
    bytes_.remove_prefix(length);
    return out;
  }
  std::string_view rest() { return std::exchange(bytes_, std::string_view()); }
  bool failed() const { return failed_; }
  bool at_end() const { return bytes_.empty(); }

 private:
  template <typename T>
  T fail() {
    failed_ = true;
    bytes_ = {};
    return T{};
  }
  std::string_view bytes_;
  bool failed_ = false;
};

std::optional<BlockHash> to_hash(std::string_view bytes) {
  if (bytes.empty() || bytes.size() > BlockHash::kMaxBytes) return std::nullopt;
  return BlockHash(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

std::string_view hash_view(const BlockHash& hash) {
  return {reinterpret_cast<const char*>(hash.bytes().data()), hash.size()};
}

}  // namespace

uint64_t nvme_payload_checksum(std::span<const std::byte> payload) {
  return XXH3_64bits(payload.data(), payload.size());
}

std::string encode_block_key(const NvmeBlockKey& key) {
  std::string out;
  out.reserve(1 + key.namespace_name.size() + 8 + key.hash.size());
  put_name(out, key.namespace_name);
  put_le<uint64_t>(out, key.layout_digest);
  out.append(hash_view(key.hash));
  return out;
}

std::optional<NvmeBlockKey> decode_block_key(std::string_view bytes) {
  Reader in(bytes);
  NvmeBlockKey key;
  key.namespace_name = std::string(in.name());
  key.layout_digest = in.le<uint64_t>();
  if (in.failed()) return std::nullopt;
  auto hash = to_hash(in.rest());
  if (!hash) return std::nullopt;
  key.hash = *hash;
  return key;
}

std::string encode_block_record(const NvmeBlockRecord& record) {
  std::string out;
  out.reserve(32);
  put_le<uint64_t>(out, record.offset);
  put_le<uint64_t>(out, record.bytes);
  put_le<uint64_t>(out, record.checksum);
  put_le<uint64_t>(out, record.last_access_wall_ms);
  return out;
}

std::optional<NvmeBlockRecord> decode_block_record(std::string_view bytes) {
  Reader in(bytes);
  NvmeBlockRecord record;
  record.offset = in.le<uint64_t>();
  record.bytes = in.le<uint64_t>();
  record.checksum = in.le<uint64_t>();
  record.last_access_wall_ms = in.le<uint64_t>();
  if (in.failed() || !in.at_end() || record.bytes == 0) return std::nullopt;
  return record;
}

std::string_view nvme_layout_prefix() {
  return kLayoutPrefix;
}

std::string encode_layout_key(const std::string& namespace_name, uint64_t layout_digest) {
  std::string out(kLayoutPrefix);
  put_name(out, namespace_name);
  put_le<uint64_t>(out, layout_digest);
  return out;
}

std::optional<NvmeLayoutRecord> decode_layout(std::string_view key, std::string_view value) {
  if (key.substr(0, kLayoutPrefix.size()) != kLayoutPrefix) return std::nullopt;
  Reader in(key.substr(kLayoutPrefix.size()));
  NvmeLayoutRecord record;
  record.namespace_name = std::string(in.name());
  record.layout_digest = in.le<uint64_t>();
  if (in.failed() || !in.at_end()) return std::nullopt;
  auto block_bytes = decode_u64(value);
  if (!block_bytes || *block_bytes == 0) return std::nullopt;
  record.block_bytes = *block_bytes;
  return record;
}

std::string encode_u64(uint64_t value) {
  std::string out;
  put_le<uint64_t>(out, value);
  return out;
}

std::optional<uint64_t> decode_u64(std::string_view bytes) {
  Reader in(bytes);
  uint64_t value = in.le<uint64_t>();
  if (in.failed() || !in.at_end()) return std::nullopt;
  return value;
}

std::string encode_u32(uint32_t value) {
  std::string out;
  put_le<uint32_t>(out, value);
  return out;
}

std::optional<uint32_t> decode_u32(std::string_view bytes) {
  Reader in(bytes);
  uint32_t value = in.le<uint32_t>();
  if (in.failed() || !in.at_end()) return std::nullopt;
  return value;
}

std::string encode_session_key(const std::string& namespace_name, const std::string& session_id) {
  std::string out;
  put_name(out, namespace_name);
  out.append(session_id);
  return out;
}

namespace {

void put_session_header(std::string& out, const NvmeSessionRecord& record) {
  put_le<uint64_t>(out, record.layout_digest);
  put_le<uint64_t>(out, record.created_wall_ms);
  put_le<uint64_t>(out, record.last_active_wall_ms);
  put_le<uint32_t>(out, record.turns);
  put_u8(out, record.state);
  put_u8(out, record.priority);
  put_le<uint32_t>(out, record.returns);
  put_le<uint64_t>(out, std::bit_cast<uint64_t>(record.sum_log_gap));
}

bool read_session_header(Reader& in, NvmeSessionRecord& record) {
  record.layout_digest = in.le<uint64_t>();
  record.created_wall_ms = in.le<uint64_t>();
  record.last_active_wall_ms = in.le<uint64_t>();
  record.turns = in.le<uint32_t>();
  record.state = in.le<uint8_t>();
  record.priority = in.le<uint8_t>();
  record.returns = in.le<uint32_t>();
  record.sum_log_gap = std::bit_cast<double>(in.le<uint64_t>());
  return !in.failed() && record.state <= 1;
}

// Reads `count` hashes onto `blocks`; false when malformed.
bool read_hashes(Reader& in, uint32_t count, size_t value_bytes, std::vector<BlockHash>& blocks) {
  // Each hash takes at least 2 bytes, so a count beyond that is corrupt, not a reason
  // to reserve gigabytes.
  if (count > value_bytes / 2) return false;
  blocks.reserve(blocks.size() + count);
  for (uint32_t i = 0; i < count; ++i) {
    auto hash = to_hash(in.name());
    if (in.failed() || !hash) return false;
    blocks.push_back(*hash);
  }
  return true;
}

}  // namespace

std::string encode_session_value(const NvmeSessionRecord& record) {
  std::string out;
  out.reserve(46 + record.blocks.size() * 17);
  put_session_header(out, record);
  put_le<uint32_t>(out, static_cast<uint32_t>(record.blocks.size()));
  for (const BlockHash& hash : record.blocks) put_name(out, hash_view(hash));
  return out;
}

std::string encode_session_delta(const NvmeSessionRecord& record, uint32_t base_count) {
  std::string out;
  const size_t appended = record.blocks.size() - base_count;
  out.reserve(50 + appended * 17);
  put_session_header(out, record);
  put_le<uint32_t>(out, base_count);
  put_le<uint32_t>(out, static_cast<uint32_t>(appended));
  for (size_t i = base_count; i < record.blocks.size(); ++i) {
    put_name(out, hash_view(record.blocks[i]));
  }
  return out;
}

bool apply_session_delta(NvmeSessionRecord& record, std::string_view delta) {
  Reader in(delta);
  NvmeSessionRecord header;
  if (!read_session_header(in, header)) return false;
  const uint32_t base_count = in.le<uint32_t>();
  const uint32_t count = in.le<uint32_t>();
  if (in.failed()) return false;
  std::vector<BlockHash> appended;
  if (!read_hashes(in, count, delta.size(), appended) || !in.at_end()) return false;
  record.layout_digest = header.layout_digest;
  record.created_wall_ms = header.created_wall_ms;
  record.last_active_wall_ms = header.last_active_wall_ms;
  record.turns = header.turns;
  record.state = header.state;
  record.priority = header.priority;
  record.returns = header.returns;
  record.sum_log_gap = header.sum_log_gap;
  // A stored prefix shorter than the delta's base lost a write: the session ends there.
  if (record.blocks.size() < base_count) return true;
  record.blocks.resize(base_count);
  record.blocks.insert(record.blocks.end(), appended.begin(), appended.end());
  return true;
}

std::optional<NvmeSessionRecord> decode_session(std::string_view key, std::string_view value) {
  NvmeSessionRecord record;
  Reader k(key);
  record.namespace_name = std::string(k.name());
  record.session_id = std::string(k.rest());
  if (k.failed() || record.session_id.empty() || record.session_id.size() > kMaxSessionIdBytes) {
    return std::nullopt;
  }
  Reader in(value);
  if (!read_session_header(in, record)) return std::nullopt;
  const uint32_t count = in.le<uint32_t>();
  if (in.failed() || !read_hashes(in, count, value.size(), record.blocks)) return std::nullopt;
  if (!in.at_end()) return std::nullopt;
  return record;
}

}  // namespace kvtier
