// CopyCompletionDelay: what `fault-copy-delay-ms` (TESTS ONLY) does. The copies an
// engine waits for (Save and Load: foreground batches) run on the Device as usual, but
// their completions are handed on one at a time, in the order the copies were
// submitted, each `delay` after the later of (its copy landing) and (the completion
// before it being handed on): the pace of one copy engine that spends `delay` more on
// every batch. So a layer-wise load of N pipelined Loads is answered about `delay`
// apart, layer 0 first, without a slow machine.
//
// The order is the submission order across all copies, whatever the copy threads or
// streams: a copy that lands early (another thread, a smaller batch) waits for the
// ones submitted before it. Nothing blocks meanwhile: the wait is a timer on the
// control thread's io_context, and the copy threads go on copying.
//
// Thread-safety: control thread only — every method, and the timer's handler, runs
// there. Ownership: the held completions belong to this object; one still held when it
// is destroyed is dropped without running (the io_context outlives it: the Service
// waits for every copy before it goes, so that happens only on an abandoned loop).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>

namespace kvtier::daemon {

class CopyCompletionDelay {
 public:
  // One copy's place in line; opaque to callers.
  struct Place;

  // REQUIRES: delay > 0.
  CopyCompletionDelay(boost::asio::io_context& io, std::chrono::milliseconds delay);
  ~CopyCompletionDelay();
  CopyCompletionDelay(const CopyCompletionDelay&) = delete;
  CopyCompletionDelay& operator=(const CopyCompletionDelay&) = delete;

  // A copy about to be submitted takes the last place in line.
  std::shared_ptr<Place> enter();
  // Its copy was refused (it will never complete): the place leaves the line.
  void leave(const std::shared_ptr<Place>& place);
  // Its copy completed: `deliver` runs once every earlier place has been handed on
  // and `delay` has passed since then or since now, whichever is later. Never runs
  // `deliver` before returning. REQUIRES: called once per place, not after leave().
  void copied(const std::shared_ptr<Place>& place, std::function<void()> deliver);

 private:
  // Starts the timer for the front of the line when its copy has landed and no
  // completion is being timed.
  void time_front();
  void hand_on_front();

  const std::chrono::milliseconds delay_;
  boost::asio::steady_timer timer_;
  std::deque<std::shared_ptr<Place>> line_;  // oldest submission first
  bool timing_ = false;                      // the timer runs for line_.front()
};

}  // namespace kvtier::daemon
