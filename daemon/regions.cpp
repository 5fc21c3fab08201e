// Engine regions: RegisterRegion (check the request, open the memory) and
// UnregisterRegion, whose reply waits until the daemon's mapping is closed.
//
// Opening and closing run on the region worker (region_worker.h), never on the control
// thread: mapping a multi-GiB memfd with MAP_POPULATE, or importing hundreds of VMM
// chunks, takes long enough to stall every other engine. The request is checked here;
// the worker opens the memory and posts the result back, and the reply goes out from
// here. Until then the connection's later requests wait behind it (startup.h: a
// connection's requests take effect in the order sent), so a Save naming a region
// still opening sees it opened (or the open's error on the RegisterRegion first).
//
// A mapping closes when the region's last shared_ptr goes. The connection's
// EngineContext holds one, and every CopyBatch that touches the region holds one until
// the device is done with it; devices drop those before they call `done`
// (cuda/device.h). So an Unregister takes the region out of its connection at once (no
// later request can name it) and, while copies still hold it, parks the daemon's own
// reference; every copy completion on the control thread looks again, and the reply
// goes out when the parked reference is the last one, right after it was dropped on
// the region worker.
#include <strings.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/log.h"
#include "daemon/region_worker.h"
#include "daemon/requests.h"
#include "daemon/service.h"

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

std::string uuid_list(const std::vector<GpuInfo>& gpus) {
  std::string out;
  for (const GpuInfo& gpu : gpus) out += (out.empty() ? "" : ", ") + gpu.uuid;
  return out;
}

}  // namespace

Status Service::handle_register_region(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                                       uint32_t region_id, RegionHandle region) {
  if (engine.regions.count(region_id) != 0) {
    return invalid_argument("regionId {} is already registered on this connection", region_id);
  }
  if (engine.regions.size() >= config_.max_regions_per_connection) {
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
  if (!used)
    return invalid_argument("regionId {} is not named by any plane of the layout", region_id);
  RegionHandle* handle = &region;  // decoded at the boundary (decode_register_region)
  const bool cuda_kind = handle->kind != RegionHandle::Kind::kMemfd;
  // Well-formed regions of a kind this backend does not serve: NotSupported.
  if (cuda_kind && backend_kind_ != wire::DeviceKind::CUDA) {
    return not_supported(
        "kind {}: this kvtierd runs the host backend and cannot open cuda regions; register "
        "memfd regions (or use a kvtierd started with --device cuda)",
        kind_name(handle->kind));
  }
  if (!cuda_kind && backend_kind_ == wire::DeviceKind::CUDA) {
    return not_supported(
        "kind memfd: this kvtierd runs the cuda backend ({}) and opens GPU regions only "
        "(cudaIpc, cudaVmmFd)",
        device_->name());
  }
  int gpu_index = SlabAllocator::kAnyPart;
  if (cuda_kind) {
    std::string& uuid = handle->gpu_uuid;
    if (uuid.empty()) {
      if (gpus_.size() != 1) {
        return invalid_argument("gpuUuid is empty, but this kvtierd serves {} GPUs ({}): name one",
                                gpus_.size(), uuid_list(gpus_));
      }
      uuid = gpus_[0].uuid;  // the one GPU there is
      gpu_index = 0;
    } else {
      auto served = std::find_if(gpus_.begin(), gpus_.end(), [&](const GpuInfo& gpu) {
        return ::strcasecmp(gpu.uuid.c_str(), uuid.c_str()) == 0;
      });
      if (served == gpus_.end()) {
        return invalid_argument("gpuUuid '{}' is not a GPU this kvtierd serves ({})", uuid,
                                uuid_list(gpus_));
      }
      uuid = served->uuid;  // the daemon's spelling
      gpu_index = static_cast<int>(served - gpus_.begin());
    }
  }
  KVTIER_RETURN_IF_ERROR(engine.layout.check_region(region_id, handle->size_bytes));
  ++engine.regions_opening;
  // Device methods may be called from any thread (device.h); the CUDA backend makes the
  // region's GPU context current on the worker before it opens or closes anything.
  // Shared: the worker's jobs are std::function, which must be copyable.
  auto opening = std::make_shared<RegionHandle>(std::move(*handle));
  region_worker_->post([this, c, id, region_id, gpu_index, opening,
                        delay_ms = config_.fault_region_open_delay_ms,
                        guard = asio::make_work_guard(io_)]() mutable {
    // fault-region-open-delay-ms (tests only): a slow open, without a slow machine.
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    auto memory = device_->open_region(std::move(*opening));
    asio::post(io_, [this, c, id, region_id, gpu_index, memory = std::move(memory),
                     guard = std::move(guard)]() mutable {
      finish_register_region(c, id, region_id, gpu_index, std::move(memory));
    });
  });
  return Status::ok();
}

void Service::finish_register_region(const ConnectionPtr& c, uint64_t id, uint32_t region_id,
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
  resume_deferred(c);  // requests sent after this one waited for it
}

void Service::close_region_off_thread(std::shared_ptr<Memory> memory,
                                      std::function<void()> closed) {
  region_worker_->post([this, memory = std::move(memory), closed = std::move(closed),
                        guard = asio::make_work_guard(io_)]() mutable {
    memory.reset();  // the daemon's last reference: unmaps / closes the IPC handle here
    if (!closed) return;
    asio::post(io_, [closed = std::move(closed), guard = std::move(guard)] { closed(); });
  });
}

Status Service::handle_unregister_region(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                                         uint32_t region_id) {
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
    reply(c, id, [&](wire::Response::Builder response) {
      response.initUnregisterRegion().setRegionId(region_id);
    });
  });
  return Status::ok();
}

void Service::reply_to_finished_unregisters() {
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
          reply(c, id, [&](wire::Response::Builder response) {
            response.initUnregisterRegion().setRegionId(region_id);
          });
        });
  }
}

}  // namespace kvtier::daemon
