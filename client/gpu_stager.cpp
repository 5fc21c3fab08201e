#include "client/gpu_stager.h"

#include <algorithm>
#include <optional>
#include <unordered_set>
#include <utility>

#include "client/cuda_regions.h"
#include "client/staging_kernels.h"
#include "cuda/driver_api.h"
#include "cuda/staging_index.h"

namespace kvtier {
namespace {

using cuda::driver_status;
using cuda::DriverApi;

// Makes `context` current for a scope unless it already is, and puts the thread's own
// context back afterwards (the caller is an engine thread whose choice must survive).
class ContextScope {
 public:
  static Result<ContextScope> enter(const DriverApi& api, CUcontext context) {
    ContextScope scope(api);
    KVTIER_RETURN_IF_ERROR(driver_status(api.ctx_get_current(&scope.previous_), "cuCtxGetCurrent"));
    if (scope.previous_ != context) {
      KVTIER_RETURN_IF_ERROR(driver_status(api.ctx_set_current(context), "cuCtxSetCurrent"));
      scope.restore_ = true;
    }
    return scope;
  }
  ContextScope(ContextScope&& other) noexcept
      : api_(other.api_),
        previous_(other.previous_),
        restore_(std::exchange(other.restore_, false)) {}
  ContextScope& operator=(ContextScope&&) = delete;
  ~ContextScope() {
    if (restore_) (void)api_->ctx_set_current(previous_);
  }

 private:
  explicit ContextScope(const DriverApi& api) : api_(&api) {}
  const DriverApi* api_;
  CUcontext previous_ = nullptr;
  bool restore_ = false;
};

}  // namespace

// A chunk of a request in the ring: one Save or one Load of `count` blocks from
// `first`, its staged rows at ring offset `offset`.
struct GpuStager::Piece {
  uint32_t range = 0;  // the load's range index (0 for a Save)
  size_t first = 0;
  size_t count = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  bool sent = false;
  bool skipped = false;                     // after its range stopped: never sent
  bool done = false;                        // its reply consumed (and scatter queued)
  CUevent event = nullptr;                  // after its scatter; nullptr: nothing queued
  std::optional<Pending<SaveResult>> save;  // a Save's reply
  std::optional<Pending<LoadResult>> load;  // a Load's reply
};

struct GpuStager::State {
  const DriverApi* api = nullptr;
  CUdevice device = 0;
  CUcontext context = nullptr;  // the device's primary context, retained
  std::unique_ptr<StagingKernels> kernels;
  CUdeviceptr ring = 0;
  CUdeviceptr plane_table = 0;
  uint64_t ring_bytes = 0;
  uint32_t region_id = 0;
  bool registered = false;
  std::vector<staging::Plane> planes;
  uint64_t num_blocks = 0;
  uint64_t block_bytes = 0;
  uint32_t max_blocks = 0;  // per request (HelloInfo)
  std::vector<CUevent> spare_events;

  // Pieces holding ring space, oldest first; `head` is where the next one goes.
  std::deque<Piece*> ring_pieces;
  uint64_t head = 0;

  // The layer-wise Load in progress.
  bool loading = false;
  std::string session_id;
  std::vector<BlockRef> blocks;
  std::vector<PlaneRange> ranges;  // resolved: count ≥ 1
  std::vector<uint64_t> row_bytes;
  std::vector<std::unique_ptr<Piece>> pieces;  // every piece of the load, in order
  std::vector<size_t> range_first_piece;       // index of each range's first piece
  size_t next_unsent = 0;
  size_t next_range = 0;

  ~State() {
    if (api == nullptr || context == nullptr) return;
    auto scope = ContextScope::enter(*api, context);
    if (scope.is_ok()) {
      for (CUevent event : spare_events) (void)api->event_destroy(event);
      if (plane_table != 0) (void)api->mem_free(plane_table);
      if (ring != 0) (void)api->mem_free(ring);
      kernels.reset();
    } else {
      (void)kernels.release();  // leaked: unloading needs its context
    }
    (void)api->primary_ctx_release(device);
  }

  Result<CUevent> take_event() {
    if (!spare_events.empty()) {
      CUevent event = spare_events.back();
      spare_events.pop_back();
      return event;
    }
    CUevent event = nullptr;
    KVTIER_RETURN_IF_ERROR(
        driver_status(api->event_create(&event, CU_EVENT_DISABLE_TIMING), "cuEventCreate"));
    return event;
  }

