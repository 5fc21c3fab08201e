#include "tiers/nvme_tier.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/log.h"
#include "common/unique_fd.h"
#include "tiers/nvme_worker.h"

namespace kvtier {
namespace {

std::string reserve_path(const std::string& dir) {
  return dir + "/index.reserve";
}

Result<uint64_t> free_bytes(const std::string& dir) {
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) != 0) return errno_status(errno, "statvfs " + dir);
  return uint64_t{fs.f_bavail} * fs.f_frsize;
}

// Makes the reserve file where there is room; a warning where there is not.
void make_reserve(const std::string& dir, uint64_t bytes) {
  if (bytes == 0) return;
  const std::string path = reserve_path(dir);
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  int rc = fd.valid() ? ::fallocate(fd.get(), 0, 0, static_cast<off_t>(bytes)) : -1;
  if (rc == 0) return;
  const int error = errno;
  fd.reset();
  ::unlink(path.c_str());
  KVTIER_LOG_WARN(
      "NVMe tier {}: cannot set aside {} bytes for reopening the index ({}); the file system is "
      "nearly full, and a restart while it stays full may be refused",
      dir, bytes, std::strerror(error));
}

}  // namespace

Result<std::unique_ptr<NvmeTier>> NvmeTier::open(const NvmeTierOptions& options,
                                                 NvmeRecovery* recovered) {
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) return errno_status(ec.value(), "create " + options.dir);
  if (options.capacity_bytes == 0) return invalid_argument("the NVMe tier capacity is 0");

  // The reserve goes first: its room is what lets the index open on a full disk.
  (void)::unlink(reserve_path(options.dir).c_str());
  auto available = free_bytes(options.dir);
  if (!available.is_ok()) return available.status();
  if (*available < options.index_open_min_free_bytes) {
    return resource_exhausted(
        "NVMe tier {}: the file system has {} bytes free and opening the index needs {}; free "
        "space there (or give the tier another directory)",
        options.dir, *available, options.index_open_min_free_bytes);
  }

  std::unique_ptr<NvmeTier> tier(new NvmeTier());
  tier->capacity_bytes_ = options.capacity_bytes;
  tier->dir_ = options.dir;
  tier->heal_first_delay_ms_ = std::max<uint64_t>(1, options.heal_first_delay_ms);
  tier->heal_max_delay_ms_ = std::max(tier->heal_first_delay_ms_, options.heal_max_delay_ms);
  auto index = NvmeIndex::open(options.dir + "/index", options.slab_bytes, options.faults);
  if (!index.is_ok()) return index.status();
  tier->index_ = std::move(*index);
  if (!tier->index_->created() && tier->index_->slab_bytes() != options.slab_bytes) {
    // Recorded offsets follow the carving the tier was created with.
    KVTIER_LOG_INFO("NVMe tier {} keeps the slab size it was created with ({} bytes, not {})",
                    options.dir, tier->index_->slab_bytes(), options.slab_bytes);
  }

  SlabFileOptions file;
  file.path = options.dir + "/slabs.dat";
  file.size_bytes = options.capacity_bytes;
  file.queue_depth = options.queue_depth;
  file.buffers = options.io_buffers;
  file.allow_direct_io = options.allow_direct_io;
  auto io = open_uring_slab_io(file);
  if (!io.is_ok()) return io.status();
  tier->io_ = std::move(*io);
  if (!options.faults.empty()) {
    KVTIER_LOG_WARN("NVMe tier: injecting {} fault(s) into slab file I/O (test setting)",
                    options.faults.size());
    tier->io_ = std::make_unique<FaultInjectingSlabIo>(std::move(tier->io_), options.faults);
  }

  NvmeRecovery state;
  KVTIER_RETURN_IF_ERROR(tier->index_->for_each_layout([&](const NvmeLayoutRecord& layout) {
    state.layouts.push_back(layout);
    tier->recorded_layouts_.emplace(layout.namespace_name, layout.layout_digest);
  }));
  std::vector<std::string> malformed_blocks, malformed_sessions;
  state.blocks.reserve(tier->index_->estimated_blocks() * 11 / 10);
  KVTIER_RETURN_IF_ERROR(tier->index_->for_each_block(
      [&](NvmeBlockKey&& key, const NvmeBlockRecord& record) {
        state.blocks.push_back({std::move(key), record});
      },
      &malformed_blocks));
  KVTIER_RETURN_IF_ERROR(tier->index_->for_each_session(
      [&](NvmeSessionRecord&& session) { state.sessions.push_back(std::move(session)); },
      &malformed_sessions));
  state.malformed_records = malformed_blocks.size() + malformed_sessions.size();
  if (!malformed_blocks.empty()) {
    KVTIER_LOG_WARN("NVMe index: deleting {} malformed block records", malformed_blocks.size());
    KVTIER_RETURN_IF_ERROR(tier->index_->delete_raw_block_keys(malformed_blocks));
  }
  if (!malformed_sessions.empty()) {
    KVTIER_LOG_WARN("NVMe index: ignoring {} malformed session records", malformed_sessions.size());
  }
  *recovered = std::move(state);
  // A small tier (tests) sets aside less: a quarter of its capacity, at least 16 MiB.
  make_reserve(options.dir, std::min(options.index_reserve_bytes,
                                     std::max<uint64_t>(16ull << 20, options.capacity_bytes / 4)));
  tier->writer_ = std::make_unique<NvmeWorker>("kvtier-nvme-wr");
  tier->reader_ = std::make_unique<NvmeWorker>("kvtier-nvme-rd");
  return tier;
}

