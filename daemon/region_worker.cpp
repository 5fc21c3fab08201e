#include "daemon/region_worker.h"

#include <algorithm>

namespace kvtier::daemon {

RegionWorker::RegionWorker(int threads) {
  const int count = std::max(threads, 1);
  threads_.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) threads_.emplace_back([this] { run(); });
}

RegionWorker::~RegionWorker() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  job_ready_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

void RegionWorker::post(std::function<void()> job) {
  {
    MutexLock lock(mu_);
    jobs_.push_back(std::move(job));
  }
  job_ready_.notify_one();
}

void RegionWorker::run() {
  for (;;) {
    std::function<void()> job;
    {
      MutexLock lock(mu_);
      while (!stopping_ && jobs_.empty()) job_ready_.wait(lock);
      // Queued jobs still run when stopping: a close must happen, and an open's result
      // is dropped harmlessly once the control loop is gone.
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace kvtier::daemon
