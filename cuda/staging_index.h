// Staging index math: where each byte of a staged transfer comes from and goes to.
//
// An engine on a GPU packs a request's blocks out of its paged KV cache into a
// contiguous staging buffer with a gather kernel (and unpacks a Load with a scatter
// kernel), so kvtierd moves staging ↔ its tiers in large contiguous copies instead of
// one small copy per plane (client/gpu_stager.h). This header is that kernel's whole
// address arithmetic and copy loop, written once for three callers: the CUDA kernels
// (cuda/staging_kernels.cu, nvcc), the CPU tests that check it against a plain
// reference for every layout kvtier knows, and the fake CUDA driver, whose kernel
// launch runs the same functions on the host.
//
// The staged form of a block is what kvtierd stores: the planes of a range
// [plane_begin, plane_begin + plane_count) of the layout concatenated in layout order
// (a whole block when the range is every plane). Staged block j starts at
// staging + j × row_bytes. Work unit u = j × plane_count + (p − plane_begin) copies
// plane p of staged block j: one plane slice of one engine block.
//
// Thread-safety: pure functions on their arguments.
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#define KVTIER_HD __host__ __device__ __forceinline__
#else
#define KVTIER_HD inline
#endif

namespace kvtier::staging {

// One plane of the engine's layout, in the engine's device addresses.
struct Plane {
  uint64_t base;             // address of engine block 0's slice (region base + plane offset)
  uint64_t stride;           // bytes from engine block i's slice to block i + 1's
  uint64_t bytes;            // bytes of one block's slice
  uint64_t offset_in_block;  // where the slice starts in a whole stored block
};

enum Direction : uint32_t {
  kGather = 0,   // paged cache → staging (a Save)
  kScatter = 1,  // staging → paged cache (a Load)
};

// Block ids one launch carries in its parameters, so a launch needs no device buffer
// and no upload of its own: the driver copies kernel parameters at launch. The whole
// struct stays under the 4 KiB every CUDA architecture accepts as parameters.
constexpr uint32_t kMaxBlocksPerLaunch = 960;

// One launch: its parameters, passed by value.
struct Launch {
  uint64_t planes;                          // device address of the layout's Plane table
  uint64_t staging;                         // device address of staged block 0 of this launch
  uint64_t row_bytes;                       // bytes per staged block: the range's planes together
  uint32_t plane_begin;                     // the range of planes copied
  uint32_t plane_count;                     // ≥ 1
  uint32_t block_count;                     // ≤ kMaxBlocksPerLaunch
  uint32_t direction;                       // Direction
  uint32_t block_ids[kMaxBlocksPerLaunch];  // engine block id of staged block j
};
static_assert(sizeof(Launch) <= 4096, "kernel parameters must fit 4 KiB");

// What work unit `unit` copies: `bytes` from `src` to `dst`.
struct Copy {
  uint64_t src;
  uint64_t dst;
  uint64_t bytes;
};

KVTIER_HD uint64_t unit_count(const Launch& launch) {
  return uint64_t{launch.block_count} * launch.plane_count;
}

// REQUIRES: unit < unit_count(launch); `planes` is the table `launch.planes` names.
KVTIER_HD Copy unit_copy(const Launch& launch, const Plane* planes, uint64_t unit) {
  const uint32_t j = static_cast<uint32_t>(unit / launch.plane_count);
  const uint32_t p = launch.plane_begin + static_cast<uint32_t>(unit % launch.plane_count);
  const Plane& plane = planes[p];
  const uint64_t paged = plane.base + uint64_t{launch.block_ids[j]} * plane.stride;
  const uint64_t staged = launch.staging + uint64_t{j} * launch.row_bytes +
                          (plane.offset_in_block - planes[launch.plane_begin].offset_in_block);
  if (launch.direction == kGather) return Copy{paged, staged, plane.bytes};
  return Copy{staged, paged, plane.bytes};
}

// Copies `copy` with lane `lane` of `lanes` cooperating (a CUDA block's threads; 0 of 1
// on the host): 16-byte words where both ends are 16-byte aligned, else 8, 4 or 1, and
// the bytes past the last whole word one by one. Every lane's share is disjoint.
KVTIER_HD void copy_lanes(const Copy& copy, uint32_t lane, uint32_t lanes) {
  const uint64_t both = copy.src | copy.dst;
  uint64_t word = 0;  // 0: bytes one by one
  if ((both & 15) == 0) {
    word = 16;
  } else if ((both & 7) == 0) {
    word = 8;
  } else if ((both & 3) == 0) {
    word = 4;
  }
  const uint64_t words = word == 0 ? 0 : copy.bytes / word;
  if (word == 16) {
    struct alignas(16) Word16 {
      uint64_t lo, hi;
    };
    const Word16* src = reinterpret_cast<const Word16*>(copy.src);
    Word16* dst = reinterpret_cast<Word16*>(copy.dst);
    for (uint64_t i = lane; i < words; i += lanes) dst[i] = src[i];
  } else if (word == 8) {
    const uint64_t* src = reinterpret_cast<const uint64_t*>(copy.src);
    uint64_t* dst = reinterpret_cast<uint64_t*>(copy.dst);
    for (uint64_t i = lane; i < words; i += lanes) dst[i] = src[i];
  } else if (word == 4) {
    const uint32_t* src = reinterpret_cast<const uint32_t*>(copy.src);
    uint32_t* dst = reinterpret_cast<uint32_t*>(copy.dst);
    for (uint64_t i = lane; i < words; i += lanes) dst[i] = src[i];
  }
  const uint8_t* src = reinterpret_cast<const uint8_t*>(copy.src);
  uint8_t* dst = reinterpret_cast<uint8_t*>(copy.dst);
  for (uint64_t i = words * word + lane; i < copy.bytes; i += lanes) dst[i] = src[i];
}

// The whole launch on the host, unit by unit: what the fake CUDA driver runs for a
// kernel launch, and what the CPU tests compare with their reference.
inline void run_on_host(const Launch& launch) {
  const Plane* planes = reinterpret_cast<const Plane*>(launch.planes);
  const uint64_t units = unit_count(launch);
  for (uint64_t u = 0; u < units; ++u) copy_lanes(unit_copy(launch, planes, u), 0, 1);
}

// Names of the kernels in the embedded module (cuModuleGetFunction). Each takes one
// parameter, a Launch, and copies unit u with CUDA block u (grid-stride over units).
inline constexpr const char* kKernelName = "kvtier_staging_copy";
constexpr uint32_t kThreadsPerBlock = 256;

}  // namespace kvtier::staging