NvmeTier::~NvmeTier() {
  // Workers first: the index and the slab file must outlive the job in progress. Stopped
  // before they are reset: the writer's running job may still schedule a try at healing
  // through writer_ (it is dropped).
  if (writer_) writer_->stop();  // absent when open failed
  if (reader_) reader_->stop();
  writer_.reset();
  reader_.reset();
}

void NvmeTier::write_blocks(std::vector<WriteItem> items,
                            std::function<void(std::vector<Status>)> done) {
  writer_->post([this, items = std::move(items), done = std::move(done)]() mutable {
    std::vector<Status> results;
    run_write(items, results);
    done(std::move(results));
  });
}

void NvmeTier::run_write(std::vector<WriteItem>& items, std::vector<Status>& results) {
  if (degraded()) {
    const Status refused = unavailable(
        "the NVMe tier {} is read-only while degraded ({}); it takes writes again "
        "once it heals",
        dir_, health().reason.message());
    results.assign(items.size(), refused);
    return;
  }
  std::vector<SlabIoOp> ops;
  std::vector<uint64_t> checksums;
  ops.reserve(items.size());
  for (const WriteItem& item : items) {
    // The checksum is of the very bytes handed to the drive: the source is pinned and
    // unchanged until `done`.
    checksums.push_back(nvme_payload_checksum({item.source, item.bytes}));
    ops.push_back(
        {SlabIoKind::kWrite, item.offset, const_cast<std::byte*>(item.source), item.bytes});
  }
  std::vector<SlabIoResult> written(ops.size());
  io_->run(SlabIoChannel::kWrite, ops, written);
  results.clear();
  for (SlabIoResult& result : written) results.push_back(std::move(result.status));
  // A write the disk refused (ENOSPC, EIO): the rest of this job still commits what was
  // written, and the tier takes no more until it heals.
  const Status* write_error = nullptr;
  for (const Status& result : results) {
    if (!result.is_ok() && write_error == nullptr) write_error = &result;
  }
  if (write_error != nullptr) degrade(*write_error);

  std::vector<std::pair<NvmeBlockKey, NvmeBlockRecord>> records;
  std::vector<NvmeLayoutRecord> layouts;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!results[i].is_ok()) continue;
    const WriteItem& item = items[i];
    records.push_back(
        {item.key, {item.offset, item.bytes, checksums[i], item.last_access_wall_ms}});
    const std::pair<std::string, uint64_t> layout{item.key.namespace_name, item.key.layout_digest};
    if (!recorded_layouts_.contains(layout) &&
        std::none_of(layouts.begin(), layouts.end(), [&](const NvmeLayoutRecord& l) {
          return l.namespace_name == layout.first && l.layout_digest == layout.second;
        })) {
      layouts.push_back({layout.first, layout.second, item.bytes});
    }
  }
  if (records.empty()) return;
  // Durable payloads first: an index entry must never name bytes a crash could lose.
  Status step = io_->sync();
  if (step.is_ok()) step = index_->commit_blocks(records, layouts);
  if (!step.is_ok()) {
    for (Status& result : results) {
      if (result.is_ok()) result = step;
    }
    degrade(step);
    return;
  }
  for (const NvmeLayoutRecord& layout : layouts) {
    recorded_layouts_.emplace(layout.namespace_name, layout.layout_digest);
  }
}

