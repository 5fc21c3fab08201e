#include "client/client.h"

#include <fcntl.h>

#include <capnp/message.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "ipc/unix_socket.h"

namespace kvtier {
namespace {

capnp::Data::Reader as_data(const BlockHash& hash) {
  auto bytes = hash.bytes();
  return capnp::Data::Reader(bytes.data(), bytes.size());
}

void fill_blocks(capnp::List<wire::BlockRef>::Builder list, std::span<const BlockRef> blocks) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    list[i].setHash(as_data(blocks[i].hash));
    list[i].setEngineBlockId(blocks[i].engine_block_id);
  }
}

Status unexpected_reply(wire::Response::Reader response, std::string_view wanted) {
  return internal_error("kvtierd answered {} with reply kind {}", wanted,
                        static_cast<int>(response.which()));
}

SessionInfo session_from_wire(wire::SessionInfo::Reader s) {
  SessionInfo info{s.getSessionId().cStr(),
                   s.getNamespaceName().cStr(),
                   s.getState() == wire::SessionState::ACTIVE,
                   s.getIdleMs(),
                   s.getTurns(),
                   s.getBlocks(),
                   {},
                   s.getLayoutDigest()};
  for (auto count : s.getBlocksPerTier()) info.blocks_per_tier.push_back(count);
  info.bytes = s.getBytes();
  info.pinned = s.getPinned();
  info.return_probability = s.getReturnProbability();
  info.return_in_ms = s.getReturnInMs();
  return info;
}

void fill_hello(wire::Request::Builder request, const LayoutSpec& layout,
                const std::string& engine_name, double prefill_tokens_per_second,
                DeviceKind device_kind) {
  auto hello = request.initHello();
  hello.setProtocolVersion(wire::PROTOCOL_VERSION);
  hello.setEngineName(engine_name);
  hello.setDeviceKind(device_kind == DeviceKind::kCuda ? wire::DeviceKind::CUDA
                                                       : wire::DeviceKind::HOST);
  hello.setPrefillTokensPerSecond(prefill_tokens_per_second);
  auto out = hello.initLayout();
  out.setModelId(layout.model_id);
  out.setNumLayers(layout.num_layers);
  out.setNumKvHeads(layout.num_kv_heads);
  out.setHeadDim(layout.head_dim);
  out.setDtype(layout.dtype);
  out.setTokensPerBlock(layout.tokens_per_block);
  out.setTpRank(layout.tp_rank);
  out.setTpSize(layout.tp_size);
  out.setNumBlocks(layout.num_blocks);
  out.setExtraKey(layout.extra_key);
  auto planes = out.initPlanes(static_cast<unsigned>(layout.planes.size()));
  for (size_t i = 0; i < layout.planes.size(); ++i) {
    planes[i].setRegionId(layout.planes[i].region_id);
    planes[i].setOffsetBytes(layout.planes[i].offset_bytes);
    planes[i].setStrideBytes(layout.planes[i].stride_bytes);
    planes[i].setBytesPerBlock(layout.planes[i].bytes_per_block);
  }
}

Result<HelloInfo> decode_hello(wire::Response::Reader response) {
  if (!response.isHello()) return unexpected_reply(response, "Hello");
  auto reply = response.getHello();
  HelloInfo info;
  info.protocol_version = reply.getProtocolVersion();
  info.layout_digest = reply.getLayoutDigest();
  info.block_bytes = reply.getBlockBytes();
  info.namespace_name = reply.getNamespaceName().cStr();
  info.max_blocks_per_request = reply.getMaxBlocksPerRequest();
  info.device_kind =
      reply.getDeviceKind() == wire::DeviceKind::CUDA ? DeviceKind::kCuda : DeviceKind::kHost;
  for (auto uuid : reply.getGpuUuids()) info.gpu_uuids.emplace_back(uuid.cStr());
  info.device_name = reply.getDeviceName().cStr();
  return info;
}

}  // namespace

