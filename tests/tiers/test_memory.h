// Test helpers for the tier tests: a Memory backed by a std::vector (the store never
// touches the bytes) and short ways to build block keys.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/block_key.h"
#include "device/device.h"

namespace kvtier::tiers_test {

class VectorMemory final : public Memory {
 public:
  explicit VectorMemory(uint64_t bytes) : bytes_(bytes) {}
  uint64_t size_bytes() const override { return bytes_.size(); }
  MemoryLocation location() const override { return MemoryLocation::kHost; }
  std::byte* host_data() override { return bytes_.data(); }
  std::string describe() const override { return "test vector memory"; }

 private:
  std::vector<std::byte> bytes_;
};

inline std::shared_ptr<Memory> make_memory(uint64_t bytes) {
  return std::make_shared<VectorMemory>(bytes);
}

// A 4-byte hash spelling `n`, so keys are distinct per n.
inline BlockHash hash_of(uint32_t n) {
  const uint8_t bytes[4] = {static_cast<uint8_t>(n), static_cast<uint8_t>(n >> 8),
                            static_cast<uint8_t>(n >> 16), static_cast<uint8_t>(n >> 24)};
  return BlockHash(bytes);
}

inline BlockKey key_of(const LayoutKey& layout, uint32_t n) {
  return BlockKey{layout, hash_of(n)};
}

}  // namespace kvtier::tiers_test
