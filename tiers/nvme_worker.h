// NvmeWorker: one thread running queued jobs in order — the NVMe tier's writer and
// reader. Jobs are plain functions; each runs alone, so a job may block on I/O.
//
// Thread-safety: post() and flush() may be called from any thread but the worker's
// own. Destruction finishes the running job, drops the queued ones and joins.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace kvtier {

class NvmeWorker {
 public:
  explicit NvmeWorker(std::string name);
  ~NvmeWorker();
  NvmeWorker(const NvmeWorker&) = delete;
  NvmeWorker& operator=(const NvmeWorker&) = delete;

  void post(std::function<void()> job);
  // Blocks until the jobs queued before the call have run.
  void flush();

 private:
  void run();

  // Protected by mu_.
  std::mutex mu_;
  std::condition_variable changed_;  // a job was queued, one finished, or stopping_
  std::deque<std::function<void()>> jobs_;
  uint64_t queued_ = 0;    // jobs ever queued
  uint64_t finished_ = 0;  // jobs ever finished (or dropped)
  bool stopping_ = false;

  const std::string name_;
  std::thread thread_;  // last: starts after the fields above exist
};

}  // namespace kvtier
