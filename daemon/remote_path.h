// The remote tier's state inside the Service (remote_path.cpp): the worker that owns
// the Redis Cluster connections, and how far each session has been written there.
// Control thread only, like the rest of the Service.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>

#include "daemon/service.h"
#include "policy/session_table.h"
#include "tiers/remote_worker.h"

namespace kvtier::daemon {

struct Service::RemoteState {
  std::unique_ptr<remote::RemoteWorker> worker;
  // Per session: its first `synced` blocks were handed to the worker (lowered again to
  // the first that failed when a write-behind reports failures).
  std::unordered_map<policy::SessionKey, uint32_t, policy::SessionKeyHasher> synced;
  uint64_t written_blocks = 0;   // written behind, confirmed
  uint64_t failed_blocks = 0;    // written behind, refused or unreachable
  uint64_t deferred_blocks = 0;  // not in host memory at the end of their turn (GPU, NVMe)
  uint64_t declined_writes = 0;  // write-behinds the in-flight bound declined
};

}  // namespace kvtier::daemon
