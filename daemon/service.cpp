#include "daemon/service.h"

#include <capnp/message.h>
#include <kj/exception.h>
#include <boost/asio/post.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "common/log.h"
#include "daemon/copy_delay.h"
#include "daemon/persistence.h"
#include "daemon/region_worker.h"
#include "daemon/remote_path.h"
#include "daemon/startup.h"

namespace kvtier::daemon {
namespace {

// Requests about the daemon as a whole (kvtierctl's): no layout, so no Hello needed.
bool is_operator_request(wire::Request::Which which) {
  switch (which) {
    case wire::Request::STATS:
    case wire::Request::LIST_SESSIONS:
    case wire::Request::GET_SESSION:
    case wire::Request::EVICT:
    case wire::Request::PIN:
    case wire::Request::DRAIN:
    case wire::Request::GET_CONFIG:
      return true;
    default:
      return false;
  }
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

}  // namespace

void set_wire_error(wire::Error::Builder out, const Status& status) {
  static_assert(static_cast<uint16_t>(StatusCode::kNotSupported) ==
                static_cast<uint16_t>(wire::ErrorCode::NOT_SUPPORTED));
  out.setCode(static_cast<wire::ErrorCode>(static_cast<uint16_t>(status.code())));
  out.setMessage(status.message());
  out.setRetryable(status.retryable());
}

policy::PlannerConfig planner_config(const DaemonConfig& config) {
  policy::PlannerConfig planner;
  planner.hbm_high_watermark = config.hbm_high_watermark;
  planner.hbm_low_watermark = config.hbm_low_watermark;
  planner.hbm_idle_ms = config.hbm_idle_ms;
  planner.ram_idle_ms = config.ram_idle_ms;
  planner.ram_high_watermark = config.ram_high_watermark;
  planner.ram_low_watermark = config.ram_low_watermark;
  planner.nvme_high_watermark = config.nvme_high_watermark;
  planner.nvme_low_watermark = config.nvme_low_watermark;
  // Validated by the settings table; an unknown name cannot get here.
  planner.mode = policy::parse_policy_mode(config.policy).value_or(policy::PolicyMode::kPredictive);
  planner.cost.read_bytes_per_s = {config.hbm_read_gbps * 1e9, config.ram_read_gbps * 1e9,
                                   config.nvme_read_gbps * 1e9};
  planner.cost.prefill_tokens_per_s = config.prefill_tokens_per_s;
  planner.imminent_probability = config.prefetch_probability;
  planner.plan_interval_ms = config.plan_interval_ms;
  return planner;
}

ipc::ConnectionLimits connection_limits(const DaemonConfig& config) {
  ipc::ConnectionLimits limits;
  limits.max_in_flight = config.max_in_flight_per_connection;
  limits.max_held_request_bytes = config.max_request_bytes_per_connection;
  limits.max_queued_reply_bytes = config.max_reply_bytes_per_connection;
  limits.max_connections = config.max_connections;
  return limits;
}

Service::Service(asio::io_context& io, DaemonConfig config, std::unique_ptr<Device> device,
                 const policy::Clock* clock)
    : io_(io),
      config_(std::move(config)),
      device_(std::move(device)),
      clock_(clock != nullptr ? *clock : steady_clock_),
      sessions_(clock_),
      planner_(planner_config(config_), clock_),
      plan_timer_(io),
      startup_(std::make_unique<StartupState>(io)) {
  if (config_.fault_copy_delay_ms > 0) {  // fault-copy-delay-ms (tests only)
    KVTIER_LOG_INFO("every Save and Load copy completes {} ms late, one at a time (tests only)",
                    config_.fault_copy_delay_ms);
    copy_delay_ = std::make_unique<CopyCompletionDelay>(
        io_, std::chrono::milliseconds(config_.fault_copy_delay_ms));
  }
}

Service::~Service() {
  remote_.reset();  // its thread may be reading pinned tier memory: stopped first
  cancel_fill();
  if (startup_->filler.joinable()) startup_->filler.join();
  region_worker_.reset();  // runs the closes still queued
  device_->drain();
}

Status Service::start() {
  gpus_ = device_->gpus();
  backend_kind_ = gpus_.empty() ? wire::DeviceKind::HOST : wire::DeviceKind::CUDA;
  // The device calls this on one of its threads; everything it does happens here.
  device_->set_fatal_error_handler([this](const Status& status) {
    asio::post(io_, [this, status] { on_device_lost(status); });
  });
  // Two threads: closing one engine's big region does not hold up opening another's.
  region_worker_ = std::make_unique<RegionWorker>(2);
  std::vector<BlockStore::TierMemory> tiers;
  // Reserved now, filled on background threads (startup.cpp) while the socket serves.
  std::vector<UnfilledMemory> fills;
  if (config_.hbm_bytes > 0) {
    // hbm-bytes on every GPU, in parts that never split a slab between two GPUs; a
    // part smaller than slab-bytes is one slab.
    const uint64_t hbm_slab_bytes = std::min(config_.slab_bytes, config_.hbm_bytes);
    auto arena = device_->reserve_arena(config_.hbm_bytes, hbm_slab_bytes);
    if (!arena.is_ok()) return arena.status();
    BlockStore::TierMemory hbm{Tier::kHbm, arena->memory, hbm_slab_bytes};
    hbm.parts = static_cast<uint32_t>(std::max<size_t>(gpus_.size(), 1));
    tiers.push_back(std::move(hbm));
    fills.push_back(std::move(*arena));
  }
  if (config_.ram_bytes > 0) {
    auto pool = device_->reserve_pinned_pool(config_.ram_bytes);
    if (!pool.is_ok()) return pool.status();
    tiers.push_back({Tier::kRam, pool->memory, config_.slab_bytes});
    fills.push_back(std::move(*pool));
  }
  KVTIER_RETURN_IF_ERROR(open_nvme(tiers));  // persistence.cpp
  store_ = std::make_unique<BlockStore>(std::move(tiers));
  view_ = make_placement_view(*store_, [this](Tier tier) { return leaving_bytes(tier); });
  make_mover();
  KVTIER_RETURN_IF_ERROR(recover_nvme());
  KVTIER_RETURN_IF_ERROR(open_remote());  // remote_path.cpp
  started_ms_ = now_ms();
  start_fill(std::move(fills));  // the planner starts once it is done
  return Status::ok();
}

// Service::stop is in persistence.cpp: with an NVMe tier, stopping drains to it.

void Service::on_device_lost(const Status& status) {
  if (exit_code_ != 0) return;
  exit_code_ = kExitDeviceLost;
  KVTIER_LOG_ERROR(
      "GPU context lost: {}; exiting so systemd restarts kvtierd (NVMe contents survive)",
      status.to_string());
  stopping_ = true;
  plan_timer_.cancel();
  if (nvme_) {
    // A drain in progress ends here: what it would copy from RAM or HBM can no longer
    // be trusted. What is on NVMe is, and the session table says which sessions use
    // it (a session ends at its first block that is not there after the restart).
    nvme_->drain_phase = NvmeState::DrainPhase::kDone;
    if (nvme_->drain_deadline) nvme_->drain_deadline->cancel();
    for (const policy::Session* session : sessions_.by_last_active()) {
      note_session_changed(*session);
    }
    flush_sessions(/*sync=*/true);
    nvme_->tier->flush();  // blocks until the table (and writes before it) are durable
  }
  if (fatal_exit_) fatal_exit_(exit_code_);
  io_.stop();
}

void Service::on_connect(const ConnectionPtr& connection) {
  auto engine = engines_.connect(connection->peer());
  connection->user_state = engine;
  KVTIER_LOG_DEBUG("connection {} from pid {} uid {} (namespace {})", connection->id(),
                   connection->peer().pid, connection->peer().uid, engine->namespace_name);
}

void Service::on_disconnect(const ConnectionPtr& connection) {
  // Regions stay mapped while copies that use them are in flight (the batches hold
  // them); dropping the context releases the daemon's own references.
  auto engine = std::static_pointer_cast<EngineContext>(connection->user_state);
  if (engine && !engine->regions.empty()) {
    KVTIER_LOG_DEBUG("connection {} closed; releasing {} regions", connection->id(),
                     engine->regions.size());
  }
  if (engine) {
    // Closing a mapping can take long (munmap of GiBs): the region worker does it.
    for (auto& [region_id, memory] : engine->regions) close_region_off_thread(std::move(memory));
    engine->regions.clear();
    startup_->deferred_requests -= engine->deferred.size();
    engine->deferred.clear();
  }
  // Nobody is left to tell: Unregisters waiting for copies just let go.
  for (ParkedUnregister& parked : parked_unregisters_) {
    if (parked.connection == connection) close_region_off_thread(std::move(parked.memory));
  }
  std::erase_if(parked_unregisters_,
                [&](const ParkedUnregister& parked) { return parked.connection == connection; });
  std::erase_if(parked_saves_,
                [&](const ParkedSave& parked) { return parked.connection == connection; });
  connection->user_state.reset();
}

void Service::on_frame(const ConnectionPtr& connection, ipc::Frame frame) {
  auto engine = std::static_pointer_cast<EngineContext>(connection->user_state);
  uint64_t id = 0;
  Status status;
  try {
    auto request = frame.reader().getRoot<wire::Request>();
    id = request.getId();
    record_request(*engine, id, request);
    std::vector<UniqueFd> fds;
    status = claim_descriptors(connection, request, fds);
    if (status.is_ok() && must_defer(*engine, request.which())) {
      // startup.h: waits for the fill or for a region this connection is opening.
      status = defer_request(connection, *engine, std::move(frame), std::move(fds));
    } else if (status.is_ok()) {
      status = dispatch(connection, *engine, request, std::move(fds));
    }
  } catch (const kj::Exception& e) {
    // Malformed pointers surface as kj exceptions while reading; handlers copy what
    // they need before changing any state, so failing here changes nothing.
    status = invalid_argument("malformed request: {}", e.getDescription().cStr());
  }
  if (!status.is_ok()) reply_error(connection, id, status);
}

Status Service::claim_descriptors(const ConnectionPtr& c, wire::Request::Reader request,
                                  std::vector<UniqueFd>& fds) {
  // Descriptors are claimed on arrival, before anything can reject or defer the
  // request, so a rejected RegisterRegion never leaves its fds queued for the next
  // request.
  if (request.which() != wire::Request::REGISTER_REGION) return Status::ok();
  const uint32_t count = request.getRegisterRegion().getFdCount();
  for (uint32_t i = 0; i < count && i < ipc::kMaxFdsPerRequest; ++i) {
    auto fd = c->take_fd();
    if (!fd.is_ok()) {
      return invalid_argument("fdCount is {} but only {} descriptors arrived with the request",
                              count, i);
    }
    fds.push_back(std::move(*fd));
  }
  if (count > ipc::kMaxFdsPerRequest) {
    return invalid_argument("fdCount {} exceeds {}", count, ipc::kMaxFdsPerRequest);
  }
  return Status::ok();
}

Status Service::dispatch(const ConnectionPtr& c, EngineContext& engine,
                         wire::Request::Reader request, std::vector<UniqueFd> fds) {
  const uint64_t id = request.getId();
  auto which = request.which();
  if (id == 0) return invalid_argument("request id 0 is reserved; use ids from 1");
  bool needs_hello = which != wire::Request::HELLO && !is_operator_request(which);
  if (needs_hello && !engine.hello_done) {
    return invalid_argument("send Hello first: this connection has not declared its layout");
  }
  switch (which) {
    case wire::Request::HELLO: {
      LayoutLimits limits;
      limits.max_block_bytes = std::min<uint64_t>(limits.max_block_bytes, config_.slab_bytes);
      return handle_hello(c, engine, id, decode_hello(request.getHello(), limits));
    }
    case wire::Request::REGISTER_REGION: {
      auto region = decode_register_region(request.getRegisterRegion(), std::move(fds));
      if (!region.is_ok()) return region.status();
      return handle_register_region(c, engine, id, request.getRegisterRegion().getRegionId(),
                                    std::move(*region));
    }
    case wire::Request::UNREGISTER_REGION:
      return handle_unregister_region(c, engine, id, request.getUnregisterRegion().getRegionId());
    case wire::Request::SAVE: {
      auto save = request.getSave();
      auto parsed = decode_block_list(engine, config_.max_blocks_per_request, save.getSessionId(),
                                      save.getBlocks(), BlockListKind::kSave);
      if (!parsed.is_ok()) return parsed.status();
      parsed->end_of_turn = save.getEndOfTurn();
      KVTIER_RETURN_IF_ERROR(decode_save_retention(save, *parsed));
      return handle_save(c, engine, id, std::move(*parsed));
    }
    case wire::Request::LOOKUP: {
      auto hashes = decode_lookup(config_.max_blocks_per_request, request.getLookup().getHashes());
      if (!hashes.is_ok()) return hashes.status();
      return handle_lookup(c, engine, id, *hashes);
    }
    case wire::Request::LOAD: {
      auto load = request.getLoad();
      auto parsed = decode_block_list(engine, config_.max_blocks_per_request, load.getSessionId(),
                                      load.getBlocks(), BlockListKind::kLoad);
      if (!parsed.is_ok()) return parsed.status();
      KVTIER_RETURN_IF_ERROR(decode_load_planes(engine.layout, load, *parsed));
      return handle_load(c, engine, id, std::move(*parsed));
    }
    case wire::Request::BEGIN_TURN:
      return handle_begin_turn(c, engine, id, request.getBeginTurn().getSessionId().cStr());
    case wire::Request::CLOSE_SESSION:
      return handle_close_session(c, engine, id, request.getCloseSession().getSessionId().cStr());
    case wire::Request::STATS:
      return handle_stats(c, engine, id, request.getStats().getAllNamespaces());
    case wire::Request::LIST_SESSIONS:
      return handle_list_sessions(c, engine, id, request.getListSessions().getAllNamespaces());
    case wire::Request::GET_SESSION:
      return handle_get_session(c, engine, id, decode_get_session(request.getGetSession()));
    case wire::Request::EVICT:
      return handle_evict(c, engine, id, decode_evict(request.getEvict()));
    case wire::Request::PIN:
      return handle_pin(c, engine, id, decode_pin(request.getPin()));
    case wire::Request::DRAIN:
      return handle_drain(c, engine, id);
    case wire::Request::GET_CONFIG:
      return handle_get_config(c, engine, id);
  }
  return invalid_argument("unknown request kind {} (newer client?)", static_cast<int>(which));
}

void Service::reply(const ConnectionPtr& connection, uint64_t id, const Fill& fill) {
  capnp::MallocMessageBuilder message;
  auto response = message.initRoot<wire::Response>();
  response.setId(id);
  fill(response);
  record_reply(connection, id, response.asReader());
  connection->send(capnp::messageToFlatArray(message));
  connection->request_done();
}

void Service::reply_error(const ConnectionPtr& connection, uint64_t id, const Status& status) {
  if (status.code() == StatusCode::kInternal) {
    KVTIER_LOG_ERROR("request {} on connection {}: {}", id, connection->id(), status.to_string());
  } else {
    KVTIER_LOG_DEBUG("request {} on connection {}: {}", id, connection->id(), status.to_string());
  }
  reply(connection, id,
        [&](wire::Response::Builder response) { set_wire_error(response.initError(), status); });
}

Status Service::handle_hello(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                             HelloRequest hello) {
  if (engine.hello_done) return invalid_argument("Hello was already sent on this connection");
  if (hello.protocol_version != wire::PROTOCOL_VERSION) {
    return invalid_argument("protocolVersion {} is not supported; this daemon speaks version {}",
                            hello.protocol_version, wire::PROTOCOL_VERSION);
  }
  if (hello.engine_name.size() > 128)
    return invalid_argument("engineName is longer than 128 bytes");
  if (hello.device_kind != backend_kind_) {
    if (backend_kind_ == wire::DeviceKind::HOST) {
      return not_supported(
          "deviceKind {}: this kvtierd runs the host backend and takes memfd regions only (GPU "
          "regions need a kvtierd started with --device cuda on a GPU machine)",
          device_kind_name(hello.device_kind));
    }
    return not_supported(
        "deviceKind {}: this kvtierd runs the cuda backend ({}) and takes GPU regions only "
        "(cudaIpc, cudaVmmFd)",
        device_kind_name(hello.device_kind), device_->name());
  }
  auto& layout = hello.layout;
  if (!layout.is_ok()) return layout.status();
  LayoutKey key{engine.namespace_id, layout->digest};
  KVTIER_RETURN_IF_ERROR(store_->register_layout(key, layout->block_bytes));
  // The cost model weighs reload against recompute per layout; an engine that does
  // not report a plausible prefill speed gets the configured one (an absurd one would
  // make every block look cheaper to recompute than to keep).
  const double prefill = hello.prefill_tokens_per_second;
  planner_.set_layout_cost(
      key, {hello.tokens_per_block,
            std::isfinite(prefill) && prefill > 0 && prefill < 1e9 ? prefill : 0.0});
  engine.layout = std::move(*layout);
  engine.layout_key = key;
  engine.engine_name = std::move(hello.engine_name);
  engine.hello_done = true;
  KVTIER_LOG_INFO(
      "engine '{}' (pid {}, namespace {}) joined: model {}, {} planes, {} bytes per block",
      engine.engine_name, c->peer().pid, engine.namespace_name, engine.layout.model_id,
      engine.layout.planes.size(), engine.layout.block_bytes);
  reply(c, id, [&](wire::Response::Builder response) {
    auto out = response.initHello();
    out.setProtocolVersion(wire::PROTOCOL_VERSION);
    out.setLayoutDigest(engine.layout.digest);
    out.setBlockBytes(engine.layout.block_bytes);
    out.setNamespaceName(engine.namespace_name);
    out.setMaxBlocksPerRequest(config_.max_blocks_per_request);
    out.setDeviceKind(backend_kind_);
    auto uuids = out.initGpuUuids(static_cast<unsigned>(gpus_.size()));
    for (unsigned i = 0; i < gpus_.size(); ++i) uuids.set(i, gpus_[i].uuid);
    out.setDeviceName(std::string(device_->name()));
    out.setRetentionPriorities(true);
    out.setLoadPlaneRanges(true);
  });
  return Status::ok();
}

Status Service::handle_begin_turn(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                                  const std::string& session_id) {
  policy::Session* session = sessions_.find(engine.namespace_id, session_id);
  if (session == nullptr) {
    if (!remote_) return not_found("unknown session '{}'", session_id);
    resume_from_remote(c, engine, id, session_id);  // answers when the record came (or not)
    return Status::ok();
  }
  begin_turn(c, engine, id, *session, 0);
  return Status::ok();
}

void Service::begin_turn(const ConnectionPtr& c, const EngineContext& engine, uint64_t id,
                         policy::Session& session, uint32_t fetching) {
  sessions_.record_activity(session);
  session.turn_begun = true;
  session.turn_begun_ms = now_ms();
  sessions_.expire_priorities(sessions_.now_ms());
  auto moves = planner_.plan_turn_start(session, sessions_, *view_);
  mover_->apply(moves, engine.gpu_part);  // toward the GPU of the engine that will load them
  const auto known = static_cast<uint32_t>(session.blocks.size()) + fetching;
  // The plan may also demote other sessions' blocks to make room: count promotions.
  const auto promoted = std::count_if(moves.begin(), moves.end(), [](const policy::Move& move) {
    return move.kind == policy::MoveKind::kPromote;
  });
  reply(c, id, [&](wire::Response::Builder response) {
    auto out = response.initBeginTurn();
    out.setKnownBlocks(known);
    out.setPromotedBlocks(static_cast<uint32_t>(promoted) + fetching);
  });
}

Status Service::handle_close_session(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                                     const std::string& session_id) {
  const policy::Session* session = sessions_.find(engine.namespace_id, session_id);
  if (session == nullptr) return not_found("unknown session '{}'", session_id);
  const LayoutKey layout = session->layout;
  auto closed = sessions_.close(engine.namespace_id, session_id);
  if (!closed.is_ok()) return closed.status();
  for (const BlockHash& hash : *closed) store_->drop_session_ref({layout, hash});
  note_session_closed(engine.namespace_id, session_id);
  reply(c, id, [&](wire::Response::Builder response) {
    response.initCloseSession().setReleasedBlocks(static_cast<uint32_t>(closed->size()));
  });
  return Status::ok();
}

}  // namespace kvtier::daemon
