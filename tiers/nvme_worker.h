// NvmeWorker: one thread running queued jobs in order — the NVMe tier's writer and
// reader. Jobs are plain functions; each runs alone, so a job may block on I/O.
//
// Thread-safety: post() and flush() may be called from any thread but the worker's
// own. Destruction finishes the running job, drops the queued (and delayed) ones and
// joins.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "common/mutex.h"

namespace kvtier {

class NvmeWorker {
 public:
  explicit NvmeWorker(std::string name);
  ~NvmeWorker();
  NvmeWorker(const NvmeWorker&) = delete;
  NvmeWorker& operator=(const NvmeWorker&) = delete;

  void post(std::function<void()> job) KVTIER_EXCLUDES(mu_);
  // Runs `job` once `delay` has passed (after the job running then; before the queued
  // ones). One delayed job at a time: a second call replaces the first.
  void post_after(std::chrono::milliseconds delay, std::function<void()> job) KVTIER_EXCLUDES(mu_);
  // Blocks until the jobs queued before the call have run.
  void flush() KVTIER_EXCLUDES(mu_);
  // Finishes the running job, drops the queued and delayed ones, and joins; what is
  // posted after (by the running job, say) is dropped too. Not from the worker.
  void stop() KVTIER_EXCLUDES(mu_);

 private:
  void run() KVTIER_EXCLUDES(mu_);

  Mutex mu_;
  CondVar changed_;  // a job was queued, one finished, or stopping_
  std::deque<std::function<void()>> jobs_ KVTIER_GUARDED_BY(mu_);
  std::function<void()> delayed_ KVTIER_GUARDED_BY(mu_);  // post_after's job, due at delayed_at_
  std::chrono::steady_clock::time_point delayed_at_ KVTIER_GUARDED_BY(mu_);
  uint64_t queued_ KVTIER_GUARDED_BY(mu_) = 0;    // jobs ever queued
  uint64_t finished_ KVTIER_GUARDED_BY(mu_) = 0;  // jobs ever finished (or dropped)
  bool stopping_ KVTIER_GUARDED_BY(mu_) = false;

  const std::string name_;
  std::thread thread_;  // last: starts after the fields above exist
};

}  // namespace kvtier