  // Where `bytes` fit in the ring now, or nullopt. REQUIRES: bytes ≤ ring_bytes.
  std::optional<uint64_t> fit(uint64_t bytes) const {
    if (ring_pieces.empty()) return 0;
    const uint64_t tail = ring_pieces.front()->offset;
    if (head > tail) {  // used: [tail, head)
      if (ring_bytes - head >= bytes) return head;
      if (tail >= bytes) return 0;
      return std::nullopt;
    }
    // Wrapped (head ≤ tail): free is [head, tail).
    if (tail - head >= bytes) return head;
    return std::nullopt;
  }
  void occupy(Piece* piece, uint64_t offset) {
    piece->offset = offset;
    head = offset + piece->bytes;
    ring_pieces.push_back(piece);
  }
  void release_front() {
    ring_pieces.pop_front();
    if (ring_pieces.empty()) head = 0;
  }

  // Queues the kernel copying planes [range.begin, +count) of `blocks` between the
  // engine's cache and ring rows from `offset`, `row` bytes each.
  Status launch(PlaneRange range, uint64_t row, std::span<const BlockRef> blocks, uint64_t offset,
                staging::Direction direction, CUstream stream) {
    ids.clear();
    for (const BlockRef& block : blocks)
      ids.push_back(static_cast<uint32_t>(block.engine_block_id));
    return kernels
        ->copy(plane_table, range.begin, range.count, row, ids, ring + offset, direction, stream)
        .status();
  }

  // Waits until what is queued on `stream` is done: through an event where one can be
  // recorded, else the whole stream (never on the word of an event not recorded).
  Status wait_for(CUstream stream, const char* what) {
    auto event = take_event();
    if (event.is_ok()) {
      Status recorded = driver_status(api->event_record(*event, stream), "cuEventRecord");
      Status waited =
          recorded.is_ok() ? driver_status(api->event_synchronize(*event), what) : recorded;
      spare_events.push_back(*event);
      if (recorded.is_ok()) return waited;
    }
    return driver_status(api->stream_synchronize(stream), what);
  }
  // The first error that left a layer-wise Load in an unknown state; later calls return
  // it until end_load.
  Status broken;
  std::vector<uint32_t> ids;  // launch()'s scratch
};

bool GpuStager::kernels_built() {
  return StagingKernels::built();
}

Status GpuStager::probe(CUdeviceptr cache_ptr) {
  if (!StagingKernels::built()) {
    return unavailable("this libkvtier was built without nvcc: no staging kernels");
  }
  auto api = DriverApi::get();
  if (!api.is_ok()) return api.status();
  const DriverApi& cu = **api;
  int ordinal = -1;
  KVTIER_RETURN_IF_ERROR(driver_status(
      cu.pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, cache_ptr),
      "the cache's GPU (cuPointerGetAttribute)"));
  CUdevice device = 0;
  KVTIER_RETURN_IF_ERROR(driver_status(cu.device_get(&device, ordinal), "cuDeviceGet"));
  CUcontext primary = nullptr;
  KVTIER_RETURN_IF_ERROR(
      driver_status(cu.primary_ctx_retain(&primary, device), "cuDevicePrimaryCtxRetain"));
  Status status;
  {
    auto scope = ContextScope::enter(cu, primary);
    if (!scope.is_ok()) {
      status = scope.status();
    } else {
      auto kernels = StagingKernels::load(cu);
      status = kernels.status();
    }
  }
  (void)cu.primary_ctx_release(device);
  return status;
}

