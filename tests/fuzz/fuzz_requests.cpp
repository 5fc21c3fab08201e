// Requests as the daemon decodes them at its boundary (daemon/layout.h,
// daemon/requests.h), from any bytes read as a Cap'n Proto message with the daemon's
// reader limits. An accepted request re-encodes (field by field into a fresh message)
// to one that decodes to the same thing; a refused one is InvalidArgument naming the
// field; a RegisterRegion accepted holds together (one descriptor per VMM chunk, the
// region inside its chunks, a 64-byte IPC handle); a layout accepted for a region really fits it
// (checked in 128-bit arithmetic, so an overflowing size, offset or stride cannot pass).
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "daemon/engines.h"
#include "daemon/layout.h"
#include "daemon/requests.h"
#include "ipc/framing.h"
#include "schema/kvtier.capnp.h"
#include "tests/fuzz/fuzz_check.h"

using namespace kvtier;
using namespace kvtier::daemon;
using kvtier::fuzz::Input;
using kvtier::fuzz::names_one_of;
using kvtier::fuzz::refused_naming;

namespace {

void copy_layout(wire::Layout::Reader from, wire::Layout::Builder to) {
  to.setModelId(from.getModelId());
  to.setNumLayers(from.getNumLayers());
  to.setNumKvHeads(from.getNumKvHeads());
  to.setHeadDim(from.getHeadDim());
  to.setDtype(from.getDtype());
  to.setTokensPerBlock(from.getTokensPerBlock());
  to.setTpRank(from.getTpRank());
  to.setTpSize(from.getTpSize());
  to.setNumBlocks(from.getNumBlocks());
  to.setExtraKey(from.getExtraKey());
  auto planes = to.initPlanes(from.getPlanes().size());
  for (unsigned i = 0; i < planes.size(); ++i) {
    auto plane = from.getPlanes()[i];
    planes[i].setRegionId(plane.getRegionId());
    planes[i].setOffsetBytes(plane.getOffsetBytes());
    planes[i].setStrideBytes(plane.getStrideBytes());
    planes[i].setBytesPerBlock(plane.getBytesPerBlock());
  }
}

bool same_layout(const EngineLayout& a, const EngineLayout& b) {
  if (a.model_id != b.model_id || a.num_blocks != b.num_blocks || a.block_bytes != b.block_bytes ||
      a.digest != b.digest || a.planes.size() != b.planes.size())
    return false;
  for (size_t i = 0; i < a.planes.size(); ++i) {
    const PlaneLayout& p = a.planes[i];
    const PlaneLayout& q = b.planes[i];
    if (p.region_id != q.region_id || p.offset_bytes != q.offset_bytes ||
        p.stride_bytes != q.stride_bytes || p.bytes_per_block != q.bytes_per_block ||
        p.offset_in_block != q.offset_in_block)
      return false;
  }
  return true;
}

void check_layout(wire::Layout::Reader wire_layout, Input& input) {
  LayoutLimits limits;
  limits.max_planes = 64;
  auto layout = EngineLayout::from_wire(wire_layout, limits);
  if (!layout.is_ok()) {
    refused_naming(layout.status(), {"layout"});
    return;
  }
  uint64_t sum = 0;
  for (const PlaneLayout& plane : layout->planes) {
    KVTIER_FUZZ_CHECK(plane.offset_in_block == sum, "plane offsets are not the running sum");
    KVTIER_FUZZ_CHECK(plane.bytes_per_block > 0, "an empty plane was accepted");
    sum += plane.bytes_per_block;
  }
  KVTIER_FUZZ_CHECK(sum == layout->block_bytes && sum <= limits.max_block_bytes,
                    "block bytes %llu vs planes %llu",
                    static_cast<unsigned long long>(layout->block_bytes),
                    static_cast<unsigned long long>(sum));
  // Re-encoded field by field, it decodes to the same layout and digest.
  capnp::MallocMessageBuilder message;
  auto copy = message.initRoot<wire::Layout>();
  copy_layout(wire_layout, copy);
  auto again = EngineLayout::from_wire(copy.asReader(), limits);
  KVTIER_FUZZ_CHECK(again.is_ok() && same_layout(*layout, *again), "re-encoded layout differs");
  // A region the layout is accepted for holds every block of every plane in it.
  const uint32_t region = layout->planes[input.byte() % layout->planes.size()].region_id;
  const uint64_t region_bytes = (static_cast<uint64_t>(input.u32()) << 32) | input.u32();
  if (layout->check_region(region, region_bytes).is_ok()) {
    for (const PlaneLayout& plane : layout->planes) {
      if (plane.region_id != region) continue;
      const unsigned __int128 end =
          static_cast<unsigned __int128>(layout->num_blocks - 1) * plane.stride_bytes +
          plane.offset_bytes + plane.bytes_per_block;
      KVTIER_FUZZ_CHECK(end <= region_bytes, "a plane accepted past the region's end");
    }
  } else {
    auto refused = layout->check_region(region, region_bytes);
    KVTIER_FUZZ_CHECK(names_one_of(refused.message(), {"layout.planes["}), "%s",
                      refused.message().c_str());
  }
}

// An engine with a small valid layout (two planes in region 0, 64 blocks).
const EngineContext& fixed_engine() {
  static const std::unique_ptr<EngineContext> engine = [] {
    capnp::MallocMessageBuilder message;
    auto layout = message.initRoot<wire::Layout>();
    layout.setModelId("fuzz-model");
    layout.setTpSize(1);
    layout.setNumBlocks(64);
    auto planes = layout.initPlanes(2);
    for (unsigned i = 0; i < 2; ++i) {
      planes[i].setOffsetBytes(i * 64 * 4096);
      planes[i].setStrideBytes(4096);
      planes[i].setBytesPerBlock(4096);
    }
    auto context = std::make_unique<EngineContext>();
    auto parsed = EngineLayout::from_wire(layout.asReader(), LayoutLimits{});
    KVTIER_FUZZ_CHECK(parsed.is_ok(), "the fixed layout: %s", parsed.status().to_string().c_str());
    context->layout = std::move(parsed).value();
    context->regions.emplace(0, nullptr);
    context->hello_done = true;
    return context;
  }();
  return *engine;
}

// A Load's plane range: refused naming planeBegin, or a nonempty range inside the
// layout's planes.
void check_load_planes(wire::Load::Reader load) {
  const EngineLayout& layout = fixed_engine().layout;
  BlockListRequest request;
  Status decoded = decode_load_planes(layout, load, request);
  if (!decoded.is_ok()) {
    refused_naming(decoded, {"planeBegin"});
    return;
  }
  KVTIER_FUZZ_CHECK(
      request.planes.count >= 1 &&
          uint64_t{request.planes.begin} + request.planes.count <= layout.planes.size(),
      "planes %u + %u accepted for a layout of %zu", request.planes.begin, request.planes.count,
      layout.planes.size());
}

void check_block_list(capnp::Text::Reader session, capnp::List<wire::BlockRef>::Reader blocks,
                      BlockListKind kind, uint32_t max_blocks) {
  const EngineContext& engine = fixed_engine();
  auto decoded = decode_block_list(engine, max_blocks, session, blocks, kind);
  if (!decoded.is_ok()) {
    refused_naming(decoded.status(), {"sessionId", "blocks"});
    return;
  }
  KVTIER_FUZZ_CHECK(decoded->hashes.size() == blocks.size() &&
                        decoded->engine_block_ids.size() == blocks.size() &&
                        blocks.size() <= max_blocks,
                    "decoded %zu of %u", decoded->hashes.size(), blocks.size());
  if (kind == BlockListKind::kSave) KVTIER_FUZZ_CHECK(!decoded->session_id.empty(), "no session");
  for (size_t i = 0; i < decoded->hashes.size(); ++i) {
    KVTIER_FUZZ_CHECK(decoded->engine_block_ids[i] < engine.layout.num_blocks, "block id out");
    auto bytes = decoded->hashes[i].bytes();
    KVTIER_FUZZ_CHECK(!bytes.empty() && bytes.size() <= BlockHash::kMaxBytes, "hash size");
    for (size_t j = 0; kind == BlockListKind::kLoad && j < i; ++j) {
      KVTIER_FUZZ_CHECK(decoded->engine_block_ids[j] != decoded->engine_block_ids[i],
                        "a Load names block %llu twice",
                        static_cast<unsigned long long>(decoded->engine_block_ids[i]));
    }
  }
  // Re-encoded from the decoded values, it decodes to the same request.
  capnp::MallocMessageBuilder message;
  auto save = message.initRoot<wire::Save>();
  save.setSessionId(decoded->session_id);
  auto list = save.initBlocks(static_cast<unsigned>(decoded->hashes.size()));
  for (unsigned i = 0; i < list.size(); ++i) {
    auto bytes = decoded->hashes[i].bytes();
    list[i].setHash(capnp::Data::Reader(bytes.data(), bytes.size()));
    list[i].setEngineBlockId(decoded->engine_block_ids[i]);
  }
  auto again = decode_block_list(engine, max_blocks, save.asReader().getSessionId(),
                                 save.asReader().getBlocks(), kind);
  KVTIER_FUZZ_CHECK(again.is_ok() && again->session_id == decoded->session_id &&
                        again->hashes == decoded->hashes &&
                        again->engine_block_ids == decoded->engine_block_ids,
                    "re-encoded block list differs");
}

void check_lookup(capnp::List<capnp::Data>::Reader hashes, uint32_t max_blocks) {
  auto decoded = decode_lookup(max_blocks, hashes);
  if (!decoded.is_ok()) {
    refused_naming(decoded.status(), {"hashes"});
    return;
  }
  KVTIER_FUZZ_CHECK(decoded->size() == hashes.size() && hashes.size() <= max_blocks, "count");
  for (unsigned i = 0; i < hashes.size(); ++i) {
    auto bytes = (*decoded)[i].bytes();
    KVTIER_FUZZ_CHECK(bytes.size() == hashes[i].size() &&
                          std::memcmp(bytes.data(), hashes[i].begin(), bytes.size()) == 0,
                      "hash %u differs from the wire", i);
  }
}

// RegisterRegion with `fd_count` descriptors (placeholders: decoding only moves them).
void check_register_region(wire::RegisterRegion::Reader region, size_t fd_count) {
  auto decoded = decode_register_region(region, std::vector<UniqueFd>(fd_count));
  if (!decoded.is_ok()) {
    refused_naming(decoded.status(), {"sizeBytes", "offsetBytes", "chunkBytes", "fdCount",
                                      "descriptor", "ipcHandle", "gpuUuid", "kind"});
    return;
  }
  const RegionHandle& handle = *decoded;
  KVTIER_FUZZ_CHECK(handle.size_bytes >= 1 && handle.size_bytes <= kMaxRegionBytes, "size %llu",
                    static_cast<unsigned long long>(handle.size_bytes));
  KVTIER_FUZZ_CHECK(handle.gpu_uuid.size() <= kMaxGpuUuidBytes, "uuid of %zu bytes",
                    handle.gpu_uuid.size());
  const unsigned __int128 end =
      static_cast<unsigned __int128>(handle.offset_bytes) + handle.size_bytes;
  switch (handle.kind) {
    case RegionHandle::Kind::kMemfd:
      KVTIER_FUZZ_CHECK(fd_count == 1 && handle.offset_bytes == 0 && handle.vmm_chunks.empty(),
                        "memfd accepted with %zu fds at offset %llu", fd_count,
                        static_cast<unsigned long long>(handle.offset_bytes));
      break;
    case RegionHandle::Kind::kCudaIpc:
      KVTIER_FUZZ_CHECK(fd_count == 0 && region.getIpcHandle().size() == 64 && end <= UINT64_MAX &&
                            handle.vmm_chunks.empty(),
                        "cudaIpc accepted with %zu fds, a %zu-byte handle", fd_count,
                        region.getIpcHandle().size());
      KVTIER_FUZZ_CHECK(
          std::memcmp(handle.ipc_handle.data(), region.getIpcHandle().begin(), 64) == 0,
          "the IPC handle changed");
      break;
    case RegionHandle::Kind::kCudaVmmFd: {
      KVTIER_FUZZ_CHECK(fd_count >= 1 && handle.vmm_chunks.size() == fd_count,
                        "%zu chunks for %zu fds", handle.vmm_chunks.size(), fd_count);
      unsigned __int128 total = 0;
      for (size_t i = 0; i < handle.vmm_chunks.size(); ++i) {
        KVTIER_FUZZ_CHECK(handle.vmm_chunks[i].bytes > 0 &&
                              handle.vmm_chunks[i].bytes == region.getChunkBytes()[i],
                          "chunk %zu", i);
        total += handle.vmm_chunks[i].bytes;
      }
      KVTIER_FUZZ_CHECK(end <= total, "a VMM region past its chunks");
      break;
    }
  }
  // Re-encoded from the decoded handle, it decodes to the same thing.
  capnp::MallocMessageBuilder message;
  auto again = message.initRoot<wire::RegisterRegion>();
  again.setRegionId(region.getRegionId());
  again.setSizeBytes(handle.size_bytes);
  again.setOffsetBytes(handle.offset_bytes);
  again.setGpuUuid(handle.gpu_uuid);
  again.setKind(region.getKind());
  if (handle.kind == RegionHandle::Kind::kCudaIpc) {
    again.setIpcHandle(capnp::Data::Reader(
        reinterpret_cast<const uint8_t*>(handle.ipc_handle.data()), handle.ipc_handle.size()));
  }
  auto chunks = again.initChunkBytes(static_cast<unsigned>(handle.vmm_chunks.size()));
  for (unsigned i = 0; i < chunks.size(); ++i) chunks.set(i, handle.vmm_chunks[i].bytes);
  auto redecoded = decode_register_region(again.asReader(), std::vector<UniqueFd>(fd_count));
  KVTIER_FUZZ_CHECK(redecoded.is_ok() && redecoded->kind == handle.kind &&
                        redecoded->size_bytes == handle.size_bytes &&
                        redecoded->offset_bytes == handle.offset_bytes &&
                        redecoded->gpu_uuid == handle.gpu_uuid &&
                        redecoded->ipc_handle == handle.ipc_handle &&
                        redecoded->vmm_chunks.size() == handle.vmm_chunks.size(),
                    "re-encoded RegisterRegion differs: %s",
                    redecoded.is_ok() ? "" : redecoded.status().to_string().c_str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input input(data, size);
  const uint32_t max_blocks = 1 + input.byte() % 64;
  uint8_t extra[16];
  for (uint8_t& b : extra) b = input.byte();
  std::span<const uint8_t> body = input.rest();
  if (body.size() < 8) return 0;
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(body.size() / 8);
  std::memcpy(words.begin(), body.data(), words.size() * sizeof(capnp::word));
  Input more(extra, sizeof(extra));
  Status handled = ipc::catch_malformed("request", [&] {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = 1 << 20;
    options.nestingLimit = 64;
    capnp::FlatArrayMessageReader reader(words.asPtr(), options);
    auto request = reader.getRoot<wire::Request>();
    switch (request.which()) {
      case wire::Request::HELLO:
        check_layout(request.getHello().getLayout(), more);
        break;
      case wire::Request::SAVE:
        check_block_list(request.getSave().getSessionId(), request.getSave().getBlocks(),
                         BlockListKind::kSave, max_blocks);
        break;
      case wire::Request::LOAD:
        check_block_list(request.getLoad().getSessionId(), request.getLoad().getBlocks(),
                         BlockListKind::kLoad, max_blocks);
        check_load_planes(request.getLoad());
        break;
      case wire::Request::LOOKUP:
        check_lookup(request.getLookup().getHashes(), max_blocks);
        break;
      case wire::Request::REGISTER_REGION:
        // As many descriptors as came with the message: the request says fdCount, the
        // socket may deliver fewer or more.
        check_register_region(request.getRegisterRegion(),
                              more.byte() < 192
                                  ? std::min<uint32_t>(request.getRegisterRegion().getFdCount(), 16)
                                  : more.byte() % 17);
        break;
      default:
        break;
    }
    return Status::ok();
  });
  KVTIER_FUZZ_CHECK(handled.is_ok() || handled.code() == StatusCode::kInvalidArgument, "%s",
                    handled.to_string().c_str());
  return 0;
}
