#include "client/paged_cache.h"

#include <xxhash.h>

#include <cstring>

namespace kvtier {

void PagedCache::generate(const BlockHash& hash, uint32_t plane, std::byte* out, uint64_t bytes) {
  auto hb = hash.bytes();
  uint64_t state = XXH3_64bits_withSeed(hb.data(), hb.size(), plane + 1) | 1;
  uint64_t words = bytes / 8;
  for (uint64_t i = 0; i < words; ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    std::memcpy(out + i * 8, &state, 8);
  }
  for (uint64_t i = words * 8; i < bytes; ++i) out[i] = static_cast<std::byte>(state >> (i % 8));
}

LayoutSpec PagedCache::make_layout(const PagedCacheShape& shape, uint32_t region_id) {
  LayoutSpec layout;
  layout.model_id = shape.model_id;
  layout.num_layers = shape.num_layers;
  layout.num_kv_heads = shape.num_kv_heads;
  layout.head_dim = shape.head_dim;
  layout.dtype = shape.dtype_bytes == 2 ? "fp16" : fmt::format("{}byte", shape.dtype_bytes);
  layout.tokens_per_block = shape.tokens_per_block;
  layout.num_blocks = shape.num_blocks;
  for (uint32_t p = 0; p < 2 * shape.num_layers; ++p) {
    layout.planes.push_back(PlaneSpec{region_id,
                                      uint64_t{p} * shape.num_blocks * shape.plane_bytes(),
                                      shape.plane_bytes(), shape.plane_bytes()});
  }
  return layout;
}

Result<PagedCache> PagedCache::create(const PagedCacheShape& shape, uint32_t region_id) {
  auto region = MemfdRegion::create("kvtier-paged-cache", shape.region_bytes());
  if (!region.is_ok()) return region.status();
  return PagedCache(shape, std::move(*region), make_layout(shape, region_id), region_id);
}

std::byte* PagedCache::plane_slice(uint32_t plane, uint64_t block_id) const {
  const PlaneSpec& spec = layout_.planes[plane];
  return region_.data() + spec.offset_bytes + block_id * spec.stride_bytes;
}

void PagedCache::fill(uint64_t block_id, const BlockHash& hash) {
  for (uint32_t p = 0; p < layout_.planes.size(); ++p) {
    generate(hash, p, plane_slice(p, block_id), shape_.plane_bytes());
  }
}

bool PagedCache::verify(uint64_t block_id, const BlockHash& hash) const {
  std::vector<std::byte> expected(shape_.plane_bytes());
  for (uint32_t p = 0; p < layout_.planes.size(); ++p) {
    generate(hash, p, expected.data(), expected.size());
    if (std::memcmp(expected.data(), plane_slice(p, block_id), expected.size()) != 0) return false;
  }
  return true;
}

void PagedCache::wipe() {
  std::memset(region_.data(), 0, region_.size_bytes());
}

std::vector<BlockHash> PagedCache::chain_hashes(const std::string& seed, size_t count) {
  std::vector<BlockHash> hashes;
  XXH128_hash_t parent = XXH3_128bits(seed.data(), seed.size());
  for (size_t i = 0; i < count; ++i) {
    uint64_t input[3] = {parent.low64, parent.high64, i};
    parent = XXH3_128bits(input, sizeof(input));
    uint8_t bytes[16];
    std::memcpy(bytes, &parent.low64, 8);
    std::memcpy(bytes + 8, &parent.high64, 8);
    hashes.emplace_back(std::span<const uint8_t>(bytes, 16));
  }
  return hashes;
}

}  // namespace kvtier
