#include "tests/daemon/gated_device.h"

namespace kvtier::daemon {

Status GatedDevice::submit(CopyBatch batch, CopyDone done) {
  if (!closed_) return inner_->submit(std::move(batch), std::move(done));
  held_.emplace_back(std::move(batch), std::move(done));
  return Status::ok();
}

void GatedDevice::open_gate() {
  closed_ = false;
  while (!held_.empty()) {
    auto [batch, done] = std::move(held_.front());
    held_.pop_front();
    // Accepted at submit() already: a rejection now must still reach the waiter.
    Status submitted = inner_->submit(std::move(batch), done);
    if (!submitted.is_ok()) done(submitted);
  }
}

void GatedDevice::drain() {
  open_gate();
  inner_->drain();
}

}  // namespace kvtier::daemon
