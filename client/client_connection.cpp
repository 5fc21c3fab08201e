// The Client's connection: sending requests, filing replies for whichever thread waits
// for them, and coming back after kvtierd went away (reconnect with backoff, the
// replay of Hello and regions). The request vocabulary is in client.cpp.
#include <fcntl.h>

#include <capnp/message.h>

#include <algorithm>
#include <chrono>
#include <functional>

#include "client/client.h"
#include "client/client_wire.h"
#include "ipc/framing.h"

namespace kvtier {

Result<std::unique_ptr<Client>> Client::connect(const std::string& socket_path,
                                                const ClientOptions& options) {
  auto transport = ipc::ClientTransport::connect(socket_path);
  if (!transport.is_ok()) {
    // A path that cannot be a socket or a socket this user may not open will not get
    // better by reconnecting: only the rest is Unavailable.
    const StatusCode code = transport.status().code();
    return Status(
        code == StatusCode::kInvalidArgument || code == StatusCode::kPermissionDenied
            ? code
            : StatusCode::kUnavailable,
        fmt::format("cannot reach kvtierd at {}: {}", socket_path, transport.status().message()));
  }
  return std::unique_ptr<Client>(new Client(std::move(*transport), socket_path, options));
}

Result<uint64_t> Client::send(const std::function<void(wire::Request::Builder)>& fill,
                              std::span<const int> fds) {
  capnp::MallocMessageBuilder message;
  auto request = message.initRoot<wire::Request>();
  MutexLock lock(send_mutex_);
  KVTIER_RETURN_IF_ERROR(ensure_connected_locked());
  uint64_t id = next_id_++;
  request.setId(id);
  fill(request);
  auto status = transport_.send(message, fds);
  if (status.is_ok()) return id;
  // A request the client itself refuses (too large) leaves the stream intact.
  if (status.code() == StatusCode::kInvalidArgument) return status;
  const Status lost = unavailable("the connection to kvtierd was lost: {}", status.message());
  mark_broken(lost);
  // The old daemon never got the whole request (a restarted one never saw it): when the
  // client comes back at once, the request goes out once more on the new connection, so
  // the first call after a restart is served rather than failed.
  if (!options_.reconnect || !ensure_connected_locked().is_ok()) return lost;
  id = next_id_++;
  request.setId(id);
  if (transport_.send(message, fds).is_ok()) return id;
  mark_broken(lost);
  return lost;
}

void Client::mark_broken(const Status& why) {
  MutexLock lock(receive_mutex_);
  if (connection_error_.is_ok()) connection_error_ = why;
  reply_filed_.notify_all();
}

bool Client::connected() {
  MutexLock lock(receive_mutex_);
  return connection_error_.is_ok();
}

Status Client::ensure_connected_locked() {
  Status broken;
  {
    MutexLock lock(receive_mutex_);
    if (connection_error_.is_ok()) return Status::ok();
    broken = connection_error_;
    // A reader is still on the old socket (a failed send saw the break first).
    if (reader_active_)
      return unavailable("the connection to kvtierd was lost: {}", broken.message());
  }
  if (!options_.reconnect) return broken;
  const auto now = std::chrono::steady_clock::now();
  if (now < next_attempt_) {
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_attempt_ - now);
    return unavailable("kvtierd is away ({}); the next reconnect attempt is in {} ms",
                       broken.message(), wait.count());
  }
  Status attempt = reconnect_locked();
  if (attempt.is_ok()) {
    backoff_ = std::chrono::milliseconds{0};
    return attempt;
  }
  backoff_ = backoff_.count() == 0 ? options_.initial_backoff
                                   : std::min(backoff_ * 2, options_.max_backoff);
  // Jitter: engines that lost the same daemon do not all come back at once.
  jitter_state_ ^= jitter_state_ << 13;
  jitter_state_ ^= jitter_state_ >> 7;
  jitter_state_ ^= jitter_state_ << 17;
  const auto jittered =
      backoff_ / 2 +
      std::chrono::milliseconds(
          jitter_state_ % static_cast<uint64_t>(std::max<int64_t>(1, backoff_.count() / 2 + 1)));
  next_attempt_ = now + jittered;
  return attempt;
}

namespace {

// How long the replay (Hello and regions) may take on a new connection. The caller is
// any thread that made a call, often an engine's scheduler, and the library promises
// that no call waits for a daemon that is away: one that accepts the connection but
// does not answer (stopped with SIGSTOP, deadlocked) counts as away. A healthy daemon
// answers the replay in milliseconds; 2 s leaves room for one under load, and the
// caller gets Unavailable after it, the backoff scheduling the next attempt.
constexpr std::chrono::milliseconds kReplayDeadline{2000};

// Bounds the next send or receive on `transport` by what is left until `deadline`.
Status bound_by(ipc::ClientTransport& transport, std::chrono::steady_clock::time_point deadline) {
  const auto left =
      std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) {
    return unavailable("kvtierd did not answer within {} ms", kReplayDeadline.count());
  }
  // Never zero here: zero would mean no bound.
  if (Status set = transport.set_timeout(left); !set.is_ok()) {
    return unavailable("cannot bound the replay on the new connection: {}", set.message());
  }
  return Status::ok();
}

