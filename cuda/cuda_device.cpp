#include "cuda/cuda_device.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <deque>
#include <fstream>
#include <set>
#include <thread>

#include "common/gpu_uuid.h"
#include "common/log.h"
#include "common/mutex.h"
#include "cuda/copy_lane.h"
#include "cuda/cuda_memory.h"

namespace kvtier {
namespace {

using namespace cuda;

// Where a segment's copy runs: GPU (index in the GpuSet), direction, priority.
enum Direction { kDeviceToHost = 0, kHostToDevice = 1, kDeviceToDevice = 2, kDirections = 3 };
constexpr int kPriorities = 2;
constexpr int kLanesPerGpu = kDirections * kPriorities;

class CudaDevice final : public Device, public LaneOwner {
 public:
  CudaDevice(GpuSetPtr gpus, std::string name, CudaDeviceOptions options)
      : gpus_(std::move(gpus)), name_(std::move(name)), options_(std::move(options)) {}

  Status init() {
    const DriverApi& driver = gpus_->driver();
    for (const GpuContext& gpu : gpus_->gpus()) {
      KVTIER_RETURN_IF_ERROR(gpus_->make_current(gpu.index));
      int least = 0, greatest = 0;
      KVTIER_RETURN_IF_ERROR(driver_status(driver.ctx_get_stream_priority_range(&least, &greatest),
                                           "cuCtxGetStreamPriorityRange"));
      for (int priority = 0; priority < kPriorities; ++priority) {
        for (int direction = 0; direction < kDirections; ++direction) {
          const bool background = priority == static_cast<int>(CopyPriority::kBackground);
          LaneOptions lane_options;
          lane_options.piece_bytes = background ? options_.background_piece_bytes : 0;
          // Host operands in a batch need the device to use registered host pointers.
          lane_options.batch_allowed = direction == kDeviceToDevice || gpu.host_pointers_in_batches;
          // Overlap with compute is worth asking for between host and device; on one
          // GPU it would pin the copy to the copy engines, far slower than the SMs.
          lane_options.batch_flags = direction == kDeviceToDevice
                                         ? 0u
                                         : unsigned{CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE};
          lane_options.src_type =
              direction == kHostToDevice ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
          lane_options.dst_type =
              direction == kDeviceToHost ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
          auto lane = std::make_unique<CopyLane>(
              *this, gpus_, gpu.index, lane_options,
              fmt::format("{}/{}{}", gpu.index, kDirectionNames[direction],
                          background ? "/bg" : ""));
          KVTIER_RETURN_IF_ERROR(lane->start(background ? least : greatest));
          lanes_.push_back(std::move(lane));
        }
      }
    }
    return Status::ok();
  }

  ~CudaDevice() override {
    drain();
    for (auto& lane : lanes_) lane->stop();
  }

  std::string_view name() const override { return name_; }

  std::vector<GpuInfo> gpus() const override {
    std::vector<GpuInfo> infos;
    for (const GpuContext& gpu : gpus_->gpus()) infos.push_back(gpu.info);
    return infos;
  }

  Result<std::shared_ptr<Memory>> open_region(RegionHandle handle) override {
    if (handle.size_bytes == 0) return invalid_argument("sizeBytes is 0");
    if (handle.kind == RegionHandle::Kind::kMemfd) {
      return not_supported(
          "this kvtierd runs the CUDA backend: regions are cudaIpc or cudaVmmFd, not memfd");
    }
    auto gpu = find_gpu(handle.gpu_uuid);
    if (!gpu.is_ok()) return gpu.status();
    switch (handle.kind) {
      case RegionHandle::Kind::kCudaIpc:
        return open_ipc_region(gpus_, *gpu, handle);
      case RegionHandle::Kind::kCudaVmmFd:
        return open_vmm_region(gpus_, *gpu, handle);
      case RegionHandle::Kind::kMemfd:
        break;
    }
    return invalid_argument("region kind {} is unknown", static_cast<int>(handle.kind));
  }

  Result<std::shared_ptr<Memory>> allocate_arena(uint64_t bytes_per_gpu,
                                                 uint64_t part_alignment) override {
    if (bytes_per_gpu == 0) return invalid_argument("hbm arena: bytes is 0");
    return cuda::allocate_arena(gpus_, bytes_per_gpu, part_alignment);
  }

  Result<std::shared_ptr<Memory>> allocate_pinned_pool(uint64_t bytes) override {
    return cuda::allocate_pinned_pool(gpus_, bytes, pool_numa_nodes(), options_.pool_touch_threads);
  }

