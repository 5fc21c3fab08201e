// Names shared by every component: the tiers, a block's hash, and the key that
// identifies a stored block (namespace, layout digest, block hash).
// Values only; thread-safety is the holder's concern.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

namespace kvtier {

// The tiers that hold bytes, top (closest to the engine) to bottom, then kNone for "not
// held". What each tier can do, and which of them a daemon runs, is TierTopology's
// (common/tier_topology.h). The wire and C numbering differ (none = 3, remote = 4, kept
// for compatibility): schema/wire_tier.h and the C ABI convert.
enum class Tier : uint8_t { kHbm = 0, kRam = 1, kNvme = 2, kRemote = 3, kNone = 4 };
inline constexpr int kTierCount = 4;       // tiers that hold bytes (kNone excluded)
inline constexpr int kLocalTierCount = 3;  // HBM, RAM, NVMe: this node's, in BlockStore's slots
std::string_view tier_name(Tier tier);     // "hbm", "ram", "nvme", "remote", "none"

// An engine-computed block hash: 1..32 opaque bytes.
class BlockHash {
 public:
  static constexpr size_t kMaxBytes = 32;

  BlockHash() = default;
  // REQUIRES: 1 <= bytes.size() <= kMaxBytes (callers validate client input first).
  explicit BlockHash(std::span<const uint8_t> bytes) : size_(static_cast<uint8_t>(bytes.size())) {
    std::memcpy(bytes_.data(), bytes.data(), bytes.size());
  }
  std::span<const uint8_t> bytes() const { return {bytes_.data(), size_}; }
  size_t size() const { return size_; }
  std::string to_hex() const;

  friend bool operator==(const BlockHash& a, const BlockHash& b) {
    return a.size_ == b.size_ && std::memcmp(a.bytes_.data(), b.bytes_.data(), a.size_) == 0;
  }

 private:
  std::array<uint8_t, kMaxBytes> bytes_{};
  uint8_t size_ = 0;
};

// The hashers are noexcept: then std::unordered_map does not keep each node's hash code
// beside it (8 bytes per block, twice), and recomputes it when it needs it.
struct BlockHashHasher {
  size_t operator()(const BlockHash& hash) const noexcept;
};

// Identifies the (namespace, layout) a block belongs to. Blocks are interchangeable
// only between equal LayoutKeys.
struct LayoutKey {
  uint32_t namespace_id = 0;
  uint64_t layout_digest = 0;
  friend bool operator==(const LayoutKey&, const LayoutKey&) = default;
};

struct LayoutKeyHasher {
  size_t operator()(const LayoutKey& key) const noexcept {
    return std::hash<uint64_t>()(key.layout_digest * 0x9E3779B97F4A7C15ull ^ key.namespace_id);
  }
};

struct BlockKey {
  LayoutKey layout;
  BlockHash hash;
  friend bool operator==(const BlockKey&, const BlockKey&) = default;
};

struct BlockKeyHasher {
  size_t operator()(const BlockKey& key) const noexcept {
    return BlockHashHasher()(key.hash) ^ (LayoutKeyHasher()(key.layout) * 31);
  }
};

}  // namespace kvtier
