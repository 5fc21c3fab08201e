#include "cuda/copy_lane.h"

#include "common/log.h"

namespace kvtier::cuda {

void LaneRun::fold_strided(uint32_t min_rows, uint64_t max_pitch) {
  // Whether copy j continues a stride that copy i started (steps checked by the caller).
  auto joinable = [&](size_t i, size_t j) {
    return rows[j] == 1 && peer_sources[j] < 0 && sizes[j] == sizes[i] &&
           memories[j] == memories[i];
  };
  auto step_ok = [&](CUdeviceptr from, CUdeviceptr to, size_t width) {
    return to > from && to - from >= width && to - from <= max_pitch;
  };
  const size_t n = count();
  size_t out = 0;
  auto keep = [&](size_t i) {
    if (out != i) {
      dsts[out] = dsts[i];
      srcs[out] = srcs[i];
      sizes[out] = sizes[i];
      peer_sources[out] = peer_sources[i];
      rows[out] = rows[i];
      dst_pitches[out] = dst_pitches[i];
      src_pitches[out] = src_pitches[i];
      memories[out] = memories[i];
    }
    ++out;
  };
  size_t i = 0;
  while (i < n) {
    size_t end = i + 1;
    if (rows[i] == 1 && peer_sources[i] < 0 && sizes[i] > 0 && end < n && joinable(i, end) &&
        step_ok(dsts[i], dsts[end], sizes[i]) && step_ok(srcs[i], srcs[end], sizes[i])) {
      const CUdeviceptr dst_step = dsts[end] - dsts[i], src_step = srcs[end] - srcs[i];
      ++end;
      while (end < n && end - i < UINT32_MAX && joinable(i, end) &&
             dsts[end] - dsts[end - 1] == dst_step && srcs[end] - srcs[end - 1] == src_step) {
        ++end;
      }
      if (end - i >= min_rows) {
        keep(i);
        rows[out - 1] = static_cast<uint32_t>(end - i);
        dst_pitches[out - 1] = dst_step;
        src_pitches[out - 1] = src_step;
        i = end;
        continue;
      }
    }
    for (; i < end; ++i) keep(i);
  }
  dsts.resize(out);
  srcs.resize(out);
  sizes.resize(out);
  peer_sources.resize(out);
  rows.resize(out);
  dst_pitches.resize(out);
  src_pitches.resize(out);
  memories.resize(out);
}

CopyLane::CopyLane(LaneOwner& owner, GpuSetPtr gpus, int gpu, LaneOptions options, std::string name)
    : owner_(owner),
      gpus_(std::move(gpus)),
      driver_(gpus_->driver()),
      gpu_(gpu),
      options_(options),
      name_(std::move(name)) {}

CopyLane::~CopyLane() {
  stop();
}

Status CopyLane::start(int priority) {
  KVTIER_RETURN_IF_ERROR(gpus_->make_current(gpu_));
  KVTIER_RETURN_IF_ERROR(
      driver_status(driver_.stream_create_with_priority(&stream_, CU_STREAM_NON_BLOCKING, priority),
                    fmt::format("cuStreamCreateWithPriority (lane {})", name_)));
  thread_ = std::thread([this] { loop(); });
  return Status::ok();
}

void CopyLane::stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  ready_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (stream_ != nullptr) {
    (void)gpus_->make_current(gpu_);
    driver_.stream_destroy(stream_);
    stream_ = nullptr;
  }
}

void CopyLane::enqueue(std::shared_ptr<BatchState> batch, LaneRun run) {
  Job job{std::move(batch), {}, nullptr, Status::ok()};
  if (options_.piece_bytes == 0) {
    // Foreground: into the copy engine's queue now, from the caller's thread.
    if (!run.empty()) {
      job.error = gpus_->make_current(gpu_);
      if (job.error.is_ok()) {
        job.error = issue(run, 0, run.sizes.size());
        // Whatever was issued must finish before `done`: record even after an error.
        Status recorded = record(&job.event);
        if (job.error.is_ok()) job.error = recorded;
      }
    }
  } else {
    job.run = std::move(run);
  }
  {
    MutexLock lock(mu_);
    queue_.push_back(std::move(job));
  }
  ready_.notify_one();
}

Status CopyLane::issue(LaneRun& run, size_t begin, size_t end) {
  size_t stretch = begin;
  for (size_t i = begin; i < end; ++i) {
    if (run.peer_sources[i] < 0) continue;
    KVTIER_RETURN_IF_ERROR(issue_stretch(run, stretch, i));
    stretch = i + 1;
    // Between two GPUs: the driver uses peer access where the GPUs have it and stages
    // through host memory where they do not.
    KVTIER_RETURN_IF_ERROR(driver_status(
        driver_.memcpy_peer_async(run.dsts[i], gpus_->gpu(gpu_).context, run.srcs[i],
                                  gpus_->gpu(run.peer_sources[i]).context, run.sizes[i], stream_),
        "cuMemcpyPeerAsync"));
  }
  return issue_stretch(run, stretch, end);
}

