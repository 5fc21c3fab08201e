// Device: the copy engine behind every tier. It opens engine memory shared with the
// daemon (a memfd on the host backend; a CUDA IPC or VMM handle on the CUDA backend),
// allocates the daemon's own memory (the "HBM" arena and the pinned RAM pool), and
// moves bytes between them in batches of segments — a gather (engine planes →
// contiguous slots) or a scatter (slots → engine planes) is one batch.
//
// Implementations: HostDevice (memfd + memcpy on a small thread pool, always built),
// CudaDevice (streams + events, built with the CUDA toolkit), FaultInjectingDevice
// (wraps another Device and fails on command, for tests).
//
// Thread-safety: every method may be called from any thread, but the daemon calls them
// only from its control thread. `submit` never blocks on the copy; the completion
// callback runs on a device worker thread and must only hand the result back (the
// daemon posts it to its control thread).
//
// Ownership: Memory objects are shared_ptr; a CopyBatch holds references to the
// memories it touches, so an engine region closed while a copy is in flight stays
// mapped until that copy completes. Every Device drops a batch's references *before*
// it calls the batch's `done`: once the daemon has seen the completions of all batches
// that used a region, its own reference is the last one, and dropping it closes the
// mapping there and then (UnregisterRegion relies on this).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace kvtier {

enum class MemoryLocation : uint8_t { kHost, kGpu };

// A range of memory the Device can copy from and to.
class Memory {
 public:
  virtual ~Memory() = default;
  virtual uint64_t size_bytes() const = 0;
  virtual MemoryLocation location() const = 0;
  // The bytes, when the daemon's CPU may touch them directly; nullptr for GPU memory.
  virtual std::byte* host_data() = 0;
  // Short description for logs ("memfd region 4 MiB", "hbm arena").
  virtual std::string describe() const = 0;
};

// One physical chunk of a CUDA VMM region (one cuMemCreate handle, exported as an fd).
struct VmmChunk {
  UniqueFd fd;
  uint64_t bytes = 0;  // the chunk's size; a multiple of the allocation granularity
};

// How an engine shares a region. Built by the daemon from a RegisterRegion request.
struct RegionHandle {
  enum class Kind : uint8_t { kMemfd, kCudaIpc, kCudaVmmFd };
  Kind kind = Kind::kMemfd;
  uint64_t size_bytes = 0;  // size the engine declared
  // kCudaIpc: start of the region from the base of the exported allocation;
  // kCudaVmmFd: from the start of the first chunk. 0 for kMemfd.
  uint64_t offset_bytes = 0;
  UniqueFd fd;                             // kMemfd
  std::vector<VmmChunk> vmm_chunks;        // kCudaVmmFd: in address order
  std::array<std::byte, 64> ipc_handle{};  // kCudaIpc: CUipcMemHandle
  std::string gpu_uuid;                    // cuda kinds: which GPU ("GPU-…")
};

// Who is waiting for a batch. Foreground batches (an engine's Save or Load) never wait
// behind background ones (the policy's moves between tiers): they run on their own
// streams, and a device may cut background batches into bounded pieces.
enum class CopyPriority : uint8_t { kForeground, kBackground };

// A GPU the device serves.
struct GpuInfo {
  std::string uuid;    // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  std::string name;    // "NVIDIA H100 80GB HBM3"
  int ordinal = 0;     // the driver's device ordinal
  int numa_node = -1;  // host NUMA node closest to it; -1 unknown
};

// One contiguous copy inside a batch. Offsets are bytes from the start of each memory.
struct CopySegment {
  uint32_t src_memory;  // index into CopyBatch::memories
  uint32_t dst_memory;  // index into CopyBatch::memories
  uint64_t src_offset;
  uint64_t dst_offset;
  uint64_t bytes;
};