Status status_from_wire(wire::Error::Reader error) {
  const auto code = static_cast<uint16_t>(error.getCode());
  if (code == 0 || code > static_cast<uint16_t>(StatusCode::kNotSupported)) {
    // OK in an Error, or a code newer than this client: nothing to act on but the text.
    return internal_error("error code {} from kvtierd: {}", code, error.getMessage().cStr());
  }
  return Status(static_cast<StatusCode>(code), error.getMessage().cStr(), error.getRetryable());
}

std::string Client::default_socket_path() {
  if (const char* explicit_path = std::getenv("KVTIER_SOCKET"); explicit_path && *explicit_path) {
    return explicit_path;
  }
  if (const char* runtime = std::getenv("XDG_RUNTIME_DIR"); runtime && *runtime) {
    return std::string(runtime) + "/kvtier/kvtierd.sock";
  }
  return "./var/kvtierd.sock";
}

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
  std::lock_guard lock(send_mutex_);
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
  std::lock_guard lock(receive_mutex_);
  if (connection_error_.is_ok()) connection_error_ = why;
  reply_filed_.notify_all();
}

bool Client::connected() {
  std::lock_guard lock(receive_mutex_);
  return connection_error_.is_ok();
}

Status Client::ensure_connected_locked() {
  Status broken;
  {
    std::lock_guard lock(receive_mutex_);
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

// One request and its reply on a connection nobody else uses yet (the replay).
Result<ipc::Frame> exchange(ipc::ClientTransport& transport, uint64_t id,
                            const std::function<void(wire::Request::Builder)>& fill,
                            std::span<const int> fds) {
  capnp::MallocMessageBuilder message;
  auto request = message.initRoot<wire::Request>();
  request.setId(id);
  fill(request);
  KVTIER_RETURN_IF_ERROR(transport.send(message, fds));
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

}  // namespace

Status Client::reconnect_locked() {
  auto transport = ipc::ClientTransport::connect(socket_path_);
  if (!transport.is_ok()) {
    return unavailable("kvtierd is away: cannot reach it at {}: {}", socket_path_,
                       transport.status().message());
  }
  // The replay goes out before any other request on the new connection.
  auto replay_failed = [](std::string_view what, const Status& status) {
    // The daemon refusing for now (starting, too many connections) or going away again
    // is Unavailable to the caller; any other refusal is the daemon's answer.
    if (status.code() == StatusCode::kUnavailable || status.retryable()) {
      return unavailable("kvtierd is back but {} failed: {}", what, status.message());
    }
    return Status(status.code(),
                  fmt::format("kvtierd is back but refused {}: {}", what, status.message()), false);
  };
  if (hello_) {
    auto reply = exchange(*transport, next_id_++,
                          [&](wire::Request::Builder request) {
                            fill_hello(request, hello_->layout, hello_->engine_name,
                                       hello_->prefill_tokens_per_second, hello_->device_kind);
                          },
                          {});
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
  }
  for (const auto& entry : regions_) {
    const uint32_t region_id = entry.first;
    const RegionRecord& region = entry.second;
    std::vector<int> fds;
    for (const UniqueFd& fd : region.fds) fds.push_back(fd.get());
    auto reply = exchange(
        *transport, next_id_++,
        [&](wire::Request::Builder request) {
          auto out = request.initRegisterRegion();
          out.setRegionId(region_id);
          out.setFdCount(static_cast<uint32_t>(fds.size()));
          region.fill(out);
        },
        fds);
    if (!reply.is_ok()) {
      return replay_failed(fmt::format("registering region {} again", region_id), reply.status());
    }
  }
  std::lock_guard lock(receive_mutex_);
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
  std::unique_lock lock(receive_mutex_);
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
    // Waiters are woken even if filing throws (out of memory): they would sleep forever.
    struct WakeWaiters {
      std::condition_variable& filed;
      ~WakeWaiters() { filed.notify_all(); }
    } wake{reply_filed_};
    file_frame_locked(std::move(frame));
  }
}

bool Client::reply_ready(uint64_t id) {
  std::unique_lock lock(receive_mutex_);
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
  struct WakeWaiters {
    std::condition_variable& filed;
    ~WakeWaiters() { filed.notify_all(); }
  } wake{reply_filed_};
  for (auto& frame : received) file_frame_locked(std::move(frame));
  return arrived_.contains(id) || !connection_error_.is_ok();
}

void Client::abandon_reply(uint64_t id) {
  std::lock_guard lock(receive_mutex_);
  if (id < first_live_id_) return;
  if (arrived_.erase(id) == 0) abandoned_.insert(id);
}

template <typename T>
Result<T> Pending<T>::wait() {
  if (settled_) return *settled_;
  if (!id_.is_ok()) return id_.status();
  auto frame = client_->wait_for(*id_);
  if (!frame.is_ok()) return frame.status();
  Result<T> result = internal_error("reply not decoded");
  Status decoded = ipc::catch_malformed("reply", [&] {
    auto response = frame->reader().getRoot<wire::Response>();
    if (response.isError()) {
      result = status_from_wire(response.getError());
    } else {
      result = decode_(response);
    }
    return Status::ok();
  });
  if (!decoded.is_ok()) return decoded;
  return result;
}

template <typename T>
bool Pending<T>::ready() {
  if (settled_ || !id_.is_ok()) return true;
  return client_->reply_ready(*id_);
}

template <typename T>
void Pending<T>::abandon() {
  if (id_.is_ok() && !settled_) client_->abandon_reply(*id_);
  settled_.reset();
  id_ = internal_error("the reply was abandoned");
}

template <typename T>
Result<T> Client::call(const std::function<void(wire::Request::Builder)>& fill,
                       const std::function<Result<T>(wire::Response::Reader)>& decode,
                       std::span<const int> fds) {
  return Pending<T>(this, send(fill, fds), decode).wait();
}

Result<HelloInfo> Client::hello(const LayoutSpec& layout, const std::string& engine_name,
                                double prefill_tokens_per_second, DeviceKind device_kind) {
  auto info = call<HelloInfo>(
      [&](wire::Request::Builder request) {
        fill_hello(request, layout, engine_name, prefill_tokens_per_second, device_kind);
      },
      decode_hello);
  if (info.is_ok()) {
    std::lock_guard lock(send_mutex_);
    hello_ = HelloRecord{layout,      engine_name,         prefill_tokens_per_second,
                         device_kind, info->layout_digest, info->namespace_name};
  }
  return info;
}

Status Client::register_region(uint32_t region_id,
                               std::function<void(wire::RegisterRegion::Builder)> fill,
                               std::span<const int> fds) {
  Status registered = call<uint32_t>(
                          [&](wire::Request::Builder request) {
                            auto region = request.initRegisterRegion();
                            region.setRegionId(region_id);
                            region.setFdCount(static_cast<uint32_t>(fds.size()));
                            fill(region);
                          },
                          [](wire::Response::Reader response) -> Result<uint32_t> {
                            if (!response.isRegisterRegion())
                              return unexpected_reply(response, "RegisterRegion");
                            return response.getRegisterRegion().getRegionId();
                          },
                          fds)
                          .status();
  if (!registered.is_ok() || !options_.reconnect) return registered;
  // Kept to register it again after a reconnect: the engine may close its descriptors.
  RegionRecord record{std::move(fill), {}};
  for (int fd : fds) {
    UniqueFd copy(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    if (!copy.valid()) {
      return errno_status(errno, fmt::format("region {} is registered, but keeping its "
                                             "descriptor for a reconnect failed",
                                             region_id));
    }
    record.fds.push_back(std::move(copy));
  }
  std::lock_guard lock(send_mutex_);
  regions_[region_id] = std::move(record);
  return registered;
}

Status Client::register_memfd_region(uint32_t region_id, int memfd, uint64_t size_bytes) {
  int fds[] = {memfd};
  return register_region(
      region_id,
      [size_bytes](wire::RegisterRegion::Builder region) {
        region.setSizeBytes(size_bytes);
        region.setKind(wire::RegisterRegion::RegionKind::MEMFD);
      },
      fds);
}

Status Client::register_cuda_ipc_region(uint32_t region_id,
                                        std::span<const std::byte, 64> ipc_handle,
                                        uint64_t offset_bytes, uint64_t size_bytes,
                                        const std::string& gpu_uuid) {
  std::vector<uint8_t> handle(64);
  std::memcpy(handle.data(), ipc_handle.data(), handle.size());
  return register_region(
      region_id,
      [handle, offset_bytes, size_bytes, gpu_uuid](wire::RegisterRegion::Builder region) {
        region.setSizeBytes(size_bytes);
        region.setOffsetBytes(offset_bytes);
        region.setKind(wire::RegisterRegion::RegionKind::CUDA_IPC);
        region.setIpcHandle(capnp::Data::Reader(handle.data(), handle.size()));
        region.setGpuUuid(gpu_uuid);
      },
      {});
}

Status Client::register_cuda_vmm_region(uint32_t region_id, std::span<const VmmChunkFd> chunks,
                                        uint64_t offset_bytes, uint64_t size_bytes,
                                        const std::string& gpu_uuid) {
  if (chunks.size() > ipc::kMaxFdsPerRequest) {
    return invalid_argument("a VMM region of {} chunks: at most {} descriptors go in one request",
                            chunks.size(), ipc::kMaxFdsPerRequest);
  }
  std::vector<int> fds;
  std::vector<uint64_t> chunk_bytes;
  fds.reserve(chunks.size());
  for (const VmmChunkFd& chunk : chunks) {
    fds.push_back(chunk.fd);
    chunk_bytes.push_back(chunk.bytes);
  }
  return register_region(
      region_id,
      [chunk_bytes, offset_bytes, size_bytes, gpu_uuid](wire::RegisterRegion::Builder region) {
        region.setSizeBytes(size_bytes);
        region.setOffsetBytes(offset_bytes);
        region.setKind(wire::RegisterRegion::RegionKind::CUDA_VMM_FD);
        region.setGpuUuid(gpu_uuid);
        auto sizes = region.initChunkBytes(static_cast<unsigned>(chunk_bytes.size()));
        for (unsigned i = 0; i < chunk_bytes.size(); ++i) sizes.set(i, chunk_bytes[i]);
      },
      fds);
}

Pending<uint32_t> Client::unregister_region_async(uint32_t region_id) {
  {
    // Not registered again after a reconnect, whatever the reply says.
    std::lock_guard lock(send_mutex_);
    const bool kept = regions_.erase(region_id) > 0;
    // kvtierd dropped the region with the connection: nothing left to tell it.
    if (kept && !connected()) return Pending<uint32_t>(region_id);
  }
  auto id = send([&](wire::Request::Builder request) {
    request.initUnregisterRegion().setRegionId(region_id);
  });
  return Pending<uint32_t>(this, std::move(id),
                           [](wire::Response::Reader response) -> Result<uint32_t> {
                             if (!response.isUnregisterRegion())
                               return unexpected_reply(response, "UnregisterRegion");
                             return response.getUnregisterRegion().getRegionId();
                           });
}

Pending<SaveResult> Client::save_async(const std::string& session_id,
                                       std::span<const BlockRef> blocks, bool end_of_turn) {
  auto id = send([&](wire::Request::Builder request) {
    auto save = request.initSave();
    save.setSessionId(session_id);
    save.setEndOfTurn(end_of_turn);
    fill_blocks(save.initBlocks(static_cast<unsigned>(blocks.size())), blocks);
  });
  return Pending<SaveResult>(this, std::move(id),
                             [](wire::Response::Reader response) -> Result<SaveResult> {
                               if (!response.isSave()) return unexpected_reply(response, "Save");
                               auto reply = response.getSave();
                               return SaveResult{reply.getStored(), reply.getDeduplicated()};
                             });
}

Pending<LookupResult> Client::lookup_async(std::span<const BlockHash> hashes) {
  auto id = send([&](wire::Request::Builder request) {
    auto list = request.initLookup().initHashes(static_cast<unsigned>(hashes.size()));
    for (size_t i = 0; i < hashes.size(); ++i)
      list.set(static_cast<unsigned>(i), as_data(hashes[i]));
  });
  return Pending<LookupResult>(this, std::move(id),
                               [](wire::Response::Reader response) -> Result<LookupResult> {
                                 if (!response.isLookup())
                                   return unexpected_reply(response, "Lookup");
                                 auto reply = response.getLookup();
                                 LookupResult result{reply.getHitCount(), {}};
                                 for (auto tier : reply.getTiers())
                                   result.tiers.push_back(static_cast<Tier>(tier));
                                 return result;
                               });
}

Pending<LoadResult> Client::load_async(const std::string& session_id,
                                       std::span<const BlockRef> blocks) {
  auto id = send([&](wire::Request::Builder request) {
    auto load = request.initLoad();
    load.setSessionId(session_id);
    fill_blocks(load.initBlocks(static_cast<unsigned>(blocks.size())), blocks);
  });
  return Pending<LoadResult>(
      this, std::move(id), [](wire::Response::Reader response) -> Result<LoadResult> {
        if (!response.isLoad()) return unexpected_reply(response, "Load");
        auto reply = response.getLoad();
        Status stop;
        if (reply.hasStopReason() && reply.getStopReason().getCode() != wire::ErrorCode::OK) {
          stop = status_from_wire(reply.getStopReason());
        }
        return LoadResult{reply.getLoadedCount(), stop};
      });
}

Pending<BeginTurnResult> Client::begin_turn_async(const std::string& session_id) {
  auto id = send(
      [&](wire::Request::Builder request) { request.initBeginTurn().setSessionId(session_id); });
  return Pending<BeginTurnResult>(
      this, std::move(id), [](wire::Response::Reader response) -> Result<BeginTurnResult> {
        if (!response.isBeginTurn()) return unexpected_reply(response, "BeginTurn");
        auto reply = response.getBeginTurn();
        return BeginTurnResult{reply.getKnownBlocks(), reply.getPromotedBlocks()};
      });
}

Pending<uint32_t> Client::close_session_async(const std::string& session_id) {
  auto id = send(
      [&](wire::Request::Builder request) { request.initCloseSession().setSessionId(session_id); });
  return Pending<uint32_t>(this, std::move(id),
                           [](wire::Response::Reader response) -> Result<uint32_t> {
                             if (!response.isCloseSession())
                               return unexpected_reply(response, "CloseSession");
                             return response.getCloseSession().getReleasedBlocks();
                           });
}

Result<StatsInfo> Client::stats(bool all_namespaces) {
  return call<StatsInfo>(
      [&](wire::Request::Builder request) { request.initStats().setAllNamespaces(all_namespaces); },
      [](wire::Response::Reader response) -> Result<StatsInfo> {
        if (!response.isStats()) return unexpected_reply(response, "Stats");
        auto r = response.getStats();
        StatsInfo info{};
        for (auto tier : r.getTiers()) {
          info.tiers.push_back({static_cast<Tier>(tier.getTier()), tier.getCapacityBytes(),
                                tier.getUsedBytes(), tier.getBlocks()});
        }
        info.sessions_active = r.getSessionsActive();
        info.sessions_idle = r.getSessionsIdle();
        info.lookup_hits = r.getLookupHits();
        info.lookup_misses = r.getLookupMisses();
        info.bytes_saved = r.getBytesSaved();
        info.bytes_loaded = r.getBytesLoaded();
        info.bytes_demoted = r.getBytesDemoted();
        info.bytes_promoted = r.getBytesPromoted();
        info.pinned_blocks = r.getPinnedBlocks();
        info.copies_in_flight = r.getCopiesInFlight();
        info.connections = r.getConnections();
        info.blocks_evicted = r.getBlocksEvicted();
        info.data_loss_blocks = r.getDataLossBlocks();
        info.device_name = r.getDeviceName().cStr();
        info.uptime_ms = r.getUptimeMs();
        info.starting = r.getStarting();
        info.fill_bytes = r.getFillBytes();
        info.admin_pinned_blocks = r.getAdminPinnedBlocks();
        info.pinned_sessions = r.getPinnedSessions();
        for (auto move : r.getRecentMoves()) {
          static constexpr const char* kKinds[] = {"demote", "promote", "evict"};
          const auto kind = static_cast<size_t>(move.getKind());
          info.recent_moves.push_back({move.getAgoMs(), kind < 3 ? kKinds[kind] : "unknown",
                                       static_cast<Tier>(move.getFromTier()),
                                       static_cast<Tier>(move.getToTier()), move.getReason().cStr(),
                                       move.getBlocks(), move.getBytes()});
        }
        info.policy = r.getPolicy().cStr();
        for (auto gpu : r.getGpus()) {
          info.gpus.push_back({gpu.getUuid().cStr(), gpu.getName().cStr(),
                               gpu.getHbmCapacityBytes(), gpu.getHbmUsedBytes()});
        }
        return info;
      });
}

Result<std::vector<SessionInfo>> Client::list_sessions(bool all_namespaces) {
  return call<std::vector<SessionInfo>>(
      [&](wire::Request::Builder request) {
        request.initListSessions().setAllNamespaces(all_namespaces);
      },
      [](wire::Response::Reader response) -> Result<std::vector<SessionInfo>> {
        if (!response.isListSessions()) return unexpected_reply(response, "ListSessions");
        std::vector<SessionInfo> sessions;
        for (auto s : response.getListSessions().getSessions())
          sessions.push_back(session_from_wire(s));
        return sessions;
      });
}

Result<SessionInfo> Client::get_session(const std::string& session_id,
                                        const std::string& namespace_name) {
  return call<SessionInfo>(
      [&](wire::Request::Builder request) {
        auto get = request.initGetSession();
        get.setSessionId(session_id);
        get.setNamespaceName(namespace_name);
      },
      [](wire::Response::Reader response) -> Result<SessionInfo> {
        if (!response.isGetSession()) return unexpected_reply(response, "GetSession");
        return session_from_wire(response.getGetSession().getSession());
      });
}

Result<EvictResult> Client::evict(const std::string& session_id, const std::string& namespace_name,
                                  uint64_t idle_over_ms) {
  return call<EvictResult>(
      [&](wire::Request::Builder request) {
        auto evict = request.initEvict();
        evict.setSessionId(session_id);
        evict.setNamespaceName(namespace_name);
        evict.setIdleOverMs(idle_over_ms);
      },
      [](wire::Response::Reader response) -> Result<EvictResult> {
        if (!response.isEvict()) return unexpected_reply(response, "Evict");
        auto r = response.getEvict();
        return EvictResult{r.getSessions(), r.getBlocksEvicted(), r.getBytesFreed(),
                           r.getBlocksKept()};
      });
}

Result<uint32_t> Client::pin(const std::string& session_id, const std::string& namespace_name,
                             bool pinned) {
  return call<uint32_t>(
      [&](wire::Request::Builder request) {
        auto pin = request.initPin();
        pin.setSessionId(session_id);
        pin.setNamespaceName(namespace_name);
        pin.setPinned(pinned);
      },
      [](wire::Response::Reader response) -> Result<uint32_t> {
        if (!response.isPin()) return unexpected_reply(response, "Pin");
        return response.getPin().getPinnedBlocks();
      });
}

Result<DrainResult> Client::drain() {
  return call<DrainResult>([](wire::Request::Builder request) { request.initDrain(); },
                           [](wire::Response::Reader response) -> Result<DrainResult> {
                             if (!response.isDrain()) return unexpected_reply(response, "Drain");
                             auto r = response.getDrain();
                             return DrainResult{r.getBlocksQueued(), r.getBytesQueued()};
                           });
}

Result<std::vector<ConfigEntryInfo>> Client::get_config() {
  return call<std::vector<ConfigEntryInfo>>(
      [](wire::Request::Builder request) { request.initGetConfig(); },
      [](wire::Response::Reader response) -> Result<std::vector<ConfigEntryInfo>> {
        if (!response.isGetConfig()) return unexpected_reply(response, "GetConfig");
        std::vector<ConfigEntryInfo> entries;
        for (auto e : response.getGetConfig().getEntries())
          entries.push_back({e.getKey().cStr(), e.getValue().cStr(), e.getReloadable()});
        return entries;
      });
}

template class Pending<SaveResult>;
template class Pending<LookupResult>;
template class Pending<LoadResult>;
template class Pending<BeginTurnResult>;
template class Pending<uint32_t>;

}  // namespace kvtier