void NvmeTier::read_blocks(std::vector<ReadItem> items,
                           std::function<void(std::vector<ReadOutcome>)> done) {
  reader_->post([this, items = std::move(items), done = std::move(done)]() mutable {
    std::vector<ReadOutcome> outcomes;
    run_read(items, outcomes);
    done(std::move(outcomes));
  });
}

void NvmeTier::run_read(std::vector<ReadItem>& items, std::vector<ReadOutcome>& outcomes) {
  outcomes.assign(items.size(), ReadOutcome{});
  std::vector<SlabIoOp> ops;
  std::vector<size_t> op_item;
  std::vector<uint64_t> expected;
  for (size_t i = 0; i < items.size(); ++i) {
    const ReadItem& item = items[i];
    const std::string what =
        fmt::format("block {} at offset {}", item.key.hash.to_hex(), item.offset);
    // The checksum comes from the index, not from memory: the index is what survives,
    // and reading it also checks that it names the slot the caller is about to read.
    auto record = index_->get_block(item.key);
    if (!record.is_ok()) {
      outcomes[i] = {record.status().with_context(what), false};
    } else if (!record->has_value()) {
      outcomes[i] = {data_loss("{}: the NVMe index has no entry for it", what), true};
    } else if ((*record)->offset != item.offset || (*record)->bytes != item.bytes) {
      outcomes[i] = {data_loss("{}: the NVMe index names {} bytes at offset {}", what,
                               (*record)->bytes, (*record)->offset),
                     true};
    } else {
      ops.push_back({SlabIoKind::kRead, item.offset, item.destination, item.bytes});
      op_item.push_back(i);
      expected.push_back((*record)->checksum);
    }
  }
  std::vector<SlabIoResult> read(ops.size());
  if (!ops.empty()) io_->run(SlabIoChannel::kRead, ops, read);
  for (size_t j = 0; j < ops.size(); ++j) {
    ReadOutcome& outcome = outcomes[op_item[j]];
    if (!read[j].status.is_ok()) {
      outcome = {std::move(read[j].status), read[j].short_transfer};
      continue;
    }
    const uint64_t actual = nvme_payload_checksum({ops[j].buffer, ops[j].bytes});
    if (actual != expected[j]) {
      outcome = {
          data_loss("block {} at offset {}: checksum mismatch (stored {:016x}, read {:016x})",
                    items[op_item[j]].key.hash.to_hex(), ops[j].file_offset, expected[j], actual),
          true};
    }
  }
}

void NvmeTier::release_blocks(std::vector<std::pair<NvmeBlockKey, uint64_t>> slots,
                              std::function<void(Status)> done) {
  writer_->post([this, slots = std::move(slots), done = std::move(done)]() {
    Status status = index_->delete_blocks_at(slots);
    if (!status.is_ok()) degrade(status);
    done(std::move(status));
  });
}

void NvmeTier::write_sessions(std::vector<NvmeSessionRecord> puts,
                              std::vector<std::pair<std::string, std::string>> deletes, bool sync,
                              std::function<void(Status)> done) {
  writer_->post(
      [this, puts = std::move(puts), deletes = std::move(deletes), sync, done = std::move(done)]() {
        Status status = index_->write_sessions(puts, deletes, sync);
        if (!status.is_ok()) degrade(status);
        done(std::move(status));
      });
}

