// Helpers for the NVMe tier tests: a temporary directory, page-aligned buffers, and
// blocking wrappers around NvmeTier's asynchronous calls.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tiers/nvme_tier.h"

namespace kvtier::nvme_test {

class TempDir {
 public:
  explicit TempDir(const char* base = "/tmp") {
    std::string pattern = std::string(base) + "/kvtier-nvme-XXXXXX";
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    if (::mkdtemp(buffer.data()) != nullptr) path_ = buffer.data();
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }
  bool ok() const { return !path_.empty(); }

 private:
  std::string path_;
};

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};

// `bytes` of page-aligned memory, filled with a pattern derived from `seed`.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t bytes, uint8_t seed = 0)
      : bytes_(bytes), data_(static_cast<std::byte*>(std::aligned_alloc(4096, bytes))) {
    for (size_t i = 0; i < bytes; ++i)
      data_.get()[i] = std::byte(static_cast<uint8_t>(i * 7 + seed));
  }
  std::byte* data() const { return data_.get(); }
  size_t size() const { return bytes_; }
  std::span<std::byte> span() const { return {data_.get(), bytes_}; }

 private:
  size_t bytes_;
  std::unique_ptr<std::byte, FreeDeleter> data_;
};

inline NvmeBlockKey block_key(uint32_t n, const std::string& ns = "uid:1000") {
  const uint8_t bytes[4] = {static_cast<uint8_t>(n), static_cast<uint8_t>(n >> 8),
                            static_cast<uint8_t>(n >> 16), static_cast<uint8_t>(n >> 24)};
  return NvmeBlockKey{ns, 0x1234, BlockHash(bytes)};
}

inline std::vector<Status> write_now(NvmeTier& tier, std::vector<NvmeTier::WriteItem> items) {
  std::promise<std::vector<Status>> done;
  auto future = done.get_future();
  tier.write_blocks(std::move(items),
                    [&done](std::vector<Status> results) { done.set_value(std::move(results)); });
  return future.get();
}

inline std::vector<NvmeTier::ReadOutcome> read_now(NvmeTier& tier,
                                                   std::vector<NvmeTier::ReadItem> items) {
  std::promise<std::vector<NvmeTier::ReadOutcome>> done;
  auto future = done.get_future();
  tier.read_blocks(std::move(items), [&done](std::vector<NvmeTier::ReadOutcome> outcomes) {
    done.set_value(std::move(outcomes));
  });
  return future.get();
}

inline Status release_now(NvmeTier& tier, std::vector<std::pair<NvmeBlockKey, uint64_t>> slots) {
  std::promise<Status> done;
  auto future = done.get_future();
  tier.release_blocks(std::move(slots), [&done](Status status) { done.set_value(status); });
  return future.get();
}

}  // namespace kvtier::nvme_test
