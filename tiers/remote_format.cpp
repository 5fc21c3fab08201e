#include "tiers/remote_format.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <cstring>

namespace kvtier::remote {
namespace {

constexpr uint32_t kBlockMagic = 0x4252564B;    // "KVRB" little-endian
constexpr uint32_t kSessionMagic = 0x5352564B;  // "KVRS"

template <typename T>
void put_le(std::string& out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    out.push_back(static_cast<char>(static_cast<uint64_t>(value) >> (8 * i)));
  }
}

template <typename T>
T get_le(std::string_view in, size_t at) {
  uint64_t value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    value |= static_cast<uint64_t>(static_cast<uint8_t>(in[at + i])) << (8 * i);
  }
  return static_cast<T>(value);
}

uint64_t checksum(std::string_view bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

// Braces would make a hash tag of part of a name (all of a namespace on one master):
// '{', '}' and '%' are written as %7B, %7D and %25.
std::string escaped(std::string_view name) {
  std::string out;
  out.reserve(name.size());
  for (const char ch : name) {
    if (ch == '{') {
      out += "%7B";
    } else if (ch == '}') {
      out += "%7D";
    } else if (ch == '%') {
      out += "%25";
    } else {
      out += ch;
    }
  }
  return out;
}

std::string prefix(std::string_view namespace_name) {
  const std::string name = escaped(namespace_name);
  return fmt::format("kvtier:{}:{}:", name.size(), name);
}

std::string encode(uint32_t magic, std::string_view key, std::string_view payload,
                   uint64_t written_wall_ms) {
  std::string out;
  out.reserve(kRemoteHeaderBytes + payload.size());
  put_le<uint32_t>(out, magic);
  put_le<uint16_t>(out, kRemoteFormatVersion);
  put_le<uint16_t>(out, static_cast<uint16_t>(kRemoteHeaderBytes));
  put_le<uint64_t>(out, payload.size());
  put_le<uint64_t>(out, checksum(payload));
  put_le<uint64_t>(out, checksum(key));
  put_le<uint64_t>(out, written_wall_ms);
  out.append(payload);
  return out;
}

Result<std::string_view> verify(uint32_t magic, std::string_view key, std::string_view value,
                                uint64_t expected_bytes) {
  if (value.size() < kRemoteHeaderBytes) {
    return data_loss("remote value of {} is {} bytes, shorter than its header", key, value.size());
  }
  if (get_le<uint32_t>(value, 0) != magic) {
    return data_loss("remote value of {} is not a kvtier {} value", key,
                     magic == kBlockMagic ? "block" : "session");
  }
  if (const auto version = get_le<uint16_t>(value, 4); version != kRemoteFormatVersion) {
    return not_supported("remote value of {} has format version {}; this kvtierd reads {}", key,
                         version, kRemoteFormatVersion);
  }
  if (get_le<uint16_t>(value, 6) != kRemoteHeaderBytes) {
    return data_loss("remote value of {} has a header of the wrong size", key);
  }
  const auto length = get_le<uint64_t>(value, 8);
  if (length != value.size() - kRemoteHeaderBytes) {
    return data_loss("remote value of {} says {} payload bytes but holds {} (truncated?)", key,
                     length, value.size() - kRemoteHeaderBytes);
  }
  if (expected_bytes != 0 && length != expected_bytes) {
    return data_loss("remote value of {} has {} bytes where its layout has {}", key, length,
                     expected_bytes);
  }
  if (get_le<uint64_t>(value, 24) != checksum(key)) {
    return data_loss("remote value read under {} was written under another key", key);
  }
  const std::string_view payload = value.substr(kRemoteHeaderBytes);
  if (get_le<uint64_t>(value, 16) != checksum(payload)) {
    return data_loss("remote value of {} fails its checksum", key);
  }
  return payload;
}

}  // namespace

std::string block_key(std::string_view namespace_name, uint64_t layout_digest,
                      const BlockHash& hash) {
  return fmt::format("{}b:{:016x}:{}", prefix(namespace_name), layout_digest, hash.to_hex());
}

std::string session_key(std::string_view namespace_name, std::string_view session_id) {
  return fmt::format("{}s:{}", prefix(namespace_name), escaped(session_id));
}

std::string encode_block_value(std::string_view key, std::span<const std::byte> payload,
                               uint64_t written_wall_ms) {
  return encode(kBlockMagic, key,
                std::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()),
                written_wall_ms);
}

std::string encode_session_value(std::string_view key, std::string_view record) {
  return encode(kSessionMagic, key, record, 0);
}

Result<std::string_view> verify_block_value(std::string_view key, std::string_view value,
                                            uint64_t expected_bytes) {
  return verify(kBlockMagic, key, value, expected_bytes);
}

Result<std::string_view> verify_session_value(std::string_view key, std::string_view value) {
  return verify(kSessionMagic, key, value, 0);
}

}  // namespace kvtier::remote