Result<std::unique_ptr<GpuStager>> GpuStager::create(
    Client& client, const HelloInfo& hello, const LayoutSpec& layout,
    const std::map<uint32_t, CUdeviceptr>& region_bases, const GpuStagerOptions& options) {
  if (!hello.staging) {
    return not_supported("this kvtierd predates staged transfers; use the plane-copy path");
  }
  if (!StagingKernels::built()) {
    return unavailable("this libkvtier was built without nvcc: no staging kernels");
  }
  if (layout.planes.empty()) return invalid_argument("the layout has no planes");
  auto state = std::make_unique<State>();
  uint64_t offset_in_block = 0;
  for (size_t i = 0; i < layout.planes.size(); ++i) {
    const PlaneSpec& plane = layout.planes[i];
    auto base = region_bases.find(plane.region_id);
    if (base == region_bases.end()) {
      return invalid_argument("layout.planes[{}] names region {}, which has no device address", i,
                              plane.region_id);
    }
    if (plane.region_id == options.region_id) {
      return invalid_argument("the staging region id {} is a plane's region", options.region_id);
    }
    state->planes.push_back({base->second + plane.offset_bytes, plane.stride_bytes,
                             plane.bytes_per_block, offset_in_block});
    offset_in_block += plane.bytes_per_block;
  }
  state->block_bytes = offset_in_block;
  state->num_blocks = layout.num_blocks;
  if (layout.num_blocks > (uint64_t{1} << 32)) {
    return invalid_argument("the layout has {} blocks; the kernels address 2^32",
                            layout.num_blocks);
  }
  if (hello.block_bytes != 0 && hello.block_bytes != state->block_bytes) {
    return invalid_argument("the layout's blocks are {} bytes; kvtierd says {}", state->block_bytes,
                            hello.block_bytes);
  }
  if (options.ring_bytes < state->block_bytes) {
    return invalid_argument("ring_bytes {} is smaller than one block ({} bytes)",
                            options.ring_bytes, state->block_bytes);
  }
  state->ring_bytes = options.ring_bytes;
  state->region_id = options.region_id;
  state->max_blocks = hello.max_blocks_per_request == 0 ? 1024 : hello.max_blocks_per_request;

  auto api = DriverApi::get();
  if (!api.is_ok()) return api.status();
  state->api = *api;
  const DriverApi& cu = **api;
  int ordinal = -1;
  KVTIER_RETURN_IF_ERROR(
      driver_status(cu.pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                             state->planes.front().base),
                    "the cache's GPU (cuPointerGetAttribute)"));
  KVTIER_RETURN_IF_ERROR(driver_status(cu.device_get(&state->device, ordinal), "cuDeviceGet"));
  CUcontext primary = nullptr;
  KVTIER_RETURN_IF_ERROR(
      driver_status(cu.primary_ctx_retain(&primary, state->device), "cuDevicePrimaryCtxRetain"));
  state->context = primary;
  auto scope = ContextScope::enter(cu, state->context);
  if (!scope.is_ok()) return scope.status();

  auto kernels = StagingKernels::load(cu);
  if (!kernels.is_ok()) return kernels.status();
  state->kernels = std::move(*kernels);
  KVTIER_RETURN_IF_ERROR(
      driver_status(cu.mem_alloc(&state->ring, state->ring_bytes), "staging ring (cuMemAlloc)"));
  const uint64_t table_bytes = state->planes.size() * sizeof(staging::Plane);
  KVTIER_RETURN_IF_ERROR(
      driver_status(cu.mem_alloc(&state->plane_table, table_bytes), "plane table (cuMemAlloc)"));
  KVTIER_RETURN_IF_ERROR(driver_status(
      cu.memcpy_htod(state->plane_table, state->planes.data(), table_bytes), "plane table upload"));
  auto registered = register_cuda_region(client, state->region_id, state->ring, state->ring_bytes);
  if (!registered.is_ok()) return registered.status();
  state->registered = true;
  return std::unique_ptr<GpuStager>(new GpuStager(client, std::move(state)));
}

GpuStager::GpuStager(Client& client, std::unique_ptr<State> state)
    : client_(client), s_(std::move(state)) {}

GpuStager::~GpuStager() {
  if (s_->loading) (void)end_load();
  if (s_->registered) (void)client_.unregister_region(s_->region_id);
}

namespace {

// Each engine block id inside the layout and (a Load: it writes them) named once.
Status check_block_ids(std::span<const BlockRef> blocks, uint64_t num_blocks, bool distinct) {
  std::unordered_set<uint64_t> seen;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i].engine_block_id >= num_blocks) {
      return invalid_argument("blocks[{}].engine_block_id {} is beyond the layout's {} blocks", i,
                              blocks[i].engine_block_id, num_blocks);
    }
    if (distinct && !seen.insert(blocks[i].engine_block_id).second) {
      return invalid_argument("blocks[{}].engine_block_id {} is named twice", i,
                              blocks[i].engine_block_id);
    }
  }
  return Status::ok();
}

