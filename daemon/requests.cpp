#include "daemon/requests.h"

#include <span>
#include <unordered_map>

namespace kvtier::daemon {

Result<BlockListRequest> decode_block_list(const EngineContext& engine, uint32_t max_blocks,
                                           capnp::Text::Reader session,
                                           capnp::List<wire::BlockRef>::Reader blocks,
                                           BlockListKind kind) {
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
  KVTIER_RETURN_IF_ERROR(check_regions_registered(engine));
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

}  // namespace kvtier::daemon
