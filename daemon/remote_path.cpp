// The remote tier in the daemon: opening the worker, and writing each turn's new
// blocks and the session record behind the turn (daemon/service.h, remote_path.h).
#include "daemon/remote_path.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <cstdlib>
#include <deque>
#include <fstream>
#include <optional>

#include "common/log.h"
#include "daemon/persistence.h"
#include "daemon/setting_kinds.h"

namespace kvtier::daemon {
namespace {
// O_DIRECT-friendly buffers for blocks read out of NVMe for the remote tier.
constexpr size_t kBufferAlignment = 4096;
}  // namespace

Status Service::open_remote() {
  if (config_.remote_nodes.empty()) return Status::ok();
  auto seeds = parse_remote_nodes(config_.remote_nodes);
  if (!seeds.is_ok()) return seeds.status().with_context("remote-nodes");
  remote::RemoteWorkerOptions options;
  options.store.cluster.seeds = std::move(*seeds);
  options.store.cluster.user = config_.remote_user;
  if (!config_.remote_password_file.empty()) {
    std::ifstream file(config_.remote_password_file);
    if (!file || !std::getline(file, options.store.cluster.password)) {
      return invalid_argument("remote-password-file {}: cannot read its first line",
                              config_.remote_password_file);
    }
  }
  const auto timeout = std::chrono::milliseconds(std::max<uint64_t>(config_.remote_timeout_ms, 1));
  options.store.cluster.connect_timeout = timeout;
  options.store.cluster.command_timeout = timeout;
  options.store.ttl = std::chrono::milliseconds(config_.remote_ttl_ms);
  options.store.budget_bytes = std::max<uint64_t>(config_.remote_bytes, 1);
  options.max_in_flight_bytes = config_.remote_max_in_flight_bytes;
  remote_ = std::make_unique<RemoteState>();
  const std::shared_ptr<Memory>& hbm = store_->memory(Tier::kHbm);
  if (hbm != nullptr && hbm->host_data() == nullptr) {
    // Blocks saved into GPU memory are written behind through pinned host memory.
    const uint64_t staging_bytes = 2 * config_.slab_bytes;
    auto staging = device_->allocate_pinned_pool(staging_bytes);
    if (!staging.is_ok()) {
      return staging.status().with_context("pinned host memory to stage remote writes from HBM");
    }
    remote_->staging = std::move(*staging);
    remote_->staging_slots.emplace(staging_bytes, config_.slab_bytes);
  }
  // Completions come back to the control thread; after the loop stops they are
  // dropped unrun, and their pins release nothing (tiers/block_store.h).
  remote_->worker = remote::RemoteWorker::start(
      std::move(options), [this](std::function<void()> fn) { asio::post(io_, std::move(fn)); });
  KVTIER_LOG_INFO("remote tier: Redis Cluster at {} (connecting in the background)",
                  config_.remote_nodes);
  return Status::ok();
}

void Service::write_behind(const policy::Session& session, bool sweeping) {
  if (!remote_) return;
  const policy::SessionKey key{session.namespace_id, session.id};
  uint32_t& synced = remote_->synced[key];
  if (synced > session.blocks.size()) synced = 0;  // defensive: cuts lower it (note_remote_cut)
  const std::string& ns = engines_.namespaces().name(session.namespace_id);
  const uint64_t block_bytes = store_->block_bytes(session.layout);
  const uint64_t now = now_ms();
  auto batch = std::make_shared<WriteBehind>();
  batch->key = key;
  batch->namespace_name = ns;
  batch->from = synced;
  batch->block_bytes = block_bytes;
  CopyBatch staging_copy;  // blocks in GPU memory → staging slots
  staging_copy.priority = CopyPriority::kBackground;
  std::vector<StorageTier::ReadItem> nvme_reads;  // destinations filled in below
  StorageTier* nvme = mover_->tier(Tier::kNvme);
  size_t next = synced;
  for (; next < session.blocks.size(); ++next) {
    // One batch stays within the worker's in-flight bound (a larger one would be
    // declined every time); the sweep sends the rest.
    if ((batch->writes.size() + 1) * block_bytes > config_.remote_max_in_flight_bytes) break;
    const BlockKey block{session.layout, session.blocks[next]};
    auto info = store_->lookup(block);
    if (!info) break;
    const std::shared_ptr<Memory>& memory = store_->memory(info->location.tier);
    if (memory == nullptr && (info->location.tier != Tier::kNvme || nvme == nullptr)) break;
    PinnedBlock pinned = store_->pin(block, now);
    if (!pinned) break;
    const std::byte* bytes = nullptr;  // NVMe: set once the buffer exists
    if (memory == nullptr) {
      // On NVMe (demoted before it could be written): read out of NVMe first.
      batch->from_nvme.push_back(batch->writes.size());
      nvme_reads.push_back({{block, pinned.location().offset, block_bytes}, nullptr});
    } else if (memory->host_data() != nullptr) {
      bytes = memory->host_data() + pinned.location().offset;
    } else {
      // GPU memory: copied into a staging slot first (none free: the sweep comes back).
      if (!remote_->staging_slots) break;
      auto slot = remote_->staging_slots->allocate(block_bytes);
      if (!slot.is_ok()) break;
      staging_copy.segments.push_back({staging_copy.memory_index(memory),
                                       staging_copy.memory_index(remote_->staging),
                                       pinned.location().offset, *slot, block_bytes});
      batch->staged.push_back(*slot);
      batch->first_staged = std::min(batch->first_staged, batch->writes.size());
      bytes = remote_->staging->host_data() + *slot;
    }
    batch->writes.push_back({{ns, session.layout.layout_digest, block.hash}, {bytes, block_bytes}});
    batch->pins.push_back(std::move(pinned));
  }
  batch->blocks = batch->writes.size();
  // What stays behind though it is held here: a gauge, per session, not a sum of turns.
  uint32_t deferred = 0;
  for (size_t i = next; i < session.blocks.size(); ++i) {
    if (store_->lookup({session.layout, session.blocks[i]})) ++deferred;
  }
  uint32_t& was = remote_->deferred[key];
  remote_->deferred_blocks = remote_->deferred_blocks - was + deferred;
  was = deferred;
  // Tried again by the sweep (a staging slot frees, the bound has room again).
  if (deferred > 0) {
    remote_->mark_unsynced(key);
  } else {
    remote_->unsynced.erase(key);
  }

  if (batch->writes.empty()) {
    // A sweep that wrote nothing has nothing new to say (and must not keep renewing
    // the record's TTL while its blocks expire).
    if (!sweeping) {
      remote_->worker->put_session(ns, session.id,
                                   encode_session_value(to_record(session, ns, now, wall_now_ms())),
                                   [](Status) {});
    }
    return;
  }
  synced = static_cast<uint32_t>(next);  // handed over; lowered again if some fail

  batch->waiting = 1;  // this function's own: released by the call at its end
  if (!staging_copy.segments.empty()) {
    ++batch->waiting;
    merge_adjacent_segments(staging_copy.segments);
    Status submitted = submit_copy(std::move(staging_copy), [this, batch](Status copied) {
      if (copied.is_ok()) {
        remote_->staged_blocks += batch->staged.size();
      } else {
        KVTIER_LOG_WARN("staging {} blocks out of GPU memory for the remote tier failed: {}",
                        batch->staged.size(), copied.to_string());
        batch->readable = std::min(batch->readable, batch->first_staged);
      }
      write_behind_staged(batch);
    });
    if (!submitted.is_ok()) {
      batch->readable = std::min(batch->readable, batch->first_staged);
      --batch->waiting;
    }
  }
  if (!nvme_reads.empty()) {
    const uint64_t total = nvme_reads.size() * block_bytes;
    const uint64_t rounded = (total + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
    batch->nvme_buffer.reset(static_cast<std::byte*>(std::aligned_alloc(kBufferAlignment, rounded)),
                             std::free);
    if (batch->nvme_buffer == nullptr) {
      batch->readable = std::min(batch->readable, batch->from_nvme.front());
    } else {
      for (size_t j = 0; j < nvme_reads.size(); ++j) {
        std::byte* into = batch->nvme_buffer.get() + j * block_bytes;
        nvme_reads[j].destination = into;
        batch->writes[batch->from_nvme[j]].payload = {into, block_bytes};
      }
      ++batch->waiting;
      auto guard = asio::make_work_guard(io_);
      nvme->read(std::move(nvme_reads),
                 [this, batch, guard](std::vector<StorageTier::ReadOutcome> outcomes) mutable {
                   asio::post(io_, [this, batch, guard = std::move(guard),
                                    outcomes = std::move(outcomes)] {
                     for (size_t j = 0; j < outcomes.size(); ++j) {
                       if (outcomes[j].status.is_ok()) continue;
                       const size_t at = batch->from_nvme[j];
                       batch->readable = std::min(batch->readable, at);
                       if (outcomes[j].corrupt) batch->lost.push_back(batch->pins[at].key());
                       KVTIER_LOG_WARN("reading a block out of NVMe to write it behind failed: {}",
                                       outcomes[j].status.to_string());
                     }
                     write_behind_staged(batch);
                   });
                 });
    }
  }
  write_behind_staged(batch);
}

void Service::write_behind_staged(const std::shared_ptr<WriteBehind>& batch) {
  if (--batch->waiting > 0) return;
  if (batch->readable < batch->writes.size()) batch->writes.resize(batch->readable);
  if (batch->writes.empty()) {
    fail_write_behind(*batch, 0, /*declined=*/false);
  } else {
    send_write_behind(batch);
  }
  // Bad bytes on NVMe: the block goes, as when any read finds it so.
  if (!batch->lost.empty()) mover_->evict(std::exchange(batch->lost, {}), /*lost=*/true);
}

void Service::send_write_behind(const std::shared_ptr<WriteBehind>& batch) {
  auto writes = std::move(batch->writes);
  const bool queued =
      remote_->worker->put_borrowed(std::move(writes), [this, batch](std::vector<Status> statuses) {
        size_t ok = 0;
        while (ok < statuses.size() && statuses[ok].is_ok()) ++ok;
        remote_->written_blocks += ok;
        remote_->failed_blocks += statuses.size() - ok;
        if (ok < batch->blocks) {
          fail_write_behind(*batch, ok, /*declined=*/false);
        } else {
          release_write_behind(*batch);
        }
        // The record after its blocks: a node that finds it finds them (or misses). As
        // the session is now, so that an older turn's record never lands after a newer
        // one; none once the session was closed.
        const policy::Session* live = sessions_.find(batch->key.namespace_id, batch->key.id);
        if (live == nullptr) return;
        remote_->worker->put_session(
            batch->namespace_name, batch->key.id,
            encode_session_value(to_record(*live, batch->namespace_name, now_ms(), wall_now_ms())),
            [](Status) {});
        // All written and more to go (the batch stopped at the in-flight bound): the next
        // batch now rather than at the next sweep.
        if (ok == batch->blocks && remote_->unsynced.contains(batch->key) &&
            live->state == policy::SessionState::kIdle) {
          write_behind(*live, /*sweeping=*/true);
        }
      });
  if (!queued) fail_write_behind(*batch, 0, /*declined=*/true);
}

void Service::fail_write_behind(WriteBehind& batch, size_t written, bool declined) {
  if (declined) ++remote_->declined_writes;
  auto it = remote_->synced.find(batch.key);
  if (it != remote_->synced.end()) {
    // Written again from the first that was not, by the sweep.
    it->second = std::min<uint32_t>(it->second, batch.from + static_cast<uint32_t>(written));
    remote_->mark_unsynced(batch.key);
  }
  release_write_behind(batch);
}

void Service::release_write_behind(WriteBehind& batch) {
  batch.pins.clear();  // the worker, the Device and the NVMe tier are done with the slots
  for (uint64_t slot : batch.staged) remote_->staging_slots->free(slot, batch.block_bytes);
  batch.staged.clear();
}

void Service::sweep_write_behind() {
  if (!remote_ || remote_->unsynced.empty()) return;
  const uint64_t now = now_ms();
  if (now - std::min(now, remote_->last_sweep_ms) < 1000) return;
  remote_->last_sweep_ms = now;
  constexpr size_t kPerSweep = 256;  // sessions; the rest wait for the next sweep, in turn
  std::vector<policy::SessionKey> keys;
  while (!remote_->unsynced_order.empty() && keys.size() < kPerSweep) {
    policy::SessionKey key = std::move(remote_->unsynced_order.front());
    remote_->unsynced_order.pop_front();
    if (remote_->unsynced.erase(key) == 0) continue;  // closed or written meanwhile
    keys.push_back(std::move(key));
  }
  for (const policy::SessionKey& key : keys) {
    const policy::Session* session = sessions_.find(key.namespace_id, key.id);
    if (session == nullptr) continue;
    // Mid-turn sessions are written at the end of their turn.
    if (session->state == policy::SessionState::kIdle) {
      write_behind(*session, /*sweeping=*/true);
    } else {
      remote_->mark_unsynced(key);
    }
  }
}

void Service::note_remote_cut(const policy::Session& session) {
  if (!remote_) return;
  auto it = remote_->synced.find({session.namespace_id, session.id});
  // Blocks from the cut on may come back as other blocks: written again from there.
  if (it != remote_->synced.end()) {
    it->second = std::min<uint32_t>(it->second, static_cast<uint32_t>(session.blocks.size()));
  }
}

void Service::note_remote_closed(uint32_t namespace_id, const std::string& session_id) {
  if (!remote_) return;
  // Closed for good: no node resumes it (a write-behind still queued for it writes its
  // blocks, and its completion finds the session gone and writes no record).
  remote_->worker->delete_session(engines_.namespaces().name(namespace_id), session_id,
                                  [](Status) {});
  const policy::SessionKey key{namespace_id, session_id};
  remote_->synced.erase(key);
  remote_->unsynced.erase(key);
  if (auto it = remote_->deferred.find(key); it != remote_->deferred.end()) {
    remote_->deferred_blocks -= it->second;
    remote_->deferred.erase(it);
  }
}

// NVMe evictions being written to the cluster first: each block pinned (its slot stays,
// and the planner leaves it alone) until it is written there or given up.
struct Service::Spill {
  struct Block {
    BlockKey key;
    PinnedBlock pin;  // empty once finished
    uint64_t bytes = 0;
  };
  std::vector<Block> blocks;
};

namespace {
// Blocks per NVMe read of a spill (the executor's job size).
constexpr size_t kSpillBlocksPerRead = 32;
}  // namespace

uint64_t Service::leaving_bytes(Tier tier) const {
  return remote_ && tier == Tier::kNvme ? remote_->spilling_bytes : 0;
}

std::vector<BlockKey> Service::spill_evictions(std::vector<BlockKey> keys) {
  if (!remote_ || stopping_ || !remote_->worker->connected()) {
    if (remote_) remote_->spill_unwritten += keys.size();
    return keys;
  }
  auto spill = std::make_shared<Spill>();
  std::vector<BlockKey> rest;
  std::vector<remote::RemoteBlockId> ids;
  const uint64_t now = now_ms();
  for (BlockKey& key : keys) {
    const auto info = store_->lookup(key);
    // What evict() refuses (pinned, moving) it refuses either way.
    if (!info || info->state != BlockState::kReady || info->pins > 0 ||
        info->location.tier != Tier::kNvme) {
      rest.push_back(std::move(key));
      continue;
    }
    const uint64_t bytes = store_->block_bytes(key.layout);
    if (remote_->spilling_bytes + bytes > config_.remote_max_in_flight_bytes) {
      ++remote_->spill_unwritten;  // the cluster is not keeping up: local room first
      rest.push_back(std::move(key));
      continue;
    }
    PinnedBlock pin = store_->pin(key, now);
    if (!pin) {
      rest.push_back(std::move(key));
      continue;
    }
    remote_->spilling_bytes += bytes;
    ids.push_back(
        {engines_.namespaces().name(key.layout.namespace_id), key.layout.layout_digest, key.hash});
    spill->blocks.push_back({std::move(key), std::move(pin), bytes});
  }
  if (spill->blocks.empty()) return rest;
  // Most blocks were written behind at the end of their turn: only the others are read.
  const bool asked = remote_->worker->exists_blocks(
      std::move(ids), [this, spill](std::vector<Result<bool>> found) {
        std::vector<size_t> missing;
        std::vector<size_t> done;
        for (size_t i = 0; i < found.size(); ++i) {
          if (found[i].is_ok() && !*found[i]) {
            missing.push_back(i);
            continue;
          }
          // There already, or the cluster did not say: evicted without a write.
          ++(found[i].is_ok() ? remote_->spill_present : remote_->spill_unwritten);
          done.push_back(i);
        }
        finish_spill(spill, done);
        for (size_t begin = 0; begin < missing.size(); begin += kSpillBlocksPerRead) {
          const size_t end = std::min(missing.size(), begin + kSpillBlocksPerRead);
          spill_missing(spill, {missing.begin() + begin, missing.begin() + end});
        }
      });
  if (!asked) {
    for (Spill::Block& block : spill->blocks) {
      block.pin.reset();
      remote_->spilling_bytes -= block.bytes;
      ++remote_->spill_unwritten;
      rest.push_back(block.key);
    }
  }
  return rest;
}

void Service::spill_missing(const std::shared_ptr<Spill>& spill, std::vector<size_t> missing) {
  StorageTier* nvme = mover_->tier(Tier::kNvme);
  uint64_t total = 0;
  for (size_t i : missing) total += spill->blocks[i].bytes;
  const uint64_t rounded = (total + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
  std::shared_ptr<std::byte> buffer(
      static_cast<std::byte*>(std::aligned_alloc(kBufferAlignment, rounded)), std::free);
  if (nvme == nullptr || buffer == nullptr) {
    remote_->spill_unwritten += missing.size();
    finish_spill(spill, missing);
    return;
  }
  std::vector<StorageTier::ReadItem> items;
  uint64_t offset = 0;
  for (size_t i : missing) {
    const Spill::Block& block = spill->blocks[i];
    items.push_back({{block.key, block.pin.location().offset, block.bytes}, buffer.get() + offset});
    offset += block.bytes;
  }
  auto guard = asio::make_work_guard(io_);
  nvme->read(std::move(items), [this, spill, missing = std::move(missing), buffer,
                                guard](std::vector<StorageTier::ReadOutcome> outcomes) mutable {
    asio::post(io_, [this, spill, missing = std::move(missing), buffer = std::move(buffer),
                     outcomes = std::move(outcomes), guard = std::move(guard)] {
      std::vector<remote::RemoteStore::BlockWrite> writes;
      std::vector<size_t> writing;
      std::vector<size_t> unread;
      uint64_t offset = 0;
      for (size_t j = 0; j < missing.size(); ++j) {
        const Spill::Block& block = spill->blocks[missing[j]];
        if (outcomes[j].status.is_ok()) {
          writes.push_back({{engines_.namespaces().name(block.key.layout.namespace_id),
                             block.key.layout.layout_digest, block.key.hash},
                            {buffer.get() + offset, block.bytes}});
          writing.push_back(missing[j]);
        } else {
          // Bad bytes are not written anywhere; the eviction goes ahead.
          KVTIER_LOG_WARN("reading block {} out of NVMe for the remote tier failed: {}",
                          block.key.hash.to_hex(), outcomes[j].status.to_string());
          unread.push_back(missing[j]);
        }
        offset += block.bytes;
      }
      remote_->spill_unwritten += unread.size();
      finish_spill(spill, unread);
      if (writing.empty()) return;
      auto on_written = [this, spill, writing, buffer](std::vector<Status> statuses) {
        for (const Status& status : statuses) {
          ++(status.is_ok() ? remote_->spilled_blocks : remote_->spill_unwritten);
        }
        finish_spill(spill, writing);
      };
      if (!remote_->worker->put_borrowed(std::move(writes), std::move(on_written))) {
        remote_->spill_unwritten += writing.size();
        finish_spill(spill, writing);
      }
    });
  });
}

void Service::finish_spill(const std::shared_ptr<Spill>& spill,
                           const std::vector<size_t>& indices) {
  std::vector<BlockKey> evictions;
  for (size_t i : indices) {
    Spill::Block& block = spill->blocks[i];
    if (!block.pin) continue;
    const BlockLocation where = block.pin.location();
    block.pin.reset();
    remote_->spilling_bytes -= block.bytes;
    // A block read up meanwhile (a Load, a BeginTurn) stays where it went.
    const auto info = store_->lookup(block.key);
    if (info && info->location.tier == where.tier && info->location.offset == where.offset) {
      evictions.push_back(block.key);
    }
  }
  if (!evictions.empty()) mover_->evict(evictions);
}

Result<std::optional<PendingWrite>> Service::reserve_staging(const BlockKey& key,
                                                             uint64_t block_bytes) {
  std::vector<Tier> tiers;  // host-addressable ones: the worker writes the bytes there
  for (Tier tier : {Tier::kRam, Tier::kHbm}) {
    const std::shared_ptr<Memory>& memory = store_->memory(tier);
    if (memory != nullptr && memory->host_data() != nullptr) tiers.push_back(tier);
  }
  if (tiers.empty()) return not_supported("no host memory tier to read remote blocks into");
  auto reserved = store_->reserve(key, tiers, now_ms());
  if (reserved.is_ok() || reserved.status().code() != StatusCode::kResourceExhausted) {
    return reserved;
  }
  sessions_.expire_priorities(sessions_.now_ms());
  for (Tier tier : tiers) {
    auto moves = planner_.make_room(tier, block_bytes, sessions_, *view_);
    if (moves.empty()) continue;
    mover_->apply(moves);
    return store_->reserve(key, tiers, now_ms());
  }
  return reserved;
}

// One fetch_remote call's reads: the keys it started, read in chunks of at most
// kFetchChunkBytes with at most `window` chunks at the worker at once, so a prefix of
// any length is read (in turn) and slots are reserved only as their chunk starts.
struct Service::RemoteFetch {
  std::string namespace_name;
  std::deque<BlockKey> to_read;
  size_t chunks_in_flight = 0;
};

namespace {
constexpr uint64_t kFetchChunkBytes = 32ull << 20;
}  // namespace

void Service::fetch_remote(const std::string& namespace_name, const std::vector<BlockKey>& keys,
                           std::function<void(size_t, const Status&)> done) {
  auto answer = std::make_shared<std::function<void(size_t, const Status&)>>(std::move(done));
  std::vector<std::pair<size_t, Status>> at_once;
  if (!remote_->worker->connected()) {
    for (size_t i = 0; i < keys.size(); ++i) {
      (*answer)(i, store_->lookup(keys[i]) ? Status::ok()
                                           : unavailable("the remote tier is not connected"));
    }
    return;
  }
  auto fetch = std::make_shared<RemoteFetch>();
  fetch->namespace_name = namespace_name;
  for (size_t i = 0; i < keys.size(); ++i) {
    const BlockKey& key = keys[i];
    auto waiter = [answer, i](const Status& status) { (*answer)(i, status); };
    if (auto it = remote_->fetching.find(key); it != remote_->fetching.end()) {
      it->second.push_back(std::move(waiter));  // joins the read already under way
      continue;
    }
    if (store_->lookup(key)) {
      at_once.emplace_back(i, Status::ok());
      continue;
    }
    remote_->fetching[key].push_back(std::move(waiter));
    fetch->to_read.push_back(key);
  }
  pump_fetch(fetch);
  for (const auto& [i, status] : at_once) (*answer)(i, status);
}

void Service::settle_fetch(const BlockKey& key, PendingWrite* slot, const Status& status) {
  if (slot != nullptr) {
    if (status.is_ok()) {
      slot->commit();
    } else {
      slot->abort();
    }
    // A Save that found the block being written (our reservation) waits for it.
    wake_write_waiters(key, status.is_ok());
  }
  if (status.is_ok()) {
    ++remote_->fetched_blocks;
  } else {
    ++remote_->fetch_misses;
  }
  auto it = remote_->fetching.find(key);
  if (it == remote_->fetching.end()) return;
  auto waiters = std::move(it->second);
  remote_->fetching.erase(it);
  for (auto& waiter : waiters) waiter(status);
}

void Service::pump_fetch(const std::shared_ptr<RemoteFetch>& fetch) {
  if (!remote_) return;
  const uint64_t chunk_limit = std::min(kFetchChunkBytes, config_.remote_max_in_flight_bytes);
  const size_t window = std::max<uint64_t>(1, config_.remote_max_in_flight_bytes / chunk_limit);
  while (fetch->chunks_in_flight < window && !fetch->to_read.empty()) {
    std::vector<remote::RemoteWorker::ReadInto> reads;
    auto slots = std::make_shared<std::vector<PendingWrite>>();
    auto started = std::make_shared<std::vector<BlockKey>>();
    uint64_t bytes = 0;
    while (!fetch->to_read.empty()) {
      const BlockKey key = fetch->to_read.front();
      const uint64_t block_bytes = store_->block_bytes(key.layout);
      if (!started->empty() && bytes + block_bytes > chunk_limit) break;
      fetch->to_read.pop_front();
      auto reserved = reserve_staging(key, block_bytes);
      if (!reserved.is_ok() || !*reserved) {
        // No room, or present meanwhile but not visible (a Save is writing it).
        settle_fetch(
            key, nullptr,
            reserved.is_ok() ? unavailable("it is being saved; retry") : reserved.status());
        continue;
      }
      PendingWrite& slot = **reserved;
      std::byte* into = store_->memory(slot.location().tier)->host_data() + slot.location().offset;
      reads.push_back(
          {{fetch->namespace_name, key.layout.layout_digest, key.hash}, {into, block_bytes}});
      slots->push_back(std::move(slot));
      started->push_back(key);
      bytes += block_bytes;
    }
    if (reads.empty()) continue;
    ++fetch->chunks_in_flight;
    // Every started read ends once: its slot committed or given back, its waiters told.
    auto settle = [this, slots, started, fetch](const std::vector<Status>& statuses) {
      for (size_t j = 0; j < started->size(); ++j) {
        settle_fetch((*started)[j], &(*slots)[j], statuses[j]);
      }
      --fetch->chunks_in_flight;
      pump_fetch(fetch);
    };
    if (!remote_->worker->get_into(std::move(reads),
                                   [settle](std::vector<Status> statuses) { settle(statuses); })) {
      // Other reads hold the worker's bound: this chunk and the rest are not read now.
      --fetch->chunks_in_flight;
      const Status busy =
          resource_exhausted("the remote tier has as many bytes in flight as it may; retry");
      for (size_t j = 0; j < started->size(); ++j) {
        settle_fetch((*started)[j], &(*slots)[j], busy);
      }
      while (!fetch->to_read.empty()) {
        const BlockKey key = fetch->to_read.front();
        fetch->to_read.pop_front();
        settle_fetch(key, nullptr, busy);
      }
      return;
    }
  }
}

namespace {

// A reply that waits for the remote tier: the first of its answer and its deadline
// (remote-timeout) sends it.
struct RemoteWait {
  bool answered = false;
  std::unique_ptr<asio::steady_timer> deadline;
  bool take() {
    if (answered) return false;
    answered = true;
    if (deadline) deadline->cancel();
    return true;
  }
};

}  // namespace

void Service::lookup_remote(const ConnectionPtr& c, const EngineContext& engine, uint64_t id,
                            std::vector<BlockHash> hashes, std::vector<Tier> tiers) {
  auto answer = [this, c, id, total = hashes.size()](const std::vector<Tier>& found) {
    counters_.lookup_hits += found.size();
    counters_.lookup_misses += total - found.size();
    reply(c, id, [&](wire::Response::Builder response) {
      auto out = response.initLookup();
      out.setHitCount(static_cast<uint32_t>(found.size()));
      auto list = out.initTiers(static_cast<unsigned>(found.size()));
      for (unsigned i = 0; i < found.size(); ++i) list.set(i, static_cast<wire::Tier>(found[i]));
    });
  };
  // Blocks being read from the cluster already (a BeginTurn's prefetch) need no question.
  while (tiers.size() < hashes.size() &&
         remote_->fetching.contains({engine.layout_key, hashes[tiers.size()]})) {
    tiers.push_back(Tier::kRemote);
  }
  // Not connected (the cluster is down or not reached yet): a miss at once, no wait.
  if (tiers.size() == hashes.size() || !remote_->worker->connected()) {
    answer(tiers);
    return;
  }
  std::vector<remote::RemoteBlockId> ids;
  for (size_t i = tiers.size(); i < hashes.size(); ++i) {
    ids.push_back({engine.namespace_name, engine.layout_key.layout_digest, hashes[i]});
  }
  auto wait = std::make_shared<RemoteWait>();
  wait->deadline = std::make_unique<asio::steady_timer>(io_);
  wait->deadline->expires_after(std::chrono::milliseconds(config_.remote_timeout_ms));
  wait->deadline->async_wait([wait, answer, tiers](const boost::system::error_code& ec) {
    if (!ec && wait->take()) answer(tiers);  // what is held here
  });
  remote_->worker->exists_blocks(
      std::move(ids), [this, wait, answer, tiers](std::vector<Result<bool>> found) mutable {
        if (!wait->take()) return;
        for (Result<bool>& exists : found) {
          if (!exists.is_ok() || !*exists) break;
          tiers.push_back(Tier::kRemote);
          ++remote_->lookup_hits;
        }
        answer(tiers);
      });
}

void Service::resume_from_remote(const ConnectionPtr& c, const EngineContext& engine, uint64_t id,
                                 const std::string& session_id) {
  if (!remote_->worker->connected()) {
    reply_error(c, id,
                not_found("unknown session '{}' (the remote tier is not connected)", session_id));
    return;
  }
  auto engine_ref = std::static_pointer_cast<EngineContext>(c->user_state);
  auto wait = std::make_shared<RemoteWait>();
  wait->deadline = std::make_unique<asio::steady_timer>(io_);
  wait->deadline->expires_after(std::chrono::milliseconds(config_.remote_timeout_ms));
  wait->deadline->async_wait([this, wait, c, id, session_id](const boost::system::error_code& ec) {
    if (ec || !wait->take()) return;
    reply_error(c, id,
                not_found("unknown session '{}' (the remote tier did not answer within {} ms)",
                          session_id, config_.remote_timeout_ms));
  });
  remote_->worker->get_session(
      engine.namespace_name, session_id,
      [this, wait, c, id, engine_ref, session_id](Result<std::string> value) {
        if (!wait->take()) return;
        EngineContext& engine = *engine_ref;
        // A Save may have created the session meanwhile: then it is simply known.
        if (policy::Session* known = sessions_.find(engine.namespace_id, session_id)) {
          begin_turn(c, engine, id, *known, 0);
          return;
        }
        if (!value.is_ok()) {
          reply_error(c, id,
                      not_found("unknown session '{}' (the remote tier: {})", session_id,
                                value.status().to_string()));
          return;
        }
        auto record = decode_session(encode_session_key(engine.namespace_name, session_id), *value);
        if (!record || record->namespace_name != engine.namespace_name ||
            record->session_id != session_id) {
          reply_error(c, id, data_loss("session '{}': its remote record is malformed", session_id));
          return;
        }
        if (record->layout_digest != engine.layout_key.layout_digest) {
          reply_error(c, id,
                      not_found("unknown session '{}' (the remote tier has it for another KV "
                                "layout)",
                                session_id));
          return;
        }
        auto created = sessions_.get_or_create(engine.namespace_id, session_id, engine.layout_key);
        if (!created.is_ok()) {
          reply_error(c, id, created.status());
          return;
        }
        policy::Session& session = **created;
        const LayoutKey layout = engine.layout_key;
        // The blocks held here already, then the rest read from the cluster: the session
        // grows by each block once it and all before it are here, and stops at the first
        // that is not.
        size_t held = 0;
        while (held < record->blocks.size() && store_->lookup({layout, record->blocks[held]})) {
          ++held;
        }
        std::vector<BlockHash> present(record->blocks.begin(),
                                       record->blocks.begin() + static_cast<std::ptrdiff_t>(held));
        for (const BlockHash& hash : sessions_.record_save(session, present, false)) {
          store_->add_session_ref({layout, hash});
        }
        restore_from_record(session, *record, now_ms(), wall_now_ms());
        ++remote_->resumed_sessions;
        std::vector<BlockKey> rest;
        for (size_t i = held; i < record->blocks.size(); ++i) {
          rest.push_back({layout, record->blocks[i]});
        }
        const auto fetching = static_cast<uint32_t>(rest.size());
        if (held == 0) remote_->synced[{engine.namespace_id, session_id}] = 0;
        note_session_changed(session);  // its NVMe record, when there is a tier
        // The blocks as they land: the session grows by each once it and all before it
        // are here, up to the first that is not, and only while it is still the
        // session this record made (its last block the record's block before).
        struct Growth {
          std::vector<char> landed;
          size_t next = 0;
          size_t limit = 0;  // the first block that did not land (rest.size(): none yet)
        };
        auto growth = std::make_shared<Growth>();
        growth->landed.assign(rest.size(), 0);
        growth->limit = rest.size();
        const policy::SessionKey key{engine.namespace_id, session_id};
        // Before the turn is answered, so that the waits below see a live session.
        begin_turn(c, engine, id, session, fetching);
        auto grow = [this, growth, rest, key, held,
                     before = held == 0 ? std::optional<BlockHash>()
                                        : std::optional<BlockHash>(record->blocks[held - 1])](
                        size_t i, const Status& status) {
          if (status.is_ok()) {
            growth->landed[i] = 1;
          } else {
            growth->limit = std::min(growth->limit, i);
          }
          policy::Session* session = sessions_.find(key.namespace_id, key.id);
          if (session == nullptr) return;
          bool grew = false;
          while (growth->next < growth->limit && growth->landed[growth->next]) {
            const BlockKey& block = rest[growth->next];
            const std::optional<BlockHash> last =
                growth->next == 0 ? before : std::optional<BlockHash>(rest[growth->next - 1].hash);
            // Cut, closed and made again, or grown by a Save meanwhile: not this
            // record's session any more; and a block evicted again ends it here.
            if (session->blocks.size() != held + growth->next ||
                (last.has_value() &&
                 (session->blocks.empty() || session->blocks.back() != *last)) ||
                !store_->lookup(block)) {
              growth->limit = growth->next;
              break;
            }
            // Appended without touching the session's state: a block landing after the
            // turn's end must not make it active again.
            for (const BlockHash& hash : sessions_.append_blocks(*session, {block.hash})) {
              store_->add_session_ref({block.layout, hash});
            }
            // Read from the cluster: there already, nothing to write behind.
            auto synced = remote_->synced.find(key);
            if (synced != remote_->synced.end() && held == 0 && synced->second == growth->next) {
              ++synced->second;
            }
            ++growth->next;
            grew = true;
          }
          if (grew) note_session_changed(*session);
        };
        fetch_remote(engine.namespace_name, rest, std::move(grow));
      });
}

void Service::fill_remote_stats(wire::RemoteStats::Builder out) const {
  out.setConfigured(remote_ != nullptr);
  if (!remote_) return;
  const remote::RemoteWorker::Snapshot s = remote_->worker->snapshot();
  out.setConnected(s.connected);
  out.setDegraded(s.degraded);
  out.setMasters(static_cast<uint32_t>(s.masters));
  out.setStoredBytes(s.store.stored_bytes);
  out.setBudgetBytes(config_.remote_bytes);
  out.setInFlightBytes(s.in_flight_bytes);
  out.setWriteLagMs(static_cast<uint64_t>(s.write_lag.count()));
  out.setWrittenBlocks(remote_->written_blocks);
  out.setFetchedBlocks(remote_->fetched_blocks);
  out.setLookupHits(remote_->lookup_hits);
  out.setCorruptValues(s.store.corrupt);
  out.setErrors(s.store.errors);
  out.setResumedSessions(remote_->resumed_sessions);
  out.setDeferredBlocks(remote_->deferred_blocks);
  out.setSpilledBlocks(remote_->spilled_blocks);
  out.setSpillUnwritten(remote_->spill_unwritten);
}

void Service::render_remote_metrics(PrometheusText& out) const {
  if (!remote_) return;
  const remote::RemoteWorker::Snapshot s = remote_->worker->snapshot();
  auto gauge = [&](std::string_view name, std::string_view help, auto value) {
    out.family(name, "gauge", help);
    out.sample(name, "", value);
  };
  auto counter = [&](std::string_view name, std::string_view help, uint64_t value) {
    out.family(name, "counter", help);
    out.sample(name, "", value);
  };
  gauge("kvtier_remote_connected", "1 once the remote tier has a slot map of the cluster.",
        uint64_t{s.connected});
  gauge("kvtier_remote_degraded",
        "1 while a Redis node the remote tier needs is down or answering errors.",
        uint64_t{s.degraded});
  gauge("kvtier_remote_masters", "Masters in the remote tier's slot map.",
        static_cast<uint64_t>(s.masters));
  gauge("kvtier_remote_stored_bytes", "Bytes this node keeps stored in the cluster (remote-bytes).",
        s.store.stored_bytes);
  gauge("kvtier_remote_in_flight_bytes", "Payload bytes queued or moving to or from the cluster.",
        s.in_flight_bytes);
  gauge("kvtier_remote_write_lag_seconds",
        "How long the oldest pending write-behind has waited (0: none pending).",
        static_cast<double>(s.write_lag.count()) / 1000.0);
  counter("kvtier_remote_written_bytes_total", "Bytes written to the cluster.",
          s.store.bytes_written);
  counter("kvtier_remote_read_bytes_total", "Bytes read from the cluster.", s.store.bytes_read);
  counter("kvtier_remote_hits_total", "Values found and verified.", s.store.hits);
  counter("kvtier_remote_misses_total", "Values not there (or of another format version).",
          s.store.misses);
  counter("kvtier_remote_corrupt_total", "Values that did not verify (deleted, never served).",
          s.store.corrupt);
  counter("kvtier_remote_errors_total", "Commands a Redis node did not answer or refused.",
          s.store.errors);
  counter("kvtier_remote_written_blocks_total", "Blocks written behind at the end of a turn.",
          remote_->written_blocks);
  counter("kvtier_remote_failed_blocks_total", "Blocks whose write-behind failed.",
          remote_->failed_blocks);
  gauge("kvtier_remote_deferred_blocks",
        "Blocks held here that sessions' last end of turn could not write behind (in GPU "
        "memory or on NVMe).",
        remote_->deferred_blocks);
  counter("kvtier_remote_fetched_blocks_total",
          "Blocks a Load or BeginTurn read from the cluster into RAM.", remote_->fetched_blocks);
  counter("kvtier_remote_fetch_misses_total",
          "Blocks asked of the cluster and not read (absent, corrupt, unreachable, no room).",
          remote_->fetch_misses);
  counter("kvtier_remote_lookup_hits_total", "Blocks a Lookup found only in the remote tier.",
          remote_->lookup_hits);
  counter("kvtier_remote_resumed_sessions_total",
          "Sessions a BeginTurn created here from their record in the remote tier.",
          remote_->resumed_sessions);
  counter("kvtier_remote_spilled_blocks_total",
          "Blocks evicted from NVMe that were written to the cluster on their way out.",
          remote_->spilled_blocks);
  counter("kvtier_remote_spill_present_blocks_total",
          "Blocks evicted from NVMe that the cluster held already (nothing written).",
          remote_->spill_present);
  counter("kvtier_remote_spill_unwritten_blocks_total",
          "Blocks evicted from NVMe without being written to the cluster (the spill bound was "
          "full, the cluster unreachable, or a read or write failed).",
          remote_->spill_unwritten);
  counter("kvtier_remote_declined_writes_total", "Write-behinds the in-flight bound declined.",
          remote_->declined_writes);
}

}  // namespace kvtier::daemon
