// RegionWorker: the thread(s) that open and close engine regions for the daemon, so
// that mapping a large region (mmap + MAP_POPULATE of a memfd, cuIpcOpenMemHandle, a
// VMM import of hundreds of chunks) or tearing one down never stalls the control
// thread, which keeps serving every other engine meanwhile.
//
// Jobs run in the order they were posted when there is one thread; with several,
// independent jobs overlap. A job must only do its blocking work and hand the result
// back to the control thread (asio::post); it must not touch the Service's state.
// CUDA calls inside a job make their GPU's context current themselves (cuda/: every
// region open and close does so on the thread it runs on).
//
// Thread-safety: post() may be called from any thread. The destructor runs the jobs
// still queued, then joins the threads.
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace kvtier::daemon {

class RegionWorker {
 public:
  explicit RegionWorker(int threads);
  ~RegionWorker();
  RegionWorker(const RegionWorker&) = delete;
  RegionWorker& operator=(const RegionWorker&) = delete;

  void post(std::function<void()> job) KVTIER_EXCLUDES(mu_);

 private:
  void run() KVTIER_EXCLUDES(mu_);

  Mutex mu_;
  CondVar job_ready_;  // a job was queued, or stopping_
  std::deque<std::function<void()>> jobs_ KVTIER_GUARDED_BY(mu_);
  bool stopping_ KVTIER_GUARDED_BY(mu_) = false;

  std::vector<std::thread> threads_;  // constant after construction
};

}  // namespace kvtier::daemon
