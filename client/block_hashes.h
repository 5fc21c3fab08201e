// kvtier's block keys, natively: the chained SHA-256 hashes of a token sequence's full
// blocks, exactly as client/python/kvtier/hashing.py documents and computes them:
//
//   hash[0] = sha256(parent or 32 zero bytes || tokens[0:B] as int64 LE || extra_keys)
//   hash[i] = sha256(hash[i - 1]             || tokens[iB:(i+1)B]        || extra_keys)
//
// An engine's scheduler hashes every prompt it is given (a 128K-token prompt is 8,192
// blocks of 16); this does it in C++ over OpenSSL's SHA-256 (SHA extensions where the
// CPU has them) at a fraction of an interpreter's cost. The result depends on the inputs
// only, never on the process or the platform.
//
// Thread-safety: pure; any thread, concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/status.h"

namespace kvtier {

inline constexpr size_t kBlockHashBytes = 32;

// Writes the hashes of the tokens.size() / tokens_per_block full blocks (a trailing
// partial block is ignored) to `out`, 32 bytes each, and returns how many. `parent`:
// empty (the conversation starts here) or the 32-byte hash of the block just before
// tokens[0]. InvalidArgument for tokens_per_block 0, a parent of another size, or an
// `out` smaller than the hashes; Internal when the SHA-256 implementation fails.
Result<size_t> chained_block_hashes(std::span<const int64_t> tokens, uint32_t tokens_per_block,
                                    std::span<const uint8_t> extra_keys,
                                    std::span<const uint8_t> parent, std::span<uint8_t> out);

}  // namespace kvtier
