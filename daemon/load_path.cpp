// Load: scatter the leading held blocks of a prefix into the engine's blocks.
//
// Blocks on NVMe are never scattered from the disk: a Load first has them read into
// RAM (or host HBM) by the move executor (tiers/move_executor.h), waits for those reads —
// joining a read already running rather than reading twice — for at most
// nvme-load-wait-ms, and then scatters what is readable, in prefix order. A block
// whose bytes failed their checksum ends the prefix with DataLoss.
#include <boost/asio/steady_timer.hpp>

#include <memory>
#include <optional>

#include "common/log.h"
#include "daemon/persistence.h"
#include "daemon/service.h"

namespace kvtier::daemon {
namespace {

// A Load in progress: the prefix it scanned, each block either pinned where it can be
// scattered from or waiting for its NVMe read. Shared by the read waiters and the
// deadline; whichever finds the last answer (or the deadline) finishes the Load.
struct PendingLoad {
  struct Entry {
    BlockKey key;
    uint64_t engine_block_id;
    std::optional<BlockLocation> pinned;  // set once readable and pinned
    Status failure;                       // why not, for a block that was waited for
  };
  std::vector<Entry> entries;  // the prefix that was held when the Load arrived
  Status scan_stop;            // why the scan stopped early (OK when it did not)
  size_t waiting = 0;
  bool finished = false;
  std::unique_ptr<asio::steady_timer> deadline;
};

}  // namespace

Status Service::handle_load(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                            BlockListRequest request) {
  if (!request.session_id.empty()) {
    if (policy::Session* session = sessions_.find(engine.namespace_id, request.session_id)) {
      sessions_.record_activity(*session);
    }
  }
  auto load = std::make_shared<PendingLoad>();
  std::vector<BlockKey> to_read;
  for (size_t i = 0; i < request.hashes.size(); ++i) {
    BlockKey key{engine.layout_key, request.hashes[i]};
    auto info = store_->lookup(key);
    if (!info) {
      load->scan_stop =
          not_found("blocks[{}] (hash {}) is not held", i, request.hashes[i].to_hex());
      break;
    }
    PendingLoad::Entry entry{key, request.engine_block_ids[i], std::nullopt, Status::ok()};
    if (store_->memory(info->location.tier) != nullptr) {  // the Device copies from it
      entry.pinned = store_->pin(key, now_ms());
      if (!entry.pinned) {
        load->scan_stop = resource_exhausted("blocks[{}] has too many readers; retry", i);
        break;
      }
    } else {
      ++load->waiting;
      if (!mover_->reading(key)) to_read.push_back(key);
    }
    load->entries.push_back(std::move(entry));
  }

  auto engine_ref = std::static_pointer_cast<EngineContext>(c->user_state);
  // Scatters the leading readable blocks and replies; unpins everything it pinned.
  auto finish = std::make_shared<std::function<void()>>();
  *finish = [this, c, id, load, engine_ref, total = request.hashes.size()]() {
    load->finished = true;
    if (load->deadline) load->deadline->cancel();
    size_t count = 0;
    while (count < load->entries.size() && load->entries[count].pinned) ++count;
    Status stop_reason = load->scan_stop;
    if (count < load->entries.size()) {
      const PendingLoad::Entry& stopped = load->entries[count];
      stop_reason = stopped.failure.with_context(
          fmt::format("blocks[{}] (hash {})", count, stopped.key.hash.to_hex()));
    }
    for (size_t i = count; i < load->entries.size(); ++i) {
      if (load->entries[i].pinned) store_->unpin(load->entries[i].key);
    }
    load->entries.resize(count);
    // A Load that waited for NVMe may find a region unregistered meanwhile.
    if (Status registered = check_regions_registered(*engine_ref); !registered.is_ok()) {
      for (const PendingLoad::Entry& entry : load->entries) store_->unpin(entry.key);
      reply_error(c, id, registered);
      return;
    }
    CopyBatch batch;
    batch.priority = CopyPriority::kForeground;  // an engine waits for it
    for (const PendingLoad::Entry& entry : load->entries) {
      add_plane_segments(batch, *engine_ref, entry.engine_block_id, *entry.pinned,
                         /*to_engine=*/true);
    }
    auto done = [this, c, id, load, stop_reason, total,
                 block_bytes = engine_ref->layout.block_bytes](Status status) {
      for (const PendingLoad::Entry& entry : load->entries) store_->unpin(entry.key);
      if (!status.is_ok()) {
        reply_error(c, id, status.with_context("copying the blocks out failed"));
        return;
      }
      // Counted once the bytes reached the engine: a failed copy served nothing.
      counters_.lookup_hits += load->entries.size();
      counters_.lookup_misses += total - load->entries.size();
      counters_.bytes_loaded += load->entries.size() * block_bytes;
      reply(c, id, [&](wire::Response::Builder response) {
        auto out = response.initLoad();
        out.setLoadedCount(static_cast<uint32_t>(load->entries.size()));
        set_wire_error(out.initStopReason(), stop_reason);
      });
    };
    if (load->entries.empty()) {
      done(Status::ok());
      return;
    }
    Status submitted = submit_copy(std::move(batch), done);
    if (!submitted.is_ok()) {
      for (const PendingLoad::Entry& entry : load->entries) store_->unpin(entry.key);
      reply_error(c, id, submitted);
    }
  };
  if (load->waiting == 0) {
    (*finish)();
    return Status::ok();
  }

  // Blocks on NVMe: read them (one batch), or join the reads already running.
  (void)mover_->read_into_memory(to_read);
  load->deadline = std::make_unique<asio::steady_timer>(io_);
  load->deadline->expires_after(std::chrono::milliseconds(config_.nvme_load_wait_ms));
  load->deadline->async_wait([this, load, finish](const boost::system::error_code& ec) {
    if (ec || load->finished) return;
    for (PendingLoad::Entry& entry : load->entries) {
      if (!entry.pinned && entry.failure.is_ok()) {
        entry.failure =
            unavailable("still being read from NVMe after {} ms; retry", config_.nvme_load_wait_ms);
      }
    }
    (*finish)();
  });
  for (size_t i = 0; i < load->entries.size(); ++i) {
    if (load->entries[i].pinned) continue;
    mover_->await_readable(load->entries[i].key, [this, load, finish, i](const Status& status) {
      if (load->finished) return;
      PendingLoad::Entry& entry = load->entries[i];
      if (status.is_ok()) {
        entry.pinned = store_->pin(entry.key, now_ms());
        if (!entry.pinned) entry.failure = not_found("it was evicted before it could be loaded");
      } else {
        entry.failure = status;
      }
      if (--load->waiting == 0) (*finish)();
    });
  }
  return Status::ok();
}

}  // namespace kvtier::daemon
