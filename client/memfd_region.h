// MemfdRegion: a piece of shared memory an engine can register with kvtierd on the
// host backend (memfd_create + mmap). Owns the fd and the mapping; move-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"
#include "common/unique_fd.h"

namespace kvtier {

class MemfdRegion {
 public:
  static Result<MemfdRegion> create(const std::string& name, uint64_t size_bytes);

  MemfdRegion(MemfdRegion&& other) noexcept;
  MemfdRegion& operator=(MemfdRegion&& other) noexcept;
  MemfdRegion(const MemfdRegion&) = delete;
  MemfdRegion& operator=(const MemfdRegion&) = delete;
  ~MemfdRegion();

  std::byte* data() const { return data_; }
  uint64_t size_bytes() const { return size_bytes_; }
  int fd() const { return fd_.get(); }

 private:
  MemfdRegion(UniqueFd fd, std::byte* data, uint64_t size_bytes)
      : fd_(std::move(fd)), data_(data), size_bytes_(size_bytes) {}
  UniqueFd fd_;
  std::byte* data_ = nullptr;
  uint64_t size_bytes_ = 0;
};

}  // namespace kvtier
