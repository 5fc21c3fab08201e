// The C boundary of the block keys (kvtier_block_hashes; client/block_hashes.h).
#include <span>

#include "client/block_hashes.h"
#include "client/c_api_internal.h"
#include "client/kvtier.h"

#define KVTIER_EXPORT extern "C" __attribute__((visibility("default")))

using namespace kvtier;
using namespace kvtier::c_api;

KVTIER_EXPORT kvtier_status kvtier_block_hashes(const int64_t* tokens, size_t count,
                                                uint32_t tokens_per_block,
                                                const uint8_t* extra_keys, size_t extra_len,
                                                const uint8_t* parent, uint8_t* out,
                                                size_t out_bytes, size_t* blocks_out) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(blocks_out, "blocks_out"));
    if (tokens == nullptr && count > 0) return invalid_argument("tokens is NULL");
    if (extra_keys == nullptr && extra_len > 0) return invalid_argument("extra_keys is NULL");
    if (out == nullptr && out_bytes > 0) return invalid_argument("out is NULL");
    auto written = chained_block_hashes(
        std::span<const int64_t>(tokens, count), tokens_per_block,
        std::span<const uint8_t>(extra_keys, extra_len),
        parent == nullptr ? std::span<const uint8_t>() : std::span<const uint8_t>(parent, 32),
        std::span<uint8_t>(out, out_bytes));
    if (!written.is_ok()) return written.status();
    *blocks_out = *written;
    return Status::ok();
  });
}
