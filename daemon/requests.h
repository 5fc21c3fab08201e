// Requests decoded and validated at the boundary: the handlers get plain C++ values,
// never Cap'n Proto readers, and every field error names the field.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/block_key.h"
#include "common/status.h"
#include "daemon/engines.h"
#include "schema/kvtier.capnp.h"

namespace kvtier::daemon {

enum class BlockListKind { kSave, kLoad };

// A validated Save or Load, copied out of the wire message before any work starts.
struct BlockListRequest {
  std::string session_id;
  std::vector<BlockHash> hashes;
  std::vector<uint64_t> engine_block_ids;
  bool end_of_turn = false;
};

// Save (kSave: a session id is required) or Load, against the engine's layout and
// regions: at most `max_blocks` entries, hashes of 1..32 bytes, engine block ids in the
// layout, and (Load) no engine block named twice.
Result<BlockListRequest> decode_block_list(const EngineContext& engine, uint32_t max_blocks,
                                           capnp::Text::Reader session,
                                           capnp::List<wire::BlockRef>::Reader blocks,
                                           BlockListKind kind);
// Lookup: at most `max_blocks` hashes of 1..32 bytes each.
Result<std::vector<BlockHash>> decode_lookup(uint32_t max_blocks,
                                             capnp::List<capnp::Data>::Reader hashes);

}  // namespace kvtier::daemon
