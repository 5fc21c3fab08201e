// Memory kinds of the CUDA backend and the driver entry points they need. Internal to
// cuda/; the daemon sees only cuda_device.h.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "common/status.h"
#include "common/unique_fd.h"
#include "cuda/device.h"

namespace kvtier::cuda_internal {

// Driver API functions, resolved at run time through the runtime (no link-time
// dependency on libcuda, so the daemon runs on machines without a driver).
struct DriverApi {
  decltype(&::cuMemImportFromShareableHandle) mem_import = nullptr;
  decltype(&::cuMemGetAllocationPropertiesFromHandle) mem_properties = nullptr;
  decltype(&::cuMemGetAllocationGranularity) mem_granularity = nullptr;
  decltype(&::cuMemAddressReserve) address_reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemMap) mem_map = nullptr;
  decltype(&::cuMemUnmap) mem_unmap = nullptr;
  decltype(&::cuMemSetAccess) mem_set_access = nullptr;
  decltype(&::cuMemRelease) mem_release = nullptr;
  decltype(&::cuMemGetAddressRange) address_range = nullptr;

  Status load();
};

Status driver_status(CUresult result, std::string_view what);

// Device memory the daemon allocated (the arena).
class DeviceAllocation final : public Memory {
 public:
  DeviceAllocation(void* data, uint64_t bytes, int ordinal)
      : data_(data), bytes_(bytes), ordinal_(ordinal) {}
  ~DeviceAllocation() override;
  uint64_t size_bytes() const override { return bytes_; }
  MemoryLocation location() const override { return MemoryLocation::kGpu; }
  std::byte* host_data() override { return nullptr; }
  std::string describe() const override { return "hbm arena (cudaMalloc)"; }
  std::byte* device_data() const { return static_cast<std::byte*>(data_); }

 private:
  void* data_;
  uint64_t bytes_;
  int ordinal_;
};

// An engine's memory opened from a legacy IPC handle.
class IpcRegion final : public Memory {
 public:
  IpcRegion(void* data, uint64_t bytes, int ordinal)
      : data_(data), bytes_(bytes), ordinal_(ordinal) {}
  ~IpcRegion() override;
  uint64_t size_bytes() const override { return bytes_; }
  MemoryLocation location() const override { return MemoryLocation::kGpu; }
  std::byte* host_data() override { return nullptr; }
  std::string describe() const override { return "cuda ipc region"; }
  std::byte* device_data() const { return static_cast<std::byte*>(data_); }

 private:
  void* data_;
  uint64_t bytes_;
  int ordinal_;
};

// An engine's memory imported from a VMM shareable fd and mapped here.
class VmmRegion final : public Memory {
 public:
  VmmRegion(const DriverApi& driver, CUdeviceptr address, uint64_t mapped_bytes, uint64_t bytes,
            CUmemGenericAllocationHandle handle)
      : driver_(driver),
        address_(address),
        mapped_bytes_(mapped_bytes),
        bytes_(bytes),
        handle_(handle) {}
  ~VmmRegion() override;
  uint64_t size_bytes() const override { return bytes_; }
  MemoryLocation location() const override { return MemoryLocation::kGpu; }
  std::byte* host_data() override { return nullptr; }
  std::string describe() const override { return "cuda vmm region"; }
  std::byte* device_data() const { return reinterpret_cast<std::byte*>(address_); }

 private:
  const DriverApi& driver_;
  CUdeviceptr address_;
  uint64_t mapped_bytes_;
  uint64_t bytes_;
  CUmemGenericAllocationHandle handle_;
};

// The pinned RAM pool: host memory registered with CUDA.
class PinnedPool final : public Memory {
 public:
  PinnedPool(std::byte* data, uint64_t bytes) : data_(data), bytes_(bytes) {}
  ~PinnedPool() override;
  uint64_t size_bytes() const override { return bytes_; }
  MemoryLocation location() const override { return MemoryLocation::kHost; }
  std::byte* host_data() override { return data_; }
  std::string describe() const override { return "ram pool (pinned)"; }

 private:
  std::byte* data_;
  uint64_t bytes_;
};

// The address copies use for `memory`: device pointer for GPU memory, host pointer for
// pinned memory. nullptr for memory this backend did not create.
std::byte* copy_address(Memory& memory);

Result<std::shared_ptr<Memory>> open_ipc_region(RegionHandle& handle, int ordinal,
                                                const DriverApi& driver);
Result<std::shared_ptr<Memory>> open_vmm_region(RegionHandle& handle, int ordinal,
                                                const DriverApi& driver);
Result<std::shared_ptr<Memory>> allocate_pinned(uint64_t bytes, int touch_threads);

}  // namespace kvtier::cuda_internal