// `options` for blocks [first, first + count) of the Save: the ranges that touch
// them, moved to the chunk's indexes.
SaveOptions chunk_options(const SaveOptions& options, size_t first, size_t count,
                          bool first_chunk) {
  SaveOptions out;
  if (first_chunk) out.retention = options.retention;
  for (const RangeRetention& range : options.block_retention) {
    const size_t begin = std::max<size_t>(range.first, first);
    const size_t end = std::min<size_t>(size_t{range.first} + range.count, first + count);
    if (begin >= end) continue;
    out.block_retention.push_back({static_cast<uint32_t>(begin - first),
                                   static_cast<uint32_t>(end - begin), range.retention});
  }
  return out;
}

}  // namespace

Result<SaveResult> GpuStager::save(const std::string& session_id, std::span<const BlockRef> blocks,
                                   bool end_of_turn, CUstream stream, const SaveOptions& options) {
  State& s = *s_;
  if (s.loading) return invalid_argument("a layer-wise Load is in progress (end_load first)");
  KVTIER_RETURN_IF_ERROR(check_block_ids(blocks, s.num_blocks, /*distinct=*/false));
  auto scope = ContextScope::enter(*s.api, s.context);
  if (!scope.is_ok()) return scope.status();
  const size_t per_chunk =
      std::max<size_t>(1, std::min<uint64_t>(s.ring_bytes / s.block_bytes, s.max_blocks));
  const PlaneRange all{0, static_cast<uint32_t>(s.planes.size())};

  std::deque<std::unique_ptr<Piece>> in_flight;
  SaveResult total{0, 0};
  bool stopped = false;  // a chunk came back short or failed: the Save ends there
  Status error;
  size_t sent = 0;  // blocks sent in Saves
  auto settle_oldest = [&] {
    std::unique_ptr<Piece> piece = std::move(in_flight.front());
    in_flight.pop_front();
    s.release_front();
    auto reply = piece->save->wait();
    if (stopped) return;
    if (!reply.is_ok()) {
      error = reply.status();
      stopped = true;
      return;
    }
    total.stored += reply->stored;
    total.deduplicated += reply->deduplicated;
    if (reply->saved() < piece->count) stopped = true;
  };
  for (size_t first = 0; first < blocks.size() && !stopped;) {
    auto piece = std::make_unique<Piece>();
    piece->first = first;
    piece->count = std::min(per_chunk, blocks.size() - first);
    piece->bytes = piece->count * s.block_bytes;
    std::optional<uint64_t> offset;
    while (!(offset = s.fit(piece->bytes))) settle_oldest();
    if (stopped) break;
    const auto chunk = blocks.subspan(first, piece->count);
    Status launched = s.launch(all, s.block_bytes, chunk, *offset, staging::kGather, stream);
    if (launched.is_ok()) {
      // kvtierd reads the rows as soon as it has the Save: the gather must be done.
      launched = s.wait_for(stream, "staging gather");
    }
    if (!launched.is_ok()) {
      error = launched;
      stopped = true;
      break;
    }
    const bool last = first + piece->count == blocks.size();
    SaveOptions chunk_save = chunk_options(options, first, piece->count, first == 0);
    chunk_save.staging = StagingRef{s.region_id, *offset};
    piece->save.emplace(client_.save_async(session_id, chunk, end_of_turn && last, chunk_save));
    s.occupy(piece.get(), *offset);
    first += piece->count;
    sent = first;
    in_flight.push_back(std::move(piece));
  }
  while (!in_flight.empty()) settle_oldest();
  // The turn ends even when the chunk that would have said so was never sent (an empty
  // Save ends it): the session's idle clock and write-behind start as for any Save.
  if (stopped && end_of_turn && total.saved() > 0 && sent < blocks.size()) {
    (void)client_.save(session_id, {}, /*end_of_turn=*/true);
  }
  // A failure after a kept prefix reads as a partial Save: the prefix is held.
  if (!error.is_ok() && total.saved() == 0) return error;
  return total;
}

Result<LoadResult> GpuStager::load(const std::string& session_id, std::span<const BlockRef> blocks,
                                   CUstream stream, PlaneRange planes) {
  KVTIER_RETURN_IF_ERROR(begin_load(session_id, blocks, {planes}));
  auto result = finish_range(0, stream);
  Status ended = end_load();
  if (!result.is_ok()) return result;
  if (!ended.is_ok()) return ended;
  return result;
}

