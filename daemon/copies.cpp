// Copies: batches to the Device, their completions back on the control thread (copies.h).
#include "daemon/copies.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>

#include "common/log.h"
#include "daemon/copy_delay.h"

namespace kvtier::daemon {

Copies::Copies(DaemonContext& ctx, Replies& replies) : Part(ctx, replies) {
  if (ctx_.config.fault_copy_delay_ms > 0) {  // fault-copy-delay-ms (tests only)
    KVTIER_LOG_INFO("every Save and Load copy completes {} ms late, one at a time (tests only)",
                    ctx_.config.fault_copy_delay_ms);
    copy_delay_ = std::make_unique<CopyCompletionDelay>(
        ctx_.io, std::chrono::milliseconds(ctx_.config.fault_copy_delay_ms));
  }
}

Copies::~Copies() = default;

namespace {

// One segment between a tier slot and engine memory, in the copy's direction.
void push_segment(CopyBatch& batch, bool to_engine, uint32_t tier_index, uint32_t region_index,
                  uint64_t slot_offset, uint64_t engine_offset, uint64_t bytes) {
  if (to_engine) {
    batch.segments.push_back({tier_index, region_index, slot_offset, engine_offset, bytes});
  } else {
    batch.segments.push_back({region_index, tier_index, engine_offset, slot_offset, bytes});
  }
}

}  // namespace

void Copies::add_plane_segments(CopyBatch& batch, const EngineContext& engine,
                                uint64_t engine_block_id, const BlockLocation& slot, bool to_engine,
                                BlockPlanes planes) const {
  const uint32_t tier_index = batch.memory_index(ctx_.store->memory(slot.tier));
  for (const PlaneLayout& plane : planes.of(engine.layout)) {
    const uint32_t region_index = batch.memory_index(engine.regions.at(plane.region_id));
    const uint64_t engine_offset = engine.layout.plane_offset(plane, engine_block_id);
    push_segment(batch, to_engine, tier_index, region_index, slot.offset + plane.offset_in_block,
                 engine_offset, plane.bytes_per_block);
  }
}

void Copies::add_staged_segment(CopyBatch& batch, const EngineContext& engine,
                                const StagingTarget& staging, uint64_t index,
                                const BlockLocation& slot, bool to_engine,
                                BlockPlanes planes) const {
  const auto range = planes.of(engine.layout);
  const uint32_t tier_index = batch.memory_index(ctx_.store->memory(slot.tier));
  const uint32_t region_index = batch.memory_index(engine.regions.at(staging.region_id));
  const uint64_t staged_offset = staging.offset + index * staging.row_bytes;
  push_segment(batch, to_engine, tier_index, region_index,
               slot.offset + range.front().offset_in_block, staged_offset, staging.row_bytes);
}

void Copies::add_request_segments(CopyBatch& batch, const EngineContext& engine,
                                  const std::optional<StagingTarget>& staging, uint64_t index,
                                  uint64_t engine_block_id, const BlockLocation& slot,
                                  bool to_engine, BlockPlanes planes) const {
  if (staging) {
    add_staged_segment(batch, engine, *staging, index, slot, to_engine, planes);
  } else {
    add_plane_segments(batch, engine, engine_block_id, slot, to_engine, planes);
  }
}

Status Copies::submit_copy(CopyBatch batch, std::function<void(Status)> done) {
  ++ctx_.counters.copies_in_flight;
  // The work guard keeps io_context::run() alive until this completion has run.
  auto guard = asio::make_work_guard(ctx_.io);
  auto finish = [this, guard, done = std::move(done)](Status status) {
    assert_control_thread();
    --ctx_.counters.copies_in_flight;
    done(status);
    // The device let go of the batch's memories before it called us, and its pins are
    // gone: whoever waited for that looks again.
    for (const std::function<void()>& then : after_each_copy_) then();
  };
  // fault-copy-delay-ms (tests only): an engine's copies complete later, in order.
  CopyCompletionDelay* delay =
      batch.priority == CopyPriority::kForeground ? copy_delay_.get() : nullptr;
  auto place = delay != nullptr ? delay->enter() : nullptr;
  Status submitted = ctx_.device->submit(
      std::move(batch), [this, guard, place, finish = std::move(finish)](Status status) {
        asio::post(ctx_.io, [this, guard, place, finish, status]() {
          assert_control_thread();
          if (place != nullptr) {
            copy_delay_->copied(place, [finish, status] { finish(status); });
          } else {
            finish(status);
          }
        });
      });
  if (!submitted.is_ok()) {
    --ctx_.counters.copies_in_flight;
    if (delay != nullptr) delay->leave(place);
  }
  return submitted;
}

}  // namespace kvtier::daemon
