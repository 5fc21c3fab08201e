// HostDevice: the Device backend that needs no GPU. Engine regions are memfds mapped
// into the daemon; the "HBM" arena and the RAM pool are anonymous host memory; copies
// are memcpy on a fixed pool of worker threads.
//
// Thread-safety: every method may be called from any thread. `submit` validates on the
// caller's thread, queues the work and returns; completion callbacks run on a worker
// thread, without any HostDevice lock held, so a callback may call `submit` again but
// must not call `drain` (it would wait for its own batch).
//
// Ownership: Memory objects returned here own their mapping (and, for regions, the
// memfd); the mapping is released when the last shared_ptr goes, which may be on a
// worker thread right after a batch completes. The device owns its worker threads;
// destroying it drains every submitted batch first, so no callback runs afterwards.
//
// Regions: open_region accepts only Kind::kMemfd. The fd must be a memfd (or another
// sealable shmem file) whose size equals handle.size_bytes. The daemon seals it with
// F_SEAL_SHRINK, so that the engine cannot truncate it under a copy (which would kill
// the daemon with SIGBUS); a memfd created without MFD_ALLOW_SEALING that is not
// already sealed against shrinking is rejected with InvalidArgument.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "device/device.h"

namespace kvtier {

class HostDevice final : public Device {
 public:
  // REQUIRES: copy_threads >= 1 (smaller values are raised to 1).
  explicit HostDevice(int copy_threads);
  ~HostDevice() override;  // drains, then joins the workers
  HostDevice(const HostDevice&) = delete;
  HostDevice& operator=(const HostDevice&) = delete;

  std::string_view name() const override { return "host"; }
  Result<std::shared_ptr<Memory>> open_region(RegionHandle handle) override;
  // One part (there is no GPU): `part_alignment` is ignored.
  Result<std::shared_ptr<Memory>> allocate_arena(uint64_t bytes_per_gpu,
                                                 uint64_t part_alignment = 1) override;
  Result<std::shared_ptr<Memory>> allocate_pinned_pool(uint64_t bytes) override;
  // Checked against MemAvailable and the cgroup's memory.max, mapped with a huge-page
  // hint; `fill` faults the pages in with MADV_POPULATE_WRITE on several threads.
  Result<UnfilledMemory> reserve_arena(uint64_t bytes_per_gpu,
                                       uint64_t part_alignment = 1) override;
  Result<UnfilledMemory> reserve_pinned_pool(uint64_t bytes) override;
  // Rejects (InvalidArgument naming the segment, `done` not called) a memory index out
  // of range, a null or non-host memory, a segment outside either memory, a segment
  // whose source and destination overlap in one memory, and segments whose
  // destinations overlap each other. An empty batch is valid and completes OK.
  Status submit(CopyBatch batch, CopyDone done) override KVTIER_EXCLUDES(mu_);
  void drain() override KVTIER_EXCLUDES(mu_);

  int copy_threads() const { return static_cast<int>(workers_.size()); }

 private:
  struct Batch;
  struct Task {
    std::shared_ptr<Batch> batch;
    size_t shard;
  };

  void run_worker() KVTIER_EXCLUDES(mu_);
  // Copies one shard; true when it was the batch's last and `done` has been called.
  bool run_task(const Task& task);

  Mutex mu_;
  CondVar work_ready_;  // queue_ non-empty or stopping_
  CondVar all_done_;    // batches_in_flight_ reached 0
  std::deque<Task> queue_ KVTIER_GUARDED_BY(mu_);
  uint64_t batches_in_flight_ KVTIER_GUARDED_BY(mu_) = 0;
  bool stopping_ KVTIER_GUARDED_BY(mu_) = false;

  // Constant after construction.
  std::vector<std::thread> workers_;
};

// Batches below this many bytes run as one shard: splitting them costs more in
// hand-offs between threads than it saves in copy time.
inline constexpr uint64_t kMinShardBytes = 256 * 1024;

// Splits `segments` into at most `max_shards` shards of nearly equal byte counts
// (within one byte of each other, except that zero-byte segments are dropped). A
// segment that straddles a shard boundary is cut into pieces. Returns at least one
// shard (possibly empty). Exposed for tests; HostDevice calls it with
// max_shards = min(copy_threads, total_bytes / kMinShardBytes).
std::vector<std::vector<CopySegment>> split_into_shards(std::span<const CopySegment> segments,
                                                        size_t max_shards);

}  // namespace kvtier
