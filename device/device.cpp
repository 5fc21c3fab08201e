#include "device/device.h"

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

size_t merge_adjacent_segments(std::vector<CopySegment>& segments,
                               const std::function<bool(uint32_t, uint64_t)>& splits_at) {
  if (segments.size() < 2) return 0;
  // Sorting by (memories, source offset) puts continuations next to each other
  // whatever order the caller produced; copies within a batch are unordered anyway.
  std::sort(segments.begin(), segments.end(), [](const CopySegment& a, const CopySegment& b) {
    if (a.src_memory != b.src_memory) return a.src_memory < b.src_memory;
    if (a.dst_memory != b.dst_memory) return a.dst_memory < b.dst_memory;
    return a.src_offset < b.src_offset;
  });
  size_t kept = 0;
  for (size_t i = 1; i < segments.size(); ++i) {
    CopySegment& last = segments[kept];
    const CopySegment& next = segments[i];
    const bool continues = next.src_memory == last.src_memory &&
                           next.dst_memory == last.dst_memory &&
                           next.src_offset == last.src_offset + last.bytes &&
                           next.dst_offset == last.dst_offset + last.bytes &&
                           !(splits_at && (splits_at(next.src_memory, next.src_offset) ||
                                           splits_at(next.dst_memory, next.dst_offset)));
    if (continues) {
      last.bytes += next.bytes;
    } else {
      segments[++kept] = next;
    }
  }
  const size_t removed = segments.size() - (kept + 1);
  segments.resize(kept + 1);
  return removed;
}

}  // namespace kvtier