// A set of copies that complete together. Segments must not overlap in their
// destinations; they may run in any order and in parallel.
struct CopyBatch {
  std::vector<std::shared_ptr<Memory>> memories;  // kept alive until completion
  std::vector<CopySegment> segments;
  CopyPriority priority = CopyPriority::kForeground;
  uint64_t total_bytes() const;
  // Adds `memory` to `memories` if absent; returns its index.
  uint32_t memory_index(const std::shared_ptr<Memory>& memory);
};

// Tier memory handed out before its pages are in (Device::reserve_arena and
// reserve_pinned_pool), so that kvtierd can answer on its socket while they go in.
// No copy may touch `memory` until `fill` has returned OK.
struct UnfilledMemory {
  std::shared_ptr<Memory> memory;
  // Faults every page in on `threads` threads and makes the memory usable for copies
  // (the CUDA backend then pins it for DMA). Call once, on any one thread, while
  // `memory` is alive; Unavailable when `stop` was requested first, ResourceExhausted
  // when the machine cannot back it. Empty: the memory is ready as it is.
  std::function<Status(int threads, std::stop_token stop)> fill;
};

// Called exactly once per submitted batch, on a device thread.
using CopyDone = std::function<void(Status)>;

// Merges segments that continue each other (same memories, both offsets contiguous)
// into one, keeping the batch's meaning; returns how many segments it removed. Engine
// planes of consecutive blocks often sit back to back, and one copy of N bytes costs
// far less than N/k copies of k bytes on every backend. `splits_at(memory, offset)`,
// when given, says where a memory changes character (a GPU's part of the arena ends):
// no merged segment crosses such an offset on either side.
size_t merge_adjacent_segments(
    std::vector<CopySegment>& segments,
    const std::function<bool(uint32_t memory, uint64_t offset)>& splits_at = {});

class Device {
 public:
  virtual ~Device() = default;

  virtual std::string_view name() const = 0;  // "host", "NVIDIA H100 80GB HBM3"
  // The GPUs this device serves, in the order their parts appear in the arena; empty
  // for the host backend.
  virtual std::vector<GpuInfo> gpus() const { return {}; }

  // Opens engine memory. Fails with InvalidArgument when the handle is of the wrong
  // kind for this device, is not what it claims (an fd that is not a memfd), or its
  // real size differs from handle.size_bytes; with ResourceExhausted when it cannot
  // be mapped.
  virtual Result<std::shared_ptr<Memory>> open_region(RegionHandle handle) = 0;

  // The daemon's tier memory, allocated once at start-up and touched up front (on
  // several threads) so that no copy pays for page faults. ResourceExhausted when it cannot be had.
  //
  // The arena (HBM) holds `bytes_per_gpu` on every GPU the device serves (rounded
  // down to a multiple of `part_alignment`, so that no slab of that size straddles two
  // GPUs), laid out as one Memory: GPU i's part is [i·part, (i+1)·part). The host
  // backend has one part.
  virtual Result<std::shared_ptr<Memory>> allocate_arena(uint64_t bytes_per_gpu,
                                                         uint64_t part_alignment = 1) = 0;
  // The pinned RAM pool, on the NUMA node of the GPUs it serves where the machine
  // says which.
  virtual Result<std::shared_ptr<Memory>> allocate_pinned_pool(uint64_t bytes) = 0;

  // The same memory in two steps: reserved now (address range, checks against what
  // the machine has left, so a pool that cannot fit fails here), filled later by
  // UnfilledMemory::fill, off the caller's thread. Defaults: allocate now, nothing to
  // fill.
  virtual Result<UnfilledMemory> reserve_arena(uint64_t bytes_per_gpu,
                                               uint64_t part_alignment = 1) {
    auto arena = allocate_arena(bytes_per_gpu, part_alignment);
    if (!arena.is_ok()) return arena.status();
    return UnfilledMemory{std::move(*arena), {}};
  }
  virtual Result<UnfilledMemory> reserve_pinned_pool(uint64_t bytes) {
    auto pool = allocate_pinned_pool(bytes);
    if (!pool.is_ok()) return pool.status();
    return UnfilledMemory{std::move(*pool), {}};
  }

