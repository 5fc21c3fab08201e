// The fake driver's entry-point table, devices, contexts, streams, events, batch copies
// and sticky faults.
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "tests/fakecuda/fakecuda_test_util.h"

namespace kvtier::fakecuda::testing {
namespace {

TEST(FakeCudaProcAddress, ResolvesWhatKvtierAsksAndRefusesTheRest) {
  in_child({}, [] {
    FakeDriver d = load_driver();  // every entry point of driver_api.h resolves
    ASSERT_NE(d.memcpy_batch_v13000, nullptr);
    ASSERT_NE(d.memcpy_batch_v12080, nullptr);
    EXPECT_NE(reinterpret_cast<void*>(d.memcpy_batch_v13000),
              reinterpret_cast<void*>(d.memcpy_batch_v12080));
    void* pfn = &d;
    CUdriverProcAddressQueryResult status{};
    EXPECT_EQ(d.query("cuNoSuchFunction", 12000, &pfn, &status), CUDA_ERROR_NOT_FOUND);
    EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    EXPECT_EQ(pfn, nullptr);
    // Older than the symbol: found, but the version is not sufficient.
    EXPECT_EQ(d.query("cuMemCreate", 10010, &pfn, &status), CUDA_ERROR_NOT_FOUND);
    EXPECT_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    // Newer than the driver: documented as an invalid value.
    EXPECT_EQ(d.query("cuMemAlloc", 13010, &pfn, &status), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(pfn, nullptr);
    // An ABI the fake does not implement is never replaced by another one.
    EXPECT_EQ(d.query("cuCtxSynchronize", 13000, &pfn, &status), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT_EQ(d.query("cuMemAlloc", 2000, &pfn, &status), CUDA_ERROR_NOT_SUPPORTED);
    // dlsym finds the ABI names too, and they are the same functions.
    EXPECT_EQ(::dlsym(d.library, "cuMemAlloc_v2"), reinterpret_cast<void*>(d.mem_alloc));
    EXPECT_EQ(::dlsym(d.library, "cuMemcpyBatchAsync"),
              reinterpret_cast<void*>(d.memcpy_batch_v12080));
    EXPECT_EQ(::dlsym(d.library, "cuMemcpyBatchAsync_v2"),
              reinterpret_cast<void*>(d.memcpy_batch_v13000));
    const char* text = nullptr;
    EXPECT_EQ(d.get_error_name(CUDA_ERROR_ILLEGAL_ADDRESS, &text), CUDA_SUCCESS);
    EXPECT_STREQ(text, "CUDA_ERROR_ILLEGAL_ADDRESS");
    EXPECT_EQ(d.get_error_string(CUDA_ERROR_INVALID_CONTEXT, &text), CUDA_SUCCESS);
    EXPECT_STREQ(text, "invalid device context");
    EXPECT_EQ(d.get_error_string(CUDA_ERROR_LAUNCH_TIMEOUT, &text), CUDA_SUCCESS);
    EXPECT_STREQ(text, "launch timeout");
    EXPECT_EQ(d.get_error_name(static_cast<CUresult>(12345), &text), CUDA_ERROR_INVALID_VALUE);
  });
}

TEST(FakeCudaProcAddress, OlderDriverHidesTheBatchCopy) {
  in_child({{"KVTIER_FAKECUDA_DRIVER_VERSION", "12040"}}, [] {
    FakeDriver d = load_driver();
    int version = 0;
    EXPECT_EQ(d.driver_get_version(&version), CUDA_SUCCESS);
    EXPECT_EQ(version, 12040);
    EXPECT_EQ(d.memcpy_batch_v12080, nullptr);
    void* pfn = nullptr;
    CUdriverProcAddressQueryResult status{};
    EXPECT_EQ(d.query("cuMemcpyBatchAsync", 12040, &pfn, &status), CUDA_ERROR_NOT_FOUND);
    EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    EXPECT_EQ(d.query("cuMemcpyBatchAsync", 12080, &pfn, &status), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(pfn, nullptr);
    ASSERT_NE(d.mem_alloc, nullptr);  // the rest is there
  });
  in_child({{"KVTIER_FAKECUDA_DRIVER_VERSION", "12080"}}, [] {
    FakeDriver d = load_driver();
    EXPECT_NE(d.memcpy_batch_v12080, nullptr);
    EXPECT_EQ(d.memcpy_batch_v13000, nullptr);
    void* pfn = nullptr;
    EXPECT_EQ(d.query("cuMemcpyBatchAsync", 13000, &pfn, nullptr), CUDA_ERROR_INVALID_VALUE);
  });
}

TEST(FakeCudaDevices, InitFirstThenDistinctDeterministicDevices) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  auto report_uuids = [&] {
    FakeDriver d = load_driver();
    int count = -1;
    EXPECT_EQ(d.device_get_count(&count), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_EQ(d.init(1), CUDA_ERROR_INVALID_VALUE);
    ASSERT_EQ(d.init(0), CUDA_SUCCESS);
    ASSERT_EQ(d.device_get_count(&count), CUDA_SUCCESS);
    ASSERT_EQ(count, 2);
    CUuuid uuids[2];
    for (int i = 0; i < 2; ++i) ASSERT_EQ(d.device_get_uuid(&uuids[i], i), CUDA_SUCCESS);
    EXPECT_NE(std::memcmp(uuids[0].bytes, uuids[1].bytes, 16), 0);
    EXPECT_EQ(d.device_get_uuid(&uuids[0], 2), CUDA_ERROR_INVALID_DEVICE);
    char name[64];
    EXPECT_EQ(d.device_get_name(name, sizeof(name), 1), CUDA_SUCCESS);
    EXPECT_STREQ(name, "kvtier fake GPU 1");
    size_t total = 0;
    EXPECT_EQ(d.device_total_mem(&total, 0), CUDA_SUCCESS);
    EXPECT_EQ(total, size_t{3} << 30);
    int value = -1;
    EXPECT_EQ(d.device_get_attribute(&value, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 1), CUDA_SUCCESS);
    EXPECT_EQ(value, 3);
    for (auto attribute : {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
                           CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                           CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED}) {
      EXPECT_EQ(d.device_get_attribute(&value, attribute, 0), CUDA_SUCCESS);
      EXPECT_EQ(value, 1) << attribute;
    }
    int bus0 = -1, bus1 = -1;
    d.device_get_attribute(&bus0, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0);
    d.device_get_attribute(&bus1, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 1);
    EXPECT_NE(bus0, bus1);
    EXPECT_EQ(::write(pipe_fds[1], uuids, sizeof(uuids)), static_cast<ssize_t>(sizeof(uuids)));
  };
  const Env env = {{"KVTIER_FAKECUDA_DEVICE_BYTES", "3GiB"}, {"KVTIER_FAKECUDA_NUMA_ID", "3"}};
  in_child(env, report_uuids);
  in_child(env, report_uuids);
  CUuuid first[2], second[2];
  ASSERT_EQ(::read(pipe_fds[0], first, sizeof(first)), static_cast<ssize_t>(sizeof(first)));
  ASSERT_EQ(::read(pipe_fds[0], second, sizeof(second)), static_cast<ssize_t>(sizeof(second)));
  EXPECT_EQ(std::memcmp(first, second, sizeof(first)), 0) << "UUIDs differ between processes";
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);

  in_child({{"KVTIER_FAKECUDA_DEVICES", "0"}},
           [] { EXPECT_EQ(load_driver().init(0), CUDA_ERROR_NO_DEVICE); });
}

TEST(FakeCudaContexts, CallsThatNeedAContextRefuseWithoutOne) {
  in_child({}, [] {
    FakeDriver d = load_driver();
    ASSERT_EQ(d.init(0), CUDA_SUCCESS);
    CUdeviceptr ptr = 0;
    CUstream stream = nullptr;
    CUevent event = nullptr;
    CUipcMemHandle handle{};
    std::vector<char> host(4096);
    EXPECT_EQ(d.mem_alloc(&ptr, 4096), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(d.stream_create(&stream, CU_STREAM_NON_BLOCKING, 0), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(d.event_create(&event, 0), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(d.mem_host_register(host.data(), host.size(), 0), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(d.ipc_get_mem_handle(&handle, 0x1000), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(d.ipc_open_mem_handle(&ptr, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
              CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(d.ctx_synchronize(), CUDA_ERROR_INVALID_CONTEXT);

    CUcontext context = nullptr;
    ASSERT_EQ(d.primary_ctx_retain(&context, 1), CUDA_SUCCESS);
    ASSERT_EQ(d.ctx_set_current(context), CUDA_SUCCESS);
    CUdevice device = -1;
    EXPECT_EQ(d.ctx_get_device(&device), CUDA_SUCCESS);
    EXPECT_EQ(device, 1);
    int least = 7, greatest = 7;
    EXPECT_EQ(d.ctx_get_stream_priority_range(&least, &greatest), CUDA_SUCCESS);
    EXPECT_EQ(least, 0);
    EXPECT_EQ(greatest, -5);
    ASSERT_EQ(d.mem_alloc(&ptr, 4096), CUDA_SUCCESS);
    // The current context is per thread.
    std::thread([&] {
      CUdeviceptr other = 0;
      EXPECT_EQ(d.mem_alloc(&other, 4096), CUDA_ERROR_INVALID_CONTEXT);
    }).join();
    EXPECT_EQ(d.mem_free(ptr), CUDA_SUCCESS);
    EXPECT_EQ(d.mem_free(ptr), CUDA_ERROR_INVALID_VALUE);  // freed already
    // Released to zero, the context is gone.
    ASSERT_EQ(d.primary_ctx_release(1), CUDA_SUCCESS);
    EXPECT_EQ(d.mem_alloc(&ptr, 4096), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    EXPECT_EQ(d.ctx_set_current(context), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(d.primary_ctx_release(1), CUDA_ERROR_INVALID_CONTEXT);
  });
}

TEST(FakeCudaContexts, ForkedChildCannotReuseTheParentsDriver) {
  in_child({}, [] {
    FakeDriver d = load_with_context();
    const int grandchild = run_child({}, [&d] {
      int count = 0;
      EXPECT_EQ(d.device_get_count(&count), CUDA_ERROR_NOT_INITIALIZED);
      EXPECT_EQ(d.init(0), CUDA_ERROR_NOT_INITIALIZED);
    });
    EXPECT_EQ(grandchild, 0);
  });
}

TEST(FakeCudaStreams, EventsMarkCompletionAndMustShareTheStreamsContext) {
  in_child({{"KVTIER_FAKECUDA_COPY_US_PER_MIB", "100000"}}, [] {
    FakeDriver d = load_with_context(0);
    CUstream stream = nullptr;
    ASSERT_EQ(d.stream_create(&stream, CU_STREAM_NON_BLOCKING, -9), CUDA_SUCCESS);
    CUcontext other = nullptr;
    ASSERT_EQ(d.primary_ctx_retain(&other, 1), CUDA_SUCCESS);
    ASSERT_EQ(d.ctx_set_current(other), CUDA_SUCCESS);
    CUevent foreign = nullptr;
    ASSERT_EQ(d.event_create(&foreign, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    EXPECT_EQ(d.event_record(foreign, stream), CUDA_ERROR_INVALID_HANDLE);
    EXPECT_EQ(d.event_create(&foreign, CU_EVENT_INTERPROCESS), CUDA_ERROR_INVALID_VALUE);

    CUcontext own = nullptr;
    ASSERT_EQ(d.primary_ctx_retain(&own, 0), CUDA_SUCCESS);
    ASSERT_EQ(d.ctx_set_current(own), CUDA_SUCCESS);
    CUevent event = nullptr;
    ASSERT_EQ(d.event_create(&event, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    EXPECT_EQ(d.event_query(event), CUDA_SUCCESS);  // never recorded
    const size_t bytes = 4 << 20;                   // 0.4 s at 100 ms per MiB
    CUdeviceptr device = 0;
    ASSERT_EQ(d.mem_alloc(&device, bytes), CUDA_SUCCESS);
    std::vector<unsigned char> host = pattern(bytes, 1), back(bytes);
    ASSERT_EQ(d.memcpy_async(device, reinterpret_cast<CUdeviceptr>(host.data()), bytes, stream),
              CUDA_SUCCESS);
    ASSERT_EQ(d.event_record(event, stream), CUDA_SUCCESS);
    EXPECT_EQ(d.event_query(event), CUDA_ERROR_NOT_READY);  // still copying
    EXPECT_EQ(d.event_synchronize(event), CUDA_SUCCESS);
    EXPECT_EQ(d.event_query(event), CUDA_SUCCESS);
    ASSERT_EQ(d.memcpy_dtoh(back.data(), device, bytes), CUDA_SUCCESS);
    EXPECT_EQ(host, back);
    EXPECT_EQ(d.event_destroy(event), CUDA_SUCCESS);
    EXPECT_EQ(d.event_query(event), CUDA_ERROR_INVALID_HANDLE);
    EXPECT_EQ(d.stream_destroy(stream), CUDA_SUCCESS);
    EXPECT_EQ(d.stream_synchronize(stream), CUDA_ERROR_INVALID_HANDLE);
  });
}

TEST(FakeCudaCopies, BatchCopyIsStrictAboutStreamsAndAttributes) {
  in_child({}, [] {
    FakeDriver d = load_with_context();
    CUstream stream = nullptr;
    ASSERT_EQ(d.stream_create(&stream, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
    const size_t bytes = 3 * 4096 + 17;
    CUdeviceptr device = 0;
    ASSERT_EQ(d.mem_alloc(&device, bytes), CUDA_SUCCESS);
    std::vector<unsigned char> host = pattern(bytes, 2), back(bytes, 0);
    CUdeviceptr dsts[2] = {device, device + 4096};
    CUdeviceptr srcs[2] = {reinterpret_cast<CUdeviceptr>(host.data()),
                           reinterpret_cast<CUdeviceptr>(host.data() + 4096)};
    size_t sizes[2] = {4096, bytes - 4096};
    CUmemcpyAttributes attrs{};
    attrs.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    size_t index = 0, fail = 0;
    for (CUstream null_stream : {CUstream{}, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD}) {
      EXPECT_EQ(d.memcpy_batch_v13000(dsts, srcs, sizes, 2, &attrs, &index, 1, null_stream),
                CUDA_ERROR_INVALID_VALUE);
      EXPECT_EQ(d.memcpy_batch_v12080(dsts, srcs, sizes, 2, &attrs, &index, 1, &fail, null_stream),
                CUDA_ERROR_INVALID_VALUE);
    }
    size_t bad_index = 1;
    EXPECT_EQ(d.memcpy_batch_v13000(dsts, srcs, sizes, 2, &attrs, &bad_index, 1, stream),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(d.memcpy_batch_v13000(dsts, srcs, sizes, 2, &attrs, &index, 0, stream),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(d.memcpy_batch_v13000(dsts, srcs, sizes, 0, &attrs, &index, 1, stream),
              CUDA_ERROR_INVALID_VALUE);
    CUmemcpyAttributes unordered{};  // srcAccessOrder INVALID
    EXPECT_EQ(d.memcpy_batch_v13000(dsts, srcs, sizes, 2, &unordered, &index, 1, stream),
              CUDA_ERROR_INVALID_VALUE);
    // One byte past the allocation: refused at enqueue, failIdx names the copy.
    sizes[1] += 1;
    EXPECT_EQ(d.memcpy_batch_v12080(dsts, srcs, sizes, 2, &attrs, &index, 1, &fail, stream),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(fail, 1u);
    sizes[1] -= 1;
    ASSERT_EQ(d.memcpy_batch_v12080(dsts, srcs, sizes, 2, &attrs, &index, 1, &fail, stream),
              CUDA_SUCCESS);
    ASSERT_EQ(d.stream_synchronize(stream), CUDA_SUCCESS);
    ASSERT_EQ(d.memcpy_dtoh(back.data(), device, bytes), CUDA_SUCCESS);
    EXPECT_EQ(host, back);
    // Sources read during the call may change right after it.
    std::vector<unsigned char> ephemeral = pattern(4096, 3), expected = ephemeral;
    CUdeviceptr src = reinterpret_cast<CUdeviceptr>(ephemeral.data());
    size_t size = 4096;
    attrs.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL;
    ASSERT_EQ(d.memcpy_batch_v13000(&device, &src, &size, 1, &attrs, &index, 1, stream),
              CUDA_SUCCESS);
    std::fill(ephemeral.begin(), ephemeral.end(), 0);
    ASSERT_EQ(d.stream_synchronize(stream), CUDA_SUCCESS);
    ASSERT_EQ(d.memcpy_dtoh(back.data(), device, 4096), CUDA_SUCCESS);
    EXPECT_TRUE(std::equal(expected.begin(), expected.end(), back.begin()));
    // cuMemcpyAsync takes the NULL stream, but not a range past the end.
    EXPECT_EQ(d.memcpy_async(device + 8, srcs[0], bytes, nullptr), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(d.memcpy_async(device, srcs[0], bytes, nullptr), CUDA_SUCCESS);
    EXPECT_EQ(d.stream_synchronize(nullptr), CUDA_SUCCESS);
  });
}

TEST(FakeCudaFaults, FaultFileBreaksTheContextForGood) {
  const std::string fault_file =
      ::testing::TempDir() + "fakecuda_fault_" + std::to_string(::getpid());
  std::filesystem::remove(fault_file);
  in_child({{"KVTIER_FAKECUDA_FAULT_FILE", fault_file}}, [&] {
    FakeDriver d = load_with_context(0);
    CUstream stream = nullptr;
    CUevent event = nullptr;
    ASSERT_EQ(d.stream_create(&stream, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
    ASSERT_EQ(d.event_create(&event, 0), CUDA_SUCCESS);
    CUdeviceptr device = 0;
    ASSERT_EQ(d.mem_alloc(&device, 65536), CUDA_SUCCESS);
    std::vector<unsigned char> host = pattern(65536, 4);
    const auto src = reinterpret_cast<CUdeviceptr>(host.data());
    ASSERT_EQ(d.memcpy_async(device, src, 65536, stream), CUDA_SUCCESS);
    ASSERT_EQ(d.event_record(event, stream), CUDA_SUCCESS);
    ASSERT_EQ(d.stream_synchronize(stream), CUDA_SUCCESS);

    std::fclose(std::fopen(fault_file.c_str(), "w"));
    ASSERT_EQ(d.memcpy_async(device, src, 65536, stream), CUDA_SUCCESS);  // enqueued
    EXPECT_EQ(d.stream_synchronize(stream), CUDA_ERROR_ILLEGAL_ADDRESS);
    std::filesystem::remove(fault_file);  // sticky: removing the cause heals nothing
    CUdeviceptr more = 0;
    CUstream another = nullptr;
    std::vector<unsigned char> back(16);
    EXPECT_EQ(d.event_synchronize(event), CUDA_ERROR_ILLEGAL_ADDRESS);
    EXPECT_EQ(d.event_query(event), CUDA_ERROR_ILLEGAL_ADDRESS);
    EXPECT_EQ(d.mem_alloc(&more, 4096), CUDA_ERROR_ILLEGAL_ADDRESS);
    EXPECT_EQ(d.stream_create(&another, 0, 0), CUDA_ERROR_ILLEGAL_ADDRESS);
    EXPECT_EQ(d.memcpy_dtoh(back.data(), device, back.size()), CUDA_ERROR_ILLEGAL_ADDRESS);
    EXPECT_EQ(d.memcpy_async(device, src, 16, stream), CUDA_ERROR_ILLEGAL_ADDRESS);
    EXPECT_EQ(d.ctx_synchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
    EXPECT_EQ(d.mem_free(device), CUDA_ERROR_ILLEGAL_ADDRESS);
    EXPECT_EQ(d.stream_destroy(stream), CUDA_ERROR_ILLEGAL_ADDRESS);
    // Another device's context is not affected.
    CUcontext other = nullptr;
    ASSERT_EQ(d.primary_ctx_retain(&other, 1), CUDA_SUCCESS);
    ASSERT_EQ(d.ctx_set_current(other), CUDA_SUCCESS);
    EXPECT_EQ(d.mem_alloc(&more, 4096), CUDA_SUCCESS);
  });
  std::filesystem::remove(fault_file);
}

}  // namespace
}  // namespace kvtier::fakecuda::testing
