#include "client/memfd_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace kvtier {

Result<MemfdRegion> MemfdRegion::create(const std::string& name, uint64_t size_bytes) {
  if (size_bytes == 0) return invalid_argument("region size must be positive");
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return errno_status(errno, "memfd_create");
  if (::ftruncate(fd.get(), static_cast<off_t>(size_bytes)) != 0) {
    return errno_status(errno, "ftruncate memfd");
  }
  // The size is fixed from here on: sealing it tells the daemon it can map it safely.
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    return errno_status(errno, "seal memfd");
  }
  void* data =
      ::mmap(nullptr, size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  if (data == MAP_FAILED) return errno_status(errno, "mmap memfd");
  return MemfdRegion(std::move(fd), static_cast<std::byte*>(data), size_bytes);
}

MemfdRegion::MemfdRegion(MemfdRegion&& other) noexcept
    : fd_(std::move(other.fd_)),
      data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)) {}

MemfdRegion& MemfdRegion::operator=(MemfdRegion&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(data_, size_bytes_);
    fd_ = std::move(other.fd_);
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

MemfdRegion::~MemfdRegion() {
  if (data_ != nullptr) ::munmap(data_, size_bytes_);
}

}  // namespace kvtier