// One request and its reply on a connection nobody else uses yet (the replay), both
// finished by `deadline`.
Result<ipc::Frame> exchange(ipc::ClientTransport& transport, uint64_t id,
                            const std::function<void(wire::Request::Builder)>& fill,
                            std::span<const int> fds,
                            std::chrono::steady_clock::time_point deadline) {
  capnp::MallocMessageBuilder message;
  auto request = message.initRoot<wire::Request>();
  request.setId(id);
  fill(request);
  KVTIER_RETURN_IF_ERROR(bound_by(transport, deadline));
  KVTIER_RETURN_IF_ERROR(transport.send(message, fds));
  KVTIER_RETURN_IF_ERROR(bound_by(transport, deadline));
  auto frame = transport.receive();
  if (!frame.is_ok()) return frame.status();
  Status checked = ipc::catch_malformed("reply", [&] {
    auto response = frame->reader().getRoot<wire::Response>();
    if (response.isError()) return status_from_wire(response.getError());
    if (response.getId() != id) {
      return internal_error("kvtierd answered request {} with a reply to {}", id, response.getId());
    }
    return Status::ok();
  });
  if (!checked.is_ok()) return checked;
  return frame;
}

// Wakes every thread waiting for a reply when it goes out of scope, even if filing the
// replies threw (out of memory): otherwise they would sleep forever.
struct WakeWaitersOnExit {
  CondVar& filed;
  ~WakeWaitersOnExit() { filed.notify_all(); }
};

// A replay's failure as reconnect_locked reports it: the daemon refusing for now
// (starting, too many connections) or going away again is Unavailable to the caller; any
// other refusal is the daemon's answer.
Status replay_failed(std::string_view what, const Status& status) {
  if (status.code() == StatusCode::kUnavailable || status.retryable()) {
    return unavailable("kvtierd is back but {} failed: {}", what, status.message());
  }
  return Status(status.code(),
                fmt::format("kvtierd is back but refused {}: {}", what, status.message()), false);
}

}  // namespace

Status Client::reconnect_locked() {
  auto transport = ipc::ClientTransport::connect(socket_path_);
  if (!transport.is_ok()) {
    return unavailable("kvtierd is away: cannot reach it at {}: {}", socket_path_,
                       transport.status().message());
  }
  // The replay goes out before any other request on the new connection. On any failure
  // below the new transport is dropped on return, as when connect() failed.
  const auto deadline = std::chrono::steady_clock::now() + kReplayDeadline;
  if (hello_) KVTIER_RETURN_IF_ERROR(replay_hello(*transport, deadline));
  KVTIER_RETURN_IF_ERROR(replay_regions(*transport, deadline));
  // The live connection blocks as before: replies to later calls may take as long as
  // their work does (a Load waiting for NVMe).
  Status unbounded = transport->set_timeout(std::chrono::milliseconds{0});
  if (!unbounded.is_ok()) {
    return unavailable("kvtierd is back but the new connection cannot block again: {}",
                       unbounded.message());
  }
  MutexLock lock(receive_mutex_);
  lost_ = unavailable("the connection to kvtierd was lost before this reply came: {}",
                      connection_error_.message());
  first_live_id_ = next_id_;
  transport_ = std::move(*transport);
  connection_error_ = Status::ok();
  arrived_.clear();
  abandoned_.clear();
  ++reconnects_;
  return Status::ok();
}

Status Client::replay_hello(ipc::ClientTransport& transport,
                            std::chrono::steady_clock::time_point deadline) {
  // Named here, where send_mutex_ is known to be held: the lambda below is analysed
  // as a function of its own.
  const HelloRecord& hello = *hello_;
  auto reply = exchange(
      transport, next_id_++,
      [&](wire::Request::Builder request) {
        fill_hello(request, hello.layout, hello.engine_name, hello.prefill_tokens_per_second,
                   hello.device_kind, hello.data_path);
      },
      {}, deadline);
  if (!reply.is_ok()) return replay_failed("the engine's Hello", reply.status());
  Result<HelloInfo> info = internal_error("Hello reply not decoded");
  Status decoded = ipc::catch_malformed("Hello reply", [&] {
    info = decode_hello(reply->reader().getRoot<wire::Response>());
    return Status::ok();
  });
  if (!decoded.is_ok()) return replay_failed("the engine's Hello", decoded);
  if (!info.is_ok()) return replay_failed("the engine's Hello", info.status());
  if (info->layout_digest != hello_->layout_digest) {
    return replay_failed("the engine's Hello",
                         invalid_argument("the layout digest is {:016x} where it was {:016x}",
                                          info->layout_digest, hello_->layout_digest));
  }
  if (info->namespace_name != hello_->namespace_name) {
    return replay_failed("the engine's Hello",
                         permission_denied("the engine is now in namespace '{}', not '{}' "
                                           "where its blocks are",
                                           info->namespace_name, hello_->namespace_name));
  }
  hello_->retention_priorities = info->retention_priorities;  // the daemon may be another
  hello_->load_plane_ranges = info->load_plane_ranges;
  hello_->staging = info->staging;
  return Status::ok();
}

