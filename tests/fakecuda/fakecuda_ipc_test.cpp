// The fake driver across processes: legacy IPC handles, VMM POSIX fds, orphaned imports.
#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "tests/fakecuda/fakecuda_test_util.h"

namespace kvtier::fakecuda::testing {
namespace {

constexpr size_t kTwoMiB = size_t{2} << 20;

struct SocketPair {
  SocketPair() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0); }
  ~SocketPair() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  int fds[2] = {-1, -1};
};

void send_byte(int socket, char byte) {
  EXPECT_TRUE(send_message(socket, &byte, 1));
}

void expect_byte(int socket, char expected) {
  char byte = 0;
  EXPECT_TRUE(receive_message(socket, &byte, 1));
  EXPECT_EQ(byte, expected);
}

// Gone or a zombie: what the fake counts as an exporter that no longer exists.
bool process_gone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t name_end = line.rfind(')');
  return name_end == std::string::npos || line.compare(name_end, 3, ") Z") == 0;
}

TEST(FakeCudaIpc, LegacyHandleCrossesProcessesBitExact) {
  SocketPair link;
  const size_t bytes = (3 << 20) + 123;
  const pid_t exporter = start_child({}, [&] {
    const int socket = link.fds[0];
    FakeDriver d = load_with_context(1);
    CUdeviceptr device = 0;
    ASSERT_EQ(d.mem_alloc(&device, bytes), CUDA_SUCCESS);
    const std::vector<unsigned char> original = pattern(bytes, 7);
    ASSERT_EQ(d.memcpy_htod(device, original.data(), bytes), CUDA_SUCCESS);
    CUipcMemHandle handle{};
    ASSERT_EQ(d.ipc_get_mem_handle(&handle, device + 4096), CUDA_SUCCESS);  // interior
    CUdeviceptr self = 0;
    EXPECT_EQ(d.ipc_open_mem_handle(&self, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
              CUDA_ERROR_INVALID_CONTEXT);  // not in the exporting process
    ASSERT_TRUE(send_message(socket, &handle, sizeof(handle)));
    expect_byte(socket, 'W');  // the importer wrote through its mapping
    std::vector<unsigned char> back(bytes);
    ASSERT_EQ(d.memcpy_dtoh(back.data(), device, bytes), CUDA_SUCCESS);
    const std::vector<unsigned char> written = pattern(4096, 8);
    EXPECT_TRUE(std::equal(written.begin(), written.end(), back.begin()));
    EXPECT_TRUE(std::equal(original.begin() + 4096, original.end(), back.begin() + 4096));
    send_byte(socket, 'X');
    expect_byte(socket, 'Q');
    EXPECT_EQ(d.mem_free(device), CUDA_SUCCESS);
  });
  const pid_t importer = start_child({}, [&] {
    const int socket = link.fds[1];
    FakeDriver d = load_with_context(0);  // the memory lives on device 1
    CUipcMemHandle handle{};
    ASSERT_TRUE(receive_message(socket, &handle, sizeof(handle)));
    CUdeviceptr imported = 0;
    EXPECT_EQ(d.ipc_open_mem_handle(&imported, handle, 0), CUDA_ERROR_INVALID_VALUE);
    ASSERT_EQ(d.ipc_open_mem_handle(&imported, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
              CUDA_SUCCESS);
    CUdeviceptr base = 0;
    size_t size = 0;
    ASSERT_EQ(d.mem_get_address_range(&base, &size, imported + 100), CUDA_SUCCESS);
    EXPECT_EQ(base, imported);  // the allocation's base, though the handle came from +4096
    EXPECT_EQ(size, bytes);
    int ordinal = -1;
    EXPECT_EQ(d.pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, imported),
              CUDA_SUCCESS);
    EXPECT_EQ(ordinal, 1);
    std::vector<unsigned char> back(bytes);
    ASSERT_EQ(d.memcpy_dtoh(back.data(), imported, bytes), CUDA_SUCCESS);
    EXPECT_EQ(back, pattern(bytes, 7));
    const std::string memfd = "kvtier-fakecuda:pid=" + std::to_string(exporter) + ":alloc=";
    EXPECT_TRUE(maps_contain(memfd));
    CUdeviceptr again = 0;
    ASSERT_EQ(d.ipc_open_mem_handle(&again, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
              CUDA_SUCCESS);
    EXPECT_EQ(again, imported);  // reference counted
    EXPECT_EQ(d.ipc_close_mem_handle(again), CUDA_SUCCESS);
    EXPECT_TRUE(maps_contain(memfd));

    const std::vector<unsigned char> written = pattern(4096, 8);
    ASSERT_EQ(d.memcpy_htod(imported, written.data(), written.size()), CUDA_SUCCESS);
    send_byte(socket, 'W');
    expect_byte(socket, 'X');
    CUipcMemHandle garbage = handle;
    garbage.reserved[20] ^= 1;
    EXPECT_EQ(d.ipc_open_mem_handle(&again, garbage, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(d.ipc_close_mem_handle(imported + 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(d.ipc_close_mem_handle(imported), CUDA_SUCCESS);
    EXPECT_FALSE(maps_contain(memfd));
    EXPECT_EQ(d.ipc_close_mem_handle(imported), CUDA_ERROR_INVALID_VALUE);
    send_byte(socket, 'Q');
  });
  EXPECT_EQ(wait_child(importer), 0);
  EXPECT_EQ(wait_child(exporter), 0);
}

TEST(FakeCudaIpc, VmmFdCrossesProcessesBitExact) {
  SocketPair link;
  const size_t bytes = 2 * kTwoMiB;
  const pid_t exporter = start_child({}, [&] {
    const int socket = link.fds[0];
    FakeDriver d = load_with_context(0);
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 1;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemGenericAllocationHandle handle = 0;
    ASSERT_EQ(d.mem_create(&handle, bytes, &prop, 0), CUDA_SUCCESS);
    CUdeviceptr address = 0;
    ASSERT_EQ(d.address_reserve(&address, bytes, 0, 0, 0), CUDA_SUCCESS);
    ASSERT_EQ(d.mem_map(address, bytes, 0, handle, 0), CUDA_SUCCESS);
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = 0;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    ASSERT_EQ(d.mem_set_access(address, bytes, &access, 1), CUDA_SUCCESS);
    ASSERT_EQ(d.memcpy_htod(address, pattern(bytes, 9).data(), bytes), CUDA_SUCCESS);
    int fd = -1;
    ASSERT_EQ(d.mem_export(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_SUCCESS);
    ASSERT_TRUE(send_message(socket, &bytes, sizeof(bytes), fd));
    ::close(fd);
    expect_byte(socket, 'W');
    std::vector<unsigned char> back(4096);
    ASSERT_EQ(d.memcpy_dtoh(back.data(), address + kTwoMiB, back.size()), CUDA_SUCCESS);
    EXPECT_EQ(back, pattern(4096, 10));  // the importer's write, at the second chunk
    send_byte(socket, 'X');
  });
  const pid_t importer = start_child({}, [&] {
    const int socket = link.fds[1];
    FakeDriver d = load_with_context(0);
    size_t size = 0;
    int fd = -1;
    ASSERT_TRUE(receive_message(socket, &size, sizeof(size), &fd));
    int pipe_fds[2];
    ASSERT_EQ(::pipe(pipe_fds), 0);
    CUmemGenericAllocationHandle handle = 0;
    EXPECT_EQ(d.mem_import(&handle, reinterpret_cast<void*>(static_cast<uintptr_t>(pipe_fds[0])),
                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
              CUDA_ERROR_INVALID_VALUE);  // not fake device memory
    ASSERT_EQ(d.mem_import(&handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
              CUDA_SUCCESS);
    ::close(fd);  // the handle keeps its own reference
    CUmemAllocationProp prop{};
    ASSERT_EQ(d.mem_properties(&prop, handle), CUDA_SUCCESS);
    EXPECT_EQ(prop.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
    EXPECT_EQ(prop.location.id, 1);
    CUdeviceptr address = 0;
    ASSERT_EQ(d.address_reserve(&address, size, kTwoMiB, 0, 0), CUDA_SUCCESS);
    // Mapped chunk by chunk, as PyTorch's expandable segments are.
    ASSERT_EQ(d.mem_map(address, kTwoMiB, 0, handle, 0), CUDA_SUCCESS);
    ASSERT_EQ(d.mem_map(address + kTwoMiB, kTwoMiB, 0, handle, 0), CUDA_SUCCESS);
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = 0;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    ASSERT_EQ(d.mem_set_access(address, size, &access, 1), CUDA_SUCCESS);
    EXPECT_TRUE(maps_contain(":vmm="));
    // Both chunks map the allocation's first 2 MiB; a copy may span the two mappings.
    std::vector<unsigned char> back(size);
    ASSERT_EQ(d.memcpy_dtoh(back.data(), address, size), CUDA_SUCCESS);
    const std::vector<unsigned char> expected = pattern(bytes, 9);
    EXPECT_TRUE(std::equal(expected.begin(), expected.begin() + kTwoMiB, back.begin()));
    EXPECT_TRUE(std::equal(expected.begin(), expected.begin() + kTwoMiB, back.begin() + kTwoMiB));
    CUdeviceptr base = 0;
    size_t range = 0;
    ASSERT_EQ(d.mem_get_address_range(&base, &range, address + kTwoMiB + 5), CUDA_SUCCESS);
    EXPECT_EQ(base, address + kTwoMiB);
    EXPECT_EQ(range, kTwoMiB);
    ASSERT_EQ(d.mem_unmap(address + kTwoMiB, kTwoMiB), CUDA_SUCCESS);
    ASSERT_EQ(d.mem_unmap(address, kTwoMiB), CUDA_SUCCESS);
    ASSERT_EQ(d.mem_map(address, size, 0, handle, 0), CUDA_SUCCESS);
    ASSERT_EQ(d.mem_set_access(address, size, &access, 1), CUDA_SUCCESS);
    ASSERT_EQ(d.memcpy_htod(address + kTwoMiB, pattern(4096, 10).data(), 4096), CUDA_SUCCESS);
    send_byte(socket, 'W');
    expect_byte(socket, 'X');
    EXPECT_EQ(d.mem_release(handle), CUDA_SUCCESS);
    EXPECT_EQ(d.mem_unmap(address, size), CUDA_SUCCESS);
    EXPECT_FALSE(maps_contain(":vmm="));
    EXPECT_EQ(d.address_free(address, size), CUDA_SUCCESS);
  });
  EXPECT_EQ(wait_child(importer), 0);
  EXPECT_EQ(wait_child(exporter), 0);
}

// A copy from memory whose exporter exited: undefined on a real GPU, a sticky fault with
// KVTIER_FAKECUDA_POISON_ORPHANS=1, a plain copy of the last bytes otherwise.
void orphan_scenario(bool poison) {
  SocketPair link;
  const size_t bytes = 1 << 20;
  const Env env = {{"KVTIER_FAKECUDA_POISON_ORPHANS", poison ? "1" : "0"}};
  const pid_t exporter = start_child(env, [&] {
    FakeDriver d = load_with_context(0);
    CUdeviceptr device = 0;
    ASSERT_EQ(d.mem_alloc(&device, bytes), CUDA_SUCCESS);
    ASSERT_EQ(d.memcpy_htod(device, pattern(bytes, 11).data(), bytes), CUDA_SUCCESS);
    CUipcMemHandle handle{};
    ASSERT_EQ(d.ipc_get_mem_handle(&handle, device), CUDA_SUCCESS);
    ASSERT_TRUE(send_message(link.fds[0], &handle, sizeof(handle)));
    expect_byte(link.fds[0], 'O');  // then exit without freeing, like a crashed engine
  });
  const pid_t importer = start_child(env, [&] {
    FakeDriver d = load_with_context(0);
    CUipcMemHandle handle{};
    ASSERT_TRUE(receive_message(link.fds[1], &handle, sizeof(handle)));
    CUdeviceptr imported = 0;
    ASSERT_EQ(d.ipc_open_mem_handle(&imported, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
              CUDA_SUCCESS);
    CUstream stream = nullptr;
    ASSERT_EQ(d.stream_create(&stream, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
    std::vector<unsigned char> back(bytes);
    const auto host = reinterpret_cast<CUdeviceptr>(back.data());
    ASSERT_EQ(d.memcpy_async(host, imported, bytes, stream), CUDA_SUCCESS);
    ASSERT_EQ(d.stream_synchronize(stream), CUDA_SUCCESS);
    EXPECT_EQ(back, pattern(bytes, 11));
    send_byte(link.fds[1], 'O');
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!process_gone(exporter) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(process_gone(exporter));
    ASSERT_EQ(d.memcpy_async(host, imported, bytes, stream), CUDA_SUCCESS);
    CUdeviceptr more = 0;
    if (poison) {
      EXPECT_EQ(d.stream_synchronize(stream), CUDA_ERROR_ILLEGAL_ADDRESS);
      EXPECT_EQ(d.mem_alloc(&more, 4096), CUDA_ERROR_ILLEGAL_ADDRESS);
    } else {
      EXPECT_EQ(d.stream_synchronize(stream), CUDA_SUCCESS);
      EXPECT_EQ(back, pattern(bytes, 11));
      EXPECT_EQ(d.mem_alloc(&more, 4096), CUDA_SUCCESS);
    }
  });
  EXPECT_EQ(wait_child(exporter), 0);
  EXPECT_EQ(wait_child(importer), 0);
}

TEST(FakeCudaIpc, OrphanedImportIsPoisonedOnlyWhenAsked) {
  orphan_scenario(true);
  orphan_scenario(false);
}

}  // namespace
}  // namespace kvtier::fakecuda::testing
