// Initialization, configuration, devices and primary contexts.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "tests/fakecuda/fake_cuda.h"

namespace kvtier::fakecuda {
namespace {

// A misconfigured switch must not silently become a default: the test would then pass
// for the wrong reason.
[[noreturn]] void bad_switch(const char* name, const char* value) {
  std::fprintf(stderr, "fake libcuda: cannot parse %s=%s\n", name, value);
  std::abort();
}

uint64_t env_number(const char* name, uint64_t fallback, bool sizes) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const unsigned long long number = std::strtoull(value, &end, 10);
  if (errno != 0 || end == value || value[0] == '-') bad_switch(name, value);
  const std::string_view suffix(end);
  uint64_t scale = 1;
  if (suffix.empty()) {
    scale = 1;
  } else if (sizes && (suffix == "K" || suffix == "KiB")) {
    scale = uint64_t{1} << 10;
  } else if (sizes && (suffix == "M" || suffix == "MiB")) {
    scale = uint64_t{1} << 20;
  } else if (sizes && (suffix == "G" || suffix == "GiB")) {
    scale = uint64_t{1} << 30;
  } else {
    bad_switch(name, value);
  }
  return number * scale;
}

Config read_config() {
  Config c;
  c.devices = static_cast<int>(env_number("KVTIER_FAKECUDA_DEVICES", c.devices, false));
  if (c.devices > kMaxDevices)
    bad_switch("KVTIER_FAKECUDA_DEVICES", std::getenv("KVTIER_FAKECUDA_DEVICES"));
  c.device_bytes = env_number("KVTIER_FAKECUDA_DEVICE_BYTES", c.device_bytes, true);
  c.numa_id = static_cast<int>(env_number("KVTIER_FAKECUDA_NUMA_ID", c.numa_id, false));
  c.driver_version =
      static_cast<int>(env_number("KVTIER_FAKECUDA_DRIVER_VERSION", c.driver_version, false));
  if (const char* path = std::getenv("KVTIER_FAKECUDA_FAULT_FILE")) c.fault_file = path;
  c.poison_orphans = env_number("KVTIER_FAKECUDA_POISON_ORPHANS", 0, false) != 0;
  c.copy_us_per_mib = env_number("KVTIER_FAKECUDA_COPY_US_PER_MIB", 0, false);
  c.peer_access = env_number("KVTIER_FAKECUDA_PEER_ACCESS", 1, false) != 0;
  c.host_pointer_for_registered =
      env_number("KVTIER_FAKECUDA_HOST_POINTER_FOR_REGISTERED_MEM", 1, false) != 0;
  c.no_kernel_image = env_number("KVTIER_FAKECUDA_NO_KERNEL_IMAGE", 0, false) != 0;
  return c;
}

struct DriverState {
  std::mutex mu;                                   // serializes cuInit
  std::atomic<pid_t> initialized_pid{0};           // the process whose cuInit(0) succeeded
  std::vector<std::unique_ptr<Context>> contexts;  // one per device; immutable after cuInit
  std::atomic<uint64_t> used_bytes[kMaxDevices];   // value-initialized: 0
};

DriverState& driver() {
  static DriverState* state = new DriverState;  // leaked: workers may outlive main()
  return *state;
}

thread_local Context* current_context = nullptr;

// Deterministic and distinct per ordinal, shaped like a random (version 4) UUID.
CUuuid device_uuid(int ordinal) {
  CUuuid uuid{};
  uint64_t state = 0x6b7674696572ull + static_cast<uint64_t>(ordinal);
  for (int half = 0; half < 2; ++half) {
    state += 0x9e3779b97f4a7c15ull;  // splitmix64
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    std::memcpy(uuid.bytes + 8 * half, &z, 8);
  }
  uuid.bytes[6] = static_cast<char>((uuid.bytes[6] & 0x0f) | 0x40);
  uuid.bytes[8] = static_cast<char>((uuid.bytes[8] & 0x3f) | 0x80);
  return uuid;
}

}  // namespace

const Config& config() {
  static const Config* parsed = new Config(read_config());
  return *parsed;
}

