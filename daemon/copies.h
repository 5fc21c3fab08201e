// Copies: the one way a batch of block copies reaches the Device (device/device.h), for
// Saves, Loads and the executor's moves alike.
//
// A copy's completion runs on the control thread, after which what copies may have held
// up looks again (after_each_copy: the Service subscribes Unregisters waiting for their
// region, EngineSetup, and Saves waiting for room, SavePath). An executor work guard
// rides with every copy, so
// io_context::run() returns only after the last copy finished. With
// fault-copy-delay-ms (tests only) foreground copies complete late, in order.
//
// Thread-safety: control thread only (daemon_context.h).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "daemon/daemon_context.h"
#include "daemon/requests.h"

namespace kvtier::daemon {

class CopyCompletionDelay;  // copy_delay.h

class Copies final : public Part {
 public:
  Copies(DaemonContext& ctx, Replies& replies);
  ~Copies();

  // `then` runs after every copy's own completion, in the order subscribed.
  void after_each_copy(std::function<void()> then) KVTIER_REQUIRES(control_thread) {
    after_each_copy_.push_back(std::move(then));
  }

  // Submits `batch`; `done` runs later on the control thread. A refused batch returns
  // the reason and `done` never runs.
  Status submit_copy(CopyBatch batch, std::function<void(Status)> done)
      KVTIER_REQUIRES(control_thread);
  // The segments copying block `index` of a Save or Load (engine block
  // `engine_block_id`) to or from its stored block at `slot`, for the planes of `planes`
  // (count 0: every plane): one contiguous segment from the staging region when the
  // request is staged, else one per plane.
  void add_request_segments(CopyBatch& batch, const EngineContext& engine,
                            const std::optional<StagingTarget>& staging, uint64_t index,
                            uint64_t engine_block_id, const BlockLocation& slot, bool to_engine,
                            BlockPlanes planes = {}) const KVTIER_REQUIRES(control_thread);

 private:
  // Segments copying engine block `engine_block_id` to or from its stored block at
  // `slot`: one per plane of `planes` (count 0: every plane), each at its own offset in
  // the stored block, so a range of planes moves only those planes' bytes.
  void add_plane_segments(CopyBatch& batch, const EngineContext& engine, uint64_t engine_block_id,
                          const BlockLocation& slot, bool to_engine, BlockPlanes planes = {}) const
      KVTIER_REQUIRES(control_thread);
  // The segment copying staged block `index` of a staged request to or from its stored
  // block at `slot`: one contiguous copy of the planes of `planes` (count 0: every plane),
  // which lie back to back in both.
  void add_staged_segment(CopyBatch& batch, const EngineContext& engine,
                          const StagingTarget& staging, uint64_t index, const BlockLocation& slot,
                          bool to_engine, BlockPlanes planes = {}) const
      KVTIER_REQUIRES(control_thread);
  // fault-copy-delay-ms (tests only; nullptr when 0). The completions it holds carry
  // pins and pending writes: destroyed before the store (the Service's order).
  std::unique_ptr<CopyCompletionDelay> copy_delay_ KVTIER_PT_GUARDED_BY(control_thread);
  std::vector<std::function<void()>> after_each_copy_ KVTIER_GUARDED_BY(control_thread);
};

}  // namespace kvtier::daemon
