// CopyLane: one CUDA stream of one GPU, and the thread that waits for its copies.
// Internal to the CUDA backend (cuda_device.cpp).
//
// A batch's segments are split by (GPU, direction, priority) into runs, one per
// lane; each lane completes its runs in its own stream order, so a batch waits only
// for the streams it used. The last lane to finish a batch drops the batch's memory
// references, then calls its `done`.
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
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_memory.h"

namespace kvtier::cuda {

// One submitted batch while its parts are in flight.
struct BatchState {
  BatchState(CopyBatch copies, CopyDone on_done, int parts)
      : batch(std::move(copies)), done(std::move(on_done)), parts_left(parts) {}
  CopyBatch batch;  // holds the memories until the last part finished
  CopyDone done;
  std::atomic<int> parts_left;
  std::mutex mu;  // protects error
  Status error;
};

// The copies of one batch for one lane.
struct LaneRun {
  std::vector<CUdeviceptr> dsts;
  std::vector<CUdeviceptr> srcs;
  std::vector<size_t> sizes;
  // Per copy: the served GPU whose memory the source is when it is not the lane's GPU
  // (a copy between GPUs, issued with cuMemcpyPeerAsync), else -1.
  std::vector<int> peer_sources;
  void add(CUdeviceptr dst, CUdeviceptr src, uint64_t bytes, int peer_source = -1) {
    dsts.push_back(dst);
    srcs.push_back(src);
    sizes.push_back(bytes);
    peer_sources.push_back(peer_source);
  }
  bool empty() const { return sizes.empty(); }
};

// How a lane issues copies.
struct LaneOptions {
  uint64_t piece_bytes = 0;   // 0: foreground; else background in pieces of at most this
  bool batch_allowed = true;  // cuMemcpyBatchAsync may take this lane's operands
  unsigned batch_flags = 0;   // CUmemcpyFlags for the batch's attributes
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
  void stop();
  void enqueue(std::shared_ptr<BatchState> batch, LaneRun run);

 private:
  struct Job {
    std::shared_ptr<BatchState> batch;
    LaneRun run;              // background: still to issue
    CUevent event = nullptr;  // foreground: recorded after the run was issued
    Status error;             // foreground: issuing failed
  };
  // Issues copies [begin, end) of `run` on the stream: stretches of copies within the
  // lane's GPU as one batch call where the driver has it and the lane allows it, else
  // one cuMemcpyAsync each; copies from another GPU with cuMemcpyPeerAsync.
  Status issue(LaneRun& run, size_t begin, size_t end);
  Status issue_stretch(LaneRun& run, size_t begin, size_t end);
  Status record(CUevent* event);
  Status wait(CUevent event);
  void run_background(Job& job);
  void finish(Job& job, const Status& status);
  void loop();

  LaneOwner& owner_;
  const GpuSetPtr gpus_;
  const DriverApi& driver_;
  const int gpu_;
  const LaneOptions options_;
  const std::string name_;
  CUstream stream_ = nullptr;

  std::mutex mu_;  // protects the fields below
  std::condition_variable ready_;
  std::deque<Job> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kvtier::cuda
