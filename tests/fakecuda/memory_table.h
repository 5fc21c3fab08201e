// MemoryTable: every address range the fake driver knows in this process.
//
// Ranges never overlap: device allocations (cuMemAlloc), legacy-IPC imports, VMM
// mappings (one per cuMemMap) and registered host memory. VMM reservations and the VMM
// allocation handles live here too, under the same lock.
//
// Copies resolve their operands at enqueue (resolve) and pin them while they execute
// (pin/unpin). Whoever unmaps a range first waits until no copy has it pinned
// (wait_until_unpinned), so a copy never touches memory that has gone.
//
// Thread-safety: one mutex guards everything; every method and field requires it held
// (take it with lock()). Range pointers stay valid until their range is erased.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/unique_fd.h"
#include "tests/fakecuda/fake_cuda.h"

namespace kvtier::fakecuda {

// One cuMemCreate allocation, or an import of one. Shared by its handles and mappings:
// the memory lives while either does.
struct VmmMemory {
  VmmMemory(UniqueFd memfd, uint64_t size, int device_ordinal, unsigned handle_types, bool counted);
  ~VmmMemory();
  VmmMemory(const VmmMemory&) = delete;
  VmmMemory& operator=(const VmmMemory&) = delete;

  const UniqueFd fd;
  const uint64_t bytes;
  const int device;
  const unsigned requested_handle_types;  // CUmemAllocationHandleType bits
  const bool counted;                     // created here: counts against the device
};

enum class RangeKind { kDeviceAllocation, kIpcImport, kVmmMapping, kHostRegistration };

struct Range {
  uint64_t base = 0;
  uint64_t bytes = 0;  // as requested (the mapping may be longer: whole pages)
  RangeKind kind = RangeKind::kDeviceAllocation;
  int device = 0;              // the physical device holding the memory
  Context* context = nullptr;  // the context it was made in; nullptr for VMM mappings
  uint64_t id = 0;             // unique in this process, never reused
  int pinned = 0;              // copies executing on it right now

  // kDeviceAllocation: the memfd that cuIpcGetMemHandle names.
  UniqueFd memfd;
  uint64_t mapped_bytes = 0;  // kDeviceAllocation, kIpcImport: what munmap takes

  // kIpcImport: whose allocation this is, and how often cuIpcOpenMemHandle returned it.
  pid_t exporter_pid = 0;
  uint64_t exporter_start_time = 0;
  uint64_t exporter_allocation_id = 0;
  int opens = 0;

  // kVmmMapping.
  std::shared_ptr<VmmMemory> memory;
  CUmemGenericAllocationHandle handle = 0;  // the handle it was mapped with
  uint64_t reservation = 0;                 // base of the enclosing reservation
  uint32_t readable_by = 0;                 // device bits granted by cuMemSetAccess
  uint32_t writable_by = 0;
};

// One side of a copy as resolved at enqueue: host memory, or the device ranges it spans.
struct Operand {
  uint64_t address = 0;
  uint64_t bytes = 0;
  std::vector<uint64_t> range_ids;  // empty: host memory
};

// An IPC exporter whose liveness a copy depends on.
struct Exporter {
  pid_t pid = 0;
  uint64_t start_time = 0;
};

class MemoryTable {
 public:
  std::unique_lock<std::mutex> lock() { return std::unique_lock(mu_); }

  // REQUIRES: lock held, for everything below.
  uint64_t next_id() { return next_id_++; }
  Range* find(uint64_t address);  // the range containing address, or nullptr
  Range* find_base(uint64_t base, RangeKind kind);
  bool overlaps_range(uint64_t base, uint64_t bytes);
  std::vector<Range*> overlapping(uint64_t base, uint64_t bytes);  // in address order
  // The reservation containing [base, base + bytes), or nullptr.
  std::map<uint64_t, uint64_t>::iterator find_reservation(uint64_t base, uint64_t bytes);
  bool overlaps_reservation(uint64_t base, uint64_t bytes);
  Range& insert(Range range);
  void erase(Range& range);
  // The contiguous VMM mappings covering [address, address + bytes) within one
  // reservation; empty when some byte is not mapped.
  std::vector<Range*> vmm_cover(uint64_t address, uint64_t bytes);

  // INVALID_VALUE when [address, +bytes) is partly device memory, runs past the end of
  // its allocation or mapping, or lies in an unmapped reservation; also when it is host
  // memory and `must_be_device`.
  CUresult resolve(uint64_t address, uint64_t bytes, bool must_be_device, Operand* operand);
  // At execution: ILLEGAL_ADDRESS unless the operand's ranges are all still there and
  // `device` may read (or write) them. On success they are pinned (appended to `pinned`)
  // and the IPC exporters behind them appended to `exporters`.
  CUresult pin(const Operand& operand, int device, bool write, std::vector<Range*>* pinned,
               std::vector<Exporter>* exporters);
  void unpin(std::vector<Range*>* pinned);
  // Waits (releasing `held`) until no copy pins `ranges`. Afterwards the ranges may be
  // gone: callers look them up again (true when it had to wait).
  bool wait_until_unpinned(std::unique_lock<std::mutex>& held, const std::vector<Range*>& ranges);

  std::map<uint64_t, uint64_t> reservations;  // base → bytes
  struct Handle {
    std::shared_ptr<VmmMemory> memory;
    int references = 0;
  };
  std::unordered_map<CUmemGenericAllocationHandle, Handle> handles;

 private:
  std::mutex mu_;
  std::condition_variable unpinned_;
  std::map<uint64_t, Range> ranges_;  // by base
  uint64_t next_id_ = 1;
};

// The process's table (never destroyed).
MemoryTable& memory_table();

}  // namespace kvtier::fakecuda
