// Start-up: filling the tier memory off the control thread, and requests that must wait
// for earlier work (startup_gate.h says what waits for what, and why).
#include "daemon/startup_gate.h"

#include <kj/exception.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>

#include <chrono>

#include "common/log.h"
#include "common/mutex.h"
#include "common/units.h"
#include "daemon/session_journal.h"
#include "device/page_fill.h"

namespace kvtier::daemon {
namespace {

// The requests that copy bytes into or out of the tier memory (or plan moves that do).
bool needs_tier_memory(wire::Request::Which which) {
  switch (which) {
    case wire::Request::SAVE:
    case wire::Request::LOAD:
    case wire::Request::BEGIN_TURN:
    case wire::Request::DRAIN:
      return true;
    default:
      return false;
  }
}

constexpr auto kExpiryCheck = std::chrono::milliseconds(50);

}  // namespace

StartupGate::StartupGate(DaemonContext& ctx, Replies& replies, SessionJournal& journal,
                         Dispatch dispatch, std::function<void(const Status&)> failed,
                         std::function<void()> filled)
    : Part(ctx, replies),
      journal_(journal),
      dispatch_(std::move(dispatch)),
      failed_(std::move(failed)),
      filled_(std::move(filled)),
      expiry_timer_(ctx.io) {}

StartupGate::~StartupGate() {
  assert_control_thread();  // as the Service's destructor (service.cpp)
  join();
}

void StartupGate::join() {
  cancel_fill();
  if (filler_.joinable()) filler_.join();
}

void StartupGate::forget(EngineContext& engine) {
  deferred_requests_ -= engine.deferred.size();
  engine.deferred.clear();
}

void StartupGate::start_fill(std::vector<UnfilledMemory> fills) {
  uint64_t bytes = 0;
  for (const UnfilledMemory& fill : fills) {
    if (fill.fill) bytes += fill.memory->size_bytes();
  }
  fill_bytes_ = bytes;
  // The NVMe tier reads into and writes from the pools with registered buffers;
  // registering pins the pages, so it comes after the fill (on the same thread, before
  // any I/O can be asked for: nothing reaches the NVMe slab file before ctx_.ready).
  std::vector<std::span<std::byte>> io_buffers;
  NvmeTier* nvme_tier = journal_.tier();
  if (nvme_tier != nullptr) {
    for (const UnfilledMemory& fill : fills) {
      if (fill.memory->host_data() != nullptr) {
        io_buffers.emplace_back(fill.memory->host_data(), fill.memory->size_bytes());
      }
    }
  }
  const int threads = default_fill_threads();
  const uint64_t delay_ms = ctx_.config.fault_fill_delay_ms;
  if (bytes > 0) {
    KVTIER_LOG_INFO("filling {} of tier memory on {} threads; data requests wait until it is done",
                    format_bytes(bytes), threads);
  }
  // The guard keeps io_context::run() going until the outcome has been handled.
  auto guard = asio::make_work_guard(ctx_.io);
  filler_ = std::jthread([this, fills = std::move(fills), io_buffers, nvme_tier, threads, delay_ms,
                          guard](std::stop_token stop) mutable {
    const auto started = std::chrono::steady_clock::now();
    Status status;
    for (UnfilledMemory& fill : fills) {
      if (!fill.fill) continue;
      status = fill.fill(threads, stop);
      if (!status.is_ok()) {
        status =
            Status(status.code(), fmt::format("{}: {}", fill.memory->describe(), status.message()));
        break;
      }
    }
    if (status.is_ok() && nvme_tier != nullptr && !io_buffers.empty()) {
      nvme_tier->register_io_buffers(std::move(io_buffers));
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (status.is_ok() && delay_ms > 0) {  // fault-fill-delay-ms (tests only)
      Mutex mu;
      InterruptibleCondVar never;  // never notified: the wait ends at the deadline or a stop
      MutexLock lock(mu);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(delay_ms);
      while (!stop.stop_requested() && std::chrono::steady_clock::now() < deadline) {
        never.wait_until(lock, stop, deadline);
      }
    }
    fills.clear();  // the store holds the memory; this thread lets go before reporting
    asio::post(ctx_.io, [this, status, seconds, guard = std::move(guard)]() mutable {
      assert_control_thread();
      on_fill_done(status, seconds);
      guard.reset();
    });
  });
}

void StartupGate::on_fill_done(const Status& status, double seconds) {
  if (filler_.joinable()) filler_.join();  // it posted this as its last act
  if (ctx_.stopping) return;               // stopped while filling: there is nothing to serve
  if (!status.is_ok()) {
    KVTIER_LOG_ERROR("cannot fill the tier memory: {}", status.to_string());
    failed_(status);
    return;
  }
  const uint64_t bytes = fill_bytes_;
  if (bytes > 0) {
    const double gib = static_cast<double>(bytes) / (1ull << 30);
    KVTIER_LOG_INFO("tier memory filled: {} in {:.2f} s ({:.3f} s/GiB); serving data requests",
                    format_bytes(bytes), seconds, seconds / gib);
  }
  ctx_.ready = true;
  expiry_timer_.cancel();
  filled_();  // the planner starts
  resume_all_deferred();
}

void StartupGate::cancel_fill() {
  if (filler_.joinable()) filler_.request_stop();
  expiry_timer_.cancel();
}

bool StartupGate::must_defer(const EngineContext& engine, wire::Request::Which which) const {
  return !engine.deferred.empty() || engine.regions_opening > 0 ||
         (!ctx_.ready && needs_tier_memory(which));
}

Status StartupGate::defer_request(const ConnectionPtr& c, EngineContext& engine, ipc::Frame frame,
                                  std::vector<UniqueFd> fds) {
  if (deferred_requests_ >= kMaxDeferredRequests) {
    return unavailable("kvtierd has {} requests waiting (it is starting or opening regions); retry",
                       deferred_requests_);
  }
  if (engine.deferred.empty()) {
    auto& list = deferred_connections_;
    if (list.size() >= 64) {
      std::erase_if(list, [](const std::weak_ptr<ipc::Connection>& weak) {
        auto connection = weak.lock();
        if (!connection) return true;
        auto context = std::static_pointer_cast<EngineContext>(connection->user_state);
        return !context || context->deferred.empty();
      });
    }
    list.push_back(c);
  }
  engine.deferred.push_back({std::move(frame), std::move(fds), now_ms()});
  ++deferred_requests_;
  arm_deferred_expiry();
  return Status::ok();
}

void StartupGate::resume_deferred(const ConnectionPtr& c) {
  auto engine = std::static_pointer_cast<EngineContext>(c->user_state);
  if (!engine) return;
  while (!engine->deferred.empty() && engine->regions_opening == 0) {
    EngineContext::DeferredRequest& next = engine->deferred.front();
    uint64_t id = 0;
    Status status;
    try {
      auto request = next.frame.reader().getRoot<wire::Request>();
      id = request.getId();
      if (!ctx_.ready && needs_tier_memory(request.which())) {
        const uint64_t waited_ms = now_ms() - next.arrived_ms;
        if (waited_ms < ctx_.config.startup_wait_ms && !ctx_.stopping) break;  // still waits
        status = unavailable(
            "kvtierd is starting: its tier memory ({}) is still being filled after {} ms "
            "(startup-wait-ms); retry",
            format_bytes(fill_bytes_), waited_ms);
      }
    } catch (const kj::Exception& e) {
      status = invalid_argument("malformed request: {}", e.getDescription().cStr());
    }
    EngineContext::DeferredRequest taken = std::move(engine->deferred.front());
    engine->deferred.pop_front();
    --deferred_requests_;
    if (status.is_ok()) {
      try {
        status = dispatch_(c, *engine, taken.frame.reader().getRoot<wire::Request>(),
                           std::move(taken.fds));
      } catch (const kj::Exception& e) {
        status = invalid_argument("malformed request: {}", e.getDescription().cStr());
      }
    }
    if (!status.is_ok()) reply_error(c, id, status);
  }
}

void StartupGate::resume_all_deferred() {
  std::vector<std::weak_ptr<ipc::Connection>> connections;
  connections.swap(deferred_connections_);
  for (const auto& weak : connections) {
    auto connection = weak.lock();
    if (!connection) continue;
    resume_deferred(connection);
    auto engine = std::static_pointer_cast<EngineContext>(connection->user_state);
    if (engine && !engine->deferred.empty()) deferred_connections_.push_back(connection);
  }
  if (deferred_requests_ > 0) arm_deferred_expiry();
}

void StartupGate::arm_deferred_expiry() {
  // Requests waiting for the fill are looked at again soon, to answer those whose
  // startup-wait-ms is over.
  if (ctx_.ready || ctx_.stopping || expiry_armed_) return;
  expiry_armed_ = true;
  expiry_timer_.expires_after(kExpiryCheck);
  expiry_timer_.async_wait([this](const boost::system::error_code& ec) {
    assert_control_thread();
    expiry_armed_ = false;
    if (ec || ctx_.ready) return;
    resume_all_deferred();
  });
}

}  // namespace kvtier::daemon