Status GpuStager::begin_load(const std::string& session_id, std::span<const BlockRef> blocks,
                             std::vector<PlaneRange> ranges) {
  State& s = *s_;
  if (s.loading) return invalid_argument("a layer-wise Load is in progress (end_load first)");
  if (ranges.empty()) return invalid_argument("a Load needs at least one plane range");
  KVTIER_RETURN_IF_ERROR(check_block_ids(blocks, s.num_blocks, /*distinct=*/true));
  const auto plane_count = static_cast<uint32_t>(s.planes.size());
  s.row_bytes.clear();
  s.pieces.clear();
  s.range_first_piece.clear();
  for (size_t r = 0; r < ranges.size(); ++r) {
    PlaneRange& range = ranges[r];
    if (range.count == 0) {
      if (range.begin != 0) return invalid_argument("ranges[{}]: count 0 needs begin 0", r);
      range.count = plane_count;
    }
    if (range.begin >= plane_count || range.count > plane_count - range.begin) {
      return invalid_argument("ranges[{}]: planes {}..{} pass the layout's {} planes", r,
                              range.begin, range.begin + range.count, plane_count);
    }
    const staging::Plane& last = s.planes[range.begin + range.count - 1];
    const uint64_t row = last.offset_in_block + last.bytes - s.planes[range.begin].offset_in_block;
    if (row > s.ring_bytes) {
      return invalid_argument("ranges[{}]: {} bytes per block do not fit the {}-byte ring", r, row,
                              s.ring_bytes);
    }
    s.row_bytes.push_back(row);
    s.range_first_piece.push_back(s.pieces.size());
    const size_t per_chunk =
        std::max<size_t>(1, std::min<uint64_t>(s.ring_bytes / row, s.max_blocks));
    for (size_t first = 0; first < blocks.size(); first += per_chunk) {
      auto piece = std::make_unique<Piece>();
      piece->range = static_cast<uint32_t>(r);
      piece->first = first;
      piece->count = std::min(per_chunk, blocks.size() - first);
      piece->bytes = piece->count * row;
      s.pieces.push_back(std::move(piece));
    }
  }
  s.range_first_piece.push_back(s.pieces.size());
  s.session_id = session_id;
  s.blocks.assign(blocks.begin(), blocks.end());
  s.ranges = std::move(ranges);
  s.next_unsent = 0;
  s.next_range = 0;
  s.loading = true;
  // Send what fits now.
  while (s.next_unsent < s.pieces.size()) {
    auto offset = s.fit(s.pieces[s.next_unsent]->bytes);
    if (!offset) break;
    send_next_piece(*offset);
  }
  return Status::ok();
}

void GpuStager::send_next_piece(uint64_t offset) {
  State& s = *s_;
  Piece& piece = *s.pieces[s.next_unsent];
  s.occupy(&piece, offset);
  piece.load.emplace(client_.load_async(
      s.session_id, std::span<const BlockRef>(s.blocks).subspan(piece.first, piece.count),
      s.ranges[piece.range], StagingRef{s.region_id, offset}));
  piece.sent = true;
  ++s.next_unsent;
}

Result<bool> GpuStager::release_oldest(bool wait) {
  State& s = *s_;
  if (s.ring_pieces.empty()) return false;
  Piece* oldest = s.ring_pieces.front();
  if (!oldest->done) return false;
  if (oldest->event != nullptr) {
    CUresult query =
        wait ? s.api->event_synchronize(oldest->event) : s.api->event_query(oldest->event);
    if (query == CUDA_ERROR_NOT_READY) return false;
    KVTIER_RETURN_IF_ERROR(driver_status(query, "staging scatter"));
    s.spare_events.push_back(std::exchange(oldest->event, nullptr));
  }
  s.release_front();
  return true;
}

