// Clock: the policy's only source of time. The daemon passes a SteadyClock; tests and
// the trace simulator pass a ManualClock they advance themselves.
// Thread-safety: SteadyClock is safe everywhere; ManualClock belongs to one thread.
#pragma once

#include <chrono>
#include <cstdint>

namespace kvtier::policy {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual uint64_t now_ms() const = 0;  // monotonic milliseconds, arbitrary origin
};

class SteadyClock final : public Clock {
 public:
  uint64_t now_ms() const override {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  }
};

class ManualClock final : public Clock {
 public:
  explicit ManualClock(uint64_t start_ms = 0) : now_ms_(start_ms) {}
  uint64_t now_ms() const override { return now_ms_; }
  void advance_ms(uint64_t millis) { now_ms_ += millis; }
  void set_ms(uint64_t millis) { now_ms_ = millis; }

 private:
  uint64_t now_ms_;
};

}  // namespace kvtier::policy
