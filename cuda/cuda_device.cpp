#include "cuda/cuda_device.h"

#include "common/gpu_uuid.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "common/log.h"
#include "cuda/cuda_memory.h"

namespace kvtier {
namespace {

using namespace cuda_internal;

enum Direction { kDeviceToHost = 0, kHostToDevice = 1, kDeviceToDevice = 2, kDirections = 3 };

std::string format_uuid(const cudaUUID_t& uuid) {
  return format_gpu_uuid(
      std::span<const uint8_t, 16>(reinterpret_cast<const uint8_t*>(uuid.bytes), 16));
}

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, std::string name, std::string uuid, CudaDeviceOptions options)
      : ordinal_(ordinal), name_(std::move(name)), uuid_(std::move(uuid)), options_(options) {}

  Status init() {
    KVTIER_RETURN_IF_ERROR(driver_.load());
    for (auto& stream : streams_) {
      KVTIER_RETURN_IF_ERROR(cuda_status(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                         "cudaStreamCreate"));
    }
    completer_ = std::thread([this] { complete_in_order(); });
    return Status::ok();
  }

  ~CudaDevice() override {
    drain();
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    work_ready_.notify_all();
    if (completer_.joinable()) completer_.join();
    for (auto& stream : streams_) {
      if (stream != nullptr) cudaStreamDestroy(stream);
    }
  }

  std::string_view name() const override { return name_; }

  Result<std::shared_ptr<Memory>> open_region(RegionHandle handle) override {
    if (handle.size_bytes == 0) return invalid_argument("sizeBytes is 0");
    if (!handle.gpu_uuid.empty() && handle.gpu_uuid != uuid_) {
      return invalid_argument("the region is on GPU {}; this daemon serves {} ({})",
                              handle.gpu_uuid, uuid_, name_);
    }
    switch (handle.kind) {
      case RegionHandle::Kind::kCudaIpc:
        return open_ipc_region(handle, ordinal_, driver_);
      case RegionHandle::Kind::kCudaVmmFd:
        if (!handle.fd.valid()) return invalid_argument("a VMM region needs its fd");
        return open_vmm_region(handle, ordinal_, driver_);
      case RegionHandle::Kind::kMemfd:
        break;
    }
    return invalid_argument("the CUDA backend opens cudaIpc and cudaVmmFd regions, not memfd");
  }

  Result<std::shared_ptr<Memory>> allocate_arena(uint64_t bytes) override {
    if (bytes == 0) return invalid_argument("hbm arena: bytes is 0");
    KVTIER_RETURN_IF_ERROR(cuda_status(cudaSetDevice(ordinal_), "cudaSetDevice"));
    void* data = nullptr;
    KVTIER_RETURN_IF_ERROR(
        cuda_status(cudaMalloc(&data, bytes), fmt::format("cudaMalloc {} bytes", bytes)));
    return std::shared_ptr<Memory>(std::make_shared<DeviceAllocation>(data, bytes, ordinal_));
  }

  Result<std::shared_ptr<Memory>> allocate_pinned_pool(uint64_t bytes) override {
    KVTIER_RETURN_IF_ERROR(cuda_status(cudaSetDevice(ordinal_), "cudaSetDevice"));
    return allocate_pinned(bytes, options_.pool_touch_threads);
  }

