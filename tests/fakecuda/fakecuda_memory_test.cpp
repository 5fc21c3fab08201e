// The fake driver's memory: allocations, pointer queries, host registration and VMM.
#include <sys/mman.h>

#include "tests/fakecuda/fakecuda_test_util.h"

namespace kvtier::fakecuda::testing {
namespace {

constexpr size_t kTwoMiB = size_t{2} << 20;

CUmemAllocationProp device_prop(int device, bool posix_fd) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes =
      posix_fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  return prop;
}

CUmemAccessDesc read_write(int device) {
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return access;
}

TEST(FakeCudaMemory, AddressRangesPointerAttributesAndMemoryLimit) {
  in_child({{"KVTIER_FAKECUDA_DEVICE_BYTES", "64MiB"}}, [] {
    FakeDriver d = load_with_context(1);
    const size_t bytes = (1 << 20) + 100;
    CUdeviceptr device = 0;
    ASSERT_EQ(d.mem_alloc(&device, bytes), CUDA_SUCCESS);
    std::vector<unsigned char> host = pattern(bytes, 5), back(bytes);
    ASSERT_EQ(d.memcpy_htod(device, host.data(), bytes), CUDA_SUCCESS);
    ASSERT_EQ(d.memcpy_dtoh(back.data(), device, bytes), CUDA_SUCCESS);
    EXPECT_EQ(host, back);
    ASSERT_EQ(d.memset_d8(device + 10, 0xab, 5), CUDA_SUCCESS);
    ASSERT_EQ(d.memcpy_dtoh(back.data(), device, 16), CUDA_SUCCESS);
    EXPECT_EQ(back[9], host[9]);
    EXPECT_EQ(back[10], 0xab);
    EXPECT_EQ(back[14], 0xab);
    EXPECT_EQ(back[15], host[15]);
    EXPECT_EQ(d.memcpy_htod(device + 1, host.data(), bytes), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(d.memcpy_htod(reinterpret_cast<CUdeviceptr>(back.data()), host.data(), 8),
              CUDA_ERROR_INVALID_VALUE);  // the destination is not device memory

    CUdeviceptr base = 0;
    size_t size = 0;
    ASSERT_EQ(d.mem_get_address_range(&base, &size, device + 12345), CUDA_SUCCESS);
    EXPECT_EQ(base, device);
    EXPECT_EQ(size, bytes);
    EXPECT_EQ(d.mem_get_address_range(&base, &size, device + bytes), CUDA_ERROR_NOT_FOUND);
    EXPECT_EQ(d.mem_get_address_range(&base, &size, reinterpret_cast<CUdeviceptr>(host.data())),
              CUDA_ERROR_NOT_FOUND);

    int ordinal = -1;
    unsigned memory_type = 0;
    bool legacy_ipc = false;
    CUdeviceptr start = 0;
    EXPECT_EQ(d.pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, device + 7),
              CUDA_SUCCESS);
    EXPECT_EQ(ordinal, 1);
    EXPECT_EQ(d.pointer_get_attribute(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, device),
              CUDA_SUCCESS);
    EXPECT_EQ(memory_type, unsigned{CU_MEMORYTYPE_DEVICE});
    EXPECT_EQ(d.pointer_get_attribute(&legacy_ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                      device),
              CUDA_SUCCESS);
    EXPECT_TRUE(legacy_ipc);
    EXPECT_EQ(d.pointer_get_attribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, device + 99),
              CUDA_SUCCESS);
    EXPECT_EQ(start, device);
    EXPECT_EQ(d.pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                      reinterpret_cast<CUdeviceptr>(host.data())),
              CUDA_ERROR_INVALID_VALUE);

    // 64 MiB per device, counted per process.
    CUdeviceptr big = 0;
    EXPECT_EQ(d.mem_alloc(&big, 64 << 20), CUDA_ERROR_OUT_OF_MEMORY);
    ASSERT_EQ(d.mem_alloc(&big, 60 << 20), CUDA_SUCCESS);
    EXPECT_EQ(d.mem_free(big), CUDA_SUCCESS);
    EXPECT_EQ(d.mem_free(device + 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(d.mem_free(device), CUDA_SUCCESS);
  });
}

TEST(FakeCudaMemory, HostRegistration) {
  in_child({}, [] {
    FakeDriver d = load_with_context();
    const size_t bytes = 1 << 20;
    void* host = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(host, MAP_FAILED);
    auto* bytes_at = static_cast<char*>(host);
    ASSERT_EQ(d.mem_host_register(host, bytes, 0), CUDA_SUCCESS);
    EXPECT_EQ(d.mem_host_register(bytes_at + 4096, 4096, 0),
              CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    EXPECT_EQ(d.mem_host_unregister(bytes_at + 4096), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    unsigned memory_type = 0;
    EXPECT_EQ(d.pointer_get_attribute(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                      reinterpret_cast<CUdeviceptr>(bytes_at + 8)),
              CUDA_SUCCESS);
    EXPECT_EQ(memory_type, unsigned{CU_MEMORYTYPE_HOST});
    EXPECT_EQ(d.mem_host_unregister(host), CUDA_SUCCESS);
    EXPECT_EQ(d.mem_host_unregister(host), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    CUdeviceptr device = 0;
    ASSERT_EQ(d.mem_alloc(&device, 8192), CUDA_SUCCESS);
    EXPECT_EQ(d.mem_host_register(reinterpret_cast<void*>(device), 4096, 0),
              CUDA_ERROR_INVALID_VALUE);  // device memory is not host memory
    ::munmap(host, bytes);
    EXPECT_EQ(d.mem_host_register(host, bytes, 0), CUDA_ERROR_INVALID_VALUE);
  });
}

TEST(FakeCudaVmm, GranularityExportAndMappingRules) {
  in_child({}, [] {
    FakeDriver d = load_driver();
    ASSERT_EQ(d.init(0), CUDA_SUCCESS);  // VMM needs no current context
    CUmemAllocationProp prop = device_prop(1, false);
    size_t granularity = 0;
    ASSERT_EQ(d.mem_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
              CUDA_SUCCESS);
    EXPECT_EQ(granularity, kTwoMiB);
    ASSERT_EQ(d.mem_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
              CUDA_SUCCESS);
    EXPECT_EQ(granularity, kTwoMiB);
    CUmemGenericAllocationHandle handle = 0;
    EXPECT_EQ(d.mem_create(&handle, kTwoMiB + 4096, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    prop.location.id = 9;
    EXPECT_EQ(d.mem_create(&handle, kTwoMiB, &prop, 0), CUDA_ERROR_INVALID_DEVICE);
    prop.location.id = 1;
    ASSERT_EQ(d.mem_create(&handle, 2 * kTwoMiB, &prop, 0), CUDA_SUCCESS);
    int fd = -1;
    EXPECT_EQ(d.mem_export(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
              CUDA_ERROR_INVALID_VALUE);  // not requested at cuMemCreate
    EXPECT_EQ(fd, -1);

    CUdeviceptr reserved = 0;
    const size_t span = 4 * kTwoMiB;
    ASSERT_EQ(d.address_reserve(&reserved, span, 0, 0, 0), CUDA_SUCCESS);
    EXPECT_EQ(reserved % kTwoMiB, 0u);
    EXPECT_EQ(d.mem_map(reserved, 2 * kTwoMiB, kTwoMiB, handle, 0),
              CUDA_ERROR_INVALID_VALUE);  // offset must be 0
    EXPECT_EQ(d.mem_map(reserved + 4096, kTwoMiB, 0, handle, 0),
              CUDA_ERROR_INVALID_VALUE);  // ptr not a granularity multiple
    EXPECT_EQ(d.mem_map(reserved, kTwoMiB + 4096, 0, handle, 0),
              CUDA_ERROR_INVALID_VALUE);  // size not a granularity multiple
    EXPECT_EQ(d.mem_map(reserved, 3 * kTwoMiB, 0, handle, 0),
              CUDA_ERROR_INVALID_VALUE);  // more than the allocation
    EXPECT_EQ(d.mem_map(reserved + 3 * kTwoMiB, 2 * kTwoMiB, 0, handle, 0),
              CUDA_ERROR_INVALID_VALUE);  // runs out of the reservation
    const CUdeviceptr chunk = reserved + kTwoMiB;
    ASSERT_EQ(d.mem_map(chunk, 2 * kTwoMiB, 0, handle, 0), CUDA_SUCCESS);
    EXPECT_EQ(d.mem_map(chunk, kTwoMiB, 0, handle, 0),
              CUDA_ERROR_INVALID_VALUE);  // already mapped
    const CUmemAccessDesc access = read_write(1);
    EXPECT_EQ(d.mem_set_access(reserved, span, &access, 1),
              CUDA_ERROR_INVALID_VALUE);  // not fully mapped
    ASSERT_EQ(d.mem_set_access(chunk, 2 * kTwoMiB, &access, 1), CUDA_SUCCESS);

    CUcontext context = nullptr;  // from here on, calls that need one
    ASSERT_EQ(d.primary_ctx_retain(&context, 1), CUDA_SUCCESS);
    ASSERT_EQ(d.ctx_set_current(context), CUDA_SUCCESS);
    CUdeviceptr base = 0;
    size_t size = 0;
    ASSERT_EQ(d.mem_get_address_range(&base, &size, chunk + 12345), CUDA_SUCCESS);
    EXPECT_EQ(base, chunk);  // the mapping, not the reservation
    EXPECT_EQ(size, 2 * kTwoMiB);
    CUdeviceptr range_start = 0;
    EXPECT_EQ(
        d.pointer_get_attribute(&range_start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, chunk + 5),
        CUDA_SUCCESS);
    EXPECT_EQ(range_start, reserved);  // the reservation, as documented
    bool legacy_ipc = true;
    EXPECT_EQ(d.pointer_get_attribute(&legacy_ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                      chunk),
              CUDA_SUCCESS);
    EXPECT_FALSE(legacy_ipc);
    CUipcMemHandle ipc{};
    EXPECT_EQ(d.ipc_get_mem_handle(&ipc, chunk), CUDA_ERROR_INVALID_VALUE);

    std::vector<unsigned char> host = pattern(kTwoMiB, 6), back(kTwoMiB);
    ASSERT_EQ(d.memcpy_htod(chunk + kTwoMiB, host.data(), kTwoMiB), CUDA_SUCCESS);
    ASSERT_EQ(d.memcpy_dtoh(back.data(), chunk + kTwoMiB, kTwoMiB), CUDA_SUCCESS);
    EXPECT_EQ(host, back);
    EXPECT_EQ(d.memcpy_htod(chunk + kTwoMiB, host.data(), kTwoMiB + 1),
              CUDA_ERROR_INVALID_VALUE);  // past the mapping
    EXPECT_EQ(d.memcpy_htod(reserved, host.data(), 16),
              CUDA_ERROR_INVALID_VALUE);  // reserved but unmapped

    CUmemGenericAllocationHandle retained = 0;
    ASSERT_EQ(d.mem_retain_allocation_handle(&retained, reinterpret_cast<void*>(chunk + 99)),
              CUDA_SUCCESS);
    EXPECT_EQ(retained, handle);
    EXPECT_EQ(d.mem_release(retained), CUDA_SUCCESS);
    EXPECT_EQ(d.mem_release(handle), CUDA_SUCCESS);  // mapped: the memory lives
    ASSERT_EQ(d.memcpy_dtoh(back.data(), chunk + kTwoMiB, kTwoMiB), CUDA_SUCCESS);
    EXPECT_EQ(host, back);
    EXPECT_EQ(d.mem_release(handle), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(d.address_free(reserved, span), CUDA_ERROR_INVALID_VALUE);  // mapped
    EXPECT_EQ(d.mem_unmap(chunk, kTwoMiB), CUDA_ERROR_INVALID_VALUE);     // part of one
    ASSERT_EQ(d.mem_unmap(chunk, 2 * kTwoMiB), CUDA_SUCCESS);
    EXPECT_EQ(d.address_free(reserved, span - kTwoMiB), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(d.address_free(reserved, span), CUDA_SUCCESS);
  });
}

TEST(FakeCudaVmm, CopyBeforeSetAccessFaultsStickily) {
  in_child({}, [] {
    FakeDriver d = load_with_context(0);
    CUmemAllocationProp prop = device_prop(0, true);
    CUmemGenericAllocationHandle handle = 0;
    ASSERT_EQ(d.mem_create(&handle, kTwoMiB, &prop, 0), CUDA_SUCCESS);
    CUdeviceptr reserved = 0;
    ASSERT_EQ(d.address_reserve(&reserved, kTwoMiB, kTwoMiB, 0, 0), CUDA_SUCCESS);
    ASSERT_EQ(d.mem_map(reserved, kTwoMiB, 0, handle, 0), CUDA_SUCCESS);
    CUstream stream = nullptr;
    ASSERT_EQ(d.stream_create(&stream, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
    std::vector<unsigned char> host(4096, 1);
    ASSERT_EQ(d.memcpy_async(reserved, reinterpret_cast<CUdeviceptr>(host.data()), 4096, stream),
              CUDA_SUCCESS);  // valid range: refused only when it runs
    EXPECT_EQ(d.stream_synchronize(stream), CUDA_ERROR_ILLEGAL_ADDRESS);
    const CUmemAccessDesc access = read_write(0);
    EXPECT_EQ(d.mem_set_access(reserved, kTwoMiB, &access, 1), CUDA_SUCCESS);
    CUdeviceptr more = 0;
    EXPECT_EQ(d.mem_alloc(&more, 4096), CUDA_ERROR_ILLEGAL_ADDRESS);  // sticky
    EXPECT_EQ(d.ctx_synchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
  });
}

}  // namespace
}  // namespace kvtier::fakecuda::testing
