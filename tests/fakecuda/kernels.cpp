// Modules and kernel launches. The fake knows one kernel, kvtier's staging copy
// (cuda/staging_index.h): a launch of it runs the kernel's own index math on the host,
// work unit by work unit, as copies on the launch's stream. Every unit's source and
// destination must be device memory (the kernel dereferences them on the GPU);
// one that is not faults when the launch executes, as a kernel's bad access would:
// CUDA_ERROR_ILLEGAL_ADDRESS, sticky.
#include <cstring>
#include <mutex>
#include <set>

#include "cuda/staging_index.h"
#include "tests/fakecuda/streams.h"

namespace kvtier::fakecuda {
namespace {

constexpr uint32_t kFatbinMagic = 0xBA55ED50;  // what nvcc --fatbin writes first
constexpr unsigned kMaxThreadsPerBlock = 1024;

struct Module {
  Context* context;
};
// A function handle: the one kernel of a module.
struct Function {
  Module* module;
};

struct ModuleTable {
  std::mutex mu;
  std::set<Module*> modules;      // loaded, not unloaded
  std::set<Function*> functions;  // of loaded modules
};
ModuleTable& modules() {
  static ModuleTable* table = new ModuleTable;
  return *table;
}

}  // namespace
}  // namespace kvtier::fakecuda

using namespace kvtier::fakecuda;

FAKECUDA_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  Context* current = nullptr;
  if (CUresult e = require_context(&current)) return e;
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint32_t magic = 0;
  std::memcpy(&magic, image, sizeof(magic));
  if (magic != kFatbinMagic) return CUDA_ERROR_INVALID_IMAGE;
  if (config().no_kernel_image) return CUDA_ERROR_NO_BINARY_FOR_GPU;
  ModuleTable& t = modules();
  std::lock_guard lock(t.mu);
  auto* loaded = new Module{current};
  t.modules.insert(loaded);
  *module = reinterpret_cast<CUmodule>(loaded);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuModuleUnload(CUmodule hmod) {
  if (CUresult e = require_init()) return e;
  ModuleTable& t = modules();
  std::lock_guard lock(t.mu);
  auto* module = reinterpret_cast<Module*>(hmod);
  if (t.modules.erase(module) == 0) return CUDA_ERROR_INVALID_HANDLE;
  for (auto it = t.functions.begin(); it != t.functions.end();) {
    if ((*it)->module == module) {
      delete *it;
      it = t.functions.erase(it);
    } else {
      ++it;
    }
  }
  delete module;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  if (CUresult e = require_init()) return e;
  if (hfunc == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ModuleTable& t = modules();
  std::lock_guard lock(t.mu);
  auto* module = reinterpret_cast<Module*>(hmod);
  if (t.modules.count(module) == 0) return CUDA_ERROR_INVALID_HANDLE;
  if (std::strcmp(name, kvtier::staging::kKernelName) != 0) return CUDA_ERROR_NOT_FOUND;
  auto* function = new Function{module};
  t.functions.insert(function);
  *hfunc = reinterpret_cast<CUfunction>(function);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX,
                                        unsigned int blockDimY, unsigned int blockDimZ,
                                        unsigned int sharedMemBytes, CUstream hStream,
                                        void** kernelParams, void** extra) {
  Context* current = nullptr;
  if (CUresult e = require_context(&current)) return e;
  {
    ModuleTable& t = modules();
    std::lock_guard lock(t.mu);
    auto* function = reinterpret_cast<Function*>(f);
    if (t.functions.count(function) == 0) return CUDA_ERROR_INVALID_HANDLE;
    // A module belongs to the context it was loaded in.
    if (function->module->context != current) return CUDA_ERROR_INVALID_HANDLE;
  }
  if (gridDimX == 0 || gridDimY == 0 || gridDimZ == 0 || blockDimX == 0 || blockDimY == 0 ||
      blockDimZ == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (uint64_t{blockDimX} * blockDimY * blockDimZ > kMaxThreadsPerBlock || sharedMemBytes > 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Parameters come either as kernelParams or packed in extra, never both.
  if ((kernelParams == nullptr) == (extra == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (kernelParams == nullptr || kernelParams[0] == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  std::shared_ptr<Stream> stream;
  if (CUresult e = find_stream(hStream, *current, &stream)) return e;
  if (CUresult e = stream->context().sticky.load()) return e;

  // The driver copies the parameters at launch: the caller may reuse its buffer at once.
  kvtier::staging::Launch launch;
  std::memcpy(&launch, kernelParams[0], sizeof(launch));
  Work work;
  work.async_copy = true;
  const bool shape_ok = launch.plane_count > 0 &&
                        launch.block_count <= kvtier::staging::kMaxBlocksPerLaunch &&
                        launch.direction <= kvtier::staging::kScatter;
  // The plane table is read by the kernel on the device: it must be device memory too.
  Segment table;
  const uint64_t table_bytes =
      uint64_t{launch.plane_begin + launch.plane_count} * sizeof(kvtier::staging::Plane);
  if (!shape_ok || resolve_copy(launch.planes, launch.planes, table_bytes, true, true, &table)) {
    work.launch_fault = true;
  } else {
    const auto* planes = reinterpret_cast<const kvtier::staging::Plane*>(launch.planes);
    const uint64_t units = kvtier::staging::unit_count(launch);
    work.segments.reserve(units);
    for (uint64_t u = 0; u < units && !work.launch_fault; ++u) {
      const kvtier::staging::Copy copy = kvtier::staging::unit_copy(launch, planes, u);
      Segment segment;
      if (resolve_copy(copy.dst, copy.src, copy.bytes, true, true, &segment)) {
        work.launch_fault = true;
      } else {
        work.segments.push_back(std::move(segment));
      }
    }
  }
  if (work.launch_fault) work.segments.clear();
  stream->enqueue(std::move(work));
  return CUDA_SUCCESS;
}
