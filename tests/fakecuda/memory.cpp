// Device allocations, pointer queries and host registration.
#include <sys/mman.h>

#include <cstring>
#include <vector>

#include "tests/fakecuda/memfd.h"
#include "tests/fakecuda/memory_table.h"

namespace kvtier::fakecuda {
namespace {

template <typename T>
CUresult put(void* data, T value) {
  std::memcpy(data, &value, sizeof(value));
  return CUDA_SUCCESS;
}

// Whether every page of [base, base + bytes) is mapped in this process.
bool host_range_mapped(uint64_t base, uint64_t bytes) {
  const uint64_t page = page_bytes();
  const uint64_t first = base / page * page;
  const uint64_t end = round_up(base + bytes, page);
  std::vector<unsigned char> residency(4096);
  for (uint64_t at = first; at < end;) {
    const uint64_t chunk = std::min<uint64_t>(end - at, residency.size() * page);
    if (::mincore(reinterpret_cast<void*>(at), chunk, residency.data()) != 0) return false;
    at += chunk;
  }
  return true;
}

}  // namespace
}  // namespace kvtier::fakecuda

using namespace kvtier::fakecuda;
using kvtier::UniqueFd;

FAKECUDA_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  Context* context = nullptr;
  if (CUresult e = require_context(&context)) return e;
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = reserve_device_bytes(context->device, bytesize)) return e;
  MemoryTable& memory = memory_table();
  uint64_t id = 0;
  {
    auto lock = memory.lock();
    id = memory.next_id();
  }
  UniqueFd fd = create_device_memfd(kAllocKind, id, context->device, bytesize);
  const uint64_t mapped = round_up(bytesize, page_bytes());
  void* address = fd.valid()
                      ? ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0)
                      : MAP_FAILED;
  if (address == MAP_FAILED) {
    release_device_bytes(context->device, bytesize);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  Range range;
  range.base = reinterpret_cast<uint64_t>(address);
  range.bytes = bytesize;
  range.kind = RangeKind::kDeviceAllocation;
  range.device = context->device;
  range.context = context;
  range.id = id;
  range.memfd = std::move(fd);
  range.mapped_bytes = mapped;
  auto lock = memory.lock();
  memory.insert(std::move(range));
  *dptr = reinterpret_cast<CUdeviceptr>(address);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  Context* context = nullptr;
  if (CUresult e = require_context(&context)) return e;
  MemoryTable& memory = memory_table();
  auto lock = memory.lock();
  while (true) {
    Range* range = memory.find_base(dptr, RangeKind::kDeviceAllocation);
    if (range == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (memory.wait_until_unpinned(lock, {range})) continue;  // copies finish first
    ::munmap(reinterpret_cast<void*>(range->base), range->mapped_bytes);
    release_device_bytes(range->device, range->bytes);
    memory.erase(*range);
    return CUDA_SUCCESS;
  }
}

FAKECUDA_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize,
                                                 CUdeviceptr dptr) {
  Context* context = nullptr;
  if (CUresult e = require_context(&context)) return e;
  MemoryTable& memory = memory_table();
  auto lock = memory.lock();
  // A VMM address answers with its mapping (the chunk), not the whole reservation.
  Range* range = memory.find(dptr);
  if (range == nullptr || range->kind == RangeKind::kHostRegistration) return CUDA_ERROR_NOT_FOUND;
  if (pbase != nullptr) *pbase = range->base;
  if (psize != nullptr) *psize = range->bytes;
  return CUDA_SUCCESS;
}

// Booleans are written as one byte (bool); callers that pass a zeroed int read them too.
FAKECUDA_EXPORT CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute,
                                               CUdeviceptr ptr) {
  if (CUresult e = require_init()) return e;
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  MemoryTable& memory = memory_table();
  auto lock = memory.lock();
  Range* range = memory.find(ptr);
  if (range == nullptr) {
    // Inside a reservation but not mapped: only the reservation is known.
    auto reservation = memory.find_reservation(ptr, 1);
    if (reservation == memory.reservations.end()) return CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
      case CU_POINTER_ATTRIBUTE_MAPPED:
        return put(data, false);
      case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        return put<CUdeviceptr>(data, reservation->first);
      case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        return put<size_t>(data, reservation->second);
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  }
  const bool host = range->kind == RangeKind::kHostRegistration;
  const bool vmm = range->kind == RangeKind::kVmmMapping;
  uint64_t range_start = range->base, range_bytes = range->bytes;
  if (vmm) {
    // The whole reservation, as documented; the mapping is MAPPING_BASE_ADDR/SIZE.
    range_start = range->reservation;
    range_bytes = memory.reservations.at(range->reservation);
  }
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      return put(data, context_handle(range->context));
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      return put<unsigned>(data, host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE);
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: {
      Context* context = nullptr;
      if (CUresult e = require_context(&context)) return e;
      return put<CUdeviceptr>(data, ptr);
    }
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (!host) return CUDA_ERROR_INVALID_VALUE;  // device memory has no host address
      return put(data, reinterpret_cast<void*>(ptr));
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      return put<unsigned long long>(data, range->id);
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      return put(data, false);
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      return put<int>(data, range->device);
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      return put(data, range->kind == RangeKind::kDeviceAllocation);
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      return put<CUdeviceptr>(data, range_start);
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      return put<size_t>(data, range_bytes);
    case CU_POINTER_ATTRIBUTE_MAPPED:
      return put(data, true);
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      return put<unsigned long long>(data, vmm ? range->memory->requested_handle_types : 0);
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
      return put(data, false);
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
      return put<CUdeviceptr>(data, range->base);
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
      return put<size_t>(data, range->bytes);
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
      return put<unsigned long long>(data, range->id);
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

FAKECUDA_EXPORT CUresult cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int Flags) {
  Context* context = nullptr;
  if (CUresult e = require_context(&context)) return e;
  constexpr unsigned kKnown = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                              CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
  if (p == nullptr || bytesize == 0 || (Flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  const auto base = reinterpret_cast<uint64_t>(p);
  MemoryTable& memory = memory_table();
  auto lock = memory.lock();
  const std::vector<Range*> overlapping = memory.overlapping(base, bytesize);
  for (Range* range : overlapping) {
    if (range->kind == RangeKind::kHostRegistration)
      return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  }
  // Fake device memory is host memory too, but it is not registrable.
  if (!overlapping.empty()) return CUDA_ERROR_INVALID_VALUE;
  if (memory.overlaps_reservation(base, bytesize) || !host_range_mapped(base, bytesize)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Range range;
  range.base = base;
  range.bytes = bytesize;
  range.kind = RangeKind::kHostRegistration;
  range.device = context->device;
  range.context = context;
  range.id = memory.next_id();
  memory.insert(std::move(range));
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemHostUnregister(void* p) {
  Context* context = nullptr;
  if (CUresult e = require_context(&context)) return e;
  MemoryTable& memory = memory_table();
  auto lock = memory.lock();
  Range* range = memory.find_base(reinterpret_cast<uint64_t>(p), RangeKind::kHostRegistration);
  if (range == nullptr) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  memory.erase(*range);
  return CUDA_SUCCESS;
}
