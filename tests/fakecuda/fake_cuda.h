// Fake CUDA driver (libcuda.so.1) on host memory: a test double at the driver-API boundary.
//
// It lets the real kvtierd (`--device cuda`) and real engine processes run where there is
// no GPU: run them with LD_LIBRARY_PATH=<build>/tests/fakecuda. kvtier resolves every
// entry point through cuGetProcAddress_v2 with the CUDA version its PFN type names
// (cuda/driver_api.h); the ABI names (cuInit, cuMemAlloc_v2, …) are exported too, so
// dlsym works. Signatures are those of the real cuda.h / cudaTypedefs.h. It is strict
// where the real driver is: the error codes are the documented ones.
//
// What it models
//  - cuInit(0) before anything else; a fork()ed child cannot use its parent's driver
//    state (CUDA_ERROR_NOT_INITIALIZED), as with the real driver.
//  - N devices: distinct deterministic UUIDs, names, total memory, the attributes kvtier
//    reads; allocations beyond the device's memory fail (accounted per process).
//  - Primary contexts (refcounted) and each thread's current context: calls that need
//    one fail with CUDA_ERROR_INVALID_CONTEXT on a thread without one.
//  - Device memory: a memfd per allocation, mapped MAP_SHARED; a CUdeviceptr is the host
//    address of the mapping. The memfd's name shows in /proc/<pid>/maps as
//    "/memfd:kvtier-fakecuda:pid=<exporter>:alloc=<id>:dev=<d>" (VMM: ":vmm=<id>"), so a
//    test can tell whether a process still maps another process's memory.
//  - Legacy IPC: a handle names the exporter's pid and memfd; the importer opens it
//    through /proc/<pid>/fd/<fd>. VMM: 2 MiB granularity, POSIX fd export/import,
//    reservations, map/unmap, access (copies into a mapping without access fault).
//  - Streams run their work in order on one worker thread each; events mark completion.
//    Copies are validated when enqueued (a device range must stay inside its allocation
//    or mapping) and executed by memcpy on the worker.
//  - cuMemcpy2DAsync: each row is validated like a copy of its own against its side's
//    memory type (HOST: not device memory; DEVICE: device memory; UNIFIED: either);
//    a row longer than its pitch, or a pitch above CU_DEVICE_ATTRIBUTE_MAX_PITCH, is
//    INVALID_VALUE. CUDA arrays do not exist here (NOT_SUPPORTED).
//  - Modules and launches of kvtier's one kernel, the staging copy (kernels.cpp):
//    cuModuleLoadData checks the image's fatbin magic (INVALID_IMAGE otherwise),
//    cuModuleGetFunction knows only that kernel's name (NOT_FOUND otherwise), and
//    cuLaunchKernel copies the parameters at launch, checks the launch shape, and
//    queues the kernel's units on the stream; a unit touching memory that is not
//    device memory faults when it executes (ILLEGAL_ADDRESS, sticky).
//  - cuGetProcAddress_v2: the newest ABI not newer than the requested version. Unknown
//    symbol (or one newer than the driver): CUDA_ERROR_NOT_FOUND, SYMBOL_NOT_FOUND.
//    Requested version older than the symbol: CUDA_ERROR_NOT_FOUND, VERSION_NOT_SUFFICIENT.
//    Requested version newer than the driver: CUDA_ERROR_INVALID_VALUE, as documented.
//    A real ABI the fake lacks (e.g. cuCtxSynchronize v13000): CUDA_ERROR_NOT_SUPPORTED.
//  - Sticky errors: a faulting copy (no access, memory gone, fault switch) breaks its
//    context: from then on every call that needs that context, and every synchronization
//    on it, returns CUDA_ERROR_ILLEGAL_ADDRESS; cleanup calls (cuMemFree, cuStreamDestroy,
//    …) return it too and release nothing, as the process must be restarted.
//
// What it cannot show
//  - Performance, DMA and copy-engine behaviour: a copy is a memcpy on a thread.
//  - Real PID namespaces and container boundaries: IPC needs the importer to see the
//    exporter's pid and be allowed to open its /proc/<pid>/fd entries.
//  - Multi-GPU peer access and NVLink: every device reaches every byte.
//  - Real fault timing: a fault surfaces at the failing copy (its stream, its events),
//    never asynchronously later; queued work after it is skipped.
//  - Driver quirks the documentation does not describe, MPS, graphs, memory pools,
//    managed memory, per-thread default streams. Kernels other than kvtier's staging
//    copy (kernels.cpp: a module image must start with the fatbin magic, and a launch
//    runs cuda/staging_index.h's index math on the host as copies on its stream, each
//    side required to be device memory; its speed and occupancy say nothing). The NULL stream is
//    an ordinary in-order stream per context, without implicit synchronization.
//  - A context released to zero references is only marked destroyed; its memory stays.
//
// Switches (environment, read once per process on first use; every process of a test
// sets the same ones)
//   KVTIER_FAKECUDA_DEVICES         device count (default 2; 0 makes cuInit fail NO_DEVICE)
//   KVTIER_FAKECUDA_DEVICE_BYTES    memory per device (default 16GiB; K/M/G/KiB/MiB/GiB)
//   KVTIER_FAKECUDA_NUMA_ID         CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID (default 0)
//   KVTIER_FAKECUDA_DRIVER_VERSION  cuDriverGetVersion (default 13000); below 12080 the
//                                   batch-copy entry point does not exist
//   KVTIER_FAKECUDA_FAULT_FILE      while this path exists, an asynchronous copy executing
//                                   on a stream faults (ILLEGAL_ADDRESS, sticky)
//   KVTIER_FAKECUDA_POISON_ORPHANS  =1: a copy touching legacy-IPC memory whose exporter
//                                   process is gone faults the same way
//   KVTIER_FAKECUDA_COPY_US_PER_MIB stream workers sleep this many µs per MiB copied
//   KVTIER_FAKECUDA_PEER_ACCESS     =0: no device can access another's memory
//                                   (cuDeviceCanAccessPeer 0, cuMemSetAccess refuses
//                                   other devices); cuMemcpyPeerAsync still copies
//   KVTIER_FAKECUDA_NO_KERNEL_IMAGE =1: cuModuleLoadData fails NO_BINARY_FOR_GPU, as a
//                                   driver with no code for the GPU and too old for
//                                   the image's PTX
//   KVTIER_FAKECUDA_HOST_POINTER_FOR_REGISTERED_MEM
//                                   =0: the attribute is 0 and a batch copy given a
//                                   host pointer faults (as on paravirtualized GPUs)
//
// Thread-safety: every entry point may be called from any thread. Driver state is
// process-global, as the real driver's is; each table is reachable only under its lock
// (memory: memory_table.h, streams and events: streams.h). Global objects are never
// destroyed, so stream workers may outlive main().
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <atomic>
#include <cstdint>
#include <string>

