// Test helpers for the fake CUDA driver.
//
// Every test runs its body in a fork()ed child: the switches are read once per process
// and sticky errors never heal, so each scenario needs a fresh process. The parent never
// loads the driver. In the child, gtest assertions work as usual; the child's exit code
// tells the parent whether any failed.
//
// FakeDriver loads the fake by absolute path and resolves entry points through its
// cuGetProcAddress_v2 with the versions cuda/driver_api.h uses.
#pragma once

#include <dlfcn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace kvtier::fakecuda::testing {

using Env = std::vector<std::pair<std::string, std::string>>;

struct FakeDriver {
  void* library = nullptr;
  PFN_cuGetProcAddress_v12000 get_proc_address = nullptr;
  PFN_cuInit_v2000 init = nullptr;
  PFN_cuDriverGetVersion_v2020 driver_get_version = nullptr;
  PFN_cuDeviceGetCount_v2000 device_get_count = nullptr;
  PFN_cuDeviceGetName_v2000 device_get_name = nullptr;
  PFN_cuDeviceGetUuid_v11040 device_get_uuid = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
  PFN_cuDeviceTotalMem_v3020 device_total_mem = nullptr;
  PFN_cuDevicePrimaryCtxRetain_v7000 primary_ctx_retain = nullptr;
  PFN_cuDevicePrimaryCtxRelease_v11000 primary_ctx_release = nullptr;
  PFN_cuCtxSetCurrent_v4000 ctx_set_current = nullptr;
  PFN_cuCtxGetDevice_v2000 ctx_get_device = nullptr;
  PFN_cuCtxSynchronize_v2000 ctx_synchronize = nullptr;
  PFN_cuCtxGetStreamPriorityRange_v5050 ctx_get_stream_priority_range = nullptr;
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;
  PFN_cuMemAlloc_v3020 mem_alloc = nullptr;
  PFN_cuMemFree_v3020 mem_free = nullptr;
  PFN_cuMemGetAddressRange_v3020 mem_get_address_range = nullptr;
  PFN_cuPointerGetAttribute_v4000 pointer_get_attribute = nullptr;
  PFN_cuMemHostRegister_v6050 mem_host_register = nullptr;
  PFN_cuMemHostUnregister_v4000 mem_host_unregister = nullptr;
  PFN_cuMemcpyHtoD_v3020 memcpy_htod = nullptr;
  PFN_cuMemcpyDtoH_v3020 memcpy_dtoh = nullptr;
  PFN_cuMemsetD8_v3020 memset_d8 = nullptr;
  PFN_cuIpcGetMemHandle_v4010 ipc_get_mem_handle = nullptr;
  PFN_cuIpcOpenMemHandle_v11000 ipc_open_mem_handle = nullptr;
  PFN_cuIpcCloseMemHandle_v4010 ipc_close_mem_handle = nullptr;
  PFN_cuMemCreate_v10020 mem_create = nullptr;
  PFN_cuMemRelease_v10020 mem_release = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 mem_export = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 mem_import = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 mem_granularity = nullptr;
  PFN_cuMemGetAllocationPropertiesFromHandle_v10020 mem_properties = nullptr;
  PFN_cuMemAddressReserve_v10020 address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemMap_v10020 mem_map = nullptr;
  PFN_cuMemUnmap_v10020 mem_unmap = nullptr;
  PFN_cuMemSetAccess_v10020 mem_set_access = nullptr;
  PFN_cuMemRetainAllocationHandle_v11000 mem_retain_allocation_handle = nullptr;
  PFN_cuStreamCreateWithPriority_v5050 stream_create = nullptr;
  PFN_cuStreamDestroy_v4000 stream_destroy = nullptr;
  PFN_cuStreamSynchronize_v2000 stream_synchronize = nullptr;
  PFN_cuEventCreate_v2000 event_create = nullptr;
  PFN_cuEventRecord_v2000 event_record = nullptr;
  PFN_cuEventSynchronize_v2000 event_synchronize = nullptr;
  PFN_cuEventQuery_v2000 event_query = nullptr;
  PFN_cuEventDestroy_v4000 event_destroy = nullptr;
  PFN_cuMemcpyAsync_v4000 memcpy_async = nullptr;
  PFN_cuMemcpyBatchAsync_v12080 memcpy_batch_v12080 = nullptr;  // null below 12.8
  PFN_cuMemcpyBatchAsync_v13000 memcpy_batch_v13000 = nullptr;  // null below 13.0

  // Asks the fake's cuGetProcAddress_v2 for (symbol, version).
  CUresult query(const char* symbol, int version, void** pfn,
                 CUdriverProcAddressQueryResult* status) const {
    return get_proc_address(symbol, pfn, version, CU_GET_PROC_ADDRESS_DEFAULT, status);
  }
};

