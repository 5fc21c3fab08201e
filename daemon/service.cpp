#include "daemon/service.h"

#include <capnp/message.h>
#include <kj/exception.h>
#include <boost/asio/post.hpp>

#include <algorithm>

#include "common/log.h"
#include "common/units.h"
#include "daemon/admin_service.h"
#include "daemon/copies.h"
#include "daemon/engine_setup.h"
#include "daemon/load_path.h"
#include "daemon/placement.h"
#include "daemon/remote_path.h"
#include "daemon/replies.h"
#include "daemon/save_path.h"
#include "daemon/session_journal.h"
#include "daemon/startup_gate.h"
#include "daemon/tier_watch.h"
#include "daemon/turn_path.h"

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

}  // namespace

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
  limits.max_connections_per_uid = config.max_connections_per_tenant;
  limits.admin_reserved_connections = config.admin_reserved_connections;
  limits.introduction_timeout_ms = config.hello_timeout_ms;
  return limits;
}

DaemonContext::DaemonContext(asio::io_context& io_context, DaemonConfig daemon_config,
                             std::unique_ptr<Device> device_backend, const policy::Clock* clock_in)
    : io(io_context),
      config(std::move(daemon_config)),
      device(std::move(device_backend)),
      clock(clock_in != nullptr ? *clock_in : steady_clock),
      sessions(clock),
      planner(planner_config(config), clock) {
  sessions.set_references(&store_references);
}

Service::Service(asio::io_context& io, DaemonConfig config, std::unique_ptr<Device> device,
                 const policy::Clock* clock)
    : ctx_(io, std::move(config), std::move(device), clock) {
  // Built on the thread that will run the loop, before it runs: nothing else can reach
  // the parts yet.
  assert_control_thread();
  // Each part takes the parts it uses, so they are built in that order (the members'
  // order is their teardown's); docs/architecture.md draws the graph.
  replies_ = std::make_unique<Replies>(ctx_);
  copies_ = std::make_unique<Copies>(ctx_, *replies_);
  placement_ = std::make_unique<Placement>(ctx_, *replies_);
  journal_ = std::make_unique<SessionJournal>(ctx_, *replies_);
  remote_ = std::make_unique<RemotePath>(ctx_, *replies_, *journal_);
  startup_ = std::make_unique<StartupGate>(
      ctx_, *replies_, *journal_,
      [this](const ConnectionPtr& c, EngineContext& engine, wire::Request::Reader request,
             std::vector<UniqueFd> fds) {
        assert_control_thread();
        return dispatch(c, engine, request, std::move(fds));
      },
      [this](const Status&) {
        assert_control_thread();
        on_cannot_start();
      },
      [this] {
        assert_control_thread();
        placement_->run_planner(policy::Planner::PlanKind::kPeriodic);  // and every period
        if (ready_callback_) ready_callback_();
      });
  saves_ = std::make_unique<SavePath>(ctx_, *replies_, *placement_, *copies_, *journal_);
  loads_ = std::make_unique<LoadPath>(ctx_, *replies_, *copies_, *remote_);
  turns_ = std::make_unique<TurnPath>(ctx_, *replies_, *saves_, *remote_);
  setup_ = std::make_unique<EngineSetup>(ctx_, *replies_, *startup_);
  admin_ = std::make_unique<AdminService>(ctx_, *replies_, *journal_, *startup_, *remote_);
  watch_ = std::make_unique<TierWatch>(ctx_, *replies_);

  // What a part hears from parts it does not use: after each copy, Unregisters waiting
  // for their region and Saves waiting for room look again (the copy's pins are gone);
  // after each plan, NVMe copies that are due are written, session records flushed, the
  // remote write-behind swept and parked Saves looked at (answering those whose wait is over).
  copies_->after_each_copy([this] {
    assert_control_thread();
    setup_->reply_to_finished_unregisters();
  });
  copies_->after_each_copy([this] {
    assert_control_thread();
    saves_->resume_parked_saves();
  });
  placement_->after_each_plan([this] {
    assert_control_thread();
    journal_->write_due_copies();
    journal_->flush_sessions(/*sync=*/false);
  });
  placement_->after_each_plan([this] {
    assert_control_thread();
    remote_->sweep_write_behind();
  });
  placement_->after_each_plan([this] {
    assert_control_thread();
    saves_->resume_parked_saves();
  });
  // Whoever keeps something per session hears from the table of its growth, its cuts,
  // its turns' ends and its end, whichever path changed it (policy::SessionObserver).
  for (policy::SessionObserver* part : std::initializer_list<policy::SessionObserver*>{
           saves_.get(), admin_.get(), journal_.get(), remote_.get()}) {
    ctx_.sessions.subscribe(*part);
  }
}

