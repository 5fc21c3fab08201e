#include "client/client.h"

#include <fcntl.h>

#include <capnp/message.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "client/client_wire.h"
#include "ipc/unix_socket.h"
#include "schema/wire_tier.h"

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
  info.priority = s.getPriority();
  info.priority_remaining_ms = s.getPriorityRemainingMs();
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
                                double prefill_tokens_per_second, DeviceKind device_kind,
                                DataPath data_path) {
  auto info = call<HelloInfo>(
      [&](wire::Request::Builder request) {
        fill_hello(request, layout, engine_name, prefill_tokens_per_second, device_kind, data_path);
      },
      decode_hello);
  if (info.is_ok()) {
    MutexLock lock(send_mutex_);
    hello_ = HelloRecord{layout,
                         engine_name,
                         prefill_tokens_per_second,
                         device_kind,
                         data_path,
                         info->layout_digest,
                         info->namespace_name,
                         info->retention_priorities,
                         info->load_plane_ranges,
                         info->staging};
  }
  return info;
}

Status Client::require_feature(bool HelloRecord::*feature, const char* missing) {
  MutexLock lock(send_mutex_);
  if (hello_ && !((*hello_).*feature)) return not_supported("{}", missing).with_retryable(false);
  return Status::ok();
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
  MutexLock lock(send_mutex_);
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
    MutexLock lock(send_mutex_);
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
                                       std::span<const BlockRef> blocks, bool end_of_turn,
                                       const SaveOptions& options) {
  auto decode = [](wire::Response::Reader response) -> Result<SaveResult> {
    if (!response.isSave()) return unexpected_reply(response, "Save");
    auto reply = response.getSave();
    return SaveResult{reply.getStored(), reply.getDeduplicated()};
  };
  // An older daemon would drop the fields it does not know: save without retention, or
  // read the engine's blocks instead of the staged ones.
  if (options.retention.priority != 0 || options.retention.duration_ms != 0 ||
      !options.block_retention.empty()) {
    Status supported = require_feature(&HelloRecord::retention_priorities,
                                       "this kvtierd predates retention priorities; save without "
                                       "them");
    if (!supported.is_ok()) return Pending<SaveResult>(this, supported, decode);
  }
  if (options.staging) {
    Status supported = require_feature(&HelloRecord::staging, "this kvtierd predates staged Saves");
    if (!supported.is_ok()) return Pending<SaveResult>(this, supported, decode);
  }
  auto id = send([&](wire::Request::Builder request) {
    auto save = request.initSave();
    if (options.staging) {
      auto staging = save.initStaging();
      staging.setRegionId(options.staging->region_id);
      staging.setOffsetBytes(options.staging->offset_bytes);
    }
    save.setSessionId(session_id);
    save.setEndOfTurn(end_of_turn);
    fill_blocks(save.initBlocks(static_cast<unsigned>(blocks.size())), blocks);
    if (options.retention.priority != 0 || options.retention.duration_ms != 0) {
      auto retention = save.initRetention();
      retention.setPriority(options.retention.priority);
      retention.setDurationMs(options.retention.duration_ms);
    }
    if (!options.block_retention.empty()) {
      auto ranges = save.initBlockRetention(static_cast<unsigned>(options.block_retention.size()));
      for (unsigned i = 0; i < ranges.size(); ++i) {
        const RangeRetention& range = options.block_retention[i];
        ranges[i].setFirst(range.first);
        ranges[i].setCount(range.count);
        ranges[i].initRetention().setPriority(range.retention.priority);
        ranges[i].getRetention().setDurationMs(range.retention.duration_ms);
      }
    }
  });
  return Pending<SaveResult>(this, std::move(id), decode);
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
                                   result.tiers.push_back(from_wire(tier));
                                 return result;
                               });
}

Pending<TierNotices> Client::watch_tiers_async(uint32_t max_wait_ms, uint32_t max_changes) {
  auto id = send([&](wire::Request::Builder request) {
    auto watch = request.initWatchTiers();
    watch.setMaxWaitMs(max_wait_ms);
    watch.setMaxChanges(max_changes);
  });
  return Pending<TierNotices>(
      this, std::move(id), [](wire::Response::Reader response) -> Result<TierNotices> {
        if (!response.isWatchTiers()) return unexpected_reply(response, "WatchTiers");
        auto reply = response.getWatchTiers();
        TierNotices notices;
        notices.resync = reply.getResync();
        notices.changes.reserve(reply.getChanges().size());
        for (auto change : reply.getChanges()) {
          auto hash = change.getHash();
          if (hash.size() == 0 || hash.size() > BlockHash::kMaxBytes) {
            return internal_error("WatchTiers reply carries a hash of {} bytes", hash.size());
          }
          notices.changes.push_back({BlockHash(std::span<const uint8_t>(hash.begin(), hash.size())),
                                     from_wire(change.getTier())});
        }
        return notices;
      });
}

