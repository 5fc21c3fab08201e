// GatedDevice: a Device that forwards everything to another, except that while its
// gate is closed it keeps the batches submitted to it instead of copying them, and
// hands them on, in submission order, when the gate opens. A test closes the gate to
// hold a Save's or a Load's copy in flight for as long as it needs (to unregister a
// region under it, say) without a slow machine or a sleep.
//
// A held batch is not validated until the gate opens: a batch the inner device would
// reject then fails through its `done` (with the inner device's error) instead of
// from submit(). The daemon only builds valid batches, so tests never see this.
//
// Thread-safety: like the daemon's other state, the gate belongs to the control thread:
// submit(), close_gate(), open_gate() and held() must be called there. drain() may be
// called from any one thread once nothing else calls in (the Service's destructor);
// it opens the gate first, so it never waits for a batch nobody will release.
#pragma once

#include <deque>
#include <memory>
#include <utility>

#include "cuda/device.h"

namespace kvtier::daemon {

class GatedDevice final : public Device {
 public:
  explicit GatedDevice(std::unique_ptr<Device> inner) : inner_(std::move(inner)) {}

  void close_gate() { closed_ = true; }
  // Submits every held batch to the inner device, in order, and lets later ones through.
  void open_gate();
  // Batches submitted while the gate was closed and not yet handed on.
  size_t held() const { return held_.size(); }

  std::string_view name() const override { return inner_->name(); }
  std::vector<GpuInfo> gpus() const override { return inner_->gpus(); }
  Result<std::shared_ptr<Memory>> open_region(RegionHandle handle) override {
    return inner_->open_region(std::move(handle));
  }
  Result<std::shared_ptr<Memory>> allocate_arena(uint64_t bytes_per_gpu,
                                                 uint64_t part_alignment = 1) override {
    return inner_->allocate_arena(bytes_per_gpu, part_alignment);
  }
  Result<std::shared_ptr<Memory>> allocate_pinned_pool(uint64_t bytes) override {
    return inner_->allocate_pinned_pool(bytes);
  }
  Result<UnfilledMemory> reserve_arena(uint64_t bytes_per_gpu,
                                       uint64_t part_alignment = 1) override {
    return inner_->reserve_arena(bytes_per_gpu, part_alignment);
  }
  Result<UnfilledMemory> reserve_pinned_pool(uint64_t bytes) override {
    return inner_->reserve_pinned_pool(bytes);
  }
  Status submit(CopyBatch batch, CopyDone done) override;
  void drain() override;
  void set_fatal_error_handler(std::function<void(const Status&)> handler) override {
    inner_->set_fatal_error_handler(std::move(handler));
  }

 private:
  std::unique_ptr<Device> inner_;
  bool closed_ = false;
  std::deque<std::pair<CopyBatch, CopyDone>> held_;
};

}  // namespace kvtier::daemon
