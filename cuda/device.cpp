#include "cuda/device.h"

#include <algorithm>

namespace kvtier {

uint64_t CopyBatch::total_bytes() const {
  uint64_t total = 0;
  for (const CopySegment& segment : segments) total += segment.bytes;
  return total;
}

uint32_t CopyBatch::memory_index(const std::shared_ptr<Memory>& memory) {
  auto it = std::find(memories.begin(), memories.end(), memory);
  if (it != memories.end()) return static_cast<uint32_t>(it - memories.begin());
  memories.push_back(memory);
  return static_cast<uint32_t>(memories.size() - 1);
}

}  // namespace kvtier