Pending<LoadResult> Client::load_async(const std::string& session_id,
                                       std::span<const BlockRef> blocks, PlaneRange planes,
                                       std::optional<StagingRef> staging) {
  auto decode = [](wire::Response::Reader response) -> Result<LoadResult> {
    if (!response.isLoad()) return unexpected_reply(response, "Load");
    auto reply = response.getLoad();
    Status stop;
    if (reply.hasStopReason() && reply.getStopReason().getCode() != wire::ErrorCode::OK) {
      stop = status_from_wire(reply.getStopReason());
    }
    return LoadResult{reply.getLoadedCount(), stop};
  };
  // An older daemon would drop the fields it does not know: copy every plane, or write
  // into the engine's blocks instead of the staging region.
  if (planes.begin != 0 || planes.count != 0) {
    Status supported =
        require_feature(&HelloRecord::load_plane_ranges,
                        "this kvtierd predates plane ranges in Load; load whole blocks");
    if (!supported.is_ok()) return Pending<LoadResult>(this, supported, decode);
  }
  if (staging) {
    Status supported = require_feature(&HelloRecord::staging, "this kvtierd predates staged Loads");
    if (!supported.is_ok()) return Pending<LoadResult>(this, supported, decode);
  }
  auto id = send([&](wire::Request::Builder request) {
    auto load = request.initLoad();
    load.setSessionId(session_id);
    if (staging) {
      auto target = load.initStaging();
      target.setRegionId(staging->region_id);
      target.setOffsetBytes(staging->offset_bytes);
    }
    fill_blocks(load.initBlocks(static_cast<unsigned>(blocks.size())), blocks);
    load.setPlaneBegin(planes.begin);
    load.setPlaneCount(planes.count);
  });
  return Pending<LoadResult>(this, std::move(id), decode);
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
          info.tiers.push_back({from_wire(tier.getTier()), tier.getCapacityBytes(),
                                tier.getUsedBytes(), tier.getBlocks(), tier.getCopyBytes(),
                                tier.getWrittenBytes()});
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
        info.partial_saves = r.getPartialSaves();
        info.blocks_not_saved = r.getBlocksNotSaved();
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
                                       from_wire(move.getFromTier()), from_wire(move.getToTier()),
                                       move.getReason().cStr(), move.getBlocks(), move.getBytes()});
        }
        info.policy = r.getPolicy().cStr();
        for (auto gpu : r.getGpus()) {
          info.gpus.push_back({gpu.getUuid().cStr(), gpu.getName().cStr(),
                               gpu.getHbmCapacityBytes(), gpu.getHbmUsedBytes()});
        }
        auto remote = r.getRemote();
        info.remote = {
            remote.getConfigured(),    remote.getConnected(),       remote.getDegraded(),
            remote.getMasters(),       remote.getStoredBytes(),     remote.getBudgetBytes(),
            remote.getInFlightBytes(), remote.getWriteLagMs(),      remote.getWrittenBlocks(),
            remote.getFetchedBlocks(), remote.getLookupHits(),      remote.getCorruptValues(),
            remote.getErrors(),        remote.getResumedSessions(), remote.getDeferredBlocks(),
            remote.getSpilledBlocks(), remote.getSpillUnwritten()};
        auto nvme = r.getNvme();
        info.nvme = {nvme.getConfigured(),  nvme.getDegraded(),     nvme.getReason().cStr(),
                     nvme.getDegradedMs(),  nvme.getDegradations(), nvme.getHeals(),
                     nvme.getHealAttempts()};
        for (auto tenant : r.getTenants()) {
          StatsInfo::TenantStatsInfo t;
          t.tenant = tenant.getTenant().cStr();
          t.quota_bytes.fill(UINT64_MAX);
          const auto used = tenant.getUsedBytes();
          const auto quota = tenant.getQuotaBytes();
          for (unsigned i = 0; i < t.used_bytes.size(); ++i) {
            if (i < used.size()) t.used_bytes[i] = used[i];
            if (i < quota.size()) t.quota_bytes[i] = quota[i];
          }
          info.tenants.push_back(std::move(t));
        }
        for (auto e : r.getEngines()) {
          const char* path = e.getDataPath() == wire::DataPath::STAGING_KERNELS ? "stagingKernels"
                             : e.getDataPath() == wire::DataPath::STAGING_HOST  ? "stagingHost"
                                                                                : "planeCopies";
          info.engines.push_back({e.getEngineName().cStr(), e.getPid(), e.getNamespaceName().cStr(),
                                  e.getModelId().cStr(), e.getLayoutDigest(), e.getTpRank(),
                                  e.getTpSize(), path});
        }
        return info;
      });
}

Result<SessionPage> Client::list_sessions_page(const ListSessionsOptions& options) {
  return call<SessionPage>(
      [&](wire::Request::Builder request) {
        auto list = request.initListSessions();
        list.setAllNamespaces(options.all_namespaces);
        list.setLimit(options.limit);
        list.setSortBy(options.order == SessionOrder::kBytes ? wire::SessionOrder::BYTES
                                                             : wire::SessionOrder::IDLE);
        list.setAfter(capnp::Data::Reader(
            reinterpret_cast<const capnp::byte*>(options.after.data()), options.after.size()));
      },
      [](wire::Response::Reader response) -> Result<SessionPage> {
        if (!response.isListSessions()) return unexpected_reply(response, "ListSessions");
        const auto reply = response.getListSessions();
        SessionPage page;
        for (auto s : reply.getSessions()) page.sessions.push_back(session_from_wire(s));
        const auto next = reply.getNext();
        page.next.assign(reinterpret_cast<const char*>(next.begin()), next.size());
        page.total = reply.getTotal();
        return page;
      });
}

Result<std::vector<SessionInfo>> Client::list_sessions(bool all_namespaces) {
  ListSessionsOptions options;
  options.all_namespaces = all_namespaces;
  std::vector<SessionInfo> sessions;
  do {
    auto page = list_sessions_page(options);
    if (!page.is_ok()) return page.status();
    if (page->sessions.empty()) break;  // nothing more, whatever `next` says
    for (SessionInfo& session : page->sessions) sessions.push_back(std::move(session));
    options.after = std::move(page->next);
  } while (!options.after.empty());
  return sessions;
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
template class Pending<TierNotices>;
template class Pending<LoadResult>;
template class Pending<BeginTurnResult>;
template class Pending<uint32_t>;

}  // namespace kvtier