  Result<UnfilledMemory> reserve_pinned_pool(uint64_t bytes) override {
    return cuda::reserve_pinned_pool(gpus_, bytes, pool_numa_nodes());
  }

  Status submit(CopyBatch batch, CopyDone done) override KVTIER_EXCLUDES(mu_) {
    if (lost_.load(std::memory_order_acquire)) {
      return unavailable("the GPU context is lost (a sticky CUDA error); kvtierd must restart");
    }
    std::vector<CudaMemory*> memories;
    for (const auto& memory : batch.memories) {
      auto* cuda_memory = dynamic_cast<CudaMemory*>(memory.get());
      if (cuda_memory == nullptr)
        return invalid_argument("batch names memory the CUDA backend did not open");
      memories.push_back(cuda_memory);
    }
    std::vector<LaneRun> runs(lanes_.size());
    for (size_t i = 0; i < batch.segments.size(); ++i) {
      const CopySegment& s = batch.segments[i];
      if (s.src_memory >= memories.size() || s.dst_memory >= memories.size()) {
        return invalid_argument("segment {} names a memory index out of range", i);
      }
      const CudaMemory& src = *memories[s.src_memory];
      const CudaMemory& dst = *memories[s.dst_memory];
      if (s.src_offset > src.size_bytes() || s.bytes > src.size_bytes() - s.src_offset ||
          s.dst_offset > dst.size_bytes() || s.bytes > dst.size_bytes() - s.dst_offset) {
        return invalid_argument("segment {} lies outside its memories", i);
      }
      if (s.bytes != 0 && (src.gpu_at(s.src_offset) != src.gpu_at(s.src_offset + s.bytes - 1) ||
                           dst.gpu_at(s.dst_offset) != dst.gpu_at(s.dst_offset + s.bytes - 1))) {
        return invalid_argument("segment {} straddles two GPUs' parts of the arena", i);
      }
    }
    // Merged runs stay within one GPU's memory: a run's GPU picks its stream.
    merge_adjacent_segments(batch.segments, [&](uint32_t memory, uint64_t offset) {
      return offset > 0 && memories[memory]->gpu_at(offset) != memories[memory]->gpu_at(offset - 1);
    });
    for (size_t i = 0; i < batch.segments.size(); ++i) {
      const CopySegment& s = batch.segments[i];
      if (s.bytes == 0) continue;
      const CudaMemory& src = *memories[s.src_memory];
      const CudaMemory& dst = *memories[s.dst_memory];
      const int src_gpu = src.gpu_at(s.src_offset), dst_gpu = dst.gpu_at(s.dst_offset);
      // The engine-side GPU's copy engines move the bytes; between two GPUs, the
      // destination's.
      const int gpu = dst_gpu >= 0 ? dst_gpu : std::max(src_gpu, 0);
      const int direction = src_gpu >= 0 && dst_gpu >= 0 ? kDeviceToDevice
                            : src_gpu >= 0               ? kDeviceToHost
                                                         : kHostToDevice;
      const size_t lane = static_cast<size_t>(gpu) * kLanesPerGpu +
                          static_cast<size_t>(batch.priority) * kDirections + direction;
      const bool between_gpus = src_gpu >= 0 && dst_gpu >= 0 && src_gpu != dst_gpu;
      runs[lane].add(dst.address() + s.dst_offset, src.address() + s.src_offset, s.bytes,
                     between_gpus ? src_gpu : -1,
                     (uint64_t{s.src_memory} << 32) | uint64_t{s.dst_memory});
    }
    if (options_.strided_copies) {
      for (size_t lane = 0; lane < runs.size(); ++lane) {
        const uint64_t max_pitch = gpus_->gpu(static_cast<int>(lane / kLanesPerGpu)).max_pitch;
        if (max_pitch > 0) runs[lane].fold_strided(2, max_pitch);
      }
    }

    const auto parts = static_cast<int>(
        std::count_if(runs.begin(), runs.end(), [](const LaneRun& run) { return !run.empty(); }));
    auto state =
        std::make_shared<BatchState>(std::move(batch), std::move(done), std::max(parts, 1));
    {
      MutexLock lock(mu_);
      ++in_flight_;
    }
    if (parts == 0) {  // nothing to copy: complete through a lane all the same
      lanes_.front()->enqueue(state, LaneRun());
      return Status::ok();
    }
    for (size_t lane = 0; lane < lanes_.size(); ++lane) {
      if (!runs[lane].empty()) lanes_[lane]->enqueue(state, std::move(runs[lane]));
    }
    return Status::ok();
  }