Service::~Service() {
  // The loop has returned, or never ran: only device and worker threads are left, and
  // they touch none of the parts' state.
  assert_control_thread();
  remote_.reset();  // its thread may be reading pinned tier memory: stopped first
  startup_->join();
  setup_->stop_worker();  // runs the closes still queued
  ctx_.device->drain();
}

Status Service::start() {
  assert_control_thread();
  ctx_.gpus = ctx_.device->gpus();
  ctx_.backend_kind = ctx_.gpus.empty() ? wire::DeviceKind::HOST : wire::DeviceKind::CUDA;
  // The device calls this on one of its threads; everything it does happens here.
  ctx_.device->set_fatal_error_handler([this](const Status& status) {
    asio::post(ctx_.io, [this, status] {
      assert_control_thread();
      on_device_lost(status);
    });
  });
  std::vector<BlockStore::TierMemory> tiers;
  // Reserved now, filled on background threads (StartupGate) while the socket serves.
  std::vector<UnfilledMemory> fills;
  if (ctx_.config.hbm_bytes > 0) {
    // hbm-bytes on every GPU, in parts that never split a slab between two GPUs; a
    // part smaller than slab-bytes is one slab.
    const uint64_t hbm_slab_bytes = std::min(ctx_.config.slab_bytes, ctx_.config.hbm_bytes);
    auto arena = ctx_.device->reserve_arena(ctx_.config.hbm_bytes, hbm_slab_bytes);
    if (!arena.is_ok()) return arena.status();
    BlockStore::TierMemory hbm{Tier::kHbm, arena->memory, hbm_slab_bytes};
    hbm.parts = static_cast<uint32_t>(std::max<size_t>(ctx_.gpus.size(), 1));
    tiers.push_back(std::move(hbm));
    fills.push_back(std::move(*arena));
  }
  if (ctx_.config.ram_bytes > 0) {
    auto pool = ctx_.device->reserve_pinned_pool(ctx_.config.ram_bytes);
    if (!pool.is_ok()) return pool.status();
    tiers.push_back({Tier::kRam, pool->memory, ctx_.config.slab_bytes});
    fills.push_back(std::move(*pool));
  }
  KVTIER_RETURN_IF_ERROR(journal_->open_nvme(tiers));
  ctx_.store = std::make_unique<BlockStore>(std::move(tiers));
  // A peer policy learns from the store's block events.
  if (policy::BlockObserver* peer = ctx_.planner.observer()) ctx_.store->subscribe(*peer);
  ctx_.store->subscribe(*watch_);  // tier notices (WatchTiers)
  ctx_.topology = TierTopology::of([this](Tier tier) {
    assert_control_thread();
    // The remote tier joins when open_remote() connects it.
    return !TierTopology::traits(tier).key_addressed && ctx_.store->configured(tier);
  });
  ctx_.view = make_placement_view(
      *ctx_.store,
      [this](Tier tier) {
        assert_control_thread();
        return ctx_.mover ? ctx_.mover->leaving_bytes(tier) : 0;
      },
      [this](Tier tier) {
        assert_control_thread();
        return quota_standing(ctx_, tier);
      });
  ctx_.planner.tell_capacities(*ctx_.view);
  make_mover();
  KVTIER_RETURN_IF_ERROR(journal_->recover_nvme());
  KVTIER_RETURN_IF_ERROR(remote_->open_remote());
  ctx_.started_ms = ctx_.now_ms();
  startup_->start_fill(std::move(fills));  // the planner starts once it is done
  return Status::ok();
}

void Service::on_device_lost(const Status& status) {
  if (exit_code_ != 0) return;
  exit_code_ = kExitDeviceLost;
  KVTIER_LOG_ERROR(
      "GPU context lost: {}; exiting so systemd restarts kvtierd (NVMe contents survive)",
      status.to_string());
  ctx_.stopping = true;
  placement_->stop();
  watch_->stop();
  journal_->write_before_exit();
  if (fatal_exit_) fatal_exit_(exit_code_);
  ctx_.io.stop();
}

