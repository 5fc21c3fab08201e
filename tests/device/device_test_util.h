// Helpers shared by the Device tests: memfd regions as an engine would create them,
// deterministic byte patterns, and submit wrappers that turn `done` into a future.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <span>

#include <gtest/gtest.h>

#include "common/status.h"
#include "common/unique_fd.h"
#include "device/device.h"

namespace kvtier::testing {

// A memfd of `bytes` bytes, the way an engine shares its KV region.
inline UniqueFd make_memfd(uint64_t bytes, unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING) {
  UniqueFd fd(::memfd_create("kvtier-test", flags));
  EXPECT_TRUE(fd.valid()) << "memfd_create failed";
  EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(bytes)), 0);
  return fd;
}

// A handle carrying a duplicate of `fd`, as SCM_RIGHTS would deliver it.
inline RegionHandle memfd_handle(const UniqueFd& fd, uint64_t size_bytes) {
  RegionHandle handle;
  handle.kind = RegionHandle::Kind::kMemfd;
  handle.size_bytes = size_bytes;
  handle.fd = UniqueFd(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
  return handle;
}

inline void fill_random(std::span<std::byte> bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    const uint64_t word = rng();
    std::memcpy(bytes.data() + i, &word, 8);
  }
  for (; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(rng());
}

inline std::span<std::byte> bytes_of(Memory& memory) {
  return {memory.host_data(), static_cast<size_t>(memory.size_bytes())};
}

// Submits `batch`; the future resolves with the status `done` received. A second call
// of `done` would throw std::future_error on the worker and abort the test binary.
inline std::future<Status> submit_async(Device& device, CopyBatch batch) {
  auto promise = std::make_shared<std::promise<Status>>();
  std::future<Status> future = promise->get_future();
  Status submitted =
      device.submit(std::move(batch), [promise](Status s) { promise->set_value(std::move(s)); });
  EXPECT_TRUE(submitted.is_ok()) << submitted.to_string();
  if (!submitted.is_ok()) promise->set_value(submitted);
  return future;
}

// A one-shot latch for holding a worker thread inside a completion callback.
class Gate {
 public:
  void open() { promise_.set_value(); }
  void wait() const { future_.wait(); }

 private:
  std::promise<void> promise_;
  std::shared_future<void> future_ = promise_.get_future().share();
};

}  // namespace kvtier::testing