Status CopyLane::issue_stretch(LaneRun& run, size_t begin, size_t end) {
  // One-row copies between strided ones are contiguous in the run: one batch each.
  size_t rows_begin = begin;
  for (size_t i = begin; i < end; ++i) {
    if (run.rows[i] == 1) continue;
    KVTIER_RETURN_IF_ERROR(issue_rows(run, rows_begin, i));
    KVTIER_RETURN_IF_ERROR(issue_strided(run, i));
    rows_begin = i + 1;
  }
  return issue_rows(run, rows_begin, end);
}

Status CopyLane::issue_strided(const LaneRun& run, size_t i) {
  CUDA_MEMCPY2D copy{};
  copy.srcMemoryType = options_.src_type;
  if (options_.src_type == CU_MEMORYTYPE_HOST) {
    copy.srcHost = reinterpret_cast<const void*>(run.srcs[i]);
  } else {
    copy.srcDevice = run.srcs[i];
  }
  copy.srcPitch = run.src_pitches[i];
  copy.dstMemoryType = options_.dst_type;
  if (options_.dst_type == CU_MEMORYTYPE_HOST) {
    copy.dstHost = reinterpret_cast<void*>(run.dsts[i]);
  } else {
    copy.dstDevice = run.dsts[i];
  }
  copy.dstPitch = run.dst_pitches[i];
  copy.WidthInBytes = run.sizes[i];
  copy.Height = run.rows[i];
  return driver_status(driver_.memcpy_2d_async(&copy, stream_), "cuMemcpy2DAsync");
}

Status CopyLane::issue_rows(LaneRun& run, size_t begin, size_t end) {
  const size_t count = end - begin;
  const bool batch_api =
      driver_.memcpy_batch_v13000 != nullptr || driver_.memcpy_batch_v12080 != nullptr;
  if (count > 1 && batch_api && options_.batch_allowed) {
    CUmemcpyAttributes attributes{};
    // The sources were written before the request (the engine synchronized, or an
    // earlier copy on the daemon's side completed): stream order suffices.
    attributes.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    attributes.flags = options_.batch_flags;
    size_t attribute_index = 0;
    if (driver_.memcpy_batch_v13000 != nullptr) {
      return driver_status(
          driver_.memcpy_batch_v13000(run.dsts.data() + begin, run.srcs.data() + begin,
                                      run.sizes.data() + begin, count, &attributes,
                                      &attribute_index, 1, stream_),
          "cuMemcpyBatchAsync");
    }
    size_t fail_index = SIZE_MAX;
    return driver_status(
        driver_.memcpy_batch_v12080(run.dsts.data() + begin, run.srcs.data() + begin,
                                    run.sizes.data() + begin, count, &attributes, &attribute_index,
                                    1, &fail_index, stream_),
        "cuMemcpyBatchAsync");
  }
  for (size_t i = begin; i < end; ++i) {
    KVTIER_RETURN_IF_ERROR(driver_status(
        driver_.memcpy_async(run.dsts[i], run.srcs[i], run.sizes[i], stream_), "cuMemcpyAsync"));
  }
  return Status::ok();
}

Status CopyLane::record(CUevent* event) {
  KVTIER_RETURN_IF_ERROR(
      driver_status(driver_.event_create(event, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC),
                    "cuEventCreate"));
  return driver_status(driver_.event_record(*event, stream_), "cuEventRecord");
}

Status CopyLane::wait(CUevent event) {
  Status status = driver_status(driver_.event_synchronize(event), "copy");
  driver_.event_destroy(event);
  return status;
}

void CopyLane::run_background(Job& job) {
  LaneRun& run = job.run;
  size_t begin = 0;
  Status status;
  while (begin < run.sizes.size() && status.is_ok()) {
    size_t end = begin;
    uint64_t bytes = 0;
    do {
      bytes += run.bytes(end++);
    } while (end < run.count() && bytes + run.bytes(end) <= options_.piece_bytes);
    status = gpus_->make_current(gpu_);
    if (!status.is_ok()) break;
    status = issue(run, begin, end);
    CUevent event = nullptr;
    Status recorded = record(&event);
    if (status.is_ok()) status = recorded;
    if (event != nullptr) {
      Status waited = wait(event);
      if (status.is_ok()) status = waited;
    }
    begin = end;
  }
  finish(job, status);
}

void CopyLane::finish(Job& job, const Status& status) {
  BatchState& state = *job.batch;
  if (!status.is_ok()) {
    if (status.code() == StatusCode::kDataLoss) owner_.context_lost(status);
    MutexLock lock(state.mu);
    if (state.error.is_ok()) state.error = status;
  }
  if (state.parts_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    CopyDone done = std::move(state.done);
    Status error;
    {
      MutexLock lock(state.mu);
      error = state.error;
    }
    state.batch = CopyBatch();  // let go of the memories before `done` (device/device.h)
    job.batch.reset();
    done(error);
    owner_.batch_finished();
  }
  job.batch.reset();
}

void CopyLane::loop() {
  (void)gpus_->make_current(gpu_);
  while (true) {
    Job job;
    {
      MutexLock lock(mu_);
      while (!stopping_ && queue_.empty()) ready_.wait(lock);
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    if (options_.piece_bytes != 0) {
      run_background(job);
      continue;
    }
    Status status = job.error;
    if (job.event != nullptr) {
      Status waited = wait(job.event);
      if (status.is_ok()) status = waited;
    }
    finish(job, status);
  }
}

}  // namespace kvtier::cuda