// Loads the fake in this process (the switches must be set before). Fails the test when
// an entry point kvtier needs is missing.
inline FakeDriver load_driver() {
  FakeDriver d;
  d.library = ::dlopen(KVTIER_FAKECUDA_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  EXPECT_NE(d.library, nullptr) << ::dlerror();
  if (d.library == nullptr) return d;
  d.get_proc_address =
      reinterpret_cast<PFN_cuGetProcAddress_v12000>(::dlsym(d.library, "cuGetProcAddress_v2"));
  EXPECT_NE(d.get_proc_address, nullptr);
  if (d.get_proc_address == nullptr) return d;
  int version = 0;
  auto resolve = [&](const char* symbol, int abi, auto& fn, bool required) {
    void* pfn = nullptr;
    CUdriverProcAddressQueryResult status{};
    const CUresult result = d.query(symbol, abi, &pfn, &status);
    if (required) {
      EXPECT_EQ(result, CUDA_SUCCESS) << symbol << " v" << abi;
      EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS) << symbol;
    }
    fn = result == CUDA_SUCCESS ? reinterpret_cast<std::remove_reference_t<decltype(fn)>>(pfn)
                                : nullptr;
  };
#define FAKECUDA_RESOLVE(field, symbol, abi) resolve(#symbol, abi, d.field, true)
  FAKECUDA_RESOLVE(init, cuInit, 2000);
  FAKECUDA_RESOLVE(driver_get_version, cuDriverGetVersion, 2020);
  FAKECUDA_RESOLVE(device_get_count, cuDeviceGetCount, 2000);
  FAKECUDA_RESOLVE(device_get_name, cuDeviceGetName, 2000);
  FAKECUDA_RESOLVE(device_get_uuid, cuDeviceGetUuid, 11040);
  FAKECUDA_RESOLVE(device_get_attribute, cuDeviceGetAttribute, 2000);
  FAKECUDA_RESOLVE(device_total_mem, cuDeviceTotalMem, 3020);
  FAKECUDA_RESOLVE(primary_ctx_retain, cuDevicePrimaryCtxRetain, 7000);
  FAKECUDA_RESOLVE(primary_ctx_release, cuDevicePrimaryCtxRelease, 11000);
  FAKECUDA_RESOLVE(ctx_set_current, cuCtxSetCurrent, 4000);
  FAKECUDA_RESOLVE(ctx_get_device, cuCtxGetDevice, 2000);
  FAKECUDA_RESOLVE(ctx_synchronize, cuCtxSynchronize, 2000);
  FAKECUDA_RESOLVE(ctx_get_stream_priority_range, cuCtxGetStreamPriorityRange, 5050);
  FAKECUDA_RESOLVE(get_error_name, cuGetErrorName, 6000);
  FAKECUDA_RESOLVE(get_error_string, cuGetErrorString, 6000);
  FAKECUDA_RESOLVE(mem_alloc, cuMemAlloc, 3020);
  FAKECUDA_RESOLVE(mem_free, cuMemFree, 3020);
  FAKECUDA_RESOLVE(mem_get_address_range, cuMemGetAddressRange, 3020);
  FAKECUDA_RESOLVE(pointer_get_attribute, cuPointerGetAttribute, 4000);
  FAKECUDA_RESOLVE(mem_host_register, cuMemHostRegister, 6050);
  FAKECUDA_RESOLVE(mem_host_unregister, cuMemHostUnregister, 4000);
  FAKECUDA_RESOLVE(memcpy_htod, cuMemcpyHtoD, 3020);
  FAKECUDA_RESOLVE(memcpy_dtoh, cuMemcpyDtoH, 3020);
  FAKECUDA_RESOLVE(memset_d8, cuMemsetD8, 3020);
  FAKECUDA_RESOLVE(ipc_get_mem_handle, cuIpcGetMemHandle, 4010);
  FAKECUDA_RESOLVE(ipc_open_mem_handle, cuIpcOpenMemHandle, 11000);
  FAKECUDA_RESOLVE(ipc_close_mem_handle, cuIpcCloseMemHandle, 4010);
  FAKECUDA_RESOLVE(mem_create, cuMemCreate, 10020);
  FAKECUDA_RESOLVE(mem_release, cuMemRelease, 10020);
  FAKECUDA_RESOLVE(mem_export, cuMemExportToShareableHandle, 10020);
  FAKECUDA_RESOLVE(mem_import, cuMemImportFromShareableHandle, 10020);
  FAKECUDA_RESOLVE(mem_granularity, cuMemGetAllocationGranularity, 10020);
  FAKECUDA_RESOLVE(mem_properties, cuMemGetAllocationPropertiesFromHandle, 10020);
  FAKECUDA_RESOLVE(address_reserve, cuMemAddressReserve, 10020);
  FAKECUDA_RESOLVE(address_free, cuMemAddressFree, 10020);
  FAKECUDA_RESOLVE(mem_map, cuMemMap, 10020);
  FAKECUDA_RESOLVE(mem_unmap, cuMemUnmap, 10020);
  FAKECUDA_RESOLVE(mem_set_access, cuMemSetAccess, 10020);
  FAKECUDA_RESOLVE(mem_retain_allocation_handle, cuMemRetainAllocationHandle, 11000);
  FAKECUDA_RESOLVE(stream_create, cuStreamCreateWithPriority, 5050);
  FAKECUDA_RESOLVE(stream_destroy, cuStreamDestroy, 4000);
  FAKECUDA_RESOLVE(stream_synchronize, cuStreamSynchronize, 2000);
  FAKECUDA_RESOLVE(event_create, cuEventCreate, 2000);
  FAKECUDA_RESOLVE(event_record, cuEventRecord, 2000);
  FAKECUDA_RESOLVE(event_synchronize, cuEventSynchronize, 2000);
  FAKECUDA_RESOLVE(event_query, cuEventQuery, 2000);
  FAKECUDA_RESOLVE(event_destroy, cuEventDestroy, 4000);
  FAKECUDA_RESOLVE(memcpy_async, cuMemcpyAsync, 4000);
#undef FAKECUDA_RESOLVE
  // Like kvtier, choose the batch entry point by the driver's version.
  if (d.driver_get_version != nullptr) d.driver_get_version(&version);
  if (version >= 13000) resolve("cuMemcpyBatchAsync", 13000, d.memcpy_batch_v13000, true);
  if (version >= 12080) resolve("cuMemcpyBatchAsync", 12080, d.memcpy_batch_v12080, true);
  return d;
}