uint64_t NvmeTier::degraded_ms_locked() const {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::steady_clock::now() - degraded_since_)
                                   .count());
}

NvmeHealth NvmeTier::health() const {
  MutexLock lock(health_mutex_);
  NvmeHealth health = health_;
  if (health.degraded) health.degraded_ms = degraded_ms_locked();
  return health;
}

void NvmeTier::degrade(const Status& why) {
  if (degraded()) return;
  {
    MutexLock lock(health_mutex_);
    health_.degraded = true;
    health_.reason = why;
    ++health_.degradations;
    degraded_since_ = std::chrono::steady_clock::now();
  }
  degraded_.store(true, std::memory_order_release);
  heal_delay_ms_ = heal_first_delay_ms_;
  KVTIER_LOG_ERROR(
      "NVMe tier {} degraded: {}; it is read-only until it heals (demotions and Saves skip it, "
      "Loads still read it); trying to heal in {} ms",
      dir_, why.message(), heal_delay_ms_);
  writer_->post_after(std::chrono::milliseconds(heal_delay_ms_), [this] { try_heal(); });
}

void NvmeTier::try_heal() {
  {
    MutexLock lock(health_mutex_);
    ++health_.heal_attempts;
  }
  // The index (with the room it needs), then the slab file: each must write again.
  Status healed = index_->heal();
  if (healed.is_ok()) healed = io_->sync();
  if (!healed.is_ok()) {
    heal_delay_ms_ = std::min(heal_delay_ms_ * 2, heal_max_delay_ms_);
    {
      MutexLock lock(health_mutex_);
      health_.reason = healed;
    }
    KVTIER_LOG_WARN("NVMe tier {} is still degraded: {}; trying again in {} ms", dir_,
                    healed.message(), heal_delay_ms_);
    writer_->post_after(std::chrono::milliseconds(heal_delay_ms_), [this] { try_heal(); });
    return;
  }
  uint64_t degraded_ms = 0;
  {
    MutexLock lock(health_mutex_);
    degraded_ms = degraded_ms_locked();
    health_.degraded = false;
    health_.reason = Status::ok();
    ++health_.heals;
  }
  degraded_.store(false, std::memory_order_release);
  KVTIER_LOG_INFO("NVMe tier {} healed after {} ms degraded: it takes writes again", dir_,
                  degraded_ms);
}

void NvmeTier::flush() {
  writer_->flush();
  reader_->flush();
}

}  // namespace kvtier

namespace kvtier {

void NvmeStorageTier::write(std::vector<WriteItem> items,
                            std::function<void(std::vector<Status>)> done) {
  std::vector<NvmeTier::WriteItem> writes;
  writes.reserve(items.size());
  for (const WriteItem& item : items) {
    writes.push_back({name_of_(item.slot.key), item.source, item.slot.bytes, item.slot.offset,
                      item.last_access_wall_ms});
  }
  tier_.write_blocks(std::move(writes), std::move(done));
}

void NvmeStorageTier::read(std::vector<ReadItem> items,
                           std::function<void(std::vector<ReadOutcome>)> done) {
  std::vector<NvmeTier::ReadItem> reads;
  reads.reserve(items.size());
  for (const ReadItem& item : items) {
    reads.push_back({name_of_(item.slot.key), item.destination, item.slot.bytes, item.slot.offset});
  }
  tier_.read_blocks(std::move(reads),
                    [done = std::move(done)](std::vector<NvmeTier::ReadOutcome> outcomes) {
                      std::vector<ReadOutcome> out;
                      out.reserve(outcomes.size());
                      for (NvmeTier::ReadOutcome& o : outcomes) {
                        out.push_back({std::move(o.status), o.corrupt});
                      }
                      done(std::move(out));
                    });
}

void NvmeStorageTier::release(std::vector<Slot> slots, std::function<void(Status)> done) {
  std::vector<std::pair<NvmeBlockKey, uint64_t>> named;
  named.reserve(slots.size());
  for (const Slot& slot : slots) named.emplace_back(name_of_(slot.key), slot.offset);
  tier_.release_blocks(std::move(named), std::move(done));
}

}  // namespace kvtier
