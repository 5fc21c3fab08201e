// AdminService: kvtierctl's GetSession, Evict, Pin, Drain and GetConfig (admin_service.h);
// Stats and ListSessions are in introspection.cpp.
#include <algorithm>

#include "common/units.h"
#include "daemon/admin_service.h"
#include "daemon/session_journal.h"

namespace kvtier::daemon {
namespace {

Status check_session_id(const std::string& session_id) {
  if (session_id.empty()) return invalid_argument("sessionId is empty");
  if (session_id.size() > 256) return invalid_argument("sessionId is longer than 256 bytes");
  return Status::ok();
}

// The refusal names what is needed, so the operator knows what to fix.
Status require_admin(const EngineContext& engine, const ipc::PeerCredentials& peer,
                     const DaemonConfig& config, std::string_view what) {
  if (engine.is_admin) return Status::ok();
  if (config.admin_group.empty()) {
    return permission_denied(
        "{} is an admin command: it needs root (uid 0); uid {} is not, and no admin-group is "
        "configured",
        what, peer.uid);
  }
  return permission_denied(
      "{} is an admin command: it needs root (uid 0) or membership in the admin group '{}'; "
      "uid {} has neither",
      what, config.admin_group, peer.uid);
}

}  // namespace

Result<policy::Session*> AdminService::find_session_for_admin(const std::string& session_id,
                                                              const std::string& namespace_name) {
  KVTIER_RETURN_IF_ERROR(check_session_id(session_id));
  if (!namespace_name.empty()) {
    auto ns = ctx_.engines.namespaces().find(namespace_name);
    policy::Session* session = !ns ? nullptr : ctx_.sessions.find(*ns, session_id);
    if (session == nullptr)
      return not_found("no session '{}' in namespace '{}'", session_id, namespace_name);
    return session;
  }
  std::vector<policy::Session*> matches;
  for (uint32_t ns = 0; ns < ctx_.engines.namespaces().size(); ++ns) {
    if (policy::Session* session = ctx_.sessions.find(ns, session_id)) matches.push_back(session);
  }
  if (matches.empty()) return not_found("no session '{}' in any namespace", session_id);
  if (matches.size() > 1) {
    std::string names;
    for (const policy::Session* session : matches)
      names += (names.empty() ? "'" : ", '") +
               ctx_.engines.namespaces().name(session->namespace_id) + "'";
    return invalid_argument("session '{}' exists in namespaces {}: name one (--namespace)",
                            session_id, names);
  }
  return matches.front();
}

Status AdminService::handle_get_session(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                                        const SessionTarget& request) {
  const std::string& session_id = request.session_id;
  std::string namespace_name = request.namespace_name;
  KVTIER_RETURN_IF_ERROR(check_session_id(session_id));
  if (namespace_name.empty()) namespace_name = engine.namespace_name;
  if (namespace_name != engine.namespace_name) {
    KVTIER_RETURN_IF_ERROR(
        require_admin(engine, c->peer(), ctx_.config, "reading another namespace's session"));
  }
  auto session = find_session_for_admin(session_id, namespace_name);
  if (!session.is_ok()) return session.status();
  reply(c, id, [&](wire::Response::Builder response) {
    assert_control_thread();
    fill_session_info(**session, response.initGetSession().initSession());
  });
  return Status::ok();
}

Status AdminService::handle_evict(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                                  const EvictRequest& request) {
  KVTIER_RETURN_IF_ERROR(require_admin(engine, c->peer(), ctx_.config, "evict"));
  const std::string& session_id = request.target.session_id;
  const std::string& namespace_name = request.target.namespace_name;
  std::vector<std::pair<uint32_t, std::string>> targets;
  if (!session_id.empty()) {
    auto session = find_session_for_admin(session_id, namespace_name);
    if (!session.is_ok()) return session.status();
    targets.emplace_back((*session)->namespace_id, (*session)->id);
  } else {
    const uint64_t idle_over_ms = request.idle_over_ms;
    if (idle_over_ms == 0) return invalid_argument("give a sessionId or an idleOverMs above 0");
    const uint64_t now = now_ms();
    ctx_.sessions.for_each([&](const policy::Session& session) {
      assert_control_thread();
      if (!namespace_name.empty() &&
          ctx_.engines.namespaces().name(session.namespace_id) != namespace_name)
        return;
      if (session.state == policy::SessionState::kIdle &&
          now - session.last_active_ms > idle_over_ms) {
        targets.emplace_back(session.namespace_id, session.id);
      }
    });
  }
  // Close each session as CloseSession does, then evict the blocks nobody else
  // references through the data path's eviction (which also frees NVMe slots).
  std::unordered_set<BlockKey, BlockKeyHasher> released;
  std::vector<BlockKey> unshared;
  uint64_t evicted = 0, kept = 0, bytes_freed = 0;
  for (const auto& [namespace_id, target_id] : targets) {
    const LayoutKey layout = ctx_.sessions.find(namespace_id, target_id)->layout;
    auto closed = ctx_.sessions.close(namespace_id, target_id);  // unpins it (session_closed)
    if (!closed.is_ok()) return closed.status();
    for (const BlockHash& hash : *closed) released.insert({layout, hash});
  }
  for (const BlockKey& key : released) {
    auto info = ctx_.store->lookup(key);
    if (!info) continue;
    if (info->session_refs == 0) {
      unshared.push_back(key);
    } else {
      ++kept;  // another session still holds it
    }
  }
  std::vector<bool> had_copy;  // an NVMe copy goes with its block: its slot is freed too
  for (const BlockKey& key : unshared) had_copy.push_back(ctx_.store->copy_of(key).has_value());
  ctx_.mover->evict(unshared);
  for (size_t i = 0; i < unshared.size(); ++i) {
    const BlockKey& key = unshared[i];
    if (ctx_.store->lookup(key)) {
      ++kept;  // a copy is reading it; it stays as prefix cache until the planner needs room
    } else {
      ++evicted;
      bytes_freed += ctx_.store->block_bytes(key.layout) * (had_copy[i] ? 2 : 1);
    }
  }
  KVTIER_LOG_INFO("evict (uid {}): {} sessions, {} blocks freed ({}), {} blocks kept",
                  c->peer().uid, targets.size(), evicted, format_bytes(bytes_freed), kept);
  reply(c, id, [&](wire::Response::Builder response) {
    auto out = response.initEvict();
    out.setSessions(static_cast<uint32_t>(targets.size()));
    out.setBlocksEvicted(evicted);
    out.setBytesFreed(bytes_freed);
    out.setBlocksKept(kept);
  });
  return Status::ok();
}

Status AdminService::handle_pin(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                                const PinRequest& request) {
  const bool pin = request.pinned;
  KVTIER_RETURN_IF_ERROR(require_admin(engine, c->peer(), ctx_.config, pin ? "pin" : "unpin"));
  auto session = find_session_for_admin(request.target.session_id, request.target.namespace_name);
  if (!session.is_ok()) return session.status();
  const std::pair<uint32_t, std::string> key{(*session)->namespace_id, (*session)->id};
  uint32_t held = 0;
  if (pin) {
    std::vector<PinnedBlock>& pins = admin_pins_[key];
    if (pins.empty()) pin_blocks(**session, (*session)->blocks.hashes(), pins);
    held = static_cast<uint32_t>(pins.size());
  } else {
    admin_pins_.erase(key);  // unpins its blocks
  }
  KVTIER_LOG_INFO("{} (uid {}): session '{}' in {} ({} blocks held)", pin ? "pin" : "unpin",
                  c->peer().uid, key.second, ctx_.engines.namespaces().name(key.first), held);
  reply(c, id, [&](wire::Response::Builder response) { response.initPin().setPinnedBlocks(held); });
  return Status::ok();
}

// Starts moving every unpinned block in RAM and HBM to NVMe, through the same executor
// the planner and the SIGTERM drain use (blocks in GPU memory go through RAM: the NVMe
// tier writes from host memory).
Status AdminService::handle_drain(const ConnectionPtr& c, EngineContext& engine, uint64_t id) {
  KVTIER_RETURN_IF_ERROR(require_admin(engine, c->peer(), ctx_.config, "drain"));
  if (!journal_.enabled()) {
    return invalid_argument(
        "drain moves every RAM/HBM block to the NVMe tier, and no NVMe tier is configured "
        "(nvme-bytes is 0); nothing was moved");
  }
  std::unordered_set<BlockKey, BlockKeyHasher> admin_pinned;
  for (const auto& [session, pins] : admin_pins_) {
    for (const PinnedBlock& pin : pins) admin_pinned.insert(pin.key());
  }
  // Every ready block in memory (the engine-facing tiers) goes to NVMe (from GPU memory
  // through RAM).
  const Tier durable = ctx_.topology.durable();
  std::vector<policy::Move> to_nvme;
  for (Tier tier : ctx_.topology.engine_facing()) {
    ctx_.store->for_each_in_tier(tier, [&](const BlockKey& key, const BlockInfo& info) {
      if (info.state != BlockState::kReady || admin_pinned.count(key) != 0) return;
      to_nvme.push_back({policy::MoveKind::kDemote, key, tier, durable});
    });
  }
  ctx_.mover->apply(to_nvme);
  uint64_t blocks = 0, bytes = 0;
  auto count_moving = [&](const BlockKey& key) {
    assert_control_thread();
    auto info = ctx_.store->lookup(key);
    // A block that had an NVMe copy is there already: it moved onto the copy.
    if (info && (info->state == BlockState::kMoving || info->location.tier == durable)) {
      ++blocks;
      bytes += ctx_.store->block_bytes(key.layout);
    }
  };
  for (const policy::Move& move : to_nvme) count_moving(move.block);
  KVTIER_LOG_INFO("drain (uid {}): {} blocks ({}) on their way to NVMe; {} pinned blocks stay",
                  c->peer().uid, blocks, format_bytes(bytes), admin_pinned.size());
  reply(c, id, [&](wire::Response::Builder response) {
    auto out = response.initDrain();
    out.setBlocksQueued(blocks);
    out.setBytesQueued(bytes);
  });
  return Status::ok();
}

Status AdminService::handle_get_config(const ConnectionPtr& c, EngineContext& engine, uint64_t id) {
  KVTIER_RETURN_IF_ERROR(require_admin(engine, c->peer(), ctx_.config, "config"));
  const auto entries = describe(ctx_.config);
  reply(c, id, [&](wire::Response::Builder response) {
    auto list = response.initGetConfig().initEntries(static_cast<unsigned>(entries.size()));
    for (size_t i = 0; i < entries.size(); ++i) {
      list[i].setKey(entries[i].key);
      list[i].setValue(entries[i].value);
      list[i].setReloadable(entries[i].reloadable);
    }
  });
  return Status::ok();
}

void AdminService::pin_blocks(const policy::Session& session, std::span<const BlockHash> blocks,
                              std::vector<PinnedBlock>& held) {
  for (const BlockHash& hash : blocks) {
    PinnedBlock pin = ctx_.store->pin({session.layout, hash}, now_ms());
    if (pin) {
      held.push_back(std::move(pin));
    } else {
      KVTIER_LOG_WARN(
          "pin: block {} of session '{}' could not be pinned (not stored, or being "
          "written)",
          hash.to_hex(), session.id);
    }
  }
}

void AdminService::session_grew(const policy::Session& session, std::span<const BlockHash> added) {
  auto pinned = admin_pins_.find({session.namespace_id, session.id});
  if (pinned != admin_pins_.end()) pin_blocks(session, added, pinned->second);
}

void AdminService::session_cut(const policy::Session& session) {
  auto pinned = admin_pins_.find({session.namespace_id, session.id});
  if (pinned == admin_pins_.end()) return;
  std::unordered_set<BlockHash, BlockHashHasher> kept(session.blocks.begin(), session.blocks.end());
  std::erase_if(pinned->second,
                [&](const PinnedBlock& pin) { return !kept.contains(pin.key().hash); });
}

uint64_t AdminService::admin_pinned_blocks() const {
  std::unordered_set<BlockKey, BlockKeyHasher> distinct;
  for (const auto& [session, pins] : admin_pins_) {
    for (const PinnedBlock& pin : pins) distinct.insert(pin.key());
  }
  return distinct.size();
}

uint64_t AdminService::copy_pinned_blocks() const {
  if (ctx_.store == nullptr) return 0;
  std::unordered_map<BlockKey, uint32_t, BlockKeyHasher> admin_pins;
  for (const auto& [session, pins] : admin_pins_) {
    for (const PinnedBlock& pin : pins) ++admin_pins[pin.key()];
  }
  uint64_t only_admin = 0;
  for (const auto& [block, count] : admin_pins) {
    auto info = ctx_.store->lookup(block);
    if (info && info->pins <= count) ++only_admin;
  }
  return ctx_.store->pinned_blocks() - std::min(only_admin, ctx_.store->pinned_blocks());
}

}  // namespace kvtier::daemon