// Loads the driver, cuInit(0)s it and makes device `device`'s primary context current.
inline FakeDriver load_with_context(int device = 0) {
  FakeDriver d = load_driver();
  CUcontext context = nullptr;
  EXPECT_EQ(d.init(0), CUDA_SUCCESS);
  EXPECT_EQ(d.primary_ctx_retain(&context, device), CUDA_SUCCESS);
  EXPECT_EQ(d.ctx_set_current(context), CUDA_SUCCESS);
  return d;
}

// Starts `body` in a forked child with `env` set; returns its pid.
inline pid_t start_child(const Env& env, const std::function<void()>& body) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
  body();
  std::fflush(nullptr);
  ::_exit(::testing::Test::HasFailure() ? 1 : 0);
}

// The child's exit code (-signal when it was killed).
inline int wait_child(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1000;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

inline int run_child(const Env& env, const std::function<void()>& body) {
  return wait_child(start_child(env, body));
}

// Runs `body` in a child and fails the test when any assertion in it failed.
inline void in_child(const Env& env, const std::function<void()>& body) {
  const int exit_code = run_child(env, body);
  EXPECT_EQ(exit_code, 0) << "the child process failed (its failures are printed above)";
}

// Byte patterns that differ per seed and position.
inline std::vector<unsigned char> pattern(size_t bytes, unsigned seed) {
  std::vector<unsigned char> data(bytes);
  uint32_t state = seed * 2654435761u + 1;
  for (auto& byte : data) {
    state = state * 1664525u + 1013904223u;
    byte = static_cast<unsigned char>(state >> 24);
  }
  return data;
}

// Messages between the processes of a test: whole buffers, optionally with one fd.
inline bool send_message(int socket, const void* data, size_t bytes, int fd = -1) {
  iovec io{const_cast<void*>(data), bytes};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(header), &fd, sizeof(int));
  }
  return ::sendmsg(socket, &message, 0) == static_cast<ssize_t>(bytes);
}

inline bool receive_message(int socket, void* data, size_t bytes, int* fd = nullptr) {
  iovec io{data, bytes};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  if (::recvmsg(socket, &message, MSG_WAITALL) != static_cast<ssize_t>(bytes)) return false;
  if (fd != nullptr) {
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    if (header == nullptr || header->cmsg_type != SCM_RIGHTS) return false;
    std::memcpy(fd, CMSG_DATA(header), sizeof(int));
  }
  return true;
}

// Whether this process maps a fake memfd whose name contains `needle`.
inline bool maps_contain(const std::string& needle) {
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return false;
  char line[512];
  bool found = false;
  while (!found && std::fgets(line, sizeof(line), maps) != nullptr) {
    found = std::strstr(line, needle.c_str()) != nullptr;
  }
  std::fclose(maps);
  return found;
}

}  // namespace kvtier::fakecuda::testing
