#include "daemon/layout.h"

#include <xxhash.h>

#include <limits>

namespace kvtier::daemon {
namespace {

// Appends fields to a digest input with explicit lengths so ("ab","c") ≠ ("a","bc").
class DigestInput {
 public:
  void add(uint64_t value) { bytes_.append(reinterpret_cast<const char*>(&value), sizeof(value)); }
  void add(std::string_view text) {
    add(static_cast<uint64_t>(text.size()));
    bytes_.append(text);
  }
  uint64_t digest() const { return XXH3_64bits(bytes_.data(), bytes_.size()); }

 private:
  std::string bytes_;
};

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}
bool add_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_add_overflow(a, b, out);
}

}  // namespace

Result<EngineLayout> EngineLayout::from_wire(wire::Layout::Reader layout,
                                             const LayoutLimits& limits) {
  EngineLayout out;
  out.model_id = layout.getModelId().cStr();
  out.num_blocks = layout.getNumBlocks();
  if (out.model_id.empty()) return invalid_argument("layout.modelId is empty");
  if (out.model_id.size() > 256) return invalid_argument("layout.modelId is longer than 256 bytes");
  if (layout.getDtype().size() > 32)
    return invalid_argument("layout.dtype is longer than 32 bytes");
  if (layout.getExtraKey().size() > 256)
    return invalid_argument("layout.extraKey is longer than 256 bytes");
  if (out.num_blocks == 0 || out.num_blocks > limits.max_engine_blocks) {
    return invalid_argument("layout.numBlocks {} is outside 1..{}", out.num_blocks,
                            limits.max_engine_blocks);
  }
  if (layout.getTpSize() == 0 || layout.getTpRank() >= layout.getTpSize()) {
    return invalid_argument("layout.tpRank {} is not below layout.tpSize {}", layout.getTpRank(),
                            layout.getTpSize());
  }
  auto planes = layout.getPlanes();
  if (planes.size() == 0 || planes.size() > limits.max_planes) {
    return invalid_argument("layout.planes has {} entries; 1..{} allowed", planes.size(),
                            limits.max_planes);
  }
  out.tp_rank = layout.getTpRank();
  out.tp_size = layout.getTpSize();
  DigestInput digest;
  digest.add(out.model_id);
  digest.add(layout.getNumLayers());
  digest.add(layout.getNumKvHeads());
  digest.add(layout.getHeadDim());
  digest.add(std::string_view(layout.getDtype().cStr()));
  digest.add(layout.getTokensPerBlock());
  digest.add(layout.getTpRank());
  digest.add(layout.getTpSize());
  digest.add(std::string_view(layout.getExtraKey().cStr()));
  digest.add(planes.size());
  for (unsigned i = 0; i < planes.size(); ++i) {
    auto plane = planes[i];
    PlaneLayout p{plane.getRegionId(), plane.getOffsetBytes(), plane.getStrideBytes(),
                  plane.getBytesPerBlock(), out.block_bytes};
    if (p.bytes_per_block == 0) return invalid_argument("layout.planes[{}].bytesPerBlock is 0", i);
    if (out.num_blocks > 1 && p.stride_bytes < p.bytes_per_block) {
      return invalid_argument(
          "layout.planes[{}].strideBytes {} is below bytesPerBlock {}: blocks would overlap", i,
          p.stride_bytes, p.bytes_per_block);
    }
    if (add_overflows(out.block_bytes, p.bytes_per_block, &out.block_bytes) ||
        out.block_bytes > limits.max_block_bytes) {
      return invalid_argument(
          "layout blocks exceed the largest block size of {} bytes (at planes[{}])",
          limits.max_block_bytes, i);
    }
    digest.add(p.bytes_per_block);
    out.planes.push_back(p);
  }
  out.digest = digest.digest();
  return out;
}

Status EngineLayout::check_region(uint32_t region_id, uint64_t region_bytes) const {
  for (size_t i = 0; i < planes.size(); ++i) {
    const PlaneLayout& p = planes[i];
    if (p.region_id != region_id) continue;
    uint64_t last_start = 0, end = 0;
    if (mul_overflows(num_blocks - 1, p.stride_bytes, &last_start) ||
        add_overflows(last_start, p.offset_bytes, &last_start) ||
        add_overflows(last_start, p.bytes_per_block, &end) || end > region_bytes) {
      return invalid_argument(
          "layout.planes[{}] does not fit region {}: block {} would end at byte {} of a {}-byte "
          "region",
          i, region_id, num_blocks - 1, end == 0 ? std::string("(overflow)") : std::to_string(end),
          region_bytes);
    }
  }
  return Status::ok();
}

}  // namespace kvtier::daemon
