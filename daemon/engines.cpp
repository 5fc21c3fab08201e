#include "daemon/engines.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

namespace kvtier::daemon {
namespace {

// Supplementary groups of a peer; SO_PEERCRED carries only the primary one.
bool peer_in_group(pid_t pid, gid_t gid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Groups:", 0) != 0) continue;
    std::istringstream groups(line.substr(7));
    gid_t member;
    while (groups >> member) {
      if (member == gid) return true;
    }
  }
  return false;
}

}  // namespace

const char* data_path_name(wire::DataPath path) {
  switch (path) {
    case wire::DataPath::PLANE_COPIES:
      return "planeCopies";
    case wire::DataPath::STAGING_KERNELS:
      return "stagingKernels";
    case wire::DataPath::STAGING_HOST:
      return "stagingHost";
  }
  return "unknown";
}

Status check_regions_registered(const EngineContext& engine) {
  for (size_t i = 0; i < engine.layout.planes.size(); ++i) {
    const uint32_t region_id = engine.layout.planes[i].region_id;
    if (engine.regions.count(region_id) == 0) {
      return invalid_argument("regionId {} is not registered (layout.planes[{}] names it)",
                              region_id, i);
    }
  }
  return Status::ok();
}

uint32_t Namespaces::intern(const std::string& name) {
  auto [it, inserted] = ids_.emplace(name, static_cast<uint32_t>(names_.size()));
  if (inserted) names_.push_back(name);
  return it->second;
}

std::optional<uint32_t> Namespaces::find(const std::string& name) const {
  auto it = ids_.find(name);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

std::shared_ptr<EngineContext> EngineRegistry::connect(const ipc::PeerCredentials& peer,
                                                       std::optional<bool> admin) {
  auto engine = std::make_shared<EngineContext>();
  auto shared = config_.shared_namespaces.find(peer.uid);
  engine->namespace_name =
      shared != config_.shared_namespaces.end() ? shared->second : fmt::format("uid:{}", peer.uid);
  engine->namespace_id = namespaces_.intern(engine->namespace_name);
  engine->is_admin = admin.has_value() ? *admin : is_admin(peer);
  engine->pid = peer.pid;
  std::erase_if(contexts_, [](const std::weak_ptr<EngineContext>& c) {
    auto alive = c.lock();
    return alive == nullptr || !alive->connected;
  });
  contexts_.push_back(engine);
  return engine;
}

std::vector<std::shared_ptr<const EngineContext>> EngineRegistry::introduced() {
  std::vector<std::shared_ptr<const EngineContext>> out;
  std::erase_if(contexts_, [&](const std::weak_ptr<EngineContext>& c) {
    auto alive = c.lock();
    if (alive == nullptr || !alive->connected) return true;
    if (alive->hello_done) out.push_back(std::move(alive));
    return false;
  });
  return out;
}

bool EngineRegistry::is_admin(const ipc::PeerCredentials& peer) const {
  if (peer.uid == 0) return true;
  if (!config_.admin_gid) return false;
  return peer.gid == *config_.admin_gid || peer_in_group(peer.pid, *config_.admin_gid);
}

}  // namespace kvtier::daemon