void Service::on_cannot_start() {
  exit_code_ = kExitCannotStart;
  ctx_.stopping = true;
  if (fatal_exit_) fatal_exit_(exit_code_);
  ctx_.io.stop();
}

void Service::on_connect(const ConnectionPtr& connection) {
  assert_control_thread();
  // With a server attached its admin check (ours) already ran at accept: no second
  // /proc read.
  auto engine = ctx_.engines.connect(
      connection->peer(), ctx_.server ? std::optional<bool>(connection->admin()) : std::nullopt);
  connection->user_state = engine;
  KVTIER_LOG_DEBUG("connection {} from pid {} uid {} (namespace {})", connection->id(),
                   connection->peer().pid, connection->peer().uid, engine->namespace_name);
}

void Service::on_disconnect(const ConnectionPtr& connection) {
  assert_control_thread();
  // Regions stay mapped while copies that use them are in flight (the batches hold
  // them); dropping the context releases the daemon's own references.
  auto engine = std::static_pointer_cast<EngineContext>(connection->user_state);
  if (engine && !engine->regions.empty()) {
    KVTIER_LOG_DEBUG("connection {} closed; releasing {} regions", connection->id(),
                     engine->regions.size());
  }
  setup_->forget(connection, engine.get());
  if (engine) startup_->forget(*engine);
  saves_->forget(connection);
  watch_->forget(engine.get());
  connection->user_state.reset();
}

void Service::on_frame(const ConnectionPtr& connection, ipc::Frame frame) {
  assert_control_thread();
  auto engine = std::static_pointer_cast<EngineContext>(connection->user_state);
  uint64_t id = 0;
  Status status;
  try {
    auto request = frame.reader().getRoot<wire::Request>();
    id = request.getId();
    // A Hello or an operator request says who the peer is: the hello-timeout is off
    // (any other request first is refused, and does not count).
    if (request.which() == wire::Request::HELLO || is_operator_request(request.which())) {
      connection->introduced();
    }
    replies_->record_request(*engine, id, request);
    std::vector<UniqueFd> fds;
    status = claim_descriptors(connection, request, fds);
    if (status.is_ok() && startup_->must_defer(*engine, request.which())) {
      // startup_gate.h: waits for the fill or for a region this connection is opening.
      status = startup_->defer_request(connection, *engine, std::move(frame), std::move(fds));
    } else if (status.is_ok()) {
      status = dispatch(connection, *engine, request, std::move(fds));
    }
  } catch (const kj::Exception& e) {
    // Malformed pointers surface as kj exceptions while reading; handlers copy what
    // they need before changing any state, so failing here changes nothing.
    status = invalid_argument("malformed request: {}", e.getDescription().cStr());
  }
  if (!status.is_ok()) replies_->reply_error(connection, id, status);
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
      limits.max_block_bytes = std::min<uint64_t>(limits.max_block_bytes, ctx_.config.slab_bytes);
      return setup_->handle_hello(c, engine, id, decode_hello(request.getHello(), limits));
    }
    case wire::Request::REGISTER_REGION: {
      auto region = decode_register_region(request.getRegisterRegion(), std::move(fds));
      if (!region.is_ok()) return region.status();
      return setup_->handle_register_region(
          c, engine, id, request.getRegisterRegion().getRegionId(), std::move(*region));
    }
    case wire::Request::UNREGISTER_REGION:
      return setup_->handle_unregister_region(c, engine, id,
                                              request.getUnregisterRegion().getRegionId());
    case wire::Request::SAVE:
      return dispatch_save(c, engine, id, request.getSave());
    case wire::Request::LOOKUP: {
      auto hashes =
          decode_lookup(ctx_.config.max_blocks_per_request, request.getLookup().getHashes());
      if (!hashes.is_ok()) return hashes.status();
      return loads_->handle_lookup(c, engine, id, *hashes);
    }
    case wire::Request::LOAD:
      return dispatch_load(c, engine, id, request.getLoad());
    case wire::Request::BEGIN_TURN:
      return turns_->handle_begin_turn(c, engine, id, request.getBeginTurn().getSessionId().cStr());
    case wire::Request::CLOSE_SESSION:
      return turns_->handle_close_session(c, engine, id,
                                          request.getCloseSession().getSessionId().cStr());
    case wire::Request::STATS:
      return admin_->handle_stats(c, engine, id, request.getStats().getAllNamespaces());
    case wire::Request::LIST_SESSIONS:
      return admin_->handle_list_sessions(c, engine, id,
                                          decode_list_sessions(request.getListSessions()));
    case wire::Request::GET_SESSION:
      return admin_->handle_get_session(c, engine, id, decode_get_session(request.getGetSession()));
    case wire::Request::EVICT:
      return admin_->handle_evict(c, engine, id, decode_evict(request.getEvict()));
    case wire::Request::PIN:
      return admin_->handle_pin(c, engine, id, decode_pin(request.getPin()));
    case wire::Request::DRAIN:
      return admin_->handle_drain(c, engine, id);
    case wire::Request::GET_CONFIG:
      return admin_->handle_get_config(c, engine, id);
    case wire::Request::WATCH_TIERS: {
      auto watch = request.getWatchTiers();
      return watch_->handle_watch(c, engine, id, watch.getMaxWaitMs(), watch.getMaxChanges());
    }
  }
  return invalid_argument("unknown request kind {} (newer client?)", static_cast<int>(which));
}

