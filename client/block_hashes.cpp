// Chained block hashes over OpenSSL (block_hashes.h).
//
// OpenSSL's libcrypto rather than a SHA-256 of our own: it is on every Debian machine,
// kept up to date, and picks the SHA extensions (or AVX2) at run time; Python's hashlib,
// which the package's reference implementation uses, is the same code.
#include "client/block_hashes.h"

#include <openssl/evp.h>

#include <bit>
#include <cstring>
#include <memory>
#include <vector>

namespace kvtier {
namespace {

struct ContextFree {
  void operator()(EVP_MD_CTX* context) const { EVP_MD_CTX_free(context); }
};
struct DigestFree {
  void operator()(EVP_MD* digest) const { EVP_MD_free(digest); }
};

// Fetched once per process: fetching is what costs in OpenSSL 3, not the digest.
const EVP_MD* sha256() {
  static const std::unique_ptr<EVP_MD, DigestFree> digest(EVP_MD_fetch(nullptr, "SHA256", nullptr));
  return digest.get();
}

}  // namespace

Result<size_t> chained_block_hashes(std::span<const int64_t> tokens, uint32_t tokens_per_block,
                                    std::span<const uint8_t> extra_keys,
                                    std::span<const uint8_t> parent, std::span<uint8_t> out) {
  if (tokens_per_block == 0) return invalid_argument("tokens_per_block must be positive");
  if (!parent.empty() && parent.size() != kBlockHashBytes) {
    return invalid_argument("parent is {} bytes; a block hash has {}", parent.size(),
                            kBlockHashBytes);
  }
  const size_t blocks = tokens.size() / tokens_per_block;
  if (out.size() / kBlockHashBytes < blocks) {
    return invalid_argument("out holds {} bytes; {} hashes need {}", out.size(), blocks,
                            blocks * kBlockHashBytes);
  }
  const EVP_MD* digest = sha256();
  std::unique_ptr<EVP_MD_CTX, ContextFree> context(EVP_MD_CTX_new());
  if (digest == nullptr || context == nullptr) return internal_error("SHA-256 is not available");
  uint8_t previous[kBlockHashBytes] = {};
  if (!parent.empty()) std::memcpy(previous, parent.data(), kBlockHashBytes);
  // Tokens go in as little-endian int64: the array itself on a little-endian CPU.
  std::vector<int64_t> swapped;
  if constexpr (std::endian::native != std::endian::little) swapped.resize(tokens_per_block);
  for (size_t i = 0; i < blocks; ++i) {
    const int64_t* block = tokens.data() + i * tokens_per_block;
    if constexpr (std::endian::native != std::endian::little) {
      for (uint32_t t = 0; t < tokens_per_block; ++t)
        swapped[t] = static_cast<int64_t>(__builtin_bswap64(static_cast<uint64_t>(block[t])));
      block = swapped.data();
    }
    unsigned int length = 0;
    uint8_t* hash = out.data() + i * kBlockHashBytes;
    if (EVP_DigestInit_ex2(context.get(), digest, nullptr) != 1 ||
        EVP_DigestUpdate(context.get(), previous, kBlockHashBytes) != 1 ||
        EVP_DigestUpdate(context.get(), block, tokens_per_block * sizeof(int64_t)) != 1 ||
        (!extra_keys.empty() &&
         EVP_DigestUpdate(context.get(), extra_keys.data(), extra_keys.size()) != 1) ||
        EVP_DigestFinal_ex(context.get(), hash, &length) != 1 || length != kBlockHashBytes) {
      return internal_error("SHA-256 failed at block {}", i);
    }
    std::memcpy(previous, hash, kBlockHashBytes);
  }
  return blocks;
}

}  // namespace kvtier
