#include "tiers/nvme_worker.h"

#include <pthread.h>

namespace kvtier {

NvmeWorker::NvmeWorker(std::string name) : name_(std::move(name)), thread_([this] { run(); }) {}

NvmeWorker::~NvmeWorker() {
  stop();
}

void NvmeWorker::stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void NvmeWorker::post(std::function<void()> job) {
  {
    MutexLock lock(mu_);
    jobs_.push_back(std::move(job));
    ++queued_;
  }
  changed_.notify_all();
}

void NvmeWorker::post_after(std::chrono::milliseconds delay, std::function<void()> job) {
  {
    MutexLock lock(mu_);
    delayed_ = std::move(job);
    delayed_at_ = std::chrono::steady_clock::now() + delay;
  }
  changed_.notify_all();
}

void NvmeWorker::flush() {
  MutexLock lock(mu_);
  const uint64_t target = queued_;
  while (finished_ < target && !stopping_) changed_.wait(lock);
}

void NvmeWorker::run() {
  (void)::pthread_setname_np(::pthread_self(), name_.substr(0, 15).c_str());
  MutexLock lock(mu_);
  while (true) {
    if (stopping_) {
      std::function<void()> delayed = std::move(delayed_);
      delayed_ = nullptr;
      // Queued jobs are dropped without running: none of them has touched the disk,
      // and each is safe to lose (see NvmeTier).
      std::deque<std::function<void()>> dropped = std::move(jobs_);
      jobs_.clear();
      lock.unlock();
      const uint64_t count = dropped.size();
      dropped.clear();  // outside the lock: what the jobs captured may do anything
      delayed = nullptr;
      lock.lock();
      finished_ += count;
      changed_.notify_all();
      return;
    }
    if (delayed_ && std::chrono::steady_clock::now() >= delayed_at_) {
      // Due: it goes before the queue, which a steady stream of jobs may never empty.
      std::function<void()> job = std::move(delayed_);
      delayed_ = nullptr;
      lock.unlock();
      job();
      job = nullptr;
      lock.lock();
      continue;
    }
    if (!jobs_.empty()) {
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      job = nullptr;  // release what the job captured before reporting it finished
      lock.lock();
      ++finished_;
      changed_.notify_all();
      continue;
    }
    // Nothing to run yet: wait for a job, a delayed job, its time, or the stop (every
    // one of them notifies; the loop looks again whatever woke it).
    if (delayed_) {
      changed_.wait_until(lock, delayed_at_);
    } else {
      changed_.wait(lock);
    }
  }
}

}  // namespace kvtier