Status Service::dispatch_save(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                              wire::Save::Reader save) {
  auto parsed = decode_block_list(engine, ctx_.config.max_blocks_per_request, save.getSessionId(),
                                  save.getBlocks(), BlockListKind::kSave, save.hasStaging());
  if (!parsed.is_ok()) return parsed.status();
  parsed->end_of_turn = save.getEndOfTurn();
  KVTIER_RETURN_IF_ERROR(decode_save_retention(save, *parsed));
  if (save.hasStaging()) {
    KVTIER_RETURN_IF_ERROR(
        decode_staging(engine, save.getStaging(), *parsed, BlockListKind::kSave));
    ++ctx_.counters.staged_saves;
  }
  return saves_->handle_save(c, engine, id, std::move(*parsed));
}

Status Service::dispatch_load(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                              wire::Load::Reader load) {
  auto parsed = decode_block_list(engine, ctx_.config.max_blocks_per_request, load.getSessionId(),
                                  load.getBlocks(), BlockListKind::kLoad, load.hasStaging());
  if (!parsed.is_ok()) return parsed.status();
  KVTIER_RETURN_IF_ERROR(decode_load_planes(engine.layout, load, *parsed));
  if (load.hasStaging()) {
    KVTIER_RETURN_IF_ERROR(
        decode_staging(engine, load.getStaging(), *parsed, BlockListKind::kLoad));
    ++ctx_.counters.staged_loads;
  }
  return loads_->handle_load(c, engine, id, std::move(*parsed));
}

void Service::stop(std::function<void()> stopped) {
  assert_control_thread();
  if (journal_->draining()) {
    // A second stop: the operator does not want to wait. Whatever was not written
    // is lost like after a crash, which the on-disk order makes harmless.
    KVTIER_LOG_WARN("stop requested again: exiting without finishing the drain to NVMe");
    journal_->give_up_drain();
    ctx_.io.stop();
    if (stopped) stopped();
    return;
  }
  ctx_.stopping = true;
  placement_->stop();
  watch_->stop();  // waiting WatchTiers answered: no timer holds the loop
  if (ctx_.mover) ctx_.mover->stop_spills();  // NVMe room they held is the drain's
  saves_->resume_parked_saves();              // answers them: nothing new starts now
  startup_->cancel_fill();  // a stop while the tier memory is filling: nothing was served yet
  if (journal_->drained()) {
    if (stopped) stopped();
    return;
  }
  journal_->start_drain(std::move(stopped));
}

void Service::apply_reloaded_config(const DaemonConfig& fresh) {
  assert_control_thread();
  ctx_.config = with_reloadable_settings(ctx_.config, fresh);
  // Another policy has another observer (a peer policy starts its history anew): the
  // old one unsubscribes before the planner lets it go.
  policy::BlockObserver* old_peer = ctx_.planner.observer();
  if (ctx_.store != nullptr && old_peer != nullptr) ctx_.store->unsubscribe(*old_peer);
  ctx_.planner.set_config(planner_config(ctx_.config));
  policy::BlockObserver* peer = ctx_.planner.observer();
  if (ctx_.store != nullptr && peer != nullptr) ctx_.store->subscribe(*peer);
  if (ctx_.view != nullptr) ctx_.planner.tell_capacities(*ctx_.view);
}

