#include "tests/fakecuda/memfd.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>

#include "tests/fakecuda/fake_cuda.h"

namespace kvtier::fakecuda {

UniqueFd create_device_memfd(std::string_view kind, uint64_t id, int device, uint64_t bytes) {
  char name[128];
  std::snprintf(name, sizeof(name), "kvtier-fakecuda:pid=%d:%.*s=%" PRIu64 ":dev=%d",
                static_cast<int>(::getpid()), static_cast<int>(kind.size()), kind.data(), id,
                device);
  UniqueFd fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return fd;
  // Sealing the size lets an importer trust fstat: nobody can shrink the file under its
  // mapping, which would turn a copy into SIGBUS instead of a CUDA error.
  if (::ftruncate(fd.get(), static_cast<off_t>(round_up(bytes, page_bytes()))) != 0 ||
      ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const int saved = errno;
    fd.reset();
    errno = saved;
  }
  return fd;
}

std::optional<MemfdName> memfd_name(int fd) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  char link[256];
  const ssize_t length = ::readlink(path, link, sizeof(link) - 1);
  if (length <= 0) return std::nullopt;
  link[length] = '\0';
  int pid = 0, device = 0, consumed = 0;
  char kind[16] = {};
  unsigned long long id = 0;
  if (std::sscanf(link, "/memfd:kvtier-fakecuda:pid=%d:%15[a-z]=%llu:dev=%d%n", &pid, kind, &id,
                  &device, &consumed) != 4) {
    return std::nullopt;
  }
  // What follows the name can only be the kernel's " (deleted)".
  if (std::strcmp(link + consumed, " (deleted)") != 0 && link[consumed] != '\0') {
    return std::nullopt;
  }
  MemfdName name;
  name.creator_pid = pid;
  name.id = id;
  name.device = device;
  if (kind == kAllocKind) {
    name.kind = kAllocKind;
  } else if (kind == kVmmKind) {
    name.kind = kVmmKind;
  } else {
    return std::nullopt;
  }
  return name;
}

std::optional<uint64_t> file_bytes(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::nullopt;
  return static_cast<uint64_t>(st.st_size);
}

std::optional<uint64_t> process_start_time(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* file = std::fopen(path, "re");
  if (file == nullptr) return std::nullopt;
  char buffer[1024];
  const size_t length = std::fread(buffer, 1, sizeof(buffer) - 1, file);
  std::fclose(file);
  buffer[length] = '\0';
  // The command name (field 2) may hold spaces and parentheses; the fields after the
  // last ')' are fixed: state is field 3, starttime field 22.
  const char* after_name = std::strrchr(buffer, ')');
  if (after_name == nullptr) return std::nullopt;
  char state = 0;
  unsigned long long start = 0;
  if (std::sscanf(after_name + 1,
                  " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d "
                  "%llu",
                  &state, &start) != 2) {
    return std::nullopt;
  }
  if (state == 'Z' || state == 'X' || state == 'x') return std::nullopt;
  return start;
}

uint64_t own_start_time() {
  // Not cached across fork: a child has its own start time.
  static std::atomic<pid_t> cached_pid{0};
  static std::atomic<uint64_t> cached_start{0};
  const pid_t pid = ::getpid();
  if (cached_pid.load(std::memory_order_acquire) != pid) {
    cached_start.store(process_start_time(pid).value_or(0), std::memory_order_relaxed);
    cached_pid.store(pid, std::memory_order_release);
  }
  return cached_start.load(std::memory_order_relaxed);
}

}  // namespace kvtier::fakecuda
