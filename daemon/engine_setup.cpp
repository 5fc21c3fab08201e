// EngineSetup: Hello and engine regions (engine_setup.h).
#include "daemon/engine_setup.h"

#include <strings.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "common/log.h"
#include "daemon/region_worker.h"
#include "daemon/requests.h"
#include "daemon/startup_gate.h"

namespace kvtier::daemon {
namespace {

std::string_view kind_name(RegionHandle::Kind kind) {
  switch (kind) {
    case RegionHandle::Kind::kMemfd:
      return "memfd";
    case RegionHandle::Kind::kCudaIpc:
      return "cudaIpc";
    case RegionHandle::Kind::kCudaVmmFd:
      return "cudaVmmFd";
  }
  return "unknown";
}

std::string device_kind_name(wire::DeviceKind kind) {
  switch (kind) {
    case wire::DeviceKind::HOST:
      return "host";
    case wire::DeviceKind::CUDA:
      return "cuda";
  }
  return fmt::format("{} (unknown)", static_cast<int>(kind));
}

std::string uuid_list(const std::vector<GpuInfo>& gpus) {
  std::string out;
  for (const GpuInfo& gpu : gpus) out += (out.empty() ? "" : ", ") + gpu.uuid;
  return out;
}

}  // namespace

EngineSetup::EngineSetup(DaemonContext& ctx, Replies& replies, StartupGate& startup)
    : Part(ctx, replies), startup_(startup), region_worker_(std::make_unique<RegionWorker>(2)) {}

EngineSetup::~EngineSetup() = default;

Status EngineSetup::handle_hello(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                                 HelloRequest hello) {
  if (engine.hello_done) return invalid_argument("Hello was already sent on this connection");
  if (hello.protocol_version != wire::PROTOCOL_VERSION) {
    return invalid_argument("protocolVersion {} is not supported; this daemon speaks version {}",
                            hello.protocol_version, wire::PROTOCOL_VERSION);
  }
  if (hello.engine_name.size() > 128)
    return invalid_argument("engineName is longer than 128 bytes");
  if (hello.device_kind != ctx_.backend_kind) {
    if (ctx_.backend_kind == wire::DeviceKind::HOST) {
      return not_supported(
          "deviceKind {}: this kvtierd runs the host backend and takes memfd regions only (GPU "
          "regions need a kvtierd started with --device cuda on a GPU machine)",
          device_kind_name(hello.device_kind));
    }
    return not_supported(
        "deviceKind {}: this kvtierd runs the cuda backend ({}) and takes GPU regions only "
        "(cudaIpc, cudaVmmFd)",
        device_kind_name(hello.device_kind), ctx_.device->name());
  }
  if (hello.data_path > wire::DataPath::STAGING_HOST) {
    return invalid_argument("dataPath {} is not a data path this daemon knows",
                            static_cast<unsigned>(hello.data_path));
  }
  auto& layout = hello.layout;
  if (!layout.is_ok()) return layout.status();
  LayoutKey key{engine.namespace_id, layout->digest};
  KVTIER_RETURN_IF_ERROR(ctx_.store->register_layout(key, layout->block_bytes));
  // The cost model weighs reload against recompute per layout; an engine that does
  // not report a plausible prefill speed gets the configured one (an absurd one would
  // make every block look cheaper to recompute than to keep).
  const double prefill = hello.prefill_tokens_per_second;
  ctx_.planner.set_layout_cost(
      key, {hello.tokens_per_block,
            std::isfinite(prefill) && prefill > 0 && prefill < 1e9 ? prefill : 0.0});
  engine.layout = std::move(*layout);
  engine.layout_key = key;
  engine.engine_name = std::move(hello.engine_name);
  engine.data_path = hello.data_path;
  ++ctx_.counters.hellos_by_data_path[static_cast<size_t>(hello.data_path)];
  engine.hello_done = true;
  KVTIER_LOG_INFO(
      "engine '{}' (pid {}, namespace {}) joined: model {}, {} planes, {} bytes per block, "
      "data path {}",
      engine.engine_name, c->peer().pid, engine.namespace_name, engine.layout.model_id,
      engine.layout.planes.size(), engine.layout.block_bytes, data_path_name(engine.data_path));
  reply(c, id, [&](wire::Response::Builder response) {
    assert_control_thread();
    auto out = response.initHello();
    out.setProtocolVersion(wire::PROTOCOL_VERSION);
    out.setLayoutDigest(engine.layout.digest);
    out.setBlockBytes(engine.layout.block_bytes);
    out.setNamespaceName(engine.namespace_name);
    out.setMaxBlocksPerRequest(ctx_.config.max_blocks_per_request);
    out.setDeviceKind(ctx_.backend_kind);
    auto uuids = out.initGpuUuids(static_cast<unsigned>(ctx_.gpus.size()));
    for (unsigned i = 0; i < ctx_.gpus.size(); ++i) uuids.set(i, ctx_.gpus[i].uuid);
    out.setDeviceName(std::string(ctx_.device->name()));
    out.setRetentionPriorities(true);
    out.setLoadPlaneRanges(true);
    out.setStaging(true);
  });
  return Status::ok();
}

Status EngineSetup::handle_register_region(const ConnectionPtr& c, EngineContext& engine,
                                           uint64_t id, uint32_t region_id, RegionHandle region) {
  if (engine.regions.count(region_id) != 0) {
    return invalid_argument("regionId {} is already registered on this connection", region_id);
  }
  if (engine.regions.size() >= ctx_.config.max_regions_per_connection) {
    // Not retryable: waiting does not lift the limit; unregistering a region does.
    return Status(
        StatusCode::kResourceExhausted,
        fmt::format(
            "this connection already has {} regions, the limit (max-regions-per-connection)",
            engine.regions.size()),
        /*retryable=*/false);
  }
  bool used = std::any_of(engine.layout.planes.begin(), engine.layout.planes.end(),
                          [&](const PlaneLayout& p) { return p.region_id == region_id; });
  // A region no plane names is a staging region (schema: Staging), for engines that
  // said they stage.
  if (!used && engine.data_path == wire::DataPath::PLANE_COPIES) {
    return invalid_argument(
        "regionId {} is not named by any plane of the layout (a staging region needs "
        "Hello.dataPath stagingKernels or stagingHost)",
        region_id);
  }
  RegionHandle* handle = &region;  // decoded at the boundary (decode_register_region)
  const bool cuda_kind = handle->kind != RegionHandle::Kind::kMemfd;
  // Well-formed regions of a kind this backend does not serve: NotSupported.
  if (cuda_kind && ctx_.backend_kind != wire::DeviceKind::CUDA) {
    return not_supported(
        "kind {}: this kvtierd runs the host backend and cannot open cuda regions; register "
        "memfd regions (or use a kvtierd started with --device cuda)",
        kind_name(handle->kind));
  }
  if (!cuda_kind && ctx_.backend_kind == wire::DeviceKind::CUDA) {
    return not_supported(
        "kind memfd: this kvtierd runs the cuda backend ({}) and opens GPU regions only "
        "(cudaIpc, cudaVmmFd)",
        ctx_.device->name());
  }
  int gpu_index = SlabAllocator::kAnyPart;
  if (cuda_kind) {
    std::string& uuid = handle->gpu_uuid;
    if (uuid.empty()) {
      if (ctx_.gpus.size() != 1) {
        return invalid_argument("gpuUuid is empty, but this kvtierd serves {} GPUs ({}): name one",
                                ctx_.gpus.size(), uuid_list(ctx_.gpus));
      }
      uuid = ctx_.gpus[0].uuid;  // the one GPU there is
      gpu_index = 0;
    } else {
      auto served = std::find_if(ctx_.gpus.begin(), ctx_.gpus.end(), [&](const GpuInfo& gpu) {
        return ::strcasecmp(gpu.uuid.c_str(), uuid.c_str()) == 0;
      });
      if (served == ctx_.gpus.end()) {
        return invalid_argument("gpuUuid '{}' is not a GPU this kvtierd serves ({})", uuid,
                                uuid_list(ctx_.gpus));
      }
      uuid = served->uuid;  // the daemon's spelling
      gpu_index = static_cast<int>(served - ctx_.gpus.begin());
    }
  }
  KVTIER_RETURN_IF_ERROR(engine.layout.check_region(region_id, handle->size_bytes));
  ++engine.regions_opening;
  // Device methods may be called from any thread (device/device.h); the CUDA backend makes the
  // region's GPU context current on the worker before it opens or closes anything.
  // Shared: the worker's jobs are std::function, which must be copyable.
  auto opening = std::make_shared<RegionHandle>(std::move(*handle));
  region_worker_->post([this, c, id, region_id, gpu_index, opening,
                        delay_ms = ctx_.config.fault_region_open_delay_ms,
                        guard = asio::make_work_guard(ctx_.io)]() mutable {
    // fault-region-open-delay-ms (tests only): a slow open, without a slow machine.
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    auto memory = ctx_.device->open_region(std::move(*opening));
    asio::post(ctx_.io, [this, c, id, region_id, gpu_index, memory = std::move(memory),
                         guard = std::move(guard)]() mutable {
      assert_control_thread();
      finish_register_region(c, id, region_id, gpu_index, std::move(memory));
    });
  });
  return Status::ok();
}

void EngineSetup::finish_register_region(const ConnectionPtr& c, uint64_t id, uint32_t region_id,
                                         int gpu_index, Result<std::shared_ptr<Memory>> memory) {
  auto engine = std::static_pointer_cast<EngineContext>(c->user_state);
  if (!engine) {  // the engine left while its region was opening
    if (memory.is_ok()) close_region_off_thread(std::move(*memory));
    return;
  }
  --engine->regions_opening;
  if (!memory.is_ok()) {
    reply_error(c, id, memory.status().with_context(fmt::format("regionId {}", region_id)));
  } else {
    engine->regions.emplace(region_id, std::move(*memory));
    if (gpu_index != SlabAllocator::kAnyPart) engine->gpu_part = gpu_index;
    reply(c, id, [&](wire::Response::Builder response) {
      response.initRegisterRegion().setRegionId(region_id);
    });
  }
  startup_.resume_deferred(c);  // requests sent after this one waited for it
}

void EngineSetup::close_region_off_thread(std::shared_ptr<Memory> memory,
                                          std::function<void()> closed) {
  region_worker_->post([this, memory = std::move(memory), closed = std::move(closed),
                        guard = asio::make_work_guard(ctx_.io)]() mutable {
    memory.reset();  // the daemon's last reference: unmaps / closes the IPC handle here
    if (!closed) return;
    asio::post(ctx_.io, [closed = std::move(closed), guard = std::move(guard)] {
      assert_control_thread();
      closed();
    });
  });
}

Status EngineSetup::handle_unregister_region(const ConnectionPtr& c, EngineContext& engine,
                                             uint64_t id, uint32_t region_id) {
  auto it = engine.regions.find(region_id);
  if (it == engine.regions.end()) {
    return not_found("regionId {} is not registered on this connection", region_id);
  }
  std::shared_ptr<Memory> memory = std::move(it->second);
  engine.regions.erase(it);
  if (memory.use_count() > 1) {
    KVTIER_LOG_DEBUG("connection {}: regionId {} unregistered; waiting for the copies using it",
                     c->id(), region_id);
    parked_unregisters_.push_back({std::move(memory), c, id, region_id});
    return Status::ok();
  }
  // The reply goes out once the mapping is closed (on the region worker).
  close_region_off_thread(std::move(memory), [this, c, id, region_id] {
    assert_control_thread();
    reply(c, id, [&](wire::Response::Builder response) {
      response.initUnregisterRegion().setRegionId(region_id);
    });
  });
  return Status::ok();
}

void EngineSetup::reply_to_finished_unregisters() {
  for (size_t i = 0; i < parked_unregisters_.size();) {
    if (parked_unregisters_[i].memory.use_count() > 1) {
      ++i;
      continue;
    }
    ParkedUnregister finished = std::move(parked_unregisters_[i]);
    parked_unregisters_.erase(parked_unregisters_.begin() + static_cast<ptrdiff_t>(i));
    // The mapping is closed before the engine hears it may free the memory.
    close_region_off_thread(
        std::move(finished.memory),
        [this, c = finished.connection, id = finished.request_id, region_id = finished.region_id] {
          assert_control_thread();
          reply(c, id, [&](wire::Response::Builder response) {
            response.initUnregisterRegion().setRegionId(region_id);
          });
        });
  }
}

void EngineSetup::forget(const ConnectionPtr& connection, EngineContext* engine) {
  if (engine != nullptr) {
    engine->connected = false;
    // Closing a mapping can take long (munmap of GiBs): the region worker does it.
    for (auto& [region_id, memory] : engine->regions) close_region_off_thread(std::move(memory));
    engine->regions.clear();
  }
  // Nobody is left to tell: Unregisters waiting for copies just let go.
  for (ParkedUnregister& parked : parked_unregisters_) {
    if (parked.connection == connection) close_region_off_thread(std::move(parked.memory));
  }
  std::erase_if(parked_unregisters_,
                [&](const ParkedUnregister& parked) { return parked.connection == connection; });
}

void EngineSetup::stop_worker() {
  region_worker_.reset();
}

}  // namespace kvtier::daemon
