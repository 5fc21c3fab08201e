// Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/) from the
// real encoders, so the seeds start where valid inputs are:
//   build-fuzz/tests/fuzz/make_seeds tests/fuzz/corpus
// Each seed begins with the control bytes its target reads first (see the target).
#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "schema/kvtier.capnp.h"
#include "tiers/nvme_format.h"

using namespace kvtier;
namespace fs = std::filesystem;

namespace {

std::string message_bytes(capnp::MessageBuilder& message) {
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

void write(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

void fill_layout(wire::Layout::Builder layout, unsigned planes, uint64_t stride) {
  layout.setModelId("seed-model");
  layout.setNumLayers(2);
  layout.setNumKvHeads(2);
  layout.setHeadDim(64);
  layout.setDtype("fp16");
  layout.setTokensPerBlock(16);
  layout.setTpSize(1);
  layout.setNumBlocks(64);
  auto list = layout.initPlanes(planes);
  for (unsigned i = 0; i < planes; ++i) {
    list[i].setOffsetBytes(i * 64 * stride);
    list[i].setStrideBytes(stride);
    list[i].setBytesPerBlock(4096);
  }
}

std::string request(const std::function<void(wire::Request::Builder)>& fill) {
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::Request>();
  r.setId(1);
  fill(r);
  return message_bytes(message);
}

BlockHash hash_of(uint8_t seed) {
  uint8_t bytes[16];
  for (int i = 0; i < 16; ++i) bytes[i] = static_cast<uint8_t>(seed * 31 + i);
  return BlockHash(std::span<const uint8_t>(bytes));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const fs::path root = argv[1];
  const std::string stats = request([](wire::Request::Builder r) { r.initStats(); });
  const std::string hello = request([](wire::Request::Builder r) {
    auto h = r.initHello();
    h.setProtocolVersion(wire::PROTOCOL_VERSION);
    fill_layout(h.initLayout(), 4, 4096);
  });
  const std::string save = request([](wire::Request::Builder r) {
    auto s = r.initSave();
    s.setSessionId("conversation");
    s.setEndOfTurn(true);
    auto blocks = s.initBlocks(4);
    for (unsigned i = 0; i < 4; ++i) {
      const BlockHash hash = hash_of(static_cast<uint8_t>(i));
      auto h = hash.bytes();
      blocks[i].setHash(capnp::Data::Reader(h.data(), h.size()));
      blocks[i].setEngineBlockId(i);
    }
  });
  const std::string load = request([](wire::Request::Builder r) {
    auto l = r.initLoad();
    l.setSessionId("conversation");
    auto blocks = l.initBlocks(3);
    for (unsigned i = 0; i < 3; ++i) {
      const BlockHash hash = hash_of(static_cast<uint8_t>(i));
      auto h = hash.bytes();
      blocks[i].setHash(capnp::Data::Reader(h.data(), h.size()));
      blocks[i].setEngineBlockId(10 + i);
    }
  });
  const std::string lookup = request([](wire::Request::Builder r) {
    auto hashes = r.initLookup().initHashes(2);
    for (unsigned i = 0; i < 2; ++i) {
      const BlockHash hash = hash_of(static_cast<uint8_t>(i));
      auto h = hash.bytes();
      hashes.set(i, capnp::Data::Reader(h.data(), h.size()));
    }
  });
  const std::string register_memfd = request([](wire::Request::Builder r) {
    auto region = r.initRegisterRegion();
    region.setRegionId(0);
    region.setSizeBytes(1 << 20);
    region.setKind(wire::RegisterRegion::RegionKind::MEMFD);
    region.setFdCount(1);
  });
  const std::string register_vmm = request([](wire::Request::Builder r) {
    auto region = r.initRegisterRegion();
    region.setRegionId(1);
    region.setOffsetBytes(4096);
    region.setSizeBytes(3 << 20);
    region.setKind(wire::RegisterRegion::RegionKind::CUDA_VMM_FD);
    region.setGpuUuid("GPU-00000000-1111-2222-3333-444444444444");
    region.setFdCount(2);
    auto chunks = region.initChunkBytes(2);
    chunks.set(0, 2 << 20);
    chunks.set(1, 2 << 20);
  });
  const std::string register_ipc = request([](wire::Request::Builder r) {
    auto region = r.initRegisterRegion();
    region.setRegionId(2);
    region.setOffsetBytes(512);
    region.setSizeBytes(1 << 20);
    region.setKind(wire::RegisterRegion::RegionKind::CUDA_IPC);
    uint8_t handle[64] = {1, 2, 3};
    region.setIpcHandle(capnp::Data::Reader(handle, sizeof(handle)));
  });

  // fuzz_framing: max_segments byte, 4 bytes of frame limit, chunk seed, stream.
  const std::string framing_control("\x03\x00\x00\x10\x00\x07", 6);
  write(root / "fuzz_framing", "stats", framing_control + stats);
  write(root / "fuzz_framing", "two-frames", framing_control + stats + save);
  write(root / "fuzz_framing", "truncated", framing_control + save.substr(0, save.size() / 2));

  // fuzz_requests: max_blocks byte, 16 bytes for the region check, the message.
  const std::string request_control(17, '\x08');
  write(root / "fuzz_requests", "hello", request_control + hello);
  write(root / "fuzz_requests", "save", request_control + save);
  write(root / "fuzz_requests", "load", request_control + load);
  write(root / "fuzz_requests", "lookup", request_control + lookup);
  write(root / "fuzz_requests", "register-memfd", request_control + register_memfd);
  write(root / "fuzz_requests", "register-vmm", request_control + register_vmm);
  write(root / "fuzz_requests", "register-ipc", request_control + register_ipc);

  // fuzz_nvme_records: which record, split byte, bytes.
  NvmeBlockKey key{"uid:1000", 0x1234, hash_of(7)};
  NvmeBlockRecord record{4096, 4096, 0xabcdef, 1700000000000};
  NvmeSessionRecord session;
  session.namespace_name = "uid:1000";
  session.session_id = "conversation";
  session.layout_digest = 0x1234;
  session.turns = 3;
  session.blocks = {hash_of(1), hash_of(2), hash_of(3)};
  const std::string layout_key = encode_layout_key("uid:1000", 0x1234);
  const std::string session_key = encode_session_key(session.namespace_name, session.session_id);
  auto records = root / "fuzz_nvme_records";
  write(records, "block-key", std::string("\x00\x00", 2) + encode_block_key(key));
  write(records, "block-record", std::string("\x01\x00", 2) + encode_block_record(record));
  write(records, "layout",
        std::string("\x02", 1) + static_cast<char>(layout_key.size()) + layout_key +
            encode_u64(4096));
  write(records, "u64", std::string("\x03\x00", 2) + encode_u64(1ull << 40));
  write(records, "session",
        std::string("\x04", 1) + static_cast<char>(session_key.size()) + session_key +
            encode_session_value(session));
  write(records, "delta", std::string("\x05\x00", 2) + encode_session_delta(session, 1));

  // fuzz_config: TOML.
  write(root / "fuzz_config", "small",
        "hbm-bytes = \"1GiB\"\nram-bytes = \"2GiB\"\nnvme-bytes = \"8GiB\"\n"
        "policy = \"predictive\"\nhbm-idle-ms = \"30s\"\nshared-namespace = [\"team=1000,1001\"]\n"
        "log-level = \"info\"\n");
  write(root / "fuzz_config", "wrong-type", "ram-bytes = true\n");
  write(root / "fuzz_config", "unknown-key", "ram-byte = \"1GiB\"\n");
  return 0;
}
