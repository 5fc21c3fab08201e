// LoadPath: Lookup and Load (load_path.h).
#include "daemon/load_path.h"

#include <boost/asio/steady_timer.hpp>

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/log.h"
#include "daemon/copies.h"
#include "daemon/remote_path.h"
#include "daemon/replies.h"
#include "schema/wire_tier.h"

namespace kvtier::daemon {

// A Load in progress: the prefix it scanned, each block either pinned where it can be
// scattered from or waiting for its NVMe read. Shared by the read waiters and the
// deadline; whichever finds the last answer (or the deadline) finishes the Load, and
// the pins go on to the copy that scatters them.
struct LoadPath::PendingLoad {
  struct Entry {
    BlockKey key;
    uint64_t engine_block_id;
    PinnedBlock pinned;   // held once readable and pinned
    Status failure;       // why not, for a block that was waited for
    bool remote = false;  // read from the remote tier (not held here when the Load came)
  };
  std::vector<Entry> entries;  // the prefix that was held when the Load arrived
  Status scan_stop;            // why the scan stopped early (OK when it did not)
  size_t waiting = 0;
  bool finished = false;
  std::unique_ptr<asio::steady_timer> deadline;
  // A Load of more NVMe blocks than memory has room for at once: its leading blocks
  // already read are scattered to the engine and let go of (their room lets the next
  // reads land) while the rest are still read. entries [0, served) are in the engine.
  size_t served = 0;
  bool scattering = false;    // such a partial scatter is under way
  bool finish_after = false;  // the Load was over while it was: finish when it is done
  Status scatter_failure;     // a partial scatter failed: the Load ends at `served`
};

// The scan of a Load's prefix: the Load, and the blocks it must wait for.
struct LoadPath::LoadScan {
  std::shared_ptr<PendingLoad> load = std::make_shared<PendingLoad>();
  std::vector<BlockKey> to_read;  // on NVMe, and not being read already
  // With a remote tier, blocks not held here are read from it (their entries' indexes).
  std::vector<BlockKey> from_remote;
  std::vector<size_t> remote_entries;
};

// Where a Load scatters its blocks: the engine (held while the Load is), its planes, and
// the staging region of a staged Load.
struct LoadPath::LoadTarget {
  std::shared_ptr<EngineContext> engine;
  BlockPlanes planes;
  std::optional<StagingTarget> staging;
};

// A finished Load: the blocks its last copy scatters (their pins, which the copy's
// completion owns), and what its reply says.
struct LoadPath::FinishedLoad {
  std::shared_ptr<std::vector<PendingLoad::Entry>> loaded;
  Status stop_reason;
  size_t total;          // the blocks the Load named
  uint64_t range_bytes;  // of one block: what the engine gets per block loaded
  size_t served;         // blocks earlier partial scatters put in the engine
  bool counts_lookups;   // the Load counts its blocks as lookup hits and misses
};

Status LoadPath::handle_load(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                             BlockListRequest request) {
  record_load_activity(engine, request.session_id);
  LoadScan scan = scan_prefix(engine, request);
  const std::shared_ptr<PendingLoad>& load = scan.load;
  const LoadTarget target{std::static_pointer_cast<EngineContext>(c->user_state), request.planes,
                          request.staging};
  // Scatters the leading readable blocks and replies (finish_load).
  auto finish = std::make_shared<std::function<void()>>();
  *finish = [this, c, id, load, target, total = request.hashes.size()]() {
    assert_control_thread();
    finish_load(c, id, load, target, total);
  };
  if (load->waiting == 0) {
    (*finish)();
    return Status::ok();
  }
  wait_for_blocks(scan, finish, target);
  return Status::ok();
}

void LoadPath::record_load_activity(const EngineContext& engine, const std::string& session_id) {
  if (session_id.empty()) return;
  if (policy::Session* session = ctx_.sessions.find(engine.namespace_id, session_id)) {
    ctx_.sessions.record_activity(*session);
    // The first Load after BeginTurn: how long its promotions had to land.
    if (session->turn_begun) {
      ctx_.planner.observe_turn_lead(now_ms() - std::min(now_ms(), session->turn_begun_ms));
      session->turn_begun = false;
    }
  }
}

LoadPath::LoadScan LoadPath::scan_prefix(const EngineContext& engine,
                                         const BlockListRequest& request) {
  LoadScan scan;
  PendingLoad& load = *scan.load;
  ctx_.store->prefetch(engine.layout_key, request.hashes);
  for (size_t i = 0; i < request.hashes.size(); ++i) {
    BlockKey key{engine.layout_key, request.hashes[i]};
    auto info = ctx_.store->lookup(key);
    if (!info && remote_.enabled()) {
      scan.remote_entries.push_back(load.entries.size());
      scan.from_remote.push_back(key);
      ++load.waiting;
      load.entries.push_back(
          {key, request.engine_block_ids[i], PinnedBlock(), Status::ok(), /*remote=*/true});
      continue;
    }
    if (!info) {
      load.scan_stop = not_found("blocks[{}] (hash {}) is not held", i, request.hashes[i].to_hex());
      break;
    }
    PendingLoad::Entry entry{key, request.engine_block_ids[i], PinnedBlock(), Status::ok()};
    if (ctx_.store->memory(info->location.tier) != nullptr) {  // the Device copies from it
      entry.pinned = ctx_.store->pin(key, now_ms());
      if (!entry.pinned) {
        load.scan_stop = resource_exhausted("blocks[{}] has too many readers; retry", i);
        break;
      }
    } else {
      ++load.waiting;
      if (!ctx_.mover->reading(key)) scan.to_read.push_back(key);
    }
    load.entries.push_back(std::move(entry));
  }
  return scan;
}

void LoadPath::wait_for_blocks(const LoadScan& scan, const Finish& finish,
                               const LoadTarget& target) {
  const std::shared_ptr<PendingLoad>& load = scan.load;
  // Reads waiting for room while this Load pins the blocks already read: scatter those
  // (the leading run not yet served) to the engine now and let them go, so that the
  // rest can land. Without it a Load of more NVMe blocks than RAM holds would wait out
  // nvme-load-wait-ms for room its own pins keep.
  auto scatter_ready = [this, load, finish, target]() {
    assert_control_thread();
    scatter_ready_blocks(load, finish, target);
  };

  // Blocks on NVMe: read them (one batch), or join the reads already running. Blocks
  // from the remote tier wait up to remote-timeout, those on NVMe nvme-load-wait-ms.
  (void)ctx_.mover->read_into_memory(scan.to_read);
  const bool nvme_waits = load->waiting > scan.from_remote.size();
  const uint64_t wait_ms =
      std::max<uint64_t>(nvme_waits ? ctx_.config.nvme_load_wait_ms : 0,
                         scan.from_remote.empty() ? 0 : ctx_.config.remote_timeout_ms);
  load->deadline = std::make_unique<asio::steady_timer>(ctx_.io);
  load->deadline->expires_after(std::chrono::milliseconds(wait_ms));
  load->deadline->async_wait([load, finish, wait_ms](const boost::system::error_code& ec) {
    assert_control_thread();
    if (ec || load->finished) return;
    for (PendingLoad::Entry& entry : load->entries) {
      if (!entry.pinned && entry.failure.is_ok()) {
        entry.failure = unavailable("still being read from {} after {} ms; retry",
                                    entry.remote ? "the remote tier" : "NVMe", wait_ms);
      }
    }
    (*finish)();
  });
  for (size_t i = 0; i < load->entries.size(); ++i) {
    if (load->entries[i].pinned || load->entries[i].remote) continue;
    ctx_.mover->await_readable(load->entries[i].key,
                               [this, load, finish, scatter_ready, i](const Status& status) {
                                 assert_control_thread();
                                 if (load->finished) return;
                                 pin_landed_block(*load, i, status);
                                 if (--load->waiting == 0) {
                                   (*finish)();
                                 } else {
                                   scatter_ready();
                                 }
                               });
  }
  if (!scan.from_remote.empty()) {
    remote_.fetch_remote(
        scan.from_remote,
        [this, load, finish, remote_entries = scan.remote_entries](size_t j, const Status& status) {
          assert_control_thread();
          if (load->finished) return;
          pin_landed_block(*load, remote_entries[j], status);
          if (--load->waiting == 0) (*finish)();
        });
  }
}

void LoadPath::pin_landed_block(PendingLoad& load, size_t i, const Status& status) {
  PendingLoad::Entry& entry = load.entries[i];
  if (status.is_ok()) {
    entry.pinned = ctx_.store->pin(entry.key, now_ms());
    if (!entry.pinned) entry.failure = not_found("it was evicted before it could be loaded");
  } else {
    entry.failure = status;
  }
}

void LoadPath::scatter_ready_blocks(const std::shared_ptr<PendingLoad>& load, const Finish& finish,
                                    const LoadTarget& target) {
  if (load->finished || load->scattering || load->waiting == 0 || ctx_.mover->room_waiters() == 0) {
    return;
  }
  size_t end = load->served;
  while (end < load->entries.size() && load->entries[end].pinned) ++end;
  if (end == load->served) return;
  if (!check_request_regions(*target.engine, target.staging, load->entries.size()).is_ok()) {
    return;
  }
  CopyBatch batch;
  batch.priority = CopyPriority::kForeground;
  auto pins = std::make_shared<std::vector<PinnedBlock>>();
  for (size_t i = load->served; i < end; ++i) {
    PendingLoad::Entry& entry = load->entries[i];
    copies_.add_request_segments(batch, *target.engine, target.staging, i, entry.engine_block_id,
                                 entry.pinned.location(),
                                 /*to_engine=*/true, target.planes);
    pins->push_back(std::move(entry.pinned));
  }
  load->scattering = true;
  Status submitted =
      copies_.submit_copy(std::move(batch), [this, load, finish, pins, end](Status status) {
        assert_control_thread();
        pins->clear();  // on the control thread: the room they held is free
        load->scattering = false;
        if (status.is_ok()) {
          load->served = end;
        } else {
          load->scatter_failure = status;
        }
        ctx_.mover->retry_room_waiters();
        if (load->finish_after || !status.is_ok()) (*finish)();
      });
  if (!submitted.is_ok()) {
    load->scattering = false;
    load->scatter_failure = submitted;
    (*finish)();
  }
}

void LoadPath::finish_load(const ConnectionPtr& c, uint64_t id,
                           const std::shared_ptr<PendingLoad>& load, const LoadTarget& target,
                           size_t total) {
  if (load->scattering) {  // the bytes of a partial scatter are still on their way
    load->finish_after = true;
    return;
  }
  load->finished = true;
  if (load->deadline) load->deadline->cancel();
  const size_t served = load->served;
  // The pins move out of the shared PendingLoad into `loaded`, which the copy's
  // completion owns: every way out of here (a region gone, the copy refused) drops them,
  // and so does the completion.
  auto loaded = std::make_shared<std::vector<PendingLoad::Entry>>(std::move(load->entries));
  size_t count = served;
  if (load->scatter_failure.is_ok()) {
    while (count < loaded->size() && (*loaded)[count].pinned) ++count;
  }
  Status stop_reason = load->scan_stop;
  if (!load->scatter_failure.is_ok()) {
    stop_reason = load->scatter_failure.with_context("copying the blocks out failed");
  } else if (count < loaded->size()) {
    const PendingLoad::Entry& stopped = (*loaded)[count];
    stop_reason = stopped.failure.with_context(
        fmt::format("blocks[{}] (hash {})", count, stopped.key.hash.to_hex()));
  }
  // Blocks after the first that is not readable are not loaded: unpinned here; those
  // a partial scatter served are in the engine already.
  loaded->erase(loaded->begin() + static_cast<std::ptrdiff_t>(count), loaded->end());
  loaded->erase(loaded->begin(), loaded->begin() + static_cast<std::ptrdiff_t>(served));
  const EngineContext& engine = *target.engine;
  // A Load that waited for NVMe may find a region unregistered meanwhile.
  if (Status registered = check_request_regions(engine, target.staging, total);
      !registered.is_ok()) {
    reply_error(c, id, registered);
    return;
  }
  CopyBatch batch;
  batch.priority = CopyPriority::kForeground;  // an engine waits for it
  for (size_t i = 0; i < loaded->size(); ++i) {
    const PendingLoad::Entry& entry = (*loaded)[i];
    copies_.add_request_segments(batch, engine, target.staging, served + i, entry.engine_block_id,
                                 entry.pinned.location(),
                                 /*to_engine=*/true, target.planes);
  }
  uint64_t range_bytes = 0;  // of one block: what the engine gets per block loaded
  for (const PlaneLayout& plane : target.planes.of(engine.layout))
    range_bytes += plane.bytes_per_block;
  // A layer-wise load sends one Load per range for the same blocks: only the one
  // starting at plane 0 counts them as hits or misses, so a block counts once.
  const bool counts_lookups = target.planes.begin == 0;
  const FinishedLoad finished{.loaded = loaded,
                              .stop_reason = stop_reason,
                              .total = total,
                              .range_bytes = range_bytes,
                              .served = served,
                              .counts_lookups = counts_lookups};
  auto done = [this, c, id, finished](Status status) {
    assert_control_thread();
    reply_load(c, id, finished, status);
  };
  if (loaded->empty()) {
    done(Status::ok());
    return;
  }
  Status submitted = copies_.submit_copy(std::move(batch), done);
  // Refused: the pins go as `loaded` and `done` do, when this returns.
  if (!submitted.is_ok()) reply_error(c, id, submitted);
}

void LoadPath::reply_load(const ConnectionPtr& c, uint64_t id, const FinishedLoad& finished,
                          const Status& status) {
  std::vector<PendingLoad::Entry>& loaded = *finished.loaded;
  const size_t count = finished.served + loaded.size();
  // What a peer policy learns from: the blocks read, in prefix order.
  policy::BlockObserver* observer =
      status.is_ok() && finished.counts_lookups ? ctx_.planner.observer() : nullptr;
  std::vector<BlockKey> read;
  if (observer != nullptr) {
    for (const PendingLoad::Entry& entry : loaded) read.push_back(entry.key);
  }
  // Unpinned now, on the control thread: the device drops its own copy of this
  // completion on one of its threads, which must not be where the pins go.
  loaded.clear();
  if (!status.is_ok()) {
    reply_error(c, id, status.with_context("copying the blocks out failed"));
    return;
  }
  // Counted once the bytes reached the engine: a failed copy served nothing.
  if (finished.counts_lookups) {
    ctx_.counters.lookup_hits += count;
    ctx_.counters.lookup_misses += finished.total - count;
  }
  ctx_.counters.bytes_loaded += count * finished.range_bytes;
  for (size_t i = 0; i < read.size(); ++i) {
    observer->block_loaded(read[i], static_cast<uint32_t>(i), ctx_.sessions.now_ms());
  }
  reply(c, id, [&](wire::Response::Builder response) {
    auto out = response.initLoad();
    out.setLoadedCount(static_cast<uint32_t>(count));
    set_wire_error(out.initStopReason(), finished.stop_reason);
  });
}

Status LoadPath::handle_lookup(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                               const std::vector<BlockHash>& hashes) {
  ctx_.store->prefetch(engine.layout_key, hashes);
  std::vector<Tier> tiers;
  for (const BlockHash& hash : hashes) {
    auto info = ctx_.store->lookup({engine.layout_key, hash});
    if (!info) break;
    tiers.push_back(info->location.tier);
  }
  if (remote_.enabled() && tiers.size() < hashes.size()) {
    // Answered when the cluster did.
    remote_.lookup_remote(engine, hashes, std::move(tiers),
                          [this, c, id, asked = hashes.size()](const std::vector<Tier>& found) {
                            assert_control_thread();
                            reply_lookup(c, id, asked, found);
                          });
    return Status::ok();
  }
  reply_lookup(c, id, hashes.size(), tiers);
  return Status::ok();
}

void LoadPath::reply_lookup(const ConnectionPtr& c, uint64_t id, size_t asked,
                            const std::vector<Tier>& tiers) {
  ctx_.counters.lookup_hits += tiers.size();
  ctx_.counters.lookup_misses += asked - tiers.size();
  reply(c, id, [&](wire::Response::Builder response) {
    auto out = response.initLookup();
    out.setHitCount(static_cast<uint32_t>(tiers.size()));
    auto list = out.initTiers(static_cast<unsigned>(tiers.size()));
    for (unsigned i = 0; i < tiers.size(); ++i) list.set(i, to_wire(tiers[i]));
  });
}

}  // namespace kvtier::daemon
