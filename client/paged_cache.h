// PagedCache: a stand-in for an engine's paged KV cache on the host backend, used by
// the example engine, the tests and the benchmarks.
//
// One memfd region holds `num_layers` × {K, V} planes laid out like vLLM's
// flash-attention cache: plane p occupies [p × num_blocks × plane_bytes, …) and engine
// block b's slice of it sits at b × plane_bytes. A logical block is 2 × num_layers
// planes of tokens_per_block × num_kv_heads × head_dim × dtype bytes each.
//
// Block contents are derived from the block hash, so any process can fill or verify a
// block knowing only its hash.
// Thread-safety: none; one owner.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/memfd_region.h"

namespace kvtier {

struct PagedCacheShape {
  std::string model_id = "example/llama-3-8b";
  uint32_t num_layers = 32;
  uint32_t num_kv_heads = 8;
  uint32_t head_dim = 128;
  uint32_t dtype_bytes = 2;  // fp16
  uint32_t tokens_per_block = 16;
  uint64_t num_blocks = 64;
  uint64_t plane_bytes() const {
    return uint64_t{tokens_per_block} * num_kv_heads * head_dim * dtype_bytes;
  }
  uint64_t block_bytes() const { return plane_bytes() * 2 * num_layers; }
  uint64_t region_bytes() const { return block_bytes() * num_blocks; }
};

class PagedCache {
 public:
  static Result<PagedCache> create(const PagedCacheShape& shape, uint32_t region_id = 0);
  // The layout of a cache of `shape` in one region: plane p of block b at
  // (p × num_blocks + b) × plane_bytes. Shared with the GPU cache, so both digest alike.
  static LayoutSpec make_layout(const PagedCacheShape& shape, uint32_t region_id);

  const LayoutSpec& layout() const { return layout_; }
  const PagedCacheShape& shape() const { return shape_; }
  const MemfdRegion& region() const { return region_; }
  uint32_t region_id() const { return region_id_; }

  // Writes the content derived from `hash` into engine block `block_id`.
  void fill(uint64_t block_id, const BlockHash& hash);
  // Whether engine block `block_id` holds exactly the content derived from `hash`.
  bool verify(uint64_t block_id, const BlockHash& hash) const;
  // Zeroes every block.
  void wipe();

  // The content of plane `plane` of the block with `hash`: a stream determined by
  // both, so a block in the wrong place or a plane at the wrong offset is caught.
  static void generate(const BlockHash& hash, uint32_t plane, std::byte* out, uint64_t bytes);

  // A chained prefix hash like an engine computes: block i's hash covers the session
  // seed and all earlier blocks. 16 bytes each.
  static std::vector<BlockHash> chain_hashes(const std::string& seed, size_t count);

 private:
  PagedCache(PagedCacheShape shape, MemfdRegion region, LayoutSpec layout, uint32_t region_id)
      : shape_(shape),
        region_(std::move(region)),
        layout_(std::move(layout)),
        region_id_(region_id) {}
  std::byte* plane_slice(uint32_t plane, uint64_t block_id) const;

  PagedCacheShape shape_;
  MemfdRegion region_;
  LayoutSpec layout_;
  uint32_t region_id_;
};

}  // namespace kvtier
