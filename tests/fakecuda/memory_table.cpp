#include "tests/fakecuda/memory_table.h"

#include <utility>

namespace kvtier::fakecuda {

VmmMemory::VmmMemory(UniqueFd memfd, uint64_t size, int device_ordinal, unsigned handle_types,
                     bool counted_here)
    : fd(std::move(memfd)),
      bytes(size),
      device(device_ordinal),
      requested_handle_types(handle_types),
      counted(counted_here) {}

VmmMemory::~VmmMemory() {
  if (counted) release_device_bytes(device, bytes);
}

MemoryTable& memory_table() {
  // Leaked on purpose: stream workers may still use it while the process exits.
  static MemoryTable* table = new MemoryTable;
  return *table;
}

Range* MemoryTable::find(uint64_t address) {
  auto it = ranges_.upper_bound(address);
  if (it == ranges_.begin()) return nullptr;
  --it;
  Range& range = it->second;
  return address - range.base < range.bytes ? &range : nullptr;
}

Range* MemoryTable::find_base(uint64_t base, RangeKind kind) {
  auto it = ranges_.find(base);
  return it != ranges_.end() && it->second.kind == kind ? &it->second : nullptr;
}

bool MemoryTable::overlaps_range(uint64_t base, uint64_t bytes) {
  if (find(base) != nullptr) return true;
  auto it = ranges_.upper_bound(base);
  return it != ranges_.end() && it->first - base < bytes;
}

std::vector<Range*> MemoryTable::overlapping(uint64_t base, uint64_t bytes) {
  std::vector<Range*> found;
  if (Range* first = find(base)) found.push_back(first);
  for (auto it = ranges_.upper_bound(base); it != ranges_.end() && it->first - base < bytes; ++it) {
    found.push_back(&it->second);
  }
  return found;
}

std::map<uint64_t, uint64_t>::iterator MemoryTable::find_reservation(uint64_t base,
                                                                     uint64_t bytes) {
  auto it = reservations.upper_bound(base);
  if (it == reservations.begin()) return reservations.end();
  --it;
  const uint64_t offset = base - it->first;
  if (offset >= it->second || bytes > it->second - offset) return reservations.end();
  return it;
}

bool MemoryTable::overlaps_reservation(uint64_t base, uint64_t bytes) {
  auto it = reservations.upper_bound(base);
  if (it != reservations.end() && it->first - base < bytes) return true;
  if (it == reservations.begin()) return false;
  --it;
  return base - it->first < it->second;
}

Range& MemoryTable::insert(Range range) {
  const uint64_t base = range.base;
  return ranges_.emplace(base, std::move(range)).first->second;
}

void MemoryTable::erase(Range& range) {
  ranges_.erase(range.base);
}

std::vector<Range*> MemoryTable::vmm_cover(uint64_t address, uint64_t bytes) {
  std::vector<Range*> cover;
  const uint64_t end = address + bytes;
  uint64_t cursor = address;
  while (cursor < end) {
    Range* range = find(cursor);
    if (range == nullptr || range->kind != RangeKind::kVmmMapping ||
        (!cover.empty() && range->reservation != cover.front()->reservation)) {
      return {};
    }
    cover.push_back(range);
    cursor = range->base + range->bytes;
  }
  return cover;
}

CUresult MemoryTable::resolve(uint64_t address, uint64_t bytes, bool must_be_device,
                              Operand* operand) {
  operand->address = address;
  operand->bytes = bytes;
  operand->range_ids.clear();
  if (bytes == 0) return CUDA_SUCCESS;
  if (address + bytes < address) return CUDA_ERROR_INVALID_VALUE;
  Range* first = find(address);
  if (first == nullptr || first->kind == RangeKind::kHostRegistration) {
    // Host memory, unless part of it is device memory or an unmapped reservation.
    for (Range* range : overlapping(address, bytes)) {
      if (range->kind != RangeKind::kHostRegistration) return CUDA_ERROR_INVALID_VALUE;
    }
    if (overlaps_reservation(address, bytes)) return CUDA_ERROR_INVALID_VALUE;
    return must_be_device ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
  }
  if (first->kind == RangeKind::kVmmMapping) {
    for (Range* range : vmm_cover(address, bytes)) operand->range_ids.push_back(range->id);
    return operand->range_ids.empty() ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
  }
  if (bytes > first->base + first->bytes - address) return CUDA_ERROR_INVALID_VALUE;
  operand->range_ids.push_back(first->id);
  return CUDA_SUCCESS;
}

CUresult MemoryTable::pin(const Operand& operand, int device, bool write,
                          std::vector<Range*>* pinned, std::vector<Exporter>* exporters) {
  if (operand.range_ids.empty()) return CUDA_SUCCESS;
  // The ranges must be the very ones resolved at enqueue: memory freed or unmapped in
  // between is gone, and a real copy into it faults.
  std::vector<Range*> found;
  uint64_t cursor = operand.address;
  for (uint64_t id : operand.range_ids) {
    Range* range = find(cursor);
    if (range == nullptr || range->id != id) return CUDA_ERROR_ILLEGAL_ADDRESS;
    if (range->kind == RangeKind::kVmmMapping) {
      const uint32_t bit = uint32_t{1} << device;
      if (((write ? range->writable_by : range->readable_by) & bit) == 0) {
        return CUDA_ERROR_ILLEGAL_ADDRESS;  // no cuMemSetAccess for this device
      }
    }
    found.push_back(range);
    cursor = range->base + range->bytes;
  }
  for (Range* range : found) {
    ++range->pinned;
    pinned->push_back(range);
    if (range->kind == RangeKind::kIpcImport) {
      exporters->push_back(Exporter{range->exporter_pid, range->exporter_start_time});
    }
  }
  return CUDA_SUCCESS;
}

void MemoryTable::unpin(std::vector<Range*>* pinned) {
  for (Range* range : *pinned) --range->pinned;
  pinned->clear();
  unpinned_.notify_all();
}

bool MemoryTable::wait_until_unpinned(std::unique_lock<std::mutex>& held,
                                      const std::vector<Range*>& ranges) {
  for (Range* range : ranges) {
    if (range->pinned > 0) {
      unpinned_.wait(held);
      return true;
    }
  }
  return false;
}

}  // namespace kvtier::fakecuda