Status GpuStager::send_ahead(size_t upto, bool wait) {
  State& s = *s_;
  while (s.next_unsent < s.pieces.size()) {
    Piece& piece = *s.pieces[s.next_unsent];
    if (piece.skipped) {
      ++s.next_unsent;
      continue;
    }
    auto offset = s.fit(piece.bytes);
    if (!offset) {
      auto released = release_oldest(wait && s.next_unsent <= upto);
      if (!released.is_ok()) return released.status();
      if (!*released) {
        if (wait && s.next_unsent <= upto) {
          return internal_error("staging ring: no piece to release before piece {}", upto);
        }
        return Status::ok();
      }
      continue;
    }
    send_next_piece(*offset);
  }
  return Status::ok();
}

Status GpuStager::scatter_piece(Piece& piece, size_t range, size_t loaded, CUstream stream) {
  State& s = *s_;
  const auto chunk = std::span<const BlockRef>(s.blocks).subspan(piece.first, loaded);
  Status launched =
      s.launch(s.ranges[range], s.row_bytes[range], chunk, piece.offset, staging::kScatter, stream);
  if (launched.is_ok()) {
    // The ring space is free again once the scatter has read it: an event marks
    // that; without one, wait for the stream now.
    auto event = s.take_event();
    Status recorded = event.is_ok()
                          ? driver_status(s.api->event_record(*event, stream), "cuEventRecord")
                          : event.status();
    if (recorded.is_ok()) {
      piece.event = *event;
    } else {
      if (event.is_ok()) s.spare_events.push_back(*event);
      launched = driver_status(s.api->stream_synchronize(stream), "staging scatter");
    }
  }
  return launched;
}

Result<LoadResult> GpuStager::finish_range(size_t range, CUstream stream) {
  State& s = *s_;
  if (!s.loading) return invalid_argument("no layer-wise Load is in progress");
  if (range != s.next_range) {
    return invalid_argument("ranges finish in order: range {} is next, not {}", s.next_range,
                            range);
  }
  if (!s.broken.is_ok()) return s.broken;
  auto scope = ContextScope::enter(*s.api, s.context);
  if (!scope.is_ok()) return scope.status();

  LoadResult result{0, Status::ok()};
  bool stopped = false;
  Status error;
  for (size_t i = s.range_first_piece[range]; i < s.range_first_piece[range + 1]; ++i) {
    Piece& piece = *s.pieces[i];
    if (stopped && !piece.sent) {  // past the range's prefix: not worth sending
      piece.skipped = true;
      piece.done = true;
      continue;
    }
    if (!piece.sent) {
      if (Status sent = send_ahead(i, /*wait=*/true); !sent.is_ok()) {
        error = sent;
        break;
      }
    }
    auto reply = piece.load->wait();
    piece.done = true;
    if (stopped) continue;
    if (!reply.is_ok()) {
      error = reply.status();
      stopped = true;
      continue;
    }
    const size_t loaded = std::min<size_t>(reply->loaded_count, piece.count);
    if (loaded > 0) {
      if (Status launched = scatter_piece(piece, range, loaded, stream); !launched.is_ok()) {
        error = launched;
        stopped = true;
        continue;
      }
    }
    result.loaded_count += static_cast<uint32_t>(loaded);
    if (loaded < piece.count) {
      result.stop_reason = reply->stop_reason;
      stopped = true;
    }
  }
  ++s.next_range;
  if (error.is_ok()) error = send_ahead(0, /*wait=*/false);
  if (!error.is_ok()) {
    s.broken = error;
    return error;
  }
  return result;
}

Status GpuStager::end_load() {
  State& s = *s_;
  if (!s.loading) return Status::ok();
  auto scope = ContextScope::enter(*s.api, s.context);
  Status status = scope.status();
  // Replies still owed hold ring space kvtierd may be writing: wait for them all.
  for (size_t i = 0; i < s.next_unsent; ++i) {
    Piece& piece = *s.pieces[i];
    if (piece.sent && !piece.done) {
      (void)piece.load->wait();
      piece.done = true;
    }
  }
  while (!s.ring_pieces.empty()) {
    Piece* oldest = s.ring_pieces.front();
    if (oldest->event != nullptr) {
      Status synced = driver_status(s.api->event_synchronize(oldest->event), "staging scatter");
      if (status.is_ok()) status = synced;
      s.spare_events.push_back(std::exchange(oldest->event, nullptr));
    }
    s.release_front();
  }
  s.pieces.clear();
  s.blocks.clear();
  s.loading = false;
  s.broken = Status::ok();
  return status;
}

}  // namespace kvtier