uint64_t round_up(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

uint64_t page_bytes() {
  static const uint64_t bytes = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return bytes;
}

CUresult require_init() {
  const pid_t pid = driver().initialized_pid.load(std::memory_order_acquire);
  return pid != 0 && pid == ::getpid() ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult require_context(Context** context) {
  if (CUresult e = require_init()) return e;
  Context* current = current_context;
  if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (current->references.load() == 0) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  if (CUresult e = current->sticky.load()) return e;
  *context = current;
  return CUDA_SUCCESS;
}

Context* find_context(CUcontext handle) {
  if (require_init() != CUDA_SUCCESS) return nullptr;
  for (const auto& context : driver().contexts) {
    if (context_handle(context.get()) == handle) return context.get();
  }
  return nullptr;
}

CUcontext context_handle(Context* context) {
  return reinterpret_cast<CUcontext>(context);
}

void break_context(Context& context, CUresult error) {
  CUresult expected = CUDA_SUCCESS;
  context.sticky.compare_exchange_strong(expected, error);
}

bool valid_device(int ordinal) {
  return ordinal >= 0 && ordinal < config().devices;
}

CUresult reserve_device_bytes(int device, uint64_t bytes) {
  std::atomic<uint64_t>& used = driver().used_bytes[device];
  uint64_t now = used.load();
  do {
    if (bytes > config().device_bytes || now > config().device_bytes - bytes) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  } while (!used.compare_exchange_weak(now, now + bytes));
  return CUDA_SUCCESS;
}

void release_device_bytes(int device, uint64_t bytes) {
  driver().used_bytes[device] -= bytes;
}

}  // namespace kvtier::fakecuda

using namespace kvtier::fakecuda;

FAKECUDA_EXPORT CUresult cuInit(unsigned int Flags) {
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (config().devices <= 0) return CUDA_ERROR_NO_DEVICE;
  DriverState& state = driver();
  std::lock_guard lock(state.mu);
  const pid_t pid = state.initialized_pid.load();
  if (pid == ::getpid()) return CUDA_SUCCESS;
  // The child of a process that initialized the driver inherits unusable state.
  if (pid != 0) return CUDA_ERROR_NOT_INITIALIZED;
  for (int d = 0; d < config().devices; ++d) state.contexts.push_back(std::make_unique<Context>(d));
  state.initialized_pid.store(::getpid(), std::memory_order_release);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuDriverGetVersion(int* driverVersion) {
  if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = config().driver_version;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuDeviceGetCount(int* count) {
  if (CUresult e = require_init()) return e;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = config().devices;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (CUresult e = require_init()) return e;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  if (CUresult e = require_init()) return e;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "kvtier fake GPU %d", dev);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  if (CUresult e = require_init()) return e;
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *uuid = device_uuid(dev);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  if (CUresult e = require_init()) return e;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = config().device_bytes;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  if (CUresult e = require_init()) return e;
  if (pi == nullptr || attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID:
      *pi = config().numa_id;
      break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED:
      *pi = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM:
      *pi = config().host_pointer_for_registered ? 1 : 0;
      break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
      *pi = 0x18 + dev;
      break;  // distinct per device
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
      *pi = 0;
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      *pi = 9;
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      *pi = 0;
      break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
      *pi = 2;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH:
      *pi = kMaxPitch;
      break;
    default:
      *pi = 0;
      break;
  }
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  if (CUresult e = require_init()) return e;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  Context* context = driver().contexts[dev].get();
  ++context->references;
  *pctx = context_handle(context);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  if (CUresult e = require_init()) return e;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::atomic<int>& references = driver().contexts[dev]->references;
  int now = references.load();
  do {
    if (now == 0) return CUDA_ERROR_INVALID_CONTEXT;  // not retained
  } while (!references.compare_exchange_weak(now, now - 1));
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  if (CUresult e = require_init()) return e;
  if (ctx == nullptr) {
    current_context = nullptr;
    return CUDA_SUCCESS;
  }
  Context* context = find_context(ctx);
  if (context == nullptr || context->references.load() == 0) return CUDA_ERROR_INVALID_CONTEXT;
  current_context = context;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuCtxGetCurrent(CUcontext* pctx) {
  if (CUresult e = require_init()) return e;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = context_handle(current_context);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  Context* context = nullptr;
  if (CUresult e = require_context(&context)) return e;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = context->device;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuCtxGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  Context* context = nullptr;
  if (CUresult e = require_context(&context)) return e;
  if (leastPriority != nullptr) *leastPriority = kLeastStreamPriority;
  if (greatestPriority != nullptr) *greatestPriority = kGreatestStreamPriority;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuDeviceCanAccessPeer(int* canAccessPeer, CUdevice dev, CUdevice peerDev) {
  if (CUresult e = require_init()) return e;
  if (canAccessPeer == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev) || !valid_device(peerDev)) return CUDA_ERROR_INVALID_DEVICE;
  *canAccessPeer = dev != peerDev && config().peer_access ? 1 : 0;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev) {
  if (CUresult e = require_init()) return e;
  if (pciBusId == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(pciBusId, static_cast<size_t>(len), "0000:%02X:00.0", 0x18 + dev);
  return CUDA_SUCCESS;
}
