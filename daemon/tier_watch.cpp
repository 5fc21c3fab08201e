// TierWatch: tier notices (tier_watch.h).
#include "daemon/tier_watch.h"

#include <algorithm>

#include "schema/wire_tier.h"

namespace kvtier::daemon {

TierWatch::~TierWatch() {
  assert_control_thread();
  if (ctx_.store != nullptr) ctx_.store->unsubscribe(*this);  // the Service subscribed it
}

Status TierWatch::handle_watch(const ConnectionPtr& c, const EngineContext& engine, uint64_t id,
                               uint32_t max_wait_ms, uint32_t max_changes) {
  if (max_wait_ms > kMaxWaitMs) {
    return invalid_argument("maxWaitMs {} is over {}", max_wait_ms, kMaxWaitMs);
  }
  if (ctx_.store == nullptr) return unavailable("kvtierd is starting; retry");
  auto& slot = watchers_[&engine];
  if (slot == nullptr) {
    slot = std::make_shared<Watcher>(ctx_.io);
    slot->connection = c;
    slot->layout = engine.layout_key;
    by_layout_[engine.layout_key].push_back(slot);
  }
  Watcher& watcher = *slot;
  if (watcher.waiting_id != 0) {
    return invalid_argument("a WatchTiers (request {}) is already waiting on this connection",
                            watcher.waiting_id);
  }
  const uint32_t limit = ctx_.config.max_blocks_per_request;
  watcher.waiting_id = id;
  watcher.max_changes = max_changes == 0 ? limit : std::min(max_changes, limit);
  // A stopping daemon answers at once: no timer may hold its event loop.
  if (!watcher.noted.empty() || watcher.resync || max_wait_ms == 0 || ctx_.stopping) {
    answer(watcher);
    return Status::ok();
  }
  arm(slot, max_wait_ms);
  return Status::ok();
}

void TierWatch::arm(const std::shared_ptr<Watcher>& watcher, uint32_t ms) {
  watcher->timer.expires_after(std::chrono::milliseconds(ms));
  watcher->timer.async_wait(
      [this, weak = std::weak_ptr<Watcher>(watcher)](const boost::system::error_code& error) {
        assert_control_thread();
        auto live = weak.lock();
        if (error || live == nullptr || live->waiting_id == 0) return;  // cancelled, or answered
        answer(*live);
      });
}

void TierWatch::answer(Watcher& watcher) {
  const uint64_t id = watcher.waiting_id;
  watcher.waiting_id = 0;
  watcher.answer_soon = false;
  watcher.timer.cancel();
  auto connection = watcher.connection.lock();
  if (connection == nullptr) return;
  std::vector<BlockHash> hashes;
  hashes.reserve(std::min<size_t>(watcher.noted.size(), watcher.max_changes));
  for (auto it = watcher.noted.begin();
       it != watcher.noted.end() && hashes.size() < watcher.max_changes;) {
    // Being written again (it left, and a Save stores it anew): that Save's answer
    // tells of it; "none" now would withdraw what the Save is about to keep.
    if (!ctx_.store->being_written({watcher.layout, *it})) hashes.push_back(*it);
    it = watcher.noted.erase(it);
  }
  const bool resync = watcher.resync;
  watcher.resync = false;
  notices_sent_ += hashes.size();
  std::vector<Tier> tiers;
  tiers.reserve(hashes.size());
  for (const BlockHash& hash : hashes) tiers.push_back(tier_now({watcher.layout, hash}));
  reply(connection, id, [&](wire::Response::Builder response) {
    auto out = response.initWatchTiers();
    out.setResync(resync);
    auto changes = out.initChanges(static_cast<unsigned>(hashes.size()));
    for (unsigned i = 0; i < hashes.size(); ++i) {
      auto bytes = hashes[i].bytes();
      changes[i].setHash(capnp::Data::Reader(bytes.data(), bytes.size()));
      changes[i].setTier(to_wire(tiers[i]));
    }
  });
}

Tier TierWatch::tier_now(const BlockKey& key) const {
  auto info = ctx_.store->lookup(key);
  return info ? info->location.tier : Tier::kNone;
}

void TierWatch::note(const BlockKey& key) {
  auto found = by_layout_.find(key.layout);
  if (found == by_layout_.end()) return;
  for (const std::shared_ptr<Watcher>& watcher : found->second) {
    if (watcher->resync) continue;  // everything is to be looked up again anyway
    watcher->noted.insert(key.hash);
    if (watcher->noted.size() > ctx_.config.max_tier_notices_per_connection) {
      watcher->noted = {};  // its memory too
      watcher->resync = true;
      ++resyncs_;
    }
    if (watcher->waiting_id != 0 && !watcher->answer_soon) {
      watcher->answer_soon = true;
      arm(watcher, kCoalesceMs);
    }
  }
}

void TierWatch::block_entered(const BlockKey& key, Tier tier, uint64_t) {
  assert_control_thread();
  if (!by_layout_.contains(key.layout)) return;
  // A Save's block being written: the Save's answer tells of it. A copy written below
  // the block changes nothing a subscriber sees (its fastest tier).
  auto info = ctx_.store->lookup(key);
  if (!info || info->location.tier != tier) return;
  note(key);
}

void TierWatch::block_left(const BlockKey& key, Tier, Departure why) {
  assert_control_thread();
  if (why == Departure::kCopyDropped) return;  // its copy only: its place did not change
  note(key);
}

void TierWatch::block_written(const BlockKey& key) {
  note(key);
}

void TierWatch::forget(const EngineContext* engine) {
  auto found = watchers_.find(engine);
  if (found == watchers_.end()) return;
  const std::shared_ptr<Watcher>& watcher = found->second;
  watcher->timer.cancel();
  auto layout = by_layout_.find(watcher->layout);
  std::erase(layout->second, watcher);
  if (layout->second.empty()) by_layout_.erase(layout);
  watchers_.erase(found);
}

void TierWatch::stop() {
  for (auto& [engine, watcher] : watchers_) {
    if (watcher->waiting_id != 0) answer(*watcher);
    watcher->timer.cancel();
  }
}

}  // namespace kvtier::daemon
