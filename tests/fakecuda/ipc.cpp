// Legacy CUDA IPC: cuIpcGetMemHandle, cuIpcOpenMemHandle_v2, cuIpcCloseMemHandle.
//
// Handle layout (the 64 bytes of CUipcMemHandle, native byte order; version 1):
//   u64 magic "kvtFAKE1" | i32 exporter pid | i32 exporter's memfd number |
//   u64 allocation id | u64 allocation bytes | i32 device | u32 zero |
//   u64 exporter start time (clock ticks after boot) | u64 check of the fields before |
//   8 zero bytes
// The importer opens /proc/<pid>/fd/<fd> and accepts it only when it is that very
// allocation (memfd name and size) of that very process (start time).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstring>

#include "tests/fakecuda/memfd.h"
#include "tests/fakecuda/memory_table.h"

namespace kvtier::fakecuda {
namespace {

constexpr uint64_t kIpcMagic = 0x31454b414674766bull;  // "kvtFAKE1"

struct IpcPayload {
  uint64_t magic = kIpcMagic;
  int32_t pid = 0;
  int32_t fd = -1;
  uint64_t allocation_id = 0;
  uint64_t bytes = 0;
  int32_t device = 0;
  uint32_t zero = 0;
  uint64_t start_time = 0;
  uint64_t check = 0;
};
static_assert(sizeof(IpcPayload) <= CU_IPC_HANDLE_SIZE);

uint64_t check_of(const IpcPayload& payload) {
  // FNV-1a over the fields before `check`: garbage handles fail it.
  const auto* bytes = reinterpret_cast<const unsigned char*>(&payload);
  uint64_t hash = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < offsetof(IpcPayload, check); ++i)
    hash = (hash ^ bytes[i]) * 0x100000001b3ull;
  return hash;
}

// Maps the exporter's allocation, after checking it is what the handle says.
CUresult map_exported(const IpcPayload& payload, uint64_t* address, uint64_t* mapped_bytes) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", payload.pid, payload.fd);
  UniqueFd fd(::open(path, O_RDWR | O_CLOEXEC));
  // The exporter is gone, freed the allocation, or this process may not see it.
  if (!fd.valid()) return CUDA_ERROR_INVALID_VALUE;
  const auto name = memfd_name(fd.get());
  const uint64_t expected_bytes = round_up(payload.bytes, page_bytes());
  if (!name || name->kind != kAllocKind || name->creator_pid != payload.pid ||
      name->id != payload.allocation_id || name->device != payload.device ||
      file_bytes(fd.get()) != expected_bytes) {
    return CUDA_ERROR_INVALID_VALUE;  // the fd number now names something else
  }
  // A later process with the exporter's pid is not the exporter.
  if (process_start_time(payload.pid) != payload.start_time) return CUDA_ERROR_INVALID_VALUE;
  void* mapped = ::mmap(nullptr, expected_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (mapped == MAP_FAILED) return CUDA_ERROR_MAP_FAILED;
  *address = reinterpret_cast<uint64_t>(mapped);
  *mapped_bytes = expected_bytes;
  return CUDA_SUCCESS;
}

Range* find_import(MemoryTable& memory, const IpcPayload& payload) {
  // Imports are few; a scan of the imports' bases would need another index.
  for (Range* range : memory.overlapping(0, UINT64_MAX)) {
    if (range->kind == RangeKind::kIpcImport && range->exporter_pid == payload.pid &&
        range->exporter_start_time == payload.start_time &&
        range->exporter_allocation_id == payload.allocation_id) {
      return range;
    }
  }
  return nullptr;
}

}  // namespace
}  // namespace kvtier::fakecuda

using namespace kvtier::fakecuda;
using kvtier::UniqueFd;

FAKECUDA_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  Context* context = nullptr;
  if (CUresult e = require_context(&context)) return e;
  if (pHandle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  MemoryTable& memory = memory_table();
  auto lock = memory.lock();
  // The handle names the whole allocation containing dptr; opening it returns the base.
  // VMM memory, imports and host memory are not legacy-IPC capable.
  Range* range = memory.find(dptr);
  if (range == nullptr || range->kind != RangeKind::kDeviceAllocation) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  IpcPayload payload;
  payload.pid = ::getpid();
  payload.fd = range->memfd.get();
  payload.allocation_id = range->id;
  payload.bytes = range->bytes;
  payload.device = range->device;
  payload.start_time = own_start_time();
  payload.check = check_of(payload);
  std::memset(pHandle, 0, sizeof(*pHandle));
  std::memcpy(pHandle->reserved, &payload, sizeof(payload));
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle,
                                               unsigned int Flags) {
  Context* context = nullptr;
  if (CUresult e = require_context(&context)) return e;
  if (pdptr == nullptr || Flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  IpcPayload payload;
  std::memcpy(&payload, handle.reserved, sizeof(payload));
  if (payload.magic != kIpcMagic || payload.check != check_of(payload) ||
      !valid_device(payload.device) || payload.bytes == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // The real driver refuses to open a handle in the process that exported it.
  if (payload.pid == ::getpid()) return CUDA_ERROR_INVALID_CONTEXT;
  MemoryTable& memory = memory_table();
  {
    auto lock = memory.lock();
    if (Range* open = find_import(memory, payload)) {
      ++open->opens;  // opened before: same address, one more reference
      *pdptr = open->base;
      return CUDA_SUCCESS;
    }
  }
  uint64_t address = 0, mapped_bytes = 0;
  if (CUresult e = map_exported(payload, &address, &mapped_bytes)) return e;
  auto lock = memory.lock();
  if (Range* open = find_import(memory, payload)) {  // another thread was quicker
    ::munmap(reinterpret_cast<void*>(address), mapped_bytes);
    ++open->opens;
    *pdptr = open->base;
    return CUDA_SUCCESS;
  }
  Range range;
  range.base = address;
  range.bytes = payload.bytes;
  range.kind = RangeKind::kIpcImport;
  range.device = payload.device;  // where the memory physically is
  range.context = context;
  range.id = memory.next_id();
  range.mapped_bytes = mapped_bytes;
  range.exporter_pid = payload.pid;
  range.exporter_start_time = payload.start_time;
  range.exporter_allocation_id = payload.allocation_id;
  range.opens = 1;
  memory.insert(std::move(range));
  *pdptr = address;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  Context* context = nullptr;
  if (CUresult e = require_context(&context)) return e;
  MemoryTable& memory = memory_table();
  auto lock = memory.lock();
  while (true) {
    Range* range = memory.find_base(dptr, RangeKind::kIpcImport);
    if (range == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (range->opens > 1) {
      --range->opens;
      return CUDA_SUCCESS;
    }
    if (memory.wait_until_unpinned(lock, {range})) continue;  // copies finish first
    ::munmap(reinterpret_cast<void*>(range->base), range->mapped_bytes);
    memory.erase(*range);
    return CUDA_SUCCESS;
  }
}
