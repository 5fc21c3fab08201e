// BlockReuse: how often a block has been used, and what that says about its next use —
// the block-level reuse signal, beside the session-level return prediction. A session
// predicts its own next turn; it cannot see that a new conversation will open with
// the same document or system prompt. A block's own history can: in serving traces
// a block used twice is far likelier to be used again than one used once.
//
// The model (contracts here; reasons in the .cpp):
//  * Uses are counted per block key in a count-min sketch (TinyLFU's frequency
//    sketch): four rows of saturating counters (at kMaxCount), incremented
//    conservatively, read as the minimum. It remembers blocks that have left the
//    daemon (a block evicted and saved again keeps its count), in fixed memory.
//  * Aging: every counter is halved after `sample_size` increments, and then whenever
//    the increments (halved with the counters, as TinyLFU's) reach it again, so counts
//    follow what is used now rather than what was used once long ago.
//  * The reuse curve is learned online from the same stream: reached[c] counts the
//    blocks whose count reached c (after an aging, the blocks at c or more then, and
//    those that reached c since), and a block used c times is
//    used again with probability reached[c + 1] / reached[c] (at kMaxCount, the ratio
//    just below it), made non-decreasing in c (the largest ratio at c or below).
//    Blocks whose next use is still to come count as not used again, so the curve
//    reads low at first for every count alike and at the count many blocks have just
//    reached: it ranks before it is calibrated, and a block used more often is never
//    ranked below one used less. Until kMinBlocks blocks were counted estimates are nullopt, and
//    callers use what they had.
//
// Thread-safety: none; owned by the SessionTable on the control thread.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "common/block_key.h"

namespace kvtier::policy {

class BlockReuse {
 public:
  static constexpr uint8_t kMaxCount = 15;
  static constexpr uint64_t kMinBlocks = 256;

  // `width` counters per row (rounded up to a power of two, at least 64); aging every
  // `sample_size` increments (0: 10 × width).
  explicit BlockReuse(uint32_t width = 1u << 16, uint64_t sample_size = 0);

  // One use of the block (a Save naming it: engines name each block of a turn's prompt
  // once, in one Save or in chunks).
  void record_use(const BlockKey& key);
  // How many times the block was used (0..kMaxCount, aged; may overcount, never under).
  uint8_t uses(const BlockKey& key) const;
  // P(a block used `uses` times is used again) (uses of 0 read as 1); nullopt until
  // kMinBlocks blocks were counted.
  std::optional<double> probability_used_again(uint8_t uses) const;
  std::optional<double> probability_used_again(const BlockKey& key) const {
    return probability_used_again(uses(key));
  }
  uint64_t blocks_counted() const { return reached_total_; }

 private:
  std::array<size_t, 4> slots(const BlockKey& key) const;
  void age();

  uint32_t mask_;
  uint64_t sample_size_;
  uint64_t increments_ = 0;
  std::vector<uint8_t> counters_;  // 4 rows of mask_ + 1
  // reached_[c]: blocks whose count reached c (see above); [0] unused.
  std::array<double, kMaxCount + 1> reached_{};
  uint64_t reached_total_ = 0;  // first uses counted (not aged): gates estimates
};

}  // namespace kvtier::policy
