// GpuStager: the engine side of staged transfers on a GPU.
//
// kvtierd copies an engine's blocks plane by plane; on a GPU each plane is one small
// DMA row (a Llama-8B block of 16 tokens has 64 planes of 4 KiB), and copy engines
// top out at a few million rows a second, far from the link. A GpuStager packs a
// Save's blocks out of the engine's paged cache into a staging buffer in the engine's
// own GPU memory with a gather kernel, so kvtierd moves each block as one contiguous
// copy (schema: Staging), and unpacks a Load with a scatter kernel. The kernels
// (cuda/staging_kernels.cu, index math in cuda/staging_index.h) are embedded in the
// library as a fatbin and launched through the driver API on the engine's stream, so
// the engine's own ordering holds and nothing links cudart.
//
// Use:
//   if (GpuStager::kernels_built()) path = DataPath::kStagingKernels;   // else plane copies
//   auto hello = client->hello(layout, "vllm-rank0", 0, DeviceKind::kCuda, path);
//   auto stager = GpuStager::create(*client, *hello, layout, {{0, kv_base}}, {});
//   stager->save("conv-42", blocks, true, stream);          // after the engine's writes
//   stager->load("conv-42", blocks, stream);                // scatter queued on `stream`
//   // layer by layer: begin_load with one PlaneRange per layer, then, before layer i's
//   // attention, finish_range(i, stream); end_load() when done.
// create() fails with Unavailable when the kernels cannot run here (a build without
// nvcc, a driver that refuses the image): the engine keeps the plane-copy path.
//
// The staging buffer (options.ring_bytes, cuMemAlloc on the cache's GPU) is registered
// as one region and used as a ring: a request larger than it streams through it in
// chunks, one Save or Load each, pipelined (chunk k + 1 is packed while kvtierd copies
// chunk k). A layer-wise Load keeps as many ranges in flight as the ring holds.
//
// Ordering: save() launches the gather on `stream` behind the engine's work there and
// waits for it before sending the Save (kvtierd reads staging at once); load() returns
// after the last scatter is queued on `stream`: the engine's later work on that stream
// sees the blocks, and the host need not wait.
//
// A partial Save (a chunk's reply short of its blocks) ends the Save: later chunks are
// not sent; those already sent are waited for (kvtierd keeps nothing of them: they
// follow the cut); the result counts the prefix kept; an end of turn asked for is still
// sent (an empty Save).
//
// Layer-wise counts: each range is a Load of its own, so an eviction between them can
// make a later range's loaded_count smaller than an earlier one's. Use the smallest
// count of the ranges finished so far; a layer already computed on more blocks than a
// later range has must recompute those blocks.
//
// Contexts: the kernels live in the primary context of the cache's GPU, and a stream
// passed in must belong to it (as PyTorch's and vLLM's do); the staging ring is one
// cuMemAlloc there, shared with kvtierd through legacy CUDA IPC.
//
// Thread-safety: one thread at a time (an engine's worker); the Client may be shared.
// Lifetime: the Client, and the engine's cache memory, must outlive the GpuStager.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "client/client.h"
#include "common/status.h"

namespace kvtier {

struct GpuStagerOptions {
  uint64_t ring_bytes = uint64_t{64} << 20;  // the staging buffer; at least one block
  uint32_t region_id = 0x7fff0000;           // its region id: no plane may name it
};

class GpuStager {
 public:
  // Whether this library embeds the kernels (built with nvcc). Whether the driver runs
  // them is known only by create().
  static bool kernels_built();
  // Whether the kernels run for a cache on the GPU holding `cache_ptr` (any device
  // address of it): loads them there and lets them go. OK, or create()'s Unavailable.
  // An engine asks this before its Hello, to say the data path it will use.
  static Status probe(CUdeviceptr cache_ptr);

  // `hello`: the reply to the engine's Hello, which said DataPath::kStagingKernels.
  // `region_bases`: the device address of each region the layout's planes name.
  // Unavailable when the kernels cannot run (see above); InvalidArgument for a layout
  // the bases do not cover, a ring smaller than one block, or a daemon without staging.
  static Result<std::unique_ptr<GpuStager>> create(
      Client& client, const HelloInfo& hello, const LayoutSpec& layout,
      const std::map<uint32_t, CUdeviceptr>& region_bases, const GpuStagerOptions& options = {});
  ~GpuStager();
  GpuStager(const GpuStager&) = delete;
  GpuStager& operator=(const GpuStager&) = delete;

  Result<SaveResult> save(const std::string& session_id, std::span<const BlockRef> blocks,
                          bool end_of_turn, CUstream stream, const SaveOptions& options = {});
  // Every plane of `planes` (default all) of the leading held blocks, into their engine
  // blocks; loaded_count as a Load's.
  Result<LoadResult> load(const std::string& session_id, std::span<const BlockRef> blocks,
                          CUstream stream, PlaneRange planes = {});

  // A layer-wise Load: one range per step, sent ahead as the ring allows. finish_range
  // takes the ranges in order (0, 1, …) and queues range k's scatter on `stream`; its
  // loaded_count is that range's. end_load waits for whatever is still in flight.
  Status begin_load(const std::string& session_id, std::span<const BlockRef> blocks,
                    std::vector<PlaneRange> ranges);
  Result<LoadResult> finish_range(size_t range, CUstream stream);
  Status end_load();

 private:
  struct Piece;
  struct State;
  GpuStager(Client& client, std::unique_ptr<State> state);
  // Sends the load's next unsent piece as a staged Load into the ring at `offset`.
  void send_next_piece(uint64_t offset);
  // Frees the oldest ring space: its piece is done (earlier ranges, or earlier in this
  // one); `wait` blocks for its scatter, else only a finished one goes. Returns whether
  // it freed any.
  Result<bool> release_oldest(bool wait);
  // Sends unsent pieces while the ring has room; with `wait`, until piece `upto` is sent.
  Status send_ahead(size_t upto, bool wait);
  // Queues the scatter of the first `loaded` blocks of `piece` (of range `range`) out of
  // the ring on `stream`, and marks when its ring space is free again.
  Status scatter_piece(Piece& piece, size_t range, size_t loaded, CUstream stream);

  Client& client_;
  std::unique_ptr<State> s_;
};

}  // namespace kvtier
