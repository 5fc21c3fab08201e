#include "daemon/copy_delay.h"

#include <algorithm>
#include <utility>

namespace kvtier::daemon {

struct CopyCompletionDelay::Place {
  std::function<void()> deliver;  // set when the copy landed
  bool copied = false;
};

CopyCompletionDelay::CopyCompletionDelay(boost::asio::io_context& io,
                                         std::chrono::milliseconds delay)
    : delay_(delay), timer_(io) {}

// The timer's handler may still be queued (cancelled): it must not find a dangling
// `this`, so it reads nothing once the wait was aborted.
CopyCompletionDelay::~CopyCompletionDelay() {
  timer_.cancel();
}

std::shared_ptr<CopyCompletionDelay::Place> CopyCompletionDelay::enter() {
  line_.push_back(std::make_shared<Place>());
  return line_.back();
}

void CopyCompletionDelay::leave(const std::shared_ptr<Place>& place) {
  // Only a place whose copy never completed leaves, so it is never the one being
  // timed (that one has landed).
  line_.erase(std::remove(line_.begin(), line_.end(), place), line_.end());
  time_front();  // places behind it may have landed already
}

void CopyCompletionDelay::copied(const std::shared_ptr<Place>& place,
                                 std::function<void()> deliver) {
  place->deliver = std::move(deliver);
  place->copied = true;
  time_front();
}

void CopyCompletionDelay::time_front() {
  if (timing_ || line_.empty() || !line_.front()->copied) return;
  timing_ = true;
  // From now: now is when the front landed, or when the one before it was handed on.
  timer_.expires_after(delay_);
  timer_.async_wait([this](const boost::system::error_code& error) {
    if (error) return;  // cancelled by the destructor: `this` may be gone
    hand_on_front();
  });
}

void CopyCompletionDelay::hand_on_front() {
  timing_ = false;
  std::shared_ptr<Place> front = std::move(line_.front());
  line_.pop_front();
  // Out of the line before it runs: `deliver` may submit copies, which enter() it.
  front->deliver();
  time_front();
}

}  // namespace kvtier::daemon