// cuda.h maps the API name cuMemcpyBatchAsync to the CUDA 13.0 ABI (_v2); the 12.8 ABI,
// with its failIdx argument, keeps the plain name, which the fake exports too.
#undef cuMemcpyBatchAsync
extern "C" CUresult cuMemcpyBatchAsync(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                                       size_t count, CUmemcpyAttributes* attrs, size_t* attrsIdxs,
                                       size_t numAttrs, size_t* failIdx, CUstream hStream);

#define FAKECUDA_EXPORT extern "C" __attribute__((visibility("default")))

namespace kvtier::fakecuda {

constexpr uint64_t kGranularity = uint64_t{2} << 20;  // VMM minimum and recommended
constexpr int kMaxDevices = 32;                       // access masks are 32 bits
constexpr int kLeastStreamPriority = 0;
constexpr int kGreatestStreamPriority = -5;
constexpr int kMaxPitch = 2147483647;  // CU_DEVICE_ATTRIBUTE_MAX_PITCH, as on real GPUs

// The switches above. Constant after the first call.
struct Config {
  int devices = 2;
  uint64_t device_bytes = uint64_t{16} << 30;
  int numa_id = 0;
  int driver_version = 13000;
  std::string fault_file;  // empty: no fault switch
  bool poison_orphans = false;
  uint64_t copy_us_per_mib = 0;
  bool peer_access = true;                  // cuDeviceCanAccessPeer between any two devices
  bool host_pointer_for_registered = true;  // CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
  bool no_kernel_image = false;             // cuModuleLoadData: NO_BINARY_FOR_GPU
};

const Config& config();

// A primary context. Never freed, so a CUcontext stays a valid pointer for the life of
// the process; `references` counts cuDevicePrimaryCtxRetain minus releases.
struct Context {
  explicit Context(int device_ordinal) : device(device_ordinal) {}
  const int device;
  std::atomic<int> references{0};
  std::atomic<CUresult> sticky{CUDA_SUCCESS};  // the first sticky error; never cleared
};

// CUDA_ERROR_NOT_INITIALIZED unless cuInit(0) succeeded in this very process.
CUresult require_init();
// The calling thread's current context, when usable: INVALID_CONTEXT without one,
// CONTEXT_IS_DESTROYED after its last release, its sticky error once broken.
CUresult require_context(Context** context);
// The context behind a handle; nullptr for anything that is not one of ours.
Context* find_context(CUcontext handle);
CUcontext context_handle(Context* context);
// Marks `context` broken with `error` (the first error sticks).
void break_context(Context& context, CUresult error);
bool valid_device(int ordinal);

// Bytes allocated on each device by this process (cuMemAlloc and cuMemCreate).
// Reserves `bytes` on `device`, or returns CUDA_ERROR_OUT_OF_MEMORY.
CUresult reserve_device_bytes(int device, uint64_t bytes);
void release_device_bytes(int device, uint64_t bytes);

uint64_t round_up(uint64_t value, uint64_t multiple);
uint64_t page_bytes();

}  // namespace kvtier::fakecuda
