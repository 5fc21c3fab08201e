#include "common/block_key.h"

#include <xxhash.h>

namespace kvtier {

std::string_view tier_name(Tier tier) {
  switch (tier) {
    case Tier::kHbm:
      return "hbm";
    case Tier::kRam:
      return "ram";
    case Tier::kNvme:
      return "nvme";
    case Tier::kRemote:
      return "remote";
    case Tier::kNone:
      return "none";
  }
  return "?";
}

std::string BlockHash::to_hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(size_ * 2);
  for (size_t i = 0; i < size_; ++i) {
    out.push_back(kDigits[bytes_[i] >> 4]);
    out.push_back(kDigits[bytes_[i] & 15]);
  }
  return out;
}

size_t BlockHashHasher::operator()(const BlockHash& hash) const noexcept {
  // Engine hashes are usually already uniform, but short or structured ones are
  // allowed, so mix them.
  auto bytes = hash.bytes();
  return static_cast<size_t>(XXH3_64bits(bytes.data(), bytes.size()));
}

}  // namespace kvtier