  void drain() override KVTIER_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    while (in_flight_ != 0) all_done_.wait(lock);
  }

  void set_fatal_error_handler(std::function<void(const Status&)> handler) override
      KVTIER_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    fatal_handler_ = std::move(handler);
  }

  // LaneOwner: called on lane threads.
  void batch_finished() override KVTIER_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (--in_flight_ == 0) all_done_.notify_all();
  }
  void context_lost(const Status& error) override KVTIER_EXCLUDES(mu_) {
    if (lost_.exchange(true, std::memory_order_acq_rel)) return;
    KVTIER_LOG_ERROR("GPU context lost: {}", error.to_string());
    std::function<void(const Status&)> handler;
    {
      MutexLock lock(mu_);
      handler = fatal_handler_;
    }
    if (handler) handler(error);
  }

 private:
  static constexpr const char* kDirectionNames[kDirections] = {"d2h", "h2d", "d2d"};

  std::vector<int> pool_numa_nodes() const {
    std::set<int> nodes;
    for (const GpuContext& gpu : gpus_->gpus()) {
      if (gpu.info.numa_node >= 0) nodes.insert(gpu.info.numa_node);
    }
    return std::vector<int>(nodes.begin(), nodes.end());
  }

  Result<int> find_gpu(const std::string& uuid) const {
    const auto& all = gpus_->gpus();
    if (uuid.empty()) {
      if (all.size() == 1) return 0;
      return invalid_argument("gpuUuid is empty, but this kvtierd serves {} GPUs: name one",
                              all.size());
    }
    for (const GpuContext& gpu : all) {
      if (gpu.info.uuid == uuid) return gpu.index;
    }
    std::vector<std::string> served;
    for (const GpuContext& gpu : all) served.push_back(gpu.info.uuid);
    return invalid_argument("gpuUuid {} is not served by this kvtierd (it serves {})", uuid,
                            fmt::join(served, ", "));
  }

  const GpuSetPtr gpus_;
  const std::string name_;
  const CudaDeviceOptions options_;
  std::vector<std::unique_ptr<CopyLane>> lanes_;  // [gpu][priority][direction]
  std::atomic<bool> lost_{false};

  Mutex mu_;
  CondVar all_done_;  // in_flight_ reached 0
  uint64_t in_flight_ KVTIER_GUARDED_BY(mu_) = 0;
  std::function<void(const Status&)> fatal_handler_ KVTIER_GUARDED_BY(mu_);
};

std::string describe_gpus(const std::vector<GpuContext>& gpus) {
  std::vector<std::string> names;
  for (const GpuContext& gpu : gpus) names.push_back(gpu.info.name);
  if (std::all_of(names.begin(), names.end(), [&](const auto& n) { return n == names.front(); })) {
    return names.size() == 1 ? names.front() : fmt::format("{} × {}", names.size(), names.front());
  }
  return fmt::format("{}", fmt::join(names, " + "));
}

int numa_node_from_sysfs(const DriverApi& driver, CUdevice device) {
  char bus_id[64] = {};
  if (driver.device_get_pci_bus_id(bus_id, sizeof(bus_id) - 1, device) != CUDA_SUCCESS) return -1;
  std::string path = "/sys/bus/pci/devices/" + std::string(bus_id) + "/numa_node";
  std::transform(path.begin(), path.end(), path.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::ifstream file(path);
  int node = -1;
  return file >> node ? node : -1;
}

Result<GpuContext> describe_gpu(const DriverApi& driver, int ordinal) {
  GpuContext gpu;
  gpu.ordinal = ordinal;
  KVTIER_RETURN_IF_ERROR(driver_status(driver.device_get(&gpu.device, ordinal), "cuDeviceGet"));
  char name[256] = {};
  KVTIER_RETURN_IF_ERROR(
      driver_status(driver.device_get_name(name, sizeof(name) - 1, gpu.device), "cuDeviceGetName"));
  CUuuid uuid{};
  KVTIER_RETURN_IF_ERROR(
      driver_status(driver.device_get_uuid(&uuid, gpu.device), "cuDeviceGetUuid"));
  gpu.info.name = name;
  gpu.info.ordinal = ordinal;
  gpu.info.uuid = format_gpu_uuid(
      std::span<const uint8_t, 16>(reinterpret_cast<const uint8_t*>(uuid.bytes), 16));
  int numa = -1;
  // The attribute exists from CUDA 12.2 on; before, the PCI device's sysfs entry says.
  if (driver.device_get_attribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, gpu.device) !=
          CUDA_SUCCESS ||
      numa < 0) {
    numa = numa_node_from_sysfs(driver, gpu.device);
  }
  gpu.info.numa_node = numa;
  int host_pointers = 1;
  if (driver.device_get_attribute(&host_pointers,
                                  CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
                                  gpu.device) == CUDA_SUCCESS) {
    gpu.host_pointers_in_batches = host_pointers != 0;
  }
  int max_pitch = 0;
  if (driver.device_get_attribute(&max_pitch, CU_DEVICE_ATTRIBUTE_MAX_PITCH, gpu.device) ==
          CUDA_SUCCESS &&
      max_pitch > 0) {
    gpu.max_pitch = static_cast<uint64_t>(max_pitch);
  }
  return gpu;
}

}  // namespace