Status Client::replay_regions(ipc::ClientTransport& transport,
                              std::chrono::steady_clock::time_point deadline) {
  for (const auto& entry : regions_) {
    const uint32_t region_id = entry.first;
    const RegionRecord& region = entry.second;
    std::vector<int> fds;
    for (const UniqueFd& fd : region.fds) fds.push_back(fd.get());
    auto reply = exchange(
        transport, next_id_++,
        [&](wire::Request::Builder request) {
          auto out = request.initRegisterRegion();
          out.setRegionId(region_id);
          out.setFdCount(static_cast<uint32_t>(fds.size()));
          region.fill(out);
        },
        fds, deadline);
    if (!reply.is_ok()) {
      return replay_failed(fmt::format("registering region {} again", region_id), reply.status());
    }
  }
  return Status::ok();
}

void Client::file_frame_locked(Result<ipc::Frame> frame) {
  if (!frame.is_ok()) {
    connection_error_ =
        frame.status().code() == StatusCode::kUnavailable
            ? unavailable("the connection to kvtierd was lost: {}", frame.status().message())
            : frame.status();
    return;
  }
  uint64_t reply_id = 0;
  Status parsed = ipc::catch_malformed("reply", [&] {
    reply_id = frame->reader().getRoot<wire::Response>().getId();
    return Status::ok();
  });
  if (!parsed.is_ok()) {
    connection_error_ = parsed;
    return;
  }
  if (reply_id == 0) {
    // The daemon could not parse our stream and closes the connection.
    auto response = frame->reader().getRoot<wire::Response>();
    connection_error_ = response.isError() ? status_from_wire(response.getError())
                                           : unavailable("kvtierd closed the connection");
    return;
  }
  if (abandoned_.erase(reply_id) > 0) return;
  arrived_.emplace(reply_id, std::move(*frame));
}

Result<ipc::Frame> Client::wait_for(uint64_t id) {
  MutexLock lock(receive_mutex_);
  while (true) {
    if (id < first_live_id_) return lost_;
    if (auto it = arrived_.find(id); it != arrived_.end()) {
      ipc::Frame frame = std::move(it->second);
      arrived_.erase(it);
      return frame;
    }
    if (!connection_error_.is_ok()) return connection_error_;
    if (reader_active_) {
      reply_filed_.wait(lock);
      continue;
    }
    // Become the reader. The socket is read without the mutex so that pollers and
    // other waiters can look at what was filed meanwhile.
    reader_active_ = true;
    lock.unlock();
    Result<ipc::Frame> frame = internal_error("no reply read");
    try {
      frame = transport_.receive();
    } catch (...) {
      // Whatever happens, the reader role is handed back below: others wait on it.
      frame = internal_error("reading a reply from kvtierd threw an exception");
    }
    lock.lock();
    reader_active_ = false;
    const WakeWaitersOnExit wake{reply_filed_};
    file_frame_locked(std::move(frame));
  }
}

bool Client::reply_ready(uint64_t id) {
  MutexLock lock(receive_mutex_);
  if (id < first_live_id_ || arrived_.contains(id) || !connection_error_.is_ok()) return true;
  // A reader is blocked on the socket: it will file our reply when it comes.
  if (reader_active_) return false;
  reader_active_ = true;
  lock.unlock();
  std::vector<Result<ipc::Frame>> received;
  try {
    while (true) {
      auto frame = transport_.try_receive();
      if (frame.is_ok() && !frame->has_value()) break;
      if (!frame.is_ok()) {
        received.emplace_back(frame.status());
        break;
      }
      received.emplace_back(std::move(**frame));
    }
  } catch (...) {
    // Not emplace_back here: it could throw again and leave the reader role taken.
    lock.lock();
    reader_active_ = false;
    connection_error_ = internal_error("reading a reply from kvtierd threw an exception");
    reply_filed_.notify_all();
    return true;
  }
  lock.lock();
  reader_active_ = false;
  const WakeWaitersOnExit wake{reply_filed_};
  for (auto& frame : received) file_frame_locked(std::move(frame));
  return arrived_.contains(id) || !connection_error_.is_ok();
}

void Client::abandon_reply(uint64_t id) {
  MutexLock lock(receive_mutex_);
  if (id < first_live_id_) return;
  if (arrived_.erase(id) == 0) abandoned_.insert(id);
}

}  // namespace kvtier
