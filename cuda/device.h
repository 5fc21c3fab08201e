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
// mapped until that copy completes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
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

// How an engine shares a region. Built by the IPC layer from a RegisterRegion request.
struct RegionHandle {
  enum class Kind : uint8_t { kMemfd, kCudaIpc, kCudaVmmFd };
  Kind kind = Kind::kMemfd;
  uint64_t size_bytes = 0;                 // size the engine declared
  UniqueFd fd;                             // kMemfd, kCudaVmmFd
  std::array<std::byte, 64> ipc_handle{};  // kCudaIpc: cudaIpcMemHandle_t
  std::string gpu_uuid;                    // cuda kinds: which GPU
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
  uint64_t total_bytes() const;
  // Adds `memory` to `memories` if absent; returns its index.
  uint32_t memory_index(const std::shared_ptr<Memory>& memory);
};

// Called exactly once per submitted batch, on a device thread.
using CopyDone = std::function<void(Status)>;

class Device {
 public:
  virtual ~Device() = default;

  virtual std::string_view name() const = 0;  // "host", "NVIDIA H100 80GB HBM3"

  // Opens engine memory. Fails with InvalidArgument when the handle is of the wrong
  // kind for this device, is not what it claims (an fd that is not a memfd), or its
  // real size differs from handle.size_bytes; with ResourceExhausted when it cannot
  // be mapped.
  virtual Result<std::shared_ptr<Memory>> open_region(RegionHandle handle) = 0;

  // The daemon's tier memory, allocated once at start-up and touched up front so that
  // no copy pays for page faults. ResourceExhausted when it cannot be had.
  virtual Result<std::shared_ptr<Memory>> allocate_arena(uint64_t bytes) = 0;        // HBM
  virtual Result<std::shared_ptr<Memory>> allocate_pinned_pool(uint64_t bytes) = 0;  // RAM

  // Validates the batch (indices, every segment inside its memories) and queues it.
  // An invalid batch is rejected synchronously with InvalidArgument and `done` is not
  // called; otherwise `done` is called once, with OK after every byte has landed or
  // with the first error.
  [[nodiscard]] virtual Status submit(CopyBatch batch, CopyDone done) = 0;

  // Blocks until every submitted batch has completed. For shutdown and tests.
  virtual void drain() = 0;
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

  std::string_view name() const override { return inner_->name(); }
  Result<std::shared_ptr<Memory>> open_region(RegionHandle handle) override;
  Result<std::shared_ptr<Memory>> allocate_arena(uint64_t bytes) override {
    return inner_->allocate_arena(bytes);
  }
  Result<std::shared_ptr<Memory>> allocate_pinned_pool(uint64_t bytes) override {
    return inner_->allocate_pinned_pool(bytes);
  }
  Status submit(CopyBatch batch, CopyDone done) override;
  void drain() override { inner_->drain(); }

 private:
  std::unique_ptr<Device> inner_;
  int submits_until_failure_ = 0;  // 0: no failure armed
  Status submit_error_;
  Status open_error_;
};

}  // namespace kvtier
