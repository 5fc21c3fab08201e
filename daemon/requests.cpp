#include "daemon/requests.h"

#include <fmt/format.h>

#include <cstring>
#include <span>
#include <string_view>
#include <unordered_map>

#include "policy/session_table.h"

namespace kvtier::daemon {

Result<BlockListRequest> decode_block_list(const EngineContext& engine, uint32_t max_blocks,
                                           capnp::Text::Reader session,
                                           capnp::List<wire::BlockRef>::Reader blocks,
                                           BlockListKind kind, bool staged) {
  const bool need_session = kind == BlockListKind::kSave;
  BlockListRequest request;
  request.session_id = session.cStr();
  if (need_session && request.session_id.empty()) return invalid_argument("sessionId is empty");
  if (request.session_id.size() > 256)
    return invalid_argument("sessionId is longer than 256 bytes");
  if (blocks.size() > max_blocks) {
    return invalid_argument("blocks has {} entries; at most {} per request", blocks.size(),
                            max_blocks);
  }
  // A staged request names its region later (decode_staging checks it); it needs none of
  // the layout's regions.
  if (!staged) KVTIER_RETURN_IF_ERROR(check_regions_registered(engine));
  // A Load writes into the engine's blocks: two entries naming one target would race.
  std::unordered_map<uint64_t, unsigned> load_targets;
  request.hashes.reserve(blocks.size());
  request.engine_block_ids.reserve(blocks.size());
  for (unsigned i = 0; i < blocks.size(); ++i) {
    auto hash = blocks[i].getHash();
    if (hash.size() == 0 || hash.size() > BlockHash::kMaxBytes) {
      return invalid_argument("blocks[{}].hash has {} bytes; 1..{} allowed", i, hash.size(),
                              BlockHash::kMaxBytes);
    }
    uint64_t block_id = blocks[i].getEngineBlockId();
    if (staged) {  // the staged block's place is its index: the id is not used
      request.hashes.emplace_back(std::span<const uint8_t>(hash.begin(), hash.size()));
      request.engine_block_ids.push_back(block_id);
      continue;
    }
    if (block_id >= engine.layout.num_blocks) {
      return invalid_argument("blocks[{}].engineBlockId {} is beyond the layout's {} blocks", i,
                              block_id, engine.layout.num_blocks);
    }
    if (kind == BlockListKind::kLoad) {
      auto [it, inserted] = load_targets.emplace(block_id, i);
      if (!inserted) {
        return invalid_argument("blocks[{}].engineBlockId {} is already the target of blocks[{}]",
                                i, block_id, it->second);
      }
    }
    request.hashes.emplace_back(std::span<const uint8_t>(hash.begin(), hash.size()));
    request.engine_block_ids.push_back(block_id);
  }
  return request;
}

Status check_request_regions(const EngineContext& engine,
                             const std::optional<StagingTarget>& staging, uint64_t blocks) {
  if (!staging) return check_regions_registered(engine);
  auto region = engine.regions.find(staging->region_id);
  if (region == engine.regions.end()) {
    return invalid_argument("staging.regionId {} is not registered", staging->region_id);
  }
  return check_staged_rows(*staging, blocks, region->second->size_bytes());
}

Status check_staged_rows(const StagingTarget& staging, uint64_t blocks, uint64_t region_bytes) {
  // offset + blocks × row_bytes ≤ region_bytes, without overflow (row_bytes ≤ 64 MiB and
  // blocks ≤ max-blocks-per-request keep the product far below 2^64).
  if (staging.offset > region_bytes || blocks * staging.row_bytes > region_bytes - staging.offset) {
    return invalid_argument(
        "staging: {} blocks of {} bytes from offset {} pass the end of region {} ({} bytes)",
        blocks, staging.row_bytes, staging.offset, staging.region_id, region_bytes);
  }
  return Status::ok();
}

Status decode_staging(const EngineContext& engine, wire::Staging::Reader staging,
                      BlockListRequest& request, BlockListKind kind) {
  StagingTarget target{staging.getRegionId(), staging.getOffsetBytes(), 0};
  if (kind == BlockListKind::kSave) {
    target.row_bytes = engine.layout.block_bytes;
  } else {
    for (const PlaneLayout& plane : request.planes.of(engine.layout))
      target.row_bytes += plane.bytes_per_block;
  }
  KVTIER_RETURN_IF_ERROR(check_request_regions(engine, target, request.hashes.size()));
  request.staging = target;
  return Status::ok();
}

namespace {

Result<RetentionRequest> decode_retention(wire::Retention::Reader retention,
                                          std::string_view field) {
  RetentionRequest out{retention.getPriority(), retention.getDurationMs()};
  if (out.priority > policy::kMaxPriority) {
    return invalid_argument("{}.priority is {}; 1..{} allowed (0: not given)", field, out.priority,
                            policy::kMaxPriority);
  }
  if (out.priority == 0 && out.duration_ms != 0) {
    return invalid_argument("{}.durationMs is {} without a priority", field, out.duration_ms);
  }
  return out;
}

}  // namespace

Status decode_save_retention(wire::Save::Reader save, BlockListRequest& request) {
  if (save.hasRetention()) {
    auto retention = decode_retention(save.getRetention(), "retention");
    if (!retention.is_ok()) return retention.status();
    request.retention = *retention;
  }
  const auto ranges = save.getBlockRetention();
  const size_t blocks = request.hashes.size();
  if (ranges.size() > blocks) {
    return invalid_argument("blockRetention has {} ranges for {} blocks; at most one per block",
                            ranges.size(), blocks);
  }
  request.block_retention.reserve(ranges.size());
  uint64_t covered = 0;  // bounds the work of applying them: once per block of the Save
  for (unsigned i = 0; i < ranges.size(); ++i) {
    const auto range = ranges[i];
    const uint64_t first = range.getFirst();
    const uint64_t count = range.getCount();
    if (count == 0) return invalid_argument("blockRetention[{}].count is 0", i);
    if ((covered += count) > blocks) {
      return invalid_argument(
          "blockRetention covers {} blocks in total by range {}; at most the Save's {} (ranges "
          "may overlap, but not cover more than that)",
          covered, i, blocks);
    }
    if (first + count > blocks) {
      return invalid_argument("blockRetention[{}] covers blocks {}..{}; the Save has {}", i, first,
                              first + count - 1, blocks);
    }
    auto retention =
        decode_retention(range.getRetention(), fmt::format("blockRetention[{}].retention", i));
    if (!retention.is_ok()) return retention.status();
    request.block_retention.push_back(
        {static_cast<uint32_t>(first), static_cast<uint32_t>(count), *retention});
  }
  return Status::ok();
}

Status decode_load_planes(const EngineLayout& layout, wire::Load::Reader load,
                          BlockListRequest& request) {
  const uint64_t planes = layout.planes.size();
  const uint64_t begin = load.getPlaneBegin();
  const uint64_t count = load.getPlaneCount();
  if (count == 0) {
    if (begin != 0) {
      return invalid_argument(
          "planeBegin is {} with planeCount 0, which means every plane: planeBegin must then "
          "be 0 (the layout has {} planes)",
          begin, planes);
    }
    request.planes = {0, static_cast<uint32_t>(planes)};
    return Status::ok();
  }
  if (begin >= planes) {
    return invalid_argument("planeBegin {} is past the layout's {} planes", begin, planes);
  }
  // In 64 bits: two UInt32 fields cannot overflow their sum.
  if (begin + count > planes) {
    return invalid_argument(
        "planeBegin {} + planeCount {} = {} passes the layout's {} planes (at most {} from "
        "planeBegin)",
        begin, count, begin + count, planes, planes - begin);
  }
  request.planes = {static_cast<uint32_t>(begin), static_cast<uint32_t>(count)};
  return Status::ok();
}

Result<std::vector<BlockHash>> decode_lookup(uint32_t max_blocks,
                                             capnp::List<capnp::Data>::Reader hashes) {
  if (hashes.size() > max_blocks) {
    return invalid_argument("hashes has {} entries; at most {} per request", hashes.size(),
                            max_blocks);
  }
  std::vector<BlockHash> out;
  out.reserve(hashes.size());
  for (unsigned i = 0; i < hashes.size(); ++i) {
    auto bytes = hashes[i];
    if (bytes.size() == 0 || bytes.size() > BlockHash::kMaxBytes) {
      return invalid_argument("hashes[{}] has {} bytes; 1..{} allowed", i, bytes.size(),
                              BlockHash::kMaxBytes);
    }
    out.emplace_back(std::span<const uint8_t>(bytes.begin(), bytes.size()));
  }
  return out;
}

Result<RegionHandle> decode_register_region(wire::RegisterRegion::Reader region,
                                            std::vector<UniqueFd> fds) {
  RegionHandle handle;
  handle.size_bytes = region.getSizeBytes();
  if (handle.size_bytes == 0 || handle.size_bytes > kMaxRegionBytes)
    return invalid_argument("sizeBytes {} is outside 1..1TiB", handle.size_bytes);
  if (region.getGpuUuid().size() > kMaxGpuUuidBytes)
    return invalid_argument("gpuUuid is longer than {} bytes", kMaxGpuUuidBytes);
  handle.offset_bytes = region.getOffsetBytes();
  const auto chunks = region.getChunkBytes();
  switch (region.getKind()) {
    case wire::RegisterRegion::RegionKind::MEMFD:
      if (fds.size() != 1)
        return invalid_argument("a memfd region needs exactly one descriptor (fdCount = 1)");
      if (handle.offset_bytes != 0) {
        return invalid_argument("offsetBytes is {}; a memfd region starts at byte 0 of its memfd",
                                handle.offset_bytes);
      }
      if (chunks.size() != 0) {
        return invalid_argument("chunkBytes has {} entries; only a cudaVmmFd region has chunks",
                                chunks.size());
      }
      handle.kind = RegionHandle::Kind::kMemfd;
      handle.fd = std::move(fds[0]);
      return handle;
    case wire::RegisterRegion::RegionKind::CUDA_IPC: {
      if (!fds.empty()) {
        return invalid_argument(
            "fdCount is {}; a cudaIpc region travels as ipcHandle, with no descriptor", fds.size());
      }
      if (chunks.size() != 0) {
        return invalid_argument("chunkBytes has {} entries; only a cudaVmmFd region has chunks",
                                chunks.size());
      }
      auto bytes = region.getIpcHandle();
      if (bytes.size() != handle.ipc_handle.size()) {
        return invalid_argument("ipcHandle has {} bytes; a CUDA IPC handle has 64", bytes.size());
      }
      if (handle.offset_bytes > UINT64_MAX - handle.size_bytes) {
        return invalid_argument("offsetBytes {} + sizeBytes {} overflows", handle.offset_bytes,
                                handle.size_bytes);
      }
      handle.kind = RegionHandle::Kind::kCudaIpc;
      std::memcpy(handle.ipc_handle.data(), bytes.begin(), bytes.size());
      handle.gpu_uuid = region.getGpuUuid().cStr();
      return handle;
    }
    case wire::RegisterRegion::RegionKind::CUDA_VMM_FD: {
      if (chunks.size() != fds.size()) {
        return invalid_argument(
            "chunkBytes has {} entries but fdCount is {}: a cudaVmmFd region gives one chunk "
            "size per descriptor",
            chunks.size(), fds.size());
      }
      if (fds.empty())
        return invalid_argument("a cudaVmmFd region needs at least one descriptor (fdCount ≥ 1)");
      uint64_t total = 0;
      for (unsigned i = 0; i < chunks.size(); ++i) {
        if (chunks[i] == 0) return invalid_argument("chunkBytes[{}] is 0", i);
        if (__builtin_add_overflow(total, chunks[i], &total)) {
          return invalid_argument(
              "chunkBytes overflow: chunks 0..{} add up to more than 2^64 bytes", i);
        }
      }
      if (handle.offset_bytes > total || handle.size_bytes > total - handle.offset_bytes) {
        return invalid_argument(
            "offsetBytes {} + sizeBytes {} is beyond the {} bytes of the {} chunks (chunkBytes)",
            handle.offset_bytes, handle.size_bytes, total, chunks.size());
      }
      handle.kind = RegionHandle::Kind::kCudaVmmFd;
      handle.vmm_chunks.reserve(fds.size());
      for (unsigned i = 0; i < chunks.size(); ++i) {
        handle.vmm_chunks.push_back({std::move(fds[i]), chunks[i]});
      }
      handle.gpu_uuid = region.getGpuUuid().cStr();
      return handle;
    }
  }
  return invalid_argument("kind {} is not a known region kind", static_cast<int>(region.getKind()));
}

HelloRequest decode_hello(wire::Hello::Reader hello, const LayoutLimits& limits) {
  HelloRequest out;
  out.protocol_version = hello.getProtocolVersion();
  out.engine_name = hello.getEngineName().cStr();
  out.device_kind = hello.getDeviceKind();
  out.layout = EngineLayout::from_wire(hello.getLayout(), limits);
  out.tokens_per_block = hello.getLayout().getTokensPerBlock();
  out.prefill_tokens_per_second = hello.getPrefillTokensPerSecond();
  out.data_path = hello.getDataPath();
  return out;
}

ListSessionsRequest decode_list_sessions(wire::ListSessions::Reader request) {
  ListSessionsRequest out;
  out.all_namespaces = request.getAllNamespaces();
  out.limit = request.getLimit();
  out.order = request.getSortBy();
  const auto after = request.getAfter();
  out.after.assign(reinterpret_cast<const char*>(after.begin()), after.size());
  return out;
}

SessionTarget decode_get_session(wire::GetSession::Reader request) {
  return {request.getSessionId().cStr(), request.getNamespaceName().cStr()};
}

EvictRequest decode_evict(wire::Evict::Reader request) {
  return {{request.getSessionId().cStr(), request.getNamespaceName().cStr()},
          request.getIdleOverMs()};
}

PinRequest decode_pin(wire::Pin::Reader request) {
  return {{request.getSessionId().cStr(), request.getNamespaceName().cStr()}, request.getPinned()};
}

}  // namespace kvtier::daemon
