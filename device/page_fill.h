// Faulting in tier memory: the daemon's RAM pool and (on the host backend) its "HBM"
// arena are anonymous memory whose pages are all touched at start-up, so that no copy
// ever pays for a page fault and an allocation the machine cannot back fails at once
// with ENOMEM instead of meeting the OOM killer in the middle of a copy.
//
// Used by both backends (HostDevice, the CUDA pinned pool) and by the daemon's start-up
// (daemon/startup_gate.h).
//
// Thread-safety: free functions; fill_pages runs its own threads and returns after
// they are joined.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stop_token>

#include "common/status.h"

namespace kvtier {

// What this process may still take: the machine's MemAvailable, and the cgroup's
// headroom where a memory.max is set (UINT64_MAX when neither says).
uint64_t available_memory_bytes();

// ResourceExhausted naming `what` when `bytes` is more than available_memory_bytes():
// faulting in more than that gets the daemon (or a neighbour) OOM-killed instead of
// an error, so every pool asks first.
Status check_memory_available(uint64_t bytes, std::string_view what, std::string_view setting);

// Anonymous private memory for a pool: mmap'ed and hinted for transparent huge pages,
// not yet faulted in. ResourceExhausted (or the mmap errno) when it cannot be had.
Result<std::byte*> map_pool_memory(uint64_t bytes, std::string_view what);

// Faults [data, data + bytes) in for writing on `threads` threads that take 64 MiB
// chunks from a shared cursor (MADV_POPULATE_WRITE; a touch per page on kernels older
// than 5.14). The first failure (ENOMEM) is returned and stops the others; so does
// `stop` (Cancelled-like Unavailable "stopped"), checked between chunks.
Status fill_pages(std::byte* data, uint64_t bytes, int threads, std::stop_token stop = {});

// Threads worth using to fault memory in on this machine: every CPU, 2 to 16.
int default_fill_threads();

}  // namespace kvtier
