#include "policy/block_reuse.h"

#include <algorithm>
#include <bit>

namespace kvtier::policy {
namespace {

// Independent row indexes from one 64-bit hash: a 64-bit finalizer (splitmix64's) of
// the hash plus the row, so that two keys colliding in one row rarely do in another.
uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace

BlockReuse::BlockReuse(uint32_t width, uint64_t sample_size) {
  const uint32_t rounded = std::bit_ceil(std::max<uint32_t>(width, 64));
  mask_ = rounded - 1;
  sample_size_ = sample_size != 0 ? sample_size : uint64_t{10} * rounded;
  counters_.assign(size_t{4} * rounded, 0);
}

std::array<size_t, 4> BlockReuse::slots(const BlockKey& key) const {
  const uint64_t h = BlockKeyHasher()(key);
  std::array<size_t, 4> out{};
  for (size_t row = 0; row < 4; ++row) {
    out[row] = row * (size_t{mask_} + 1) + (mix(h + row * 0x9e3779b97f4a7c15ULL) & mask_);
  }
  return out;
}

uint8_t BlockReuse::uses(const BlockKey& key) const {
  uint8_t least = kMaxCount;
  for (size_t slot : slots(key)) least = std::min(least, counters_[slot]);
  return least;
}

void BlockReuse::record_use(const BlockKey& key) {
  const auto at = slots(key);
  uint8_t least = kMaxCount;
  for (size_t slot : at) least = std::min(least, counters_[slot]);
  if (least == kMaxCount) return;
  // Conservative update: only the counters at the minimum grow, which keeps the
  // overcount of colliding keys low without a second structure.
  for (size_t slot : at) {
    if (counters_[slot] == least) ++counters_[slot];
  }
  const uint8_t now = static_cast<uint8_t>(least + 1);
  reached_[now] += 1;
  if (now == 1) ++reached_total_;
  if (++increments_ >= sample_size_) age();
}

void BlockReuse::age() {
  for (uint8_t& c : counters_) c = static_cast<uint8_t>(c >> 1);
  // A block at count c is at c/2 now and climbs from there: the tallies are taken anew
  // from the counts themselves (before any aging, reached[k] is the number of blocks at
  // k or more). One row stands for the blocks; its collisions overcount a little.
  reached_.fill(0);
  for (size_t slot = 0; slot <= mask_; ++slot) {
    for (uint8_t k = 1; k <= counters_[slot]; ++k) reached_[k] += 1;
  }
  increments_ /= 2;
}

std::optional<double> BlockReuse::probability_used_again(uint8_t uses) const {
  if (reached_total_ < kMinBlocks) return std::nullopt;
  // Non-decreasing in the count: the count many blocks have just reached (all of a hot
  // set's after an aging, say) reads low only because their next use is still to come,
  // and a block used more often is taken to be at least as likely to be used again.
  const size_t c = std::clamp<size_t>(uses, 1, kMaxCount - 1);
  std::optional<double> best;
  for (size_t k = 1; k <= c; ++k) {
    if (reached_[k] <= 0) continue;
    const double p = std::min(1.0, reached_[k + 1] / reached_[k]);
    best = best ? std::max(*best, p) : p;
  }
  return best;
}

}  // namespace kvtier::policy