std::string Service::status_line() const {
  assert_control_thread();
  if (ctx_.store == nullptr) return "starting";
  if (!ctx_.ready) {
    return fmt::format("starting: filling {} of memory pools; data requests wait",
                       format_bytes(startup_->fill_bytes()));
  }
  std::string line;
  for (const TierUsage& tier : ctx_.store->usage()) {
    const double percent = tier.capacity_bytes
                               ? 100.0 * static_cast<double>(tier.used_bytes) / tier.capacity_bytes
                               : 0.0;
    line += fmt::format("{} {:.0f}% of {}, ", tier_name(tier.tier), percent,
                        format_bytes(tier.capacity_bytes));
  }
  return line +
         fmt::format("{} sessions ({} active), {} connections, {} pinned", ctx_.sessions.size(),
                     ctx_.sessions.count(policy::SessionState::kActive),
                     ctx_.server ? ctx_.server->connection_count() : 0, admin_->pinned_sessions());
}

void Service::make_mover() {
  for (Tier tier : ctx_.topology.engine_facing()) {  // the tiers that are memory
    ctx_.storage_tiers.push_back(std::make_unique<MemoryTier>(tier, ctx_.store->memory(tier)));
  }
  if (journal_->enabled()) {
    ctx_.storage_tiers.push_back(
        std::make_unique<NvmeStorageTier>(*journal_->tier(), [this](const BlockKey& key) {
          assert_control_thread();
          return journal_->nvme_key(key);
        }));
  }
  std::vector<StorageTier*> tiers;
  for (const auto& tier : ctx_.storage_tiers) tiers.push_back(tier.get());
  MoveExecutor::Hooks hooks;
  hooks.copy = [this](CopyBatch batch, std::function<void(Status)> done) {
    assert_control_thread();
    return copies_->submit_copy(std::move(batch), std::move(done));
  };
  hooks.control_thread = [this]() -> std::function<void(std::function<void()>)> {
    auto guard = asio::make_work_guard(ctx_.io);
    return [this, guard](std::function<void()> fn) {
      asio::post(ctx_.io, [guard, fn] {
        assert_control_thread();
        fn();
      });
    };
  };
  hooks.room_by_demotion = [this](Tier tier, uint64_t bytes) {
    assert_control_thread();
    return placement_->room_by_demotion(tier, bytes);
  };
  hooks.not_moved = [this](const BlockKey& key) {
    assert_control_thread();
    ctx_.planner.revisit(ctx_.sessions, key);
  };
  hooks.removed = [this](const std::vector<BlockKey>& keys, bool lost) {
    assert_control_thread();
    placement_->on_blocks_removed(keys, lost);
  };
  hooks.before_persistent_write = [this] {
    assert_control_thread();
    journal_->flush_sessions(/*sync=*/false);
  };
  hooks.settled = [this] {
    assert_control_thread();
    journal_->check_drain();
    saves_->resume_parked_saves();
  };
  hooks.room_by_eviction = [this](Tier tier, uint64_t bytes) {
    assert_control_thread();
    ctx_.sessions.expire_priorities(ctx_.sessions.now_ms());
    return ctx_.planner.make_room(tier, bytes, ctx_.sessions, *ctx_.view);
  };
  hooks.inserted = [this](const BlockKey& key, bool ok) {
    assert_control_thread();
    saves_->wake_write_waiters(key, ok);
    if (ok) watch_->block_written(key);  // read back from the remote tier: warm here again
  };
  hooks.now_ms = [this] { return ctx_.now_ms(); };
  hooks.wall_ms_of = [this](uint64_t steady_ms) {
    return steady_to_wall_ms(steady_ms, ctx_.now_ms(), wall_now_ms());
  };
  ctx_.mover = std::make_unique<MoveExecutor>(*ctx_.store, std::move(tiers), std::move(hooks));
}

}  // namespace kvtier::daemon
