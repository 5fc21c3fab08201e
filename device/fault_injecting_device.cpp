#include "device/device.h"

#include <utility>

namespace kvtier {

void FaultInjectingDevice::fail_nth_submit(int nth, Status error) {
  // nth <= 0 disarms, so a test can cancel a failure it no longer wants.
  submits_until_failure_ = nth > 0 ? nth : 0;
  submit_error_ = std::move(error);
}

void FaultInjectingDevice::fail_open_region(Status error) {
  open_error_ = std::move(error);
}

Result<std::shared_ptr<Memory>> FaultInjectingDevice::open_region(RegionHandle handle) {
  if (!open_error_.is_ok()) return open_error_;
  return inner_->open_region(std::move(handle));
}

Status FaultInjectingDevice::submit(CopyBatch batch, CopyDone done) {
  if (submits_until_failure_ > 0 && --submits_until_failure_ == 0) {
    // The failing submit goes to the inner device with its memories but no segments:
    // nothing is copied, yet `done` still runs asynchronously on a device thread, after
    // the memories were let go, and drain() waits for it, as for a real failure. Its
    // segments are not validated: the batch fails whatever it holds.
    batch.segments.clear();
    done = [done = std::move(done), error = submit_error_](Status) { done(error); };
  }
  if (holding_) {
    held_.emplace_back(std::move(batch), std::move(done));
    return Status::ok();
  }
  return inner_->submit(std::move(batch), std::move(done));
}

void FaultInjectingDevice::release_submits() {
  holding_ = false;
  release_oldest_submits(held_.size());
}

void FaultInjectingDevice::release_oldest_submits(size_t count) {
  while (count-- > 0 && !held_.empty()) {
    auto [batch, done] = std::move(held_.front());
    held_.pop_front();
    // Accepted at submit() already: a rejection now must still reach the waiter.
    Status submitted = inner_->submit(std::move(batch), done);
    if (!submitted.is_ok()) done(submitted);
  }
}

}  // namespace kvtier