  Status submit(CopyBatch batch, CopyDone done) override {
    struct Run {
      std::vector<void*> dsts;
      std::vector<const void*> srcs;
      std::vector<size_t> sizes;
    };
    Run runs[kDirections];
    std::vector<std::byte*> addresses;
    for (const auto& memory : batch.memories) {
      std::byte* address = memory ? copy_address(*memory) : nullptr;
      if (address == nullptr)
        return invalid_argument("batch names memory the CUDA backend did not open");
      addresses.push_back(address);
    }
    for (size_t i = 0; i < batch.segments.size(); ++i) {
      const CopySegment& s = batch.segments[i];
      if (s.src_memory >= addresses.size() || s.dst_memory >= addresses.size()) {
        return invalid_argument("segment {} names a memory index out of range", i);
      }
      const Memory& src = *batch.memories[s.src_memory];
      const Memory& dst = *batch.memories[s.dst_memory];
      if (s.src_offset > src.size_bytes() || s.bytes > src.size_bytes() - s.src_offset ||
          s.dst_offset > dst.size_bytes() || s.bytes > dst.size_bytes() - s.dst_offset) {
        return invalid_argument("segment {} lies outside its memories", i);
      }
      if (s.bytes == 0) continue;
      const bool src_gpu = src.location() == MemoryLocation::kGpu,
                 dst_gpu = dst.location() == MemoryLocation::kGpu;
      const int direction = src_gpu && dst_gpu ? kDeviceToDevice
                            : src_gpu          ? kDeviceToHost
                                               : kHostToDevice;
      runs[direction].dsts.push_back(addresses[s.dst_memory] + s.dst_offset);
      runs[direction].srcs.push_back(addresses[s.src_memory] + s.src_offset);
      runs[direction].sizes.push_back(s.bytes);
    }
    Pending pending{std::move(batch), std::move(done), {}, Status::ok()};
    KVTIER_RETURN_IF_ERROR(cuda_status(cudaSetDevice(ordinal_), "cudaSetDevice"));
    for (int d = 0; d < kDirections; ++d) {
      if (runs[d].sizes.empty()) continue;
      Status issued = issue(streams_[d], runs[d].dsts, runs[d].srcs, runs[d].sizes);
      cudaEvent_t event = nullptr;
      Status recorded = cuda_status(
          cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventBlockingSync),
          "cudaEventCreate");
      if (recorded.is_ok())
        recorded = cuda_status(cudaEventRecord(event, streams_[d]), "cudaEventRecord");
      if (event != nullptr) pending.events.push_back(event);
      // Whatever was enqueued must finish before `done` runs, so an error here is
      // reported through the completion, not by returning early.
      if (!issued.is_ok() && pending.error.is_ok()) pending.error = issued;
      if (!recorded.is_ok() && pending.error.is_ok()) pending.error = recorded;
    }
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(pending));
    }
    work_ready_.notify_one();
    return Status::ok();
  }

  void drain() override {
    std::unique_lock lock(mu_);
    all_done_.wait(lock, [this] { return queue_.empty() && !completing_; });
  }

 private:
  struct Pending {
    CopyBatch batch;  // keeps the memories alive until the copies finished
    CopyDone done;
    std::vector<cudaEvent_t> events;
    Status error;
  };

  Status issue(cudaStream_t stream, std::vector<void*>& dsts, std::vector<const void*>& srcs,
               std::vector<size_t>& sizes) {
    if (use_batch_api_) {
      cudaMemcpyAttributes attributes{};
      attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      attributes.flags = cudaMemcpyFlagPreferOverlapWithCompute;
      size_t attribute_index = 0;
      cudaError_t error = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), sizes.size(),
                                               &attributes, &attribute_index, 1, stream);
      if (error == cudaSuccess) return Status::ok();
      if (error != cudaErrorNotSupported && error != cudaErrorInvalidValue) {
        return cuda_status(error, "cudaMemcpyBatchAsync");
      }
      (void)cudaGetLastError();
      use_batch_api_ = false;  // older driver: one call per segment from now on
      KVTIER_LOG_INFO("cudaMemcpyBatchAsync unavailable ({}); using cudaMemcpyAsync per segment",
                      cudaGetErrorName(error));
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      KVTIER_RETURN_IF_ERROR(
          cuda_status(cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyDefault, stream),
                      "cudaMemcpyAsync"));
    }
    return Status::ok();
  }

  // Streams complete in order, so waiting in submission order never delays a batch
  // behind a later one on the same stream.
  void complete_in_order() {
    cudaSetDevice(ordinal_);
    while (true) {
      Pending pending;
      {
        std::unique_lock lock(mu_);
        work_ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        pending = std::move(queue_.front());
        queue_.pop_front();
        completing_ = true;
      }
      Status status = pending.error;
      for (cudaEvent_t event : pending.events) {
        Status synced = cuda_status(cudaEventSynchronize(event), "copy");
        if (!synced.is_ok() && status.is_ok()) status = synced;
        cudaEventDestroy(event);
      }
      pending.done(status);
      pending.batch = CopyBatch();  // release regions before announcing the drain
      {
        std::lock_guard lock(mu_);
        completing_ = false;
      }
      all_done_.notify_all();
    }
  }

  const int ordinal_;
  const std::string name_;
  const std::string uuid_;
  const CudaDeviceOptions options_;
  DriverApi driver_;
  cudaStream_t streams_[kDirections] = {};
  bool use_batch_api_ = true;  // touched only by the submitting (control) thread

  std::mutex mu_;  // protects the fields below
  std::condition_variable work_ready_;
  std::condition_variable all_done_;
  std::deque<Pending> queue_;
  bool completing_ = false;
  bool stopping_ = false;
  std::thread completer_;
};

}  // namespace

Result<std::unique_ptr<Device>> make_cuda_device(const CudaDeviceOptions& options) {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return unavailable("no CUDA device: {}",
                       error != cudaSuccess ? cudaGetErrorString(error) : "0 GPUs");
  }
  if (options.device_ordinal < 0 || options.device_ordinal >= count) {
    return invalid_argument("GPU ordinal {} is outside 0..{}", options.device_ordinal, count - 1);
  }
  cudaDeviceProp props{};
  KVTIER_RETURN_IF_ERROR(cuda_status(cudaGetDeviceProperties(&props, options.device_ordinal),
                                     "cudaGetDeviceProperties"));
  auto device = std::make_unique<CudaDevice>(options.device_ordinal, props.name,
                                             format_uuid(props.uuid), options);
  KVTIER_RETURN_IF_ERROR(device->init());
  return std::unique_ptr<Device>(std::move(device));
}

}  // namespace kvtier