Result<std::unique_ptr<Device>> make_cuda_device(const CudaDeviceOptions& options) {
  auto loaded = cuda::DriverApi::get();
  if (!loaded.is_ok()) return loaded.status();
  const cuda::DriverApi& driver = **loaded;
  int count = 0;
  KVTIER_RETURN_IF_ERROR(driver_status(driver.device_get_count(&count), "cuDeviceGetCount"));
  if (count == 0) return unavailable("no CUDA device: the driver shows 0 GPUs");
  std::vector<GpuContext> present;
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    auto gpu = describe_gpu(driver, ordinal);
    if (!gpu.is_ok()) return gpu.status();
    present.push_back(std::move(*gpu));
  }
  std::vector<GpuContext> chosen;
  if (options.gpu_uuids.empty()) {
    chosen = present;
  } else {
    for (const std::string& uuid : options.gpu_uuids) {
      auto it = std::find_if(present.begin(), present.end(),
                             [&](const GpuContext& gpu) { return gpu.info.uuid == uuid; });
      if (it == present.end()) {
        std::vector<std::string> there;
        for (const GpuContext& gpu : present) there.push_back(gpu.info.uuid);
        return invalid_argument("--gpus: {} is not on this machine (it has {})", uuid,
                                fmt::join(there, ", "));
      }
      if (std::any_of(chosen.begin(), chosen.end(),
                      [&](const GpuContext& gpu) { return gpu.info.uuid == uuid; })) {
        return invalid_argument("--gpus: {} is listed twice", uuid);
      }
      chosen.push_back(*it);
    }
  }
  if (chosen.size() > 64) return invalid_argument("--gpus: at most 64 GPUs per kvtierd");
  for (size_t i = 0; i < chosen.size(); ++i) {
    for (size_t j = 0; j < chosen.size(); ++j) {
      int can_access = 0;
      if (i != j &&
          driver.device_can_access_peer(&can_access, chosen[i].device, chosen[j].device) ==
              CUDA_SUCCESS &&
          can_access != 0) {
        chosen[i].peers |= uint64_t{1} << j;
      }
    }
  }
  for (size_t i = 0; i < chosen.size(); ++i) {
    chosen[i].index = static_cast<int>(i);
    CUresult retained = driver.primary_ctx_retain(&chosen[i].context, chosen[i].device);
    if (retained != CUDA_SUCCESS) {
      for (size_t j = 0; j < i; ++j) driver.primary_ctx_release(chosen[j].device);
      return driver_status(retained,
                           fmt::format("cuDevicePrimaryCtxRetain {}", chosen[i].info.uuid));
    }
  }
  const std::string name = describe_gpus(chosen);
  for (const GpuContext& gpu : chosen) {
    KVTIER_LOG_INFO(
        "serving GPU {} ({}, ordinal {}, NUMA node {}, direct access to {} of the other {}{})",
        gpu.info.uuid, gpu.info.name, gpu.ordinal, gpu.info.numa_node,
        __builtin_popcountll(gpu.peers), chosen.size() - 1,
        gpu.host_pointers_in_batches ? "" : "; no host pointers in batch copies");
  }
  auto gpus = std::make_shared<const GpuSet>(driver, std::move(chosen));
  auto device = std::make_unique<CudaDevice>(std::move(gpus), name, options);
  KVTIER_RETURN_IF_ERROR(device->init());
  if (driver.memcpy_batch_v13000 == nullptr && driver.memcpy_batch_v12080 == nullptr) {
    KVTIER_LOG_INFO("driver {}.{} has no cuMemcpyBatchAsync: one cuMemcpyAsync per segment",
                    driver.driver_version / 1000, driver.driver_version % 1000 / 10);
  }
  return std::unique_ptr<Device>(std::move(device));
}

}  // namespace kvtier
