#include "bench/gpu_bench.h"

#include <unistd.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstring>
#include <future>
#include <numeric>
#include <random>
#include <vector>

#include "client/staging_kernels.h"
#include "common/units.h"
#include "cuda/cuda_device.h"
#include "cuda/driver_api.h"

namespace kvtier::bench {
namespace {

using Clock = std::chrono::steady_clock;
using cuda::driver_status;
using cuda::DriverApi;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The engine's KV cache: exportable VMM chunks on one GPU, mapped back to back.
class EngineMemory {
 public:
  static Result<std::unique_ptr<EngineMemory>> create(const DriverApi& driver, int ordinal,
                                                      uint64_t bytes) {
    std::unique_ptr<EngineMemory> memory(new EngineMemory(driver));
    CUdevice device = 0;
    KVTIER_RETURN_IF_ERROR(driver_status(driver.device_get(&device, ordinal), "cuDeviceGet"));
    memory->device_ = device;
    KVTIER_RETURN_IF_ERROR(driver_status(driver.primary_ctx_retain(&memory->context_, device),
                                         "cuDevicePrimaryCtxRetain"));
    KVTIER_RETURN_IF_ERROR(
        driver_status(driver.ctx_set_current(memory->context_), "cuCtxSetCurrent"));
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t granularity = 0;
    KVTIER_RETURN_IF_ERROR(driver_status(driver.mem_get_allocation_granularity(
                                             &granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                                         "cuMemGetAllocationGranularity"));
    // PyTorch's expandable segments map 20 MiB chunks; use that where it divides.
    memory->chunk_bytes_ = (20ull << 20) % granularity == 0 ? 20ull << 20 : granularity;
    memory->bytes_ =
        (bytes + memory->chunk_bytes_ - 1) / memory->chunk_bytes_ * memory->chunk_bytes_;
    KVTIER_RETURN_IF_ERROR(
        driver_status(driver.mem_address_reserve(&memory->base_, memory->bytes_, granularity, 0, 0),
                      "cuMemAddressReserve"));
    for (uint64_t offset = 0; offset < memory->bytes_; offset += memory->chunk_bytes_) {
      CUmemGenericAllocationHandle handle{};
      KVTIER_RETURN_IF_ERROR(
          driver_status(driver.mem_create(&handle, memory->chunk_bytes_, &prop, 0), "cuMemCreate"));
      CUresult mapped = driver.mem_map(memory->base_ + offset, memory->chunk_bytes_, 0, handle, 0);
      int fd = -1;
      CUresult exported = mapped == CUDA_SUCCESS
                              ? driver.mem_export_to_shareable_handle(
                                    &fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
                              : mapped;
      driver.mem_release(handle);
      KVTIER_RETURN_IF_ERROR(driver_status(exported, "cuMemMap / cuMemExportToShareableHandle"));
      memory->mapped_ += memory->chunk_bytes_;
      memory->fds_.emplace_back(fd);
    }
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = ordinal;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    KVTIER_RETURN_IF_ERROR(driver_status(
        driver.mem_set_access(memory->base_, memory->bytes_, &access, 1), "cuMemSetAccess"));
    return memory;
  }
  ~EngineMemory() {
    if (context_ != nullptr) driver_.ctx_set_current(context_);
    for (uint64_t offset = 0; offset < mapped_; offset += chunk_bytes_)
      driver_.mem_unmap(base_ + offset, chunk_bytes_);
    if (base_ != 0) driver_.mem_address_free(base_, bytes_);
    if (context_ != nullptr) driver_.primary_ctx_release(device_);
  }
  RegionHandle handle(const std::string& uuid) const {
    RegionHandle handle;
    handle.kind = RegionHandle::Kind::kCudaVmmFd;
    handle.size_bytes = bytes_;
    handle.gpu_uuid = uuid;
    for (const UniqueFd& fd : fds_)
      handle.vmm_chunks.push_back({UniqueFd(::dup(fd.get())), chunk_bytes_});
    return handle;
  }
  CUdeviceptr base() const { return base_; }
  uint64_t bytes() const { return bytes_; }

 private:
  explicit EngineMemory(const DriverApi& driver) : driver_(driver) {}
  const DriverApi& driver_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  CUdeviceptr base_ = 0;
  uint64_t chunk_bytes_ = 0;
  uint64_t bytes_ = 0;
  uint64_t mapped_ = 0;
  std::vector<UniqueFd> fds_;
};

Status run_batch(Device& device, CopyBatch batch) {
  std::promise<Status> finished;
  KVTIER_RETURN_IF_ERROR(
      device.submit(std::move(batch), [&](Status status) { finished.set_value(status); }));
  return finished.get_future().get();
}

// Planes of `plane` bytes laid out as a paged cache keeps them: plane p of block b at
// (p · blocks + b) · plane in `engine`; block b's planes contiguous in `slots`.
CopyBatch plane_batch(const std::shared_ptr<Memory>& engine, const std::shared_ptr<Memory>& slots,
                      uint64_t bytes, uint64_t plane, uint64_t slot_base, bool to_engine) {
  constexpr uint64_t kBlockBytes = 2 << 20;
  const uint64_t planes = kBlockBytes / plane, blocks = bytes / kBlockBytes;
  CopyBatch batch;
  const uint32_t e = batch.memory_index(engine), s = batch.memory_index(slots);
  for (uint64_t b = 0; b < blocks; ++b) {
    for (uint64_t p = 0; p < planes; ++p) {
      const uint64_t engine_offset = (p * blocks + b) * plane;
      const uint64_t slot_offset = slot_base + b * kBlockBytes + p * plane;
      if (to_engine) {
        batch.segments.push_back({s, e, slot_offset, engine_offset, plane});
      } else {
        batch.segments.push_back({e, s, engine_offset, slot_offset, plane});
      }
    }
  }
  return batch;
}

// Contiguous 2 MiB blocks between two memories at the same offsets (the staged path's
// DMA: kvtierd's copy of packed blocks; adjacent ones merge into one copy).
CopyBatch block_batch(const std::shared_ptr<Memory>& from, const std::shared_ptr<Memory>& to,
                      uint64_t bytes) {
  CopyBatch batch;
  const uint32_t f = batch.memory_index(from), t = batch.memory_index(to);
  for (uint64_t offset = 0; offset < bytes; offset += 2 << 20)
    batch.segments.push_back({f, t, offset, offset, 2 << 20});
  return batch;
}

// The engine side of the staged path for plane_batch's layout (planes of `plane`
// bytes, 2 MiB blocks): the plane table on the GPU and the blocks in a shuffled order,
// as a paged cache hands them out.
struct StagedLayout {
  CUdeviceptr table = 0;
  uint32_t planes = 0;
  std::vector<uint32_t> ids;
};
Result<StagedLayout> staged_layout(const DriverApi& driver, CUdeviceptr engine, uint64_t bytes,
                                   uint64_t plane) {
  constexpr uint64_t kBlockBytes = 2 << 20;
  const uint64_t blocks = bytes / kBlockBytes;
  StagedLayout layout;
  layout.planes = static_cast<uint32_t>(kBlockBytes / plane);
  std::vector<staging::Plane> table;
  for (uint64_t p = 0; p < layout.planes; ++p)
    table.push_back({engine + p * blocks * plane, plane, plane, p * plane});
  const uint64_t table_bytes = table.size() * sizeof(staging::Plane);
  KVTIER_RETURN_IF_ERROR(driver_status(driver.mem_alloc(&layout.table, table_bytes), "cuMemAlloc"));
  KVTIER_RETURN_IF_ERROR(
      driver_status(driver.memcpy_htod(layout.table, table.data(), table_bytes), "cuMemcpyHtoD"));
  layout.ids.resize(blocks);
  std::iota(layout.ids.begin(), layout.ids.end(), 0u);
  std::shuffle(layout.ids.begin(), layout.ids.end(), std::mt19937(42));
  return layout;
}

// One cuMemcpyAsync of `bytes` on a stream of its own, timed to completion.
Result<double> baseline_seconds(const DriverApi& driver, CUstream stream, CUdeviceptr dst,
                                CUdeviceptr src, uint64_t bytes) {
  const auto start = Clock::now();
  KVTIER_RETURN_IF_ERROR(
      driver_status(driver.memcpy_async(dst, src, bytes, stream), "cuMemcpyAsync"));
  KVTIER_RETURN_IF_ERROR(driver_status(driver.stream_synchronize(stream), "cuStreamSynchronize"));
  return seconds_since(start);
}

// One measurement's samples: the daemon's copy path with strided copies, the same
// path with one copy per plane (strided copies off), and one cuMemcpyAsync.
struct Pair {
  std::vector<double> daemon, per_plane, baseline;
};

}  // namespace

Result<BenchReport> run_gpu_bench(const GpuBenchOptions& options) {
  auto loaded = DriverApi::get();
  if (!loaded.is_ok()) return loaded.status();
  const DriverApi& driver = **loaded;
  CudaDeviceOptions device_options;
  if (!options.gpu_uuid.empty()) device_options.gpu_uuids = {options.gpu_uuid};
  auto made = make_cuda_device(device_options);
  if (!made.is_ok()) return made.status();
  std::unique_ptr<Device> device = std::move(*made);
  const GpuInfo gpu = device->gpus().front();
  if (device->gpus().size() > 1) {
    // One GPU per run: the arena is per GPU and the copies must stay on this one.
    device_options.gpu_uuids = {gpu.uuid};
    device.reset();
    made = make_cuda_device(device_options);
    if (!made.is_ok()) return made.status();
    device = std::move(*made);
  }
  const uint64_t bytes = std::max<uint64_t>(options.bytes / (2 << 20), 1) * (2 << 20);

  BenchReport report("gpu");
  report.config("gpu", gpu.name);
  report.config("gpu_uuid", gpu.uuid);
  report.config("driver_version", int64_t{driver.driver_version});
  report.config("batch_api",
                driver.memcpy_batch_v13000 != nullptr || driver.memcpy_batch_v12080 != nullptr);
  report.config("bytes_per_measurement", static_cast<int64_t>(bytes));
  report.config("rounds", int64_t{options.rounds});

  // Pinned pool set-up first, on its own.
  {
    const auto start = Clock::now();
    auto pool = device->allocate_pinned_pool(options.pool_bytes);
    if (!pool.is_ok()) return pool.status();
    report.result("pinned_pool_s_per_gib",
                  seconds_since(start) / (static_cast<double>(options.pool_bytes) / (1ull << 30)));
  }

  auto engine = EngineMemory::create(driver, gpu.ordinal, bytes);
  if (!engine.is_ok()) return engine.status();
  auto region = device->open_region((*engine)->handle(gpu.uuid));
  if (!region.is_ok()) return region.status();
  auto pool = device->allocate_pinned_pool(bytes);
  if (!pool.is_ok()) return pool.status();
  auto arena = device->allocate_arena(bytes, 2 << 20);
  if (!arena.is_ok()) return arena.status();
  const CUdeviceptr pool_address = reinterpret_cast<CUdeviceptr>((*pool)->host_data());
  // The same copies with strided copies off: one batch entry per plane.
  device_options.gpu_uuids = {gpu.uuid};
  device_options.strided_copies = false;
  auto per_plane_made = make_cuda_device(device_options);
  if (!per_plane_made.is_ok()) return per_plane_made.status();
  Device& per_plane_device = **per_plane_made;
  auto per_plane_region = per_plane_device.open_region((*engine)->handle(gpu.uuid));
  if (!per_plane_region.is_ok()) return per_plane_region.status();
  auto per_plane_pool = per_plane_device.allocate_pinned_pool(bytes);
  if (!per_plane_pool.is_ok()) return per_plane_pool.status();
  auto per_plane_arena = per_plane_device.allocate_arena(bytes, 2 << 20);
  if (!per_plane_arena.is_ok()) return per_plane_arena.status();
  CUstream stream = nullptr;
  KVTIER_RETURN_IF_ERROR(driver_status(
      driver.stream_create_with_priority(&stream, CU_STREAM_NON_BLOCKING, 0), "cuStreamCreate"));
  // The arena's address is not exposed; the D2D baseline copies engine → engine halves.
  for (uint64_t plane : {8ull << 10, 16ull << 10, 32ull << 10, 128ull << 10}) {
    Pair d2h, h2d, d2d;
    for (uint32_t round = 0; round < options.rounds + 1; ++round) {  // round 0 warms up
      const bool keep = round > 0;
      auto timed = [&](Pair& pair, CopyBatch batch, CopyBatch per_plane_batch, CUdeviceptr dst,
                       CUdeviceptr src, uint64_t baseline_bytes) -> Status {
        auto start = Clock::now();
        KVTIER_RETURN_IF_ERROR(run_batch(*device, std::move(batch)));
        const double daemon = seconds_since(start);
        start = Clock::now();
        KVTIER_RETURN_IF_ERROR(run_batch(per_plane_device, std::move(per_plane_batch)));
        const double per_plane = seconds_since(start);
        auto baseline = baseline_seconds(driver, stream, dst, src, baseline_bytes);
        if (!baseline.is_ok()) return baseline.status();
        if (keep) {
          pair.daemon.push_back(daemon);
          pair.per_plane.push_back(per_plane);
          pair.baseline.push_back(*baseline);
        }
        return Status::ok();
      };
      KVTIER_RETURN_IF_ERROR(
          timed(d2h, plane_batch(*region, *pool, bytes, plane, 0, false),
                plane_batch(*per_plane_region, *per_plane_pool, bytes, plane, 0, false),
                pool_address, (*engine)->base(), bytes));
      KVTIER_RETURN_IF_ERROR(
          timed(h2d, plane_batch(*region, *pool, bytes, plane, 0, true),
                plane_batch(*per_plane_region, *per_plane_pool, bytes, plane, 0, true),
                (*engine)->base(), pool_address, bytes));
      KVTIER_RETURN_IF_ERROR(
          timed(d2d, plane_batch(*region, *arena, bytes, plane, 0, false),
                plane_batch(*per_plane_region, *per_plane_arena, bytes, plane, 0, false),
                (*engine)->base() + bytes / 2, (*engine)->base(), bytes / 2));
    }
    const std::string kib = std::to_string(plane >> 10) + "k";
    auto add = [&](const std::string& name, Pair& pair, uint64_t baseline_bytes) {
      const double daemon_gbps = bytes / median(pair.daemon) / 1e9;
      const double per_plane_gbps = bytes / median(pair.per_plane) / 1e9;
      const double baseline_gbps = baseline_bytes / median(pair.baseline) / 1e9;
      report.result(name + "_" + kib + "_gbps", daemon_gbps);
      report.result(name + "_" + kib + "_per_plane_gbps", per_plane_gbps);
      report.result(name + "_" + kib + "_baseline_gbps", baseline_gbps);
      report.result(name + "_" + kib + "_ratio", daemon_gbps / baseline_gbps);
      report.result(name + "_" + kib + "_per_plane_ratio", per_plane_gbps / baseline_gbps);
    };
    add("d2h", d2h, bytes);
    add("h2d", h2d, bytes);
    add("d2d", d2d, bytes / 2);
  }
  for (const char* direction : {"d2h", "h2d"}) {
    report.target(std::string(direction) + "_32k_ratio", ">=", 0.9);
    report.target(std::string(direction) + "_8k_ratio", ">=", 0.8);
  }
  report.target("h2d_32k_gbps", ">=", 52);

  // The staged path (client/gpu_stager.h): the engine's gather kernel packs the planes
  // into a staging buffer in its GPU memory, then kvtierd's Device moves whole blocks
  // staging → pinned pool (a Save); the way back is a block copy pool → staging and the
  // scatter kernel (a Load). Timed end to end, kernel and copy one after the other (the
  // stager overlaps them across chunks; this does not), next to one cuMemcpyAsync.
  auto kernels = StagingKernels::load(driver);
  std::unique_ptr<EngineMemory> staging_memory;
  std::shared_ptr<Memory> staging_region;
  if (!kernels.is_ok()) {
    report.note("staging kernels not measured: " + kernels.status().to_string());
  } else {
    auto made_staging = EngineMemory::create(driver, gpu.ordinal, bytes);
    if (!made_staging.is_ok()) return made_staging.status();
    staging_memory = std::move(*made_staging);
    auto opened = device->open_region(staging_memory->handle(gpu.uuid));
    if (!opened.is_ok()) return opened.status();
    staging_region = *opened;
    for (uint64_t plane : {4ull << 10, 8ull << 10, 32ull << 10}) {
      auto layout = staged_layout(driver, (*engine)->base(), bytes, plane);
      if (!layout.is_ok()) return layout.status();
      std::vector<double> save_s, load_s, gather_s, scatter_s, d2h_base, h2d_base;
      for (uint32_t round = 0; round < options.rounds + 1; ++round) {
        auto kernel = [&](staging::Direction direction) -> Result<double> {
          const auto start = Clock::now();
          auto launched = (*kernels)->copy(layout->table, 0, layout->planes, 2 << 20, layout->ids,
                                           staging_memory->base(), direction, stream);
          if (!launched.is_ok()) return launched.status();
          KVTIER_RETURN_IF_ERROR(
              driver_status(driver.stream_synchronize(stream), "staging kernel"));
          return seconds_since(start);
        };
        auto start = Clock::now();
        auto gather = kernel(staging::kGather);
        if (!gather.is_ok()) return gather.status();
        KVTIER_RETURN_IF_ERROR(run_batch(*device, block_batch(staging_region, *pool, bytes)));
        const double save = seconds_since(start);
        auto d2h = baseline_seconds(driver, stream, pool_address, (*engine)->base(), bytes);
        if (!d2h.is_ok()) return d2h.status();
        start = Clock::now();
        KVTIER_RETURN_IF_ERROR(run_batch(*device, block_batch(*pool, staging_region, bytes)));
        auto scatter = kernel(staging::kScatter);
        if (!scatter.is_ok()) return scatter.status();
        const double load = seconds_since(start);
        auto h2d = baseline_seconds(driver, stream, (*engine)->base(), pool_address, bytes);
        if (!h2d.is_ok()) return h2d.status();
        if (round == 0) continue;  // warm-up
        save_s.push_back(save);
        load_s.push_back(load);
        gather_s.push_back(*gather);
        scatter_s.push_back(*scatter);
        d2h_base.push_back(*d2h);
        h2d_base.push_back(*h2d);
      }
      driver.mem_free(layout->table);
      const std::string kib = std::to_string(plane >> 10) + "k";
      auto add = [&](const std::string& name, const std::vector<double>& staged,
                     const std::vector<double>& kernel, const std::vector<double>& base) {
        const double staged_gbps = bytes / median(staged) / 1e9;
        report.result(name + "_" + kib + "_gbps", staged_gbps);
        report.result(name + "_" + kib + "_ratio", staged_gbps / (bytes / median(base) / 1e9));
        // The kernel's share of the DMA it feeds: kernel time ÷ (total − kernel).
        report.result(name + "_" + kib + "_kernel_share",
                      median(kernel) / std::max(median(staged) - median(kernel), 1e-9));
      };
      add("staged_d2h", save_s, gather_s, d2h_base);
      add("staged_h2d", load_s, scatter_s, h2d_base);
    }
    for (const char* direction : {"staged_d2h", "staged_h2d"}) {
      for (const char* kib : {"4k", "8k"}) {
        report.target(std::string(direction) + "_" + kib + "_ratio", ">=", 0.9);
        report.target(std::string(direction) + "_" + kib + "_kernel_share", "<=", 0.05);
      }
    }
    report.target("staged_h2d_8k_gbps", ">=", 52);
  }
  driver.stream_destroy(stream);

  if (options.session_tokens > 0) {
    const uint64_t session_bytes = options.session_tokens * options.bytes_per_token;
    auto session_engine = EngineMemory::create(driver, gpu.ordinal, session_bytes);
    if (!session_engine.is_ok()) return session_engine.status();
    auto session_region = device->open_region((*session_engine)->handle(gpu.uuid));
    if (!session_region.is_ok()) return session_region.status();
    auto session_arena = device->allocate_arena(session_bytes, 2 << 20);
    if (!session_arena.is_ok()) return session_arena.status();
    auto session_pool = device->allocate_pinned_pool(session_bytes);
    if (!session_pool.is_ok()) return session_pool.status();
    // 32 planes of 64 KiB = 2 MiB blocks (Llama-3-8B: 32 layers × K/V × 16 tokens × 8
    // heads × 128 × 2 bytes is 64 KiB per plane pair; one plane per layer here).
    constexpr uint64_t kPlane = 64 << 10;
    const auto save_start = Clock::now();
    KVTIER_RETURN_IF_ERROR(run_batch(
        *device, plane_batch(*session_region, *session_arena, session_bytes, kPlane, 0, false)));
    const double save_s = seconds_since(save_start);
    CopyBatch demote;
    demote.priority = CopyPriority::kBackground;
    const uint32_t a = demote.memory_index(*session_arena), p = demote.memory_index(*session_pool);
    for (uint64_t offset = 0; offset < session_bytes; offset += 2 << 20)
      demote.segments.push_back({a, p, offset, offset, 2 << 20});
    const auto demote_start = Clock::now();
    KVTIER_RETURN_IF_ERROR(run_batch(*device, std::move(demote)));
    const double demote_s = seconds_since(demote_start);
    const auto load_start = Clock::now();
    KVTIER_RETURN_IF_ERROR(run_batch(
        *device, plane_batch(*session_region, *session_pool, session_bytes, kPlane, 0, true)));
    const double load_s = seconds_since(load_start);
    report.config("session_bytes", static_cast<int64_t>(session_bytes));
    report.result("session_save_to_hbm_ms", save_s * 1e3);
    report.result("session_demote_to_ram_ms", demote_s * 1e3);
    report.result("session_load_from_ram_ms", load_s * 1e3);

    // The same session in small planes (session_plane_bytes; a Llama-8B block of 16
    // tokens has 4 KiB K and V planes per layer and KV head), loaded from RAM by plane
    // copies and by the staged path through the staging buffer, chunk by chunk.
    const uint64_t small = options.session_plane_bytes;
    report.config("session_plane_bytes", static_cast<int64_t>(small));
    const auto copies_start = Clock::now();
    KVTIER_RETURN_IF_ERROR(run_batch(
        *device, plane_batch(*session_region, *session_pool, session_bytes, small, 0, true)));
    const double copies_s = seconds_since(copies_start);
    report.result("session_small_planes_load_from_ram_ms", copies_s * 1e3);
    if (staging_region != nullptr) {
      auto layout = staged_layout(driver, (*session_engine)->base(), session_bytes, small);
      if (!layout.is_ok()) return layout.status();
      CUstream session_stream = nullptr;
      KVTIER_RETURN_IF_ERROR(driver_status(
          driver.stream_create_with_priority(&session_stream, CU_STREAM_NON_BLOCKING, 0),
          "cuStreamCreate"));
      const uint64_t chunk_blocks = bytes / (2 << 20);
      const auto staged_start = Clock::now();
      for (uint64_t first = 0; first < layout->ids.size(); first += chunk_blocks) {
        const uint64_t count = std::min<uint64_t>(chunk_blocks, layout->ids.size() - first);
        CopyBatch batch;
        const uint32_t from = batch.memory_index(*session_pool);
        const uint32_t to = batch.memory_index(staging_region);
        batch.segments.push_back({from, to, first * (2 << 20), 0, count * (2 << 20)});
        KVTIER_RETURN_IF_ERROR(run_batch(*device, std::move(batch)));
        auto launched =
            (*kernels)->copy(layout->table, 0, layout->planes, 2 << 20,
                             std::span<const uint32_t>(layout->ids).subspan(first, count),
                             staging_memory->base(), staging::kScatter, session_stream);
        if (!launched.is_ok()) return launched.status();
        KVTIER_RETURN_IF_ERROR(
            driver_status(driver.stream_synchronize(session_stream), "staging scatter"));
      }
      const double staged_s = seconds_since(staged_start);
      driver.stream_destroy(session_stream);
      driver.mem_free(layout->table);
      report.result("session_small_planes_load_from_ram_staged_ms", staged_s * 1e3);
      report.result("session_small_planes_staged_vs_copies_ratio", staged_s / copies_s);
      report.target("session_small_planes_staged_vs_copies_ratio", "<=", 0.5);
    }
  }
  if (gpu.name.find("fake") != std::string::npos) {
    report.note(
        "fake CUDA driver: the copy path ran end to end; its speeds are memcpy's, "
        "not a GPU's, and say nothing about the targets");
  }
  return report;
}

CLI::App* add_gpu_subcommand(CLI::App& app, GpuBenchOptions& options) {
  CLI::App* gpu = app.add_subcommand(
      "gpu", "CUDA backend: gathered D2H/H2D/D2D vs one cuMemcpyAsync; a 32K-token session");
  gpu->add_option("--gpu", options.gpu_uuid, "GPU UUID (default: the first GPU)");
  gpu->add_option("--bytes", options.bytes, "bytes per measurement (rounded to 2 MiB)")
      ->check(CLI::Range(uint64_t{2} << 20, uint64_t{64} << 30));
  gpu->add_option("--rounds", options.rounds, "rounds (medians)")->check(CLI::Range(1u, 1000u));
  gpu->add_option("--session-tokens", options.session_tokens,
                  "tokens of the session part (0: skip)");
  gpu->add_option("--bytes-per-token", options.bytes_per_token, "KV bytes per token");
  gpu->add_option("--session-plane-bytes", options.session_plane_bytes,
                  "plane size of the session's small-plane load (plane copies vs staged)")
      ->check(CLI::Range(uint64_t{512}, uint64_t{2} << 20));
  gpu->add_option("--pool-bytes", options.pool_bytes, "pinned pool measured for s/GiB")
      ->check(CLI::Range(uint64_t{2} << 20, uint64_t{1} << 40));
  return gpu;
}

}  // namespace kvtier::bench
