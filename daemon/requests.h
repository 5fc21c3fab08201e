// Requests decoded and validated at the boundary: the handlers get plain C++ values,
// never Cap'n Proto readers, and every field error names the field.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/block_key.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "daemon/engines.h"
#include "daemon/layout.h"
#include "device/device.h"
#include "schema/kvtier.capnp.h"

namespace kvtier::daemon {

enum class BlockListKind { kSave, kLoad };

// A retention priority as a Save gives it (schema: Retention).
struct RetentionRequest {
  uint8_t priority = 0;      // 1..100; 0: not given (a session's) / clear (a range's)
  uint64_t duration_ms = 0;  // 0: until changed
};
struct BlockRangeRetention {
  uint32_t first = 0;  // index into the Save's blocks
  uint32_t count = 0;
  RetentionRequest retention;
};

// Which of a layout's planes a Load copies: planes [begin, begin + count) of
// EngineLayout::planes. count 0 means every plane.
struct BlockPlanes {
  uint32_t begin = 0;
  uint32_t count = 0;
  // The planes of `layout` in the range. REQUIRES: the range lies inside the layout
  // (decode_load_planes checked it).
  std::span<const PlaneLayout> of(const EngineLayout& layout) const {
    std::span<const PlaneLayout> all(layout.planes);
    return count == 0 ? all : all.subspan(begin, count);
  }
};

// A staged Save or Load (schema: Staging): staged block i at offset + i × row_bytes of
// the engine's region `region_id`, checked to lie inside it.
struct StagingTarget {
  uint32_t region_id = 0;
  uint64_t offset = 0;
  uint64_t row_bytes = 0;  // the bytes of the planes the request copies, per block
};

// A validated Save or Load, copied out of the wire message before any work starts.
struct BlockListRequest {
  std::string session_id;
  std::vector<BlockHash> hashes;
  std::vector<uint64_t> engine_block_ids;
  bool end_of_turn = false;
  // Load only: the planes it copies, checked against the layout (count never 0 after
  // decode_load_planes: a whole-block Load names every plane).
  BlockPlanes planes;
  // Save only.
  RetentionRequest retention;
  std::vector<BlockRangeRetention> block_retention;  // in the order given: later ones win
  // Staged (engine_block_ids then unused): where the packed blocks are.
  std::optional<StagingTarget> staging;
};

// Save (kSave: a session id is required) or Load, against the engine's layout and
// regions: at most `max_blocks` entries, hashes of 1..32 bytes, and unless `staged`
// (engine block ids unused then) engine block ids in the layout and (Load) no engine
// block named twice.
Result<BlockListRequest> decode_block_list(const EngineContext& engine, uint32_t max_blocks,
                                           capnp::Text::Reader session,
                                           capnp::List<wire::BlockRef>::Reader blocks,
                                           BlockListKind kind, bool staged = false);
// The regions a request copies from or to are registered (still, for a request that
// waited): the staging region of a staged one, else every region of the layout.
// For a staged one, its `blocks` rows still fit the region (its id may have been
// registered again, smaller, while the request waited).
Status check_request_regions(const EngineContext& engine,
                             const std::optional<StagingTarget>& staging, uint64_t blocks);
// `blocks` rows of `staging` lie inside a region of `region_bytes`.
Status check_staged_rows(const StagingTarget& staging, uint64_t blocks, uint64_t region_bytes);
// A Save's or Load's `staging` into `request.staging` (its hashes, and a Load's planes,
// already decoded): a region registered on this connection, and every staged block
// inside it, without overflow.
Status decode_staging(const EngineContext& engine, wire::Staging::Reader staging,
                      BlockListRequest& request, BlockListKind kind);
// Save's retention fields into `request` (its hashes already decoded): priorities
// 0..100, a duration only with a priority, ranges of at least one block inside the
// Save's blocks that cover no more blocks in total than the Save has.
Status decode_save_retention(wire::Save::Reader save, BlockListRequest& request);
// Load's planeBegin/planeCount into `request.planes`, against the engine's layout:
// planeCount 0 is every plane (planeBegin must then be 0); otherwise planeBegin is a
// plane of the layout and planeBegin + planeCount does not pass its plane count.
Status decode_load_planes(const EngineLayout& layout, wire::Load::Reader load,
                          BlockListRequest& request);
// Lookup: at most `max_blocks` hashes of 1..32 bytes each.
Result<std::vector<BlockHash>> decode_lookup(uint32_t max_blocks,
                                             capnp::List<capnp::Data>::Reader hashes);

// Hello, copied out. The layout is parsed here; its error is kept (not returned) so the
// handler still answers the checks that come before it in their order (protocol
// version, engine name, device kind).
struct HelloRequest {
  uint32_t protocol_version = 0;
  std::string engine_name;
  wire::DeviceKind device_kind = wire::DeviceKind::HOST;
  Result<EngineLayout> layout = internal_error("no layout decoded");
  uint32_t tokens_per_block = 0;
  double prefill_tokens_per_second = 0;
  wire::DataPath data_path = wire::DataPath::PLANE_COPIES;
};
HelloRequest decode_hello(wire::Hello::Reader hello, const LayoutLimits& limits);

// The session an operator request names, and the request's other fields.
struct SessionTarget {
  std::string session_id;      // may be empty (Evict by idle time)
  std::string namespace_name;  // empty: the caller's, or wherever the id is (admin)
};
struct EvictRequest {
  SessionTarget target;
  uint64_t idle_over_ms = 0;  // with no session id: every session idle longer than this
};
struct PinRequest {
  SessionTarget target;
  bool pinned = false;
};
// A ListSessions page (schema/kvtier.capnp): `limit` 0 is the default page.
struct ListSessionsRequest {
  bool all_namespaces = false;
  uint32_t limit = 0;
  wire::SessionOrder order = wire::SessionOrder::IDLE;
  std::string after;  // the cursor: the previous page's `next`
};
ListSessionsRequest decode_list_sessions(wire::ListSessions::Reader request);
SessionTarget decode_get_session(wire::GetSession::Reader request);
EvictRequest decode_evict(wire::Evict::Reader request);
PinRequest decode_pin(wire::Pin::Reader request);

// RegisterRegion's fields checked against each other and the descriptors that came
// with it (`fds`, taken): sizeBytes in 1..kMaxRegionBytes, a memfd with one descriptor
// at offset 0, a cudaIpc handle of 64 bytes with no descriptor, a cudaVmmFd region
// with one nonzero chunk size per descriptor whose chunks hold offset + size, no
// overflow anywhere, gpuUuid at most kMaxGpuUuidBytes. The backend's checks (kinds it
// serves, which GPU) come later, so a malformed request is named as such on any daemon.
constexpr uint64_t kMaxRegionBytes = 1ull << 40;
constexpr size_t kMaxGpuUuidBytes = 64;
Result<RegionHandle> decode_register_region(wire::RegisterRegion::Reader region,
                                            std::vector<UniqueFd> fds);

}  // namespace kvtier::daemon
