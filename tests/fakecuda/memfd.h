// The memfds behind fake device memory, and what the fake knows about other processes.
//
// A memfd is named "kvtier-fakecuda:pid=<creator>:<kind>=<id>:dev=<ordinal>", where kind
// is "alloc" (cuMemAlloc) or "vmm" (cuMemCreate). The name is how an importer checks that
// an fd really is fake device memory, and how tests find mappings in /proc/<pid>/maps.
// Its size is sealed, so an importer can trust fstat.
//
// Thread-safety: free functions without shared state.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string_view>

#include "common/unique_fd.h"

namespace kvtier::fakecuda {

struct MemfdName {
  pid_t creator_pid = 0;
  std::string_view kind;  // "alloc" or "vmm" (static storage)
  uint64_t id = 0;
  int device = 0;
};

constexpr std::string_view kAllocKind = "alloc";
constexpr std::string_view kVmmKind = "vmm";

// A sealed memfd of round_up(bytes, page) bytes, named for this process; invalid on
// failure (errno set).
UniqueFd create_device_memfd(std::string_view kind, uint64_t id, int device, uint64_t bytes);

// What `fd` (an fd of this process) is, when it is a fake device memfd.
std::optional<MemfdName> memfd_name(int fd);

// The size of the file behind `fd`, or nullopt.
std::optional<uint64_t> file_bytes(int fd);

// The start time (clock ticks after boot) of a live process, or nullopt when it does not
// exist or is a zombie. Start times tell a process from a later one with the same pid.
std::optional<uint64_t> process_start_time(pid_t pid);

// This process's start time (cached).
uint64_t own_start_time();

}  // namespace kvtier::fakecuda
