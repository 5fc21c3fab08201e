// Who is connected: each connection's EngineContext (its namespace, admin right,
// layout, regions, requests in flight), and the namespaces peers map to.
//
// A namespace is a name — "uid:<uid>", or the shared namespace config gives a uid —
// interned to a small id for the block index. Ids are assigned afresh at every start
// and never persisted (the NVMe tier stores names).
//
// Thread-safety: none; the control thread owns the registry and every context.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/block_key.h"
#include "common/unique_fd.h"
#include "daemon/config.h"
#include "daemon/layout.h"
#include "device/device.h"
#include "ipc/server.h"
#include "tiers/slab_allocator.h"

namespace kvtier::daemon {

// What the daemon knows about one connected engine (or admin tool).
struct EngineContext {
  pid_t pid = 0;          // the peer's, from the socket's credentials
  bool connected = true;  // false once its connection closed (EngineSetup::forget)
  uint32_t namespace_id = 0;
  std::string namespace_name;
  bool is_admin = false;
  bool hello_done = false;
  std::string engine_name;
  wire::DataPath data_path = wire::DataPath::PLANE_COPIES;  // Hello.dataPath
  EngineLayout layout;
  LayoutKey layout_key;
  std::map<uint32_t, std::shared_ptr<Memory>> regions;  // region id → opened memory
  // The served GPU (index in Device::gpus()) its last GPU region is on: its blocks go
  // to that GPU's part of the arena when there is room. kAnyPart for host engines.
  int gpu_part = SlabAllocator::kAnyPart;
  // Requests not yet answered, for the latency metrics (replies.h).
  struct PendingRequest {
    size_t kind;
    std::chrono::steady_clock::time_point started;
    std::vector<Tier> load_hit_tiers;  // Load: tiers of the leading held blocks
  };
  std::map<uint64_t, PendingRequest> pending_requests;  // request id →
  // Requests that arrived while an earlier one must finish first (startup_gate.h): a
  // region still opening, or tier memory still filling. Served in arrival order.
  struct DeferredRequest {
    ipc::Frame frame;
    std::vector<UniqueFd> fds;  // claimed on arrival (RegisterRegion)
    uint64_t arrived_ms;
  };
  std::deque<DeferredRequest> deferred;
  uint32_t regions_opening = 0;  // RegisterRegions being opened on the region worker
};

// "planeCopies", "stagingKernels" or "stagingHost" (the schema's names).
const char* data_path_name(wire::DataPath path);

// InvalidArgument naming the first region the engine's layout needs that is not
// registered (never registered, or unregistered).
Status check_regions_registered(const EngineContext& engine);

class Namespaces {
 public:
  // The id of `name`, assigning the next one when it is new.
  uint32_t intern(const std::string& name);
  std::optional<uint32_t> find(const std::string& name) const;
  // REQUIRES: id < size().
  const std::string& name(uint32_t id) const { return names_[id]; }
  uint32_t size() const { return static_cast<uint32_t>(names_.size()); }

 private:
  std::unordered_map<std::string, uint32_t> ids_;
  std::vector<std::string> names_;  // index = id
};

class EngineRegistry {
 public:
  // Reads the shared namespaces and the admin group from `config` on every call, so
  // a reload applies to connections made after it.
  explicit EngineRegistry(const DaemonConfig& config) : config_(config) {}

  // A context for a new connection from `peer`: its namespace and admin right.
  // `admin`: what the server's admin check already said at accept (nullopt: ask is_admin).
  std::shared_ptr<EngineContext> connect(const ipc::PeerCredentials& peer,
                                         std::optional<bool> admin = std::nullopt);
  // root, or a member (primary or supplementary group) of admin-group.
  bool is_admin(const ipc::PeerCredentials& peer) const;
  Namespaces& namespaces() { return namespaces_; }
  const Namespaces& namespaces() const { return namespaces_; }
  // The connected engines that said Hello, oldest connection first (kvtierctl status).
  std::vector<std::shared_ptr<const EngineContext>> introduced();

 private:
  const DaemonConfig& config_;
  Namespaces namespaces_;
  std::vector<std::weak_ptr<EngineContext>> contexts_;  // pruned as connections go
};

}  // namespace kvtier::daemon
