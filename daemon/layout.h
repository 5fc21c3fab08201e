// EngineLayout: a validated copy of an engine's Hello layout, its digest, and the
// address arithmetic from (engine block id, plane) to a byte offset in a region.
//
// The digest covers what makes block bytes interchangeable: model, shape, dtype, TP
// position, extra key and the bytes of each plane in order. It does not cover where
// the engine keeps them (regions, offsets, strides, block count), so two engines
// with the same model and shape share blocks whatever their memory looks like.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "schema/kvtier.capnp.h"

namespace kvtier::daemon {

struct PlaneLayout {
  uint32_t region_id;
  uint64_t offset_bytes;
  uint64_t stride_bytes;
  uint64_t bytes_per_block;
  uint64_t offset_in_block;  // where this plane's bytes start inside a stored block
};

struct LayoutLimits {
  uint32_t max_planes = 1024;
  uint64_t max_block_bytes = 64ull << 20;
  uint64_t max_engine_blocks = 1ull << 32;
};

struct EngineLayout {
  std::string model_id;
  uint32_t tp_rank = 0, tp_size = 1;
  uint64_t num_blocks = 0;
  std::vector<PlaneLayout> planes;
  uint64_t block_bytes = 0;
  uint64_t digest = 0;

  // Validates `layout` (every field named in errors) and builds the EngineLayout.
  static Result<EngineLayout> from_wire(wire::Layout::Reader layout, const LayoutLimits& limits);

  // Checks every plane that lives in `region_id` fits a region of `region_bytes` for
  // all num_blocks engine blocks.
  Status check_region(uint32_t region_id, uint64_t region_bytes) const;

  uint64_t plane_offset(const PlaneLayout& plane, uint64_t engine_block_id) const {
    return plane.offset_bytes + engine_block_id * plane.stride_bytes;
  }
};

}  // namespace kvtier::daemon
