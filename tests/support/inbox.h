// Inbox: what a daemon's control thread is to a worker that posts completions (the
// remote tier's RemoteWorker): completions queue here, from any thread, and the test runs
// them one at a time on its own. Header-only.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>

namespace kvtier::testing {

class Inbox {
 public:
  // A post function for the worker.
  std::function<void(std::function<void()>)> post() {
    return [this](std::function<void()> fn) {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(fn));
      cv_.notify_all();
    };
  }
  // Runs one completion; false when none came within `timeout`.
  bool run_one(std::chrono::milliseconds timeout = std::chrono::milliseconds(10'000)) {
    std::function<void()> fn;
    {
      std::unique_lock lock(mu_);
      if (!cv_.wait_for(lock, timeout, [this] { return !queue_.empty(); })) return false;
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
    return true;
  }
  size_t pending() {
    std::lock_guard lock(mu_);
    return queue_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
};

}  // namespace kvtier::testing
