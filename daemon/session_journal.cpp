// SessionJournal: the NVMe tier's index, session records and the drain (session_journal.h).
#include "daemon/session_journal.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include "common/log.h"
#include "common/units.h"
#include "daemon/remote_path.h"

namespace kvtier::daemon {

uint64_t wall_now_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

uint64_t steady_to_wall_ms(uint64_t steady_ms, uint64_t steady_now_ms, uint64_t wall_now) {
  const uint64_t age = steady_now_ms > steady_ms ? steady_now_ms - steady_ms : 0;
  return wall_now > age ? wall_now - age : 0;
}

uint64_t wall_to_steady_ms(uint64_t wall_ms, uint64_t steady_now_ms, uint64_t wall_now) {
  const uint64_t age = wall_now > wall_ms ? wall_now - wall_ms : 0;
  return steady_now_ms > age ? steady_now_ms - age : 0;
}

NvmeSessionRecord to_record(const policy::Session& session, const std::string& namespace_name,
                            uint64_t steady_now, uint64_t wall_now) {
  NvmeSessionRecord record;
  record.namespace_name = namespace_name;
  record.session_id = session.id;
  record.layout_digest = session.layout.layout_digest;
  record.created_wall_ms = steady_to_wall_ms(session.created_ms, steady_now, wall_now);
  record.last_active_wall_ms = steady_to_wall_ms(session.last_active_ms, steady_now, wall_now);
  record.turns = session.turns;
  record.state = static_cast<uint8_t>(session.state);
  // On disk 0 is the default (the records' encoding before priorities had a scale). A
  // priority given for a time is not persisted: after a restart it has ended.
  record.priority = session.priority_until_ms != 0 || session.priority == policy::kDefaultPriority
                        ? 0
                        : session.priority;
  record.returns = session.returns;
  record.sum_log_gap = session.sum_log_gap;
  record.blocks = session.blocks.hashes();
  return record;
}

NvmeBlockKey SessionJournal::nvme_key(const BlockKey& key) const {
  return NvmeBlockKey{ctx_.engines.namespaces().name(key.layout.namespace_id),
                      key.layout.layout_digest, key.hash};
}

Status SessionJournal::open_nvme(std::vector<BlockStore::TierMemory>& tiers) {
  if (ctx_.config.nvme_bytes == 0) return Status::ok();
  for (const auto& [uid, name] : ctx_.config.shared_namespaces) {
    if (name.empty() || name.size() > 255) {
      return invalid_argument("shared-namespace '{}': an NVMe tier stores names of 1..255 bytes",
                              name);
    }
  }
  NvmeTierOptions options;
  options.dir = ctx_.config.data_dir + "/nvme";
  options.capacity_bytes = ctx_.config.nvme_bytes;
  options.slab_bytes = ctx_.config.slab_bytes;
  options.queue_depth = ctx_.config.nvme_queue_depth;
  // The pools are registered with io_uring (so the drive reads and writes them
  // directly) once they are filled: StartupGate::start_fill.
  for (const std::string& spec : ctx_.config.fault_nvme) {
    auto fault = parse_slab_io_fault(spec);
    if (!fault.is_ok()) return invalid_argument("fault-nvme: {}", fault.status().message());
    options.faults.push_back(*fault);
  }
  auto state = std::make_unique<NvmeState>();
  state->recovery = std::make_unique<NvmeRecovery>();
  auto tier = NvmeTier::open(options, state->recovery.get());
  if (!tier.is_ok()) {
    return tier.status().with_context(fmt::format("NVMe tier in {}", options.dir));
  }
  state->tier = std::move(*tier);
  // Inclusive below RAM: a block read up keeps its NVMe copy (block_store.h).
  tiers.push_back({Tier::kNvme, nullptr, state->tier->slab_bytes(), ctx_.config.nvme_bytes,
                   /*confirm_release=*/true, /*parts=*/1, /*keep_copies=*/true});
  nvme_ = std::move(state);
  return Status::ok();
}

Status SessionJournal::recover_nvme() {
  if (!nvme_ || !nvme_->recovery) return Status::ok();
  const auto started = std::chrono::steady_clock::now();
  NvmeRecovery recovery = std::move(*nvme_->recovery);
  nvme_->recovery.reset();
  const uint64_t steady_now = now_ms();
  const uint64_t wall_now = wall_now_ms();

  for (const NvmeLayoutRecord& layout : recovery.layouts) {
    const LayoutKey key{ctx_.engines.namespaces().intern(layout.namespace_name),
                        layout.layout_digest};
    Status registered = ctx_.store->register_layout(key, layout.block_bytes);
    if (!registered.is_ok()) KVTIER_LOG_WARN("NVMe layout record: {}", registered.message());
  }
  const uint64_t recovered_bytes = recover_blocks(recovery, steady_now, wall_now);
  const size_t cut_sessions = recover_sessions(recovery, steady_now, wall_now);
  // The recovery's temporaries (a record per block) are gone; hand their pages back so
  // the daemon's footprint is what it keeps, not what it once read.
  const size_t session_count = recovery.sessions.size();
  recovery = NvmeRecovery();
  (void)::malloc_trim(0);
  const auto elapsed = std::chrono::steady_clock::now() - started;
  KVTIER_LOG_INFO(
      "NVMe tier {}/nvme ({}, {}): recovered {} blocks ({}) and {} sessions ({} cut short) in "
      "{} ms",
      ctx_.config.data_dir, format_bytes(ctx_.config.nvme_bytes), nvme_->tier->describe(),
      ctx_.store->usage(Tier::kNvme).blocks, format_bytes(recovered_bytes), session_count,
      cut_sessions, std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count());
  return Status::ok();
}

uint64_t SessionJournal::recover_blocks(NvmeRecovery& recovery, uint64_t steady_now,
                                        uint64_t wall_now) {
  // Ascending offsets make rebuilding the slot allocator linear (sorting small
  // (offset, index) pairs rather than the records themselves).
  std::vector<std::pair<uint64_t, uint32_t>> order;
  order.reserve(recovery.blocks.size());
  for (size_t i = 0; i < recovery.blocks.size(); ++i) {
    order.emplace_back(recovery.blocks[i].record.offset, static_cast<uint32_t>(i));
  }
  std::sort(order.begin(), order.end());
  std::map<std::pair<std::string, uint64_t>, size_t> per_layout;  // blocks, to size the index
  for (const NvmeRecovery::Block& block : recovery.blocks) {
    ++per_layout[{block.key.namespace_name, block.key.layout_digest}];
  }
  std::set<std::pair<uint32_t, uint64_t>> reserved;
  std::vector<std::pair<NvmeBlockKey, uint64_t>> unusable;
  std::string first_problem;
  uint64_t recovered_bytes = 0;
  LayoutKey layout;  // of the previous block: usually all blocks share a few layouts
  std::string layout_namespace;
  for (const auto& [offset, index] : order) {
    NvmeRecovery::Block& block = recovery.blocks[index];
    if (block.key.namespace_name != layout_namespace ||
        block.key.layout_digest != layout.layout_digest) {
      layout_namespace = block.key.namespace_name;
      layout = {ctx_.engines.namespaces().intern(layout_namespace), block.key.layout_digest};
      if (ctx_.store->block_bytes(layout) == 0) {
        (void)ctx_.store->register_layout(layout, block.record.bytes);
      }
      if (reserved.insert({layout.namespace_id, layout.layout_digest}).second) {
        ctx_.store->reserve_blocks(layout, per_layout[{layout_namespace, layout.layout_digest}]);
      }
    }
    Status inserted =
        ctx_.store->block_bytes(layout) != block.record.bytes
            ? invalid_argument("{} bytes, but its layout has {}-byte blocks", block.record.bytes,
                               ctx_.store->block_bytes(layout))
            : ctx_.store->insert_recovered(
                  {layout, block.key.hash}, {Tier::kNvme, block.record.offset},
                  wall_to_steady_ms(block.record.last_access_wall_ms, steady_now, wall_now));
    if (inserted.is_ok()) {
      recovered_bytes += block.record.bytes;
      continue;
    }
    // E.g. a smaller --nvme-bytes than the tier was filled with: the entry goes, so no
    // later write can be mistaken for its bytes.
    if (first_problem.empty()) {
      first_problem = fmt::format("block {}: {}", block.key.hash.to_hex(), inserted.message());
    }
    unusable.emplace_back(std::move(block.key), block.record.offset);
  }
  if (!unusable.empty()) {
    KVTIER_LOG_WARN(
        "NVMe tier: dropping {} index entries this configuration cannot use (first: {})",
        unusable.size(), first_problem);
    ++nvme_->release_jobs;
    nvme_->tier->release_blocks(std::move(unusable),
                                on_control_thread<Status>(ctx_.io, [this](Status status) {
                                  assert_control_thread();
                                  --nvme_->release_jobs;
                                  if (!status.is_ok()) {
                                    KVTIER_LOG_WARN("NVMe tier: {}", status.to_string());
                                  }
                                }));
  }
  return recovered_bytes;
}

size_t SessionJournal::recover_sessions(const NvmeRecovery& recovery, uint64_t steady_now,
                                        uint64_t wall_now) {
  size_t cut_sessions = 0;
  for (const NvmeSessionRecord& record : recovery.sessions) {
    const uint32_t namespace_id = ctx_.engines.namespaces().intern(record.namespace_name);
    const LayoutKey layout{namespace_id, record.layout_digest};
    auto session = ctx_.sessions.get_or_create(namespace_id, record.session_id, layout);
    if (!session.is_ok()) continue;
    // A session is a prefix: it ends at its first block that did not survive (blocks
    // only in RAM or HBM at a crash are gone; the engine recomputes from there).
    std::vector<BlockHash> present;
    for (const BlockHash& hash : record.blocks) {
      if (!ctx_.store->lookup({layout, hash})) break;
      present.push_back(hash);
    }
    policy::Session& restored = **session;
    recovering_ = true;
    ctx_.sessions.record_save(restored, present, false);
    recovering_ = false;
    restore_from_record(restored, record, steady_now, wall_now);
    if (present.size() < record.blocks.size()) {
      ++cut_sessions;
      session_cut(restored);  // its record is rewritten whole
    } else {
      nvme_->stored_blocks[{namespace_id, record.session_id}] =
          static_cast<uint32_t>(present.size());
    }
  }
  return cut_sessions;
}

void SessionJournal::restore_from_record(policy::Session& session, const NvmeSessionRecord& record,
                                         uint64_t steady_now, uint64_t wall_now) {
  session.created_ms = wall_to_steady_ms(record.created_wall_ms, steady_now, wall_now);
  session.turns = record.turns;
  session.returns = record.returns;
  session.sum_log_gap = record.sum_log_gap;
  ctx_.sessions.set_priority(
      session, record.priority == 0 ? policy::kDefaultPriority
                                    : std::min<uint8_t>(record.priority, policy::kMaxPriority));
  ctx_.sessions.restore(
      session, record.state == 0 ? policy::SessionState::kActive : policy::SessionState::kIdle,
      wall_to_steady_ms(record.last_active_wall_ms, steady_now, wall_now));
}

void SessionJournal::note_session_changed(const policy::Session& session) {
  if (nvme_) nvme_->dirty_sessions.insert({session.namespace_id, session.id});
}

void SessionJournal::session_grew(const policy::Session& session, std::span<const BlockHash>) {
  if (!nvme_ || recovering_) return;  // recovered blocks are on NVMe, their records too
  nvme_->dirty_sessions.insert({session.namespace_id, session.id});
  if (ctx_.config.nvme_copy_after_ms == 0) return;
  queue_copies(session, ctx_.sessions.now_ms() + ctx_.config.nvme_copy_after_ms);
}

void SessionJournal::queue_copies(const policy::Session& session, uint64_t due_ms) {
  policy::SessionKey key{session.namespace_id, session.id};
  if (nvme_->copy_queued.contains(key)) return;  // its copy is due already, with these blocks
  // Kept in order of due time: a session looked at again comes due after later Saves.
  auto at = std::upper_bound(
      nvme_->copies_due.begin(), nvme_->copies_due.end(), due_ms,
      [](uint64_t due, const std::pair<uint64_t, policy::SessionKey>& e) { return due < e.first; });
  nvme_->copies_due.emplace(at, due_ms, key);
  nvme_->copy_queued.insert(std::move(key));
}

void SessionJournal::write_due_copies() {
  if (!nvme_ || nvme_->copies_due.empty()) return;
  const uint64_t now = ctx_.sessions.now_ms();
  std::vector<const policy::Session*> due;
  while (!nvme_->copies_due.empty() && nvme_->copies_due.front().first <= now) {
    const policy::SessionKey& key = nvme_->copies_due.front().second;
    if (const policy::Session* session = ctx_.sessions.find(key.namespace_id, key.id)) {
      due.push_back(session);
    }
    nvme_->copy_queued.erase(key);
    nvme_->copies_due.pop_front();
  }
  if (due.empty()) return;
  // What the operator asked most to keep first: NVMe may run out of room to spare.
  std::stable_sort(due.begin(), due.end(), [](const policy::Session* a, const policy::Session* b) {
    return a->priority > b->priority;
  });
  std::vector<BlockKey> keys;
  for (const policy::Session* session : due) {
    for (const BlockHash& hash : session->blocks) keys.push_back({session->layout, hash});
  }
  // Blocks on NVMe already, with a copy, or busy are skipped (a busy one is being
  // moved, mostly down to NVMe itself).
  ctx_.mover->copy_down(keys, Tier::kNvme);
  // A session with a block still in memory, without a copy and busy (being moved or
  // written, or its old slot still read after a move) is looked at again a planner
  // period later: the block may stay where it is. (One NVMe had no room to spare for is
  // not: a copy never takes room a block needs.)
  for (const policy::Session* session : due) {
    for (const BlockHash& hash : session->blocks) {
      const BlockKey key{session->layout, hash};
      const auto info = ctx_.store->lookup(key);
      if (info && !info->has_copy && info->location.tier != Tier::kNvme &&
          (info->state != BlockState::kReady || ctx_.store->old_slot_pinned(key))) {
        queue_copies(*session, now + ctx_.config.plan_interval_ms);
        break;
      }
    }
  }
}

void SessionJournal::session_cut(const policy::Session& session) {
  if (!nvme_) return;
  nvme_->dirty_sessions.insert({session.namespace_id, session.id});
  nvme_->stored_blocks.erase({session.namespace_id, session.id});  // written whole next
}

void SessionJournal::session_closed(uint32_t namespace_id, const std::string& session_id) {
  if (!nvme_) return;
  nvme_->dirty_sessions.erase({namespace_id, session_id});
  nvme_->stored_blocks.erase({namespace_id, session_id});
  nvme_->closed_sessions.emplace_back(ctx_.engines.namespaces().name(namespace_id), session_id);
}

void SessionJournal::flush_sessions(bool sync) {
  if (!nvme_ || (nvme_->dirty_sessions.empty() && nvme_->closed_sessions.empty())) return;
  const uint64_t steady_now = now_ms();
  const uint64_t wall_now = wall_now_ms();
  std::vector<NvmeSessionRecord> puts;
  std::vector<policy::SessionKey> written;
  for (const policy::SessionKey& key : nvme_->dirty_sessions) {
    const policy::Session* session = ctx_.sessions.find(key.namespace_id, key.id);
    if (session == nullptr) continue;
    NvmeSessionRecord record =
        to_record(*session, ctx_.engines.namespaces().name(key.namespace_id), steady_now, wall_now);
    // A session that only grew since its last write appends; others are rewritten.
    auto stored = nvme_->stored_blocks.find(key);
    if (stored != nvme_->stored_blocks.end() && stored->second <= session->blocks.size()) {
      record.append_from = stored->second;
    }
    nvme_->stored_blocks[key] = static_cast<uint32_t>(session->blocks.size());
    puts.push_back(std::move(record));
    written.push_back(key);
  }
  nvme_->dirty_sessions.clear();
  ++nvme_->session_jobs;
  nvme_->tier->write_sessions(
      std::move(puts), std::exchange(nvme_->closed_sessions, {}), sync,
      on_control_thread<Status>(ctx_.io, [this, written](Status status) {
        assert_control_thread();
        --nvme_->session_jobs;
        uint64_t held_back = 0;
        if (!status.is_ok() && nvme_->session_write_warnings.allow(&held_back)) {
          KVTIER_LOG_WARN(
              "NVMe tier: session records: {} ({} more since the last such "
              "line)",
              status.to_string(), held_back);
        }
        if (!status.is_ok()) {
          // What is stored is not known: written whole next time.
          for (const policy::SessionKey& key : written) {
            nvme_->stored_blocks.erase(key);
          }
        }
        check_drain();
      }));
}

void SessionJournal::start_drain(std::function<void()> stopped) {
  nvme_->drain_phase = NvmeState::DrainPhase::kMoving;
  nvme_->drained = std::move(stopped);
  nvme_->drain_started_ms = now_ms();
  nvme_->drained_bytes_before = ctx_.mover->counters().bytes_demoted;
  nvme_->drained_onto_copies_before = ctx_.mover->counters().bytes_demoted_onto_copy;
  ctx_.mover->set_draining(true);
  nvme_->drain_deadline = std::make_unique<asio::steady_timer>(ctx_.io);
  nvme_->drain_deadline->expires_after(std::chrono::milliseconds(ctx_.config.drain_timeout_ms));
  nvme_->drain_deadline->async_wait([this](const boost::system::error_code& ec) {
    assert_control_thread();
    if (ec || !nvme_->draining()) return;
    KVTIER_LOG_WARN("drain to NVMe did not finish within {}; exiting with the rest unwritten",
                    format_duration_ms(ctx_.config.drain_timeout_ms));
    nvme_->drain_phase = NvmeState::DrainPhase::kDone;
    ctx_.io.stop();
    if (auto drained = std::exchange(nvme_->drained, nullptr)) drained();
  });
  KVTIER_LOG_INFO("draining the RAM/HBM blocks of {} sessions to NVMe (at most {})",
                  ctx_.sessions.size(), format_duration_ms(ctx_.config.drain_timeout_ms));
  check_drain();
}

void SessionJournal::check_drain() {
  if (!nvme_ || !nvme_->draining()) return;
  if (nvme_->jobs_in_flight() || ctx_.mover->busy() || ctx_.counters.copies_in_flight > 0) return;
  if (nvme_->drain_phase == NvmeState::DrainPhase::kMoving) {
    // Everything a live session holds and NVMe does not have yet (blocks in GPU memory
    // go through RAM: the executor takes them on when they land). A block with an NVMe
    // copy moves onto it and writes nothing.
    std::vector<policy::Move> to_nvme;
    std::unordered_set<BlockKey, BlockKeyHasher> seen;
    ctx_.sessions.for_each([&](const policy::Session& session) {
      assert_control_thread();
      for (const BlockHash& hash : session.blocks) {
        const BlockKey key{session.layout, hash};
        auto info = ctx_.store->lookup(key);
        if (!info || info->location.tier == Tier::kNvme || info->state != BlockState::kReady ||
            ctx_.mover->failed_in_drain(key) || !seen.insert(key).second) {
          continue;
        }
        to_nvme.push_back({policy::MoveKind::kDemote, key, info->location.tier, Tier::kNvme});
      }
    });
    ctx_.mover->apply(to_nvme);
    if (nvme_->jobs_in_flight() || ctx_.mover->busy() || ctx_.counters.copies_in_flight > 0) return;
    // Nothing more can move: write the session table, synced, and finish.
    nvme_->drain_phase = NvmeState::DrainPhase::kFlushing;
    for (const policy::Session* session : ctx_.sessions.by_last_active())
      note_session_changed(*session);
    flush_sessions(/*sync=*/true);
    if (nvme_->jobs_in_flight()) return;
  }
  size_t left = 0;
  ctx_.sessions.for_each([&](const policy::Session& session) {
    assert_control_thread();
    for (const BlockHash& hash : session.blocks) {
      auto info = ctx_.store->lookup({session.layout, hash});
      if (info && info->location.tier != Tier::kNvme) ++left;
    }
  });
  KVTIER_LOG_INFO(
      "drain to NVMe done in {}: {} written, {} moved onto their NVMe copies; {} session "
      "blocks could not be",
      format_duration_ms(now_ms() - nvme_->drain_started_ms),
      format_bytes(ctx_.mover->counters().bytes_demoted - nvme_->drained_bytes_before),
      format_bytes(ctx_.mover->counters().bytes_demoted_onto_copy -
                   nvme_->drained_onto_copies_before),
      left);
  nvme_->drain_phase = NvmeState::DrainPhase::kDone;
  if (nvme_->drain_deadline) nvme_->drain_deadline->cancel();
  if (auto drained = std::exchange(nvme_->drained, nullptr)) drained();
}

void SessionJournal::give_up_drain() {
  if (!nvme_) return;
  nvme_->drain_phase = NvmeState::DrainPhase::kDone;
  if (nvme_->drain_deadline) nvme_->drain_deadline->cancel();
}

void SessionJournal::write_before_exit() {
  if (!nvme_) return;
  // A drain in progress ends here: what it would copy from RAM or HBM can no longer
  // be trusted. What is on NVMe is, and the session table says which sessions use
  // it (a session ends at its first block that is not there after the restart).
  give_up_drain();
  for (const policy::Session* session : ctx_.sessions.by_last_active()) {
    note_session_changed(*session);
  }
  flush_sessions(/*sync=*/true);
  nvme_->tier->flush();  // blocks until the table (and writes before it) are durable
}

}  // namespace kvtier::daemon
