// Virtual memory management: allocation handles, shareable POSIX fds, reservations,
// mappings and access. None of these calls needs a current context.
#include <fcntl.h>
#include <sys/mman.h>

#include <bit>

#include "tests/fakecuda/memfd.h"
#include "tests/fakecuda/memory_table.h"

namespace kvtier::fakecuda {
namespace {

constexpr unsigned kSupportedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
constexpr uint64_t kHandleTag = 0xfa4e000000000000ull;  // tells handles from garbage

CUresult check_properties(const CUmemAllocationProp& prop) {
  if (prop.type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  // Host (NUMA) allocations, fabric and Win32 handles exist, but the fake has none.
  if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_NOT_SUPPORTED;
  if (!valid_device(prop.location.id)) return CUDA_ERROR_INVALID_DEVICE;
  if ((static_cast<unsigned>(prop.requestedHandleTypes) & ~kSupportedHandleTypes) != 0) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}

CUmemGenericAllocationHandle add_handle(MemoryTable& memory, std::shared_ptr<VmmMemory> vmm) {
  const CUmemGenericAllocationHandle handle = kHandleTag | memory.next_id();
  memory.handles[handle] = MemoryTable::Handle{std::move(vmm), 1};
  return handle;
}

// Turns [base, base + bytes) back into reserved, inaccessible address space.
void restore_reservation(uint64_t base, uint64_t bytes) {
  ::mmap(reinterpret_cast<void*>(base), bytes, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
}

}  // namespace
}  // namespace kvtier::fakecuda

using namespace kvtier::fakecuda;
using kvtier::UniqueFd;

FAKECUDA_EXPORT CUresult cuMemGetAllocationGranularity(size_t* granularity,
                                                       const CUmemAllocationProp* prop,
                                                       CUmemAllocationGranularity_flags option) {
  if (CUresult e = require_init()) return e;
  if (granularity == nullptr || prop == nullptr ||
      (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
       option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult e = check_properties(*prop)) return e;
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                     const CUmemAllocationProp* prop, unsigned long long flags) {
  if (CUresult e = require_init()) return e;
  if (handle == nullptr || prop == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = check_properties(*prop)) return e;
  if (size == 0 || size % kGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
  const int device = prop->location.id;
  if (CUresult e = reserve_device_bytes(device, size)) return e;
  MemoryTable& memory = memory_table();
  uint64_t id = 0;
  {
    auto lock = memory.lock();
    id = memory.next_id();
  }
  UniqueFd fd = create_device_memfd(kVmmKind, id, device, size);
  if (!fd.valid()) {
    release_device_bytes(device, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  auto vmm = std::make_shared<VmmMemory>(std::move(fd), size, device,
                                         static_cast<unsigned>(prop->requestedHandleTypes), true);
  auto lock = memory.lock();
  *handle = add_handle(memory, std::move(vmm));
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  if (CUresult e = require_init()) return e;
  MemoryTable& memory = memory_table();
  auto lock = memory.lock();
  auto it = memory.handles.find(handle);
  if (it == memory.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  // The memory itself lives on while a mapping holds it.
  if (--it->second.references == 0) memory.handles.erase(it);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemExportToShareableHandle(void* shareableHandle,
                                                      CUmemGenericAllocationHandle handle,
                                                      CUmemAllocationHandleType handleType,
                                                      unsigned long long flags) {
  if (CUresult e = require_init()) return e;
  if (shareableHandle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  MemoryTable& memory = memory_table();
  auto lock = memory.lock();
  auto it = memory.handles.find(handle);
  if (it == memory.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  // Only a handle type requested at cuMemCreate can be exported.
  const VmmMemory& vmm = *it->second.memory;
  if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
      (vmm.requested_handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int fd = ::fcntl(vmm.fd.get(), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareableHandle) = fd;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                        void* osHandle,
                                                        CUmemAllocationHandleType shHandleType) {
  if (CUresult e = require_init()) return e;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(osHandle));
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
  // Only an exported fake VMM allocation imports; the caller may close its fd afterwards.
  const auto name = memfd_name(fd);
  const auto bytes = file_bytes(fd);
  if (!name || name->kind != kVmmKind || !valid_device(name->device) || !bytes || *bytes == 0 ||
      *bytes % kGranularity != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  UniqueFd own(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!own.valid()) return CUDA_ERROR_OUT_OF_MEMORY;
  auto vmm = std::make_shared<VmmMemory>(std::move(own), *bytes, name->device,
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, false);
  MemoryTable& memory = memory_table();
  auto lock = memory.lock();
  *handle = add_handle(memory, std::move(vmm));
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(
    CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  if (CUresult e = require_init()) return e;
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  MemoryTable& memory = memory_table();
  auto lock = memory.lock();
  auto it = memory.handles.find(handle);
  if (it == memory.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  *prop = CUmemAllocationProp{};
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->requestedHandleTypes =
      static_cast<CUmemAllocationHandleType>(it->second.memory->requested_handle_types);
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = it->second.memory->device;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle,
                                                     void* addr) {
  if (CUresult e = require_init()) return e;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  MemoryTable& memory = memory_table();
  auto lock = memory.lock();
  Range* range = memory.find(reinterpret_cast<uint64_t>(addr));
  if (range == nullptr || range->kind != RangeKind::kVmmMapping) return CUDA_ERROR_INVALID_VALUE;
  // The very handle value it was mapped with, even if that was released since.
  MemoryTable::Handle& entry = memory.handles[range->handle];
  if (entry.references++ == 0) entry.memory = range->memory;
  *handle = range->handle;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                             CUdeviceptr addr, unsigned long long flags) {
  if (CUresult e = require_init()) return e;
  const uint64_t page = page_bytes();
  // Size and address are multiples of the page size; alignment a power of two or 0.
  if (ptr == nullptr || flags != 0 || size == 0 || size % page != 0 || addr % page != 0 ||
      (alignment != 0 && !std::has_single_bit(alignment))) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const uint64_t align = std::max<uint64_t>(alignment == 0 ? kGranularity : alignment, page);
  const uint64_t span = size + align;
  void* area = ::mmap(reinterpret_cast<void*>(addr), span, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (area == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const auto start = reinterpret_cast<uint64_t>(area);
  const uint64_t base = round_up(start, align);
  if (base > start) ::munmap(area, base - start);
  if (start + span > base + size) {
    ::munmap(reinterpret_cast<void*>(base + size), start + span - (base + size));
  }
  MemoryTable& memory = memory_table();
  auto lock = memory.lock();
  memory.reservations[base] = size;
  *ptr = base;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  if (CUresult e = require_init()) return e;
  MemoryTable& memory = memory_table();
  auto lock = memory.lock();
  auto it = memory.reservations.find(ptr);
  // ptr and size must be exactly what cuMemAddressReserve gave, and nothing mapped in it.
  if (it == memory.reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  if (!memory.overlapping(ptr, size).empty()) return CUDA_ERROR_INVALID_VALUE;
  ::munmap(reinterpret_cast<void*>(ptr), size);
  memory.reservations.erase(it);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                  CUmemGenericAllocationHandle handle, unsigned long long flags) {
  if (CUresult e = require_init()) return e;
  // offset must currently be 0; ptr and size multiples of the minimum granularity.
  if (flags != 0 || offset != 0 || size == 0 || ptr % kGranularity != 0 ||
      size % kGranularity != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  MemoryTable& memory = memory_table();
  auto lock = memory.lock();
  auto it = memory.handles.find(handle);
  if (it == memory.handles.end() || size > it->second.memory->bytes)
    return CUDA_ERROR_INVALID_VALUE;
  auto reservation = memory.find_reservation(ptr, size);
  if (reservation == memory.reservations.end() || memory.overlaps_range(ptr, size)) {
    return CUDA_ERROR_INVALID_VALUE;  // outside a reservation, or already mapped
  }
  const std::shared_ptr<VmmMemory>& vmm = it->second.memory;
  void* mapped = ::mmap(reinterpret_cast<void*>(ptr), size, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_FIXED, vmm->fd.get(), 0);
  if (mapped == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  Range range;
  range.base = ptr;
  range.bytes = size;
  range.kind = RangeKind::kVmmMapping;
  range.device = vmm->device;
  range.id = memory.next_id();
  range.memory = vmm;
  range.handle = handle;
  range.reservation = reservation->first;
  memory.insert(std::move(range));  // inaccessible until cuMemSetAccess
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  if (CUresult e = require_init()) return e;
  MemoryTable& memory = memory_table();
  auto lock = memory.lock();
  while (true) {
    // Whole mappings only: no sub-range of one.
    const std::vector<Range*> cover =
        size == 0 ? std::vector<Range*>{} : memory.vmm_cover(ptr, size);
    if (cover.empty() || cover.front()->base != ptr ||
        cover.back()->base + cover.back()->bytes != ptr + size) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (memory.wait_until_unpinned(lock, cover)) continue;  // copies finish first
    restore_reservation(ptr, size);
    for (Range* range : cover) memory.erase(*range);
    return CUDA_SUCCESS;
  }
}

FAKECUDA_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                        size_t count) {
  if (CUresult e = require_init()) return e;
  if (desc == nullptr || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(desc[i].location.id)) return CUDA_ERROR_INVALID_DEVICE;
    const CUmemAccess_flags flags = desc[i].flags;
    if (flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  MemoryTable& memory = memory_table();
  auto lock = memory.lock();
  // The range must be fully mapped.
  const std::vector<Range*> cover = memory.vmm_cover(ptr, size);
  if (cover.empty()) return CUDA_ERROR_INVALID_VALUE;
  if (!config().peer_access) {
    // Without peer access only the device holding the memory may be granted it.
    for (Range* range : cover) {
      for (size_t i = 0; i < count; ++i) {
        if (desc[i].location.id != range->device &&
            desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE) {
          return CUDA_ERROR_INVALID_DEVICE;
        }
      }
    }
  }
  for (Range* range : cover) {
    for (size_t i = 0; i < count; ++i) {
      const uint32_t bit = uint32_t{1} << desc[i].location.id;
      range->readable_by &= ~bit;
      range->writable_by &= ~bit;
      if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE) range->readable_by |= bit;
      if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) range->writable_by |= bit;
    }
  }
  return CUDA_SUCCESS;
}