  // Validates the batch (indices, every segment inside its memories) and queues it.
  // An invalid batch is rejected synchronously with InvalidArgument and `done` is not
  // called; otherwise `done` is called once, with OK after every byte has landed or
  // with the first error.
  [[nodiscard]] virtual Status submit(CopyBatch batch, CopyDone done) = 0;

  // Blocks until every submitted batch has completed. For shutdown and tests.
  virtual void drain() = 0;

  // `handler` runs once, on a device thread, when the device hits an error that leaves
  // it unusable (a sticky CUDA error: the context is lost, and every byte in device
  // memory with it). The daemon then stops serving and exits non-zero. Default: the
  // device has no such errors.
  virtual void set_fatal_error_handler(std::function<void(const Status&)> handler) {
    (void)handler;
  }
};

// Memcpy on `copy_threads` worker threads (at least 1).
std::unique_ptr<Device> make_host_device(int copy_threads);

// Forwards to `inner` except where told to fail. Counting is per call of submit.
class FaultInjectingDevice final : public Device {
 public:
  explicit FaultInjectingDevice(std::unique_ptr<Device> inner) : inner_(std::move(inner)) {}

  // The Nth submit from now (1 = the next) completes with `error` without copying.
  void fail_nth_submit(int nth, Status error);
  // Every open_region fails with `error` until cleared with an OK status.
  void fail_open_region(Status error);
  // While held, submitted batches are kept (accepted, still in flight) instead of
  // copied; release_submits() hands them to the inner device in submission order, and
  // drain() releases them first. A test holds a Save's or Load's copy in flight for as
  // long as it needs without a slow machine or a sleep. A held batch is validated only
  // when released: a rejection then reaches its `done`. Call these, and submit(), on
  // one thread (the daemon's control thread).
  void hold_submits() { holding_ = true; }
  void release_submits();
  // Opens the gate for the `count` oldest held batches only (fewer if fewer are held)
  // and keeps holding the rest and later submits: a test lets one copy of several in
  // flight complete (one layer of a layer-wise load) while the others stay held.
  void release_oldest_submits(size_t count);
  size_t held_submits() const { return held_.size(); }

  std::string_view name() const override { return inner_->name(); }
  Result<std::shared_ptr<Memory>> open_region(RegionHandle handle) override;
  std::vector<GpuInfo> gpus() const override { return inner_->gpus(); }
  Result<std::shared_ptr<Memory>> allocate_arena(uint64_t bytes_per_gpu,
                                                 uint64_t part_alignment = 1) override {
    return inner_->allocate_arena(bytes_per_gpu, part_alignment);
  }
  Result<std::shared_ptr<Memory>> allocate_pinned_pool(uint64_t bytes) override {
    return inner_->allocate_pinned_pool(bytes);
  }
  Result<UnfilledMemory> reserve_arena(uint64_t bytes_per_gpu,
                                       uint64_t part_alignment = 1) override {
    return inner_->reserve_arena(bytes_per_gpu, part_alignment);
  }
  Result<UnfilledMemory> reserve_pinned_pool(uint64_t bytes) override {
    return inner_->reserve_pinned_pool(bytes);
  }
  Status submit(CopyBatch batch, CopyDone done) override;
  void drain() override {
    release_submits();  // never wait for a batch nobody will release
    inner_->drain();
  }
  void set_fatal_error_handler(std::function<void(const Status&)> handler) override {
    inner_->set_fatal_error_handler(std::move(handler));
  }

 private:
  std::unique_ptr<Device> inner_;
  int submits_until_failure_ = 0;  // 0: no failure armed
  Status submit_error_;
  Status open_error_;
  bool holding_ = false;
  std::deque<std::pair<CopyBatch, CopyDone>> held_;
};

}  // namespace kvtier
