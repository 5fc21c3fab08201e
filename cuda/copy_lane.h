// CopyLane: one CUDA stream of one GPU, and the thread that waits for its copies.
// Internal to the CUDA backend (cuda_device.cpp).
//
// A batch's segments are split by (GPU, direction, priority) into runs, one per
// lane. Within a run, copies of equal size whose sources and destinations each
// advance by one constant step (a block's planes at their engine stride, say) fold
// into one strided copy (cuMemcpy2DAsync: one DMA operation for all its rows): the
// copy engines move small planes at a fraction of their bandwidth when each is an
// operation of its own, even inside one cuMemcpyBatchAsync; each lane completes its runs in its own
// stream order, so a batch waits only for the streams it used. The last lane to finish a batch
// drops the batch's memory references, then calls its `done`.
//
// Foreground lanes issue a run on the caller's thread (the control thread, at once)
// and record an event the lane's thread waits on. Background lanes queue the run and
// issue it from their own thread in pieces of at most `piece_bytes`, each after the
// previous one finished, so background work never sits deep in the copy engines'
// queues ahead of a later foreground copy.
//
// Thread-safety: enqueue() may be called from any thread; the rest is the owner's.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "cuda/cuda_memory.h"

namespace kvtier::cuda {

// One submitted batch while its parts are in flight.
struct BatchState {
  BatchState(CopyBatch copies, CopyDone on_done, int parts)
      : batch(std::move(copies)), done(std::move(on_done)), parts_left(parts) {}
  CopyBatch batch;  // holds the memories until the last part finished
  CopyDone done;
  std::atomic<int> parts_left;
  Mutex mu;
  Status error KVTIER_GUARDED_BY(mu);  // the first part's failure
};

// The copies of one batch for one lane. Copy i is `rows[i]` rows of `sizes[i]` bytes,
// row r from srcs[i] + r · src_pitches[i] to dsts[i] + r · dst_pitches[i] (one row:
// pitches 0).
struct LaneRun {
  std::vector<CUdeviceptr> dsts;
  std::vector<CUdeviceptr> srcs;
  std::vector<size_t> sizes;
  // Per copy: the served GPU whose memory the source is when it is not the lane's GPU
  // (a copy between GPUs, issued with cuMemcpyPeerAsync), else -1.
  std::vector<int> peer_sources;
  std::vector<uint32_t> rows;
  std::vector<uint64_t> dst_pitches;
  std::vector<uint64_t> src_pitches;
  // Per copy: which memories it reads and writes (the batch's indices), so that a fold
  // never spans two memories that merely happen to lie at a constant distance.
  std::vector<uint64_t> memories;

  void add(CUdeviceptr dst, CUdeviceptr src, uint64_t bytes, int peer_source = -1,
           uint64_t memory_pair = 0) {
    dsts.push_back(dst);
    srcs.push_back(src);
    sizes.push_back(bytes);
    peer_sources.push_back(peer_source);
    rows.push_back(1);
    dst_pitches.push_back(0);
    src_pitches.push_back(0);
    memories.push_back(memory_pair);
  }
  bool empty() const { return sizes.empty(); }
  size_t count() const { return sizes.size(); }
  uint64_t bytes(size_t i) const { return uint64_t{sizes[i]} * rows[i]; }

  // Folds each stretch of at least `min_rows` consecutive one-row copies within one
  // GPU (no peer source) and one memory pair, of equal size, whose destinations and
  // sources each advance by a constant step of at least that size (rows never overlap)
  // and at most `max_pitch`, into one strided copy. Copies keep their order.
  void fold_strided(uint32_t min_rows, uint64_t max_pitch);
};

// How a lane issues copies.
struct LaneOptions {
  uint64_t piece_bytes = 0;   // 0: foreground; else background in pieces of at most this
  bool batch_allowed = true;  // cuMemcpyBatchAsync may take this lane's operands
  unsigned batch_flags = 0;   // CUmemcpyFlags for the batch's attributes
  // What the lane's sources and destinations are, for strided copies (which name it):
  // CU_MEMORYTYPE_HOST (the pinned pool's host address) or CU_MEMORYTYPE_DEVICE.
  CUmemorytype src_type = CU_MEMORYTYPE_DEVICE;
  CUmemorytype dst_type = CU_MEMORYTYPE_DEVICE;
};

// What lanes report to the device.
class LaneOwner {
 public:
  virtual void batch_finished() = 0;                   // after a batch's done returned
  virtual void context_lost(const Status& error) = 0;  // a sticky error was seen
 protected:
  ~LaneOwner() = default;
};

class CopyLane {
 public:
  CopyLane(LaneOwner& owner, GpuSetPtr gpus, int gpu, LaneOptions options, std::string name);
  ~CopyLane();
  CopyLane(const CopyLane&) = delete;
  CopyLane& operator=(const CopyLane&) = delete;

  // Creates the stream (non-blocking, `priority`) and starts the thread.
  Status start(int priority);
  // Finishes the queued work, joins the thread and destroys the stream.
  void stop() KVTIER_EXCLUDES(mu_);
  void enqueue(std::shared_ptr<BatchState> batch, LaneRun run) KVTIER_EXCLUDES(mu_);

 private:
  struct Job {
    std::shared_ptr<BatchState> batch;
    LaneRun run;              // background: still to issue
    CUevent event = nullptr;  // foreground: recorded after the run was issued
    Status error;             // foreground: issuing failed
  };
  // Issues copies [begin, end) of `run` on the stream: strided copies with
  // cuMemcpy2DAsync; stretches of one-row copies within the lane's GPU as one batch
  // call where the driver has it and the lane allows it, else one cuMemcpyAsync each;
  // copies from another GPU with cuMemcpyPeerAsync.
  Status issue(LaneRun& run, size_t begin, size_t end);
  Status issue_stretch(LaneRun& run, size_t begin, size_t end);
  Status issue_rows(LaneRun& run, size_t begin, size_t end);
  Status issue_strided(const LaneRun& run, size_t i);
  Status record(CUevent* event);
  Status wait(CUevent event);
  void run_background(Job& job);
  void finish(Job& job, const Status& status);
  void loop() KVTIER_EXCLUDES(mu_);

  LaneOwner& owner_;
  const GpuSetPtr gpus_;
  const DriverApi& driver_;
  const int gpu_;
  const LaneOptions options_;
  const std::string name_;
  CUstream stream_ = nullptr;

  Mutex mu_;
  CondVar ready_;  // a job was queued, or stopping_
  std::deque<Job> queue_ KVTIER_GUARDED_BY(mu_);
  bool stopping_ KVTIER_GUARDED_BY(mu_) = false;
  std::thread thread_;  // the owner's: started by start(), joined by stop()
};

}  // namespace kvtier::cuda
