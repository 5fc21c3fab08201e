#include "device/page_fill.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/units.h"

// Linux 5.14; older C libraries lack the name.
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace kvtier {
namespace {

// Large enough that a thread spends its time in the kernel's fault path rather than
// on the cursor, small enough that 2 threads split even a 1 GiB pool evenly and a
// stop request is seen within a few milliseconds.
constexpr uint64_t kFillChunkBytes = 64ull << 20;

}  // namespace

uint64_t available_memory_bytes() {
  uint64_t available = UINT64_MAX;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") {
      available = kib * 1024;
      break;
    }
  }
  std::ifstream max_file("/sys/fs/cgroup/memory.max"),
      current_file("/sys/fs/cgroup/memory.current");
  std::string max_text;
  uint64_t current = 0;
  if (max_file >> max_text && max_text != "max" && current_file >> current) {
    const uint64_t limit = std::stoull(max_text);
    available = std::min(available, limit > current ? limit - current : 0);
  }
  return available;
}

Status check_memory_available(uint64_t bytes, std::string_view what, std::string_view setting) {
  const uint64_t available = available_memory_bytes();
  if (bytes <= available) return Status::ok();
  // Not retryable: a configuration to change, not a moment to wait out.
  return resource_exhausted(
             "{}: {} requested but only {} of memory is available (MemAvailable, cgroup "
             "memory.max); lower {}",
             what, format_bytes(bytes), format_bytes(available), setting)
      .with_retryable(false);
}

Result<std::byte*> map_pool_memory(uint64_t bytes, std::string_view what) {
  if (bytes == 0) return invalid_argument("{}: bytes is 0", what);
  // Not MAP_POPULATE: it would fault 4 KiB pages before MADV_HUGEPAGE could take
  // effect, on one thread, and it ignores allocation failures.
  void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) {
    return errno_status(errno, fmt::format("mmap {} of {} bytes", what, bytes));
  }
  // A hint (THP may be disabled): one fault per 2 MiB instead of 512.
  (void)::madvise(mapped, bytes, MADV_HUGEPAGE);
  return static_cast<std::byte*>(mapped);
}

Status fill_pages(std::byte* data, uint64_t bytes, int threads, std::stop_token stop) {
  const uint64_t chunks = (bytes + kFillChunkBytes - 1) / kFillChunkBytes;
  const int thread_count = static_cast<int>(std::clamp<uint64_t>(
      static_cast<uint64_t>(std::max(threads, 1)), 1, std::max<uint64_t>(chunks, 1)));
  std::atomic<uint64_t> next_chunk{0};
  std::atomic<int> first_error{0};
  const long page_bytes = ::sysconf(_SC_PAGESIZE);
  auto fill = [&] {
    for (;;) {
      if (first_error.load(std::memory_order_relaxed) != 0 || stop.stop_requested()) return;
      const uint64_t chunk = next_chunk.fetch_add(1, std::memory_order_relaxed);
      if (chunk >= chunks) return;
      const uint64_t begin = chunk * kFillChunkBytes;
      const uint64_t length = std::min(kFillChunkBytes, bytes - begin);
      if (::madvise(data + begin, length, MADV_POPULATE_WRITE) == 0) continue;
      const int err = errno;
      if (err != EINVAL) {  // ENOMEM, EFAULT, EHWPOISON: the memory cannot be had
        int expected = 0;
        first_error.compare_exchange_strong(expected, err);
        return;
      }
      // EINVAL: a kernel older than 5.14. A touch per page faults the same pages in
      // (a failure here is SIGBUS, as with MAP_POPULATE; the size check came first).
      for (uint64_t offset = 0; offset < length; offset += static_cast<uint64_t>(page_bytes)) {
        static_cast<volatile std::byte*>(data + begin)[offset] = std::byte{0};
      }
    }
  };
  std::vector<std::thread> helpers;
  helpers.reserve(static_cast<size_t>(thread_count - 1));
  for (int t = 1; t < thread_count; ++t) helpers.emplace_back(fill);
  fill();  // the calling thread is one of the fillers
  for (std::thread& helper : helpers) helper.join();
  if (const int err = first_error.load(); err != 0) {
    return errno_status(err, fmt::format("faulting in {} of memory", format_bytes(bytes)));
  }
  if (stop.stop_requested()) return unavailable("stopped before the memory was filled");
  return Status::ok();
}

int default_fill_threads() {
  const unsigned cpus = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp(cpus, 2u, 16u));
}

}  // namespace kvtier
