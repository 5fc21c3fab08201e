#include "device/host_device.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>

#include "common/units.h"
#include "device/page_fill.h"

namespace kvtier {
namespace {

// One mmap'ed range: an engine's memfd region or an anonymous arena/pool.
class MappedMemory final : public Memory {
 public:
  MappedMemory(std::byte* data, uint64_t size_bytes, std::string description, UniqueFd fd)
      : data_(data),
        size_bytes_(size_bytes),
        description_(std::move(description)),
        fd_(std::move(fd)) {}
  ~MappedMemory() override { ::munmap(data_, size_bytes_); }
  MappedMemory(const MappedMemory&) = delete;
  MappedMemory& operator=(const MappedMemory&) = delete;

  uint64_t size_bytes() const override { return size_bytes_; }
  MemoryLocation location() const override { return MemoryLocation::kHost; }
  std::byte* host_data() override { return data_; }
  std::string describe() const override { return description_; }

 private:
  std::byte* const data_;
  const uint64_t size_bytes_;
  const std::string description_;
  UniqueFd fd_;  // kept open for as long as the region is mapped; -1 for anonymous memory
};

std::string_view kind_name(RegionHandle::Kind kind) {
  switch (kind) {
    case RegionHandle::Kind::kMemfd:
      return "memfd";
    case RegionHandle::Kind::kCudaIpc:
      return "cuda_ipc";
    case RegionHandle::Kind::kCudaVmmFd:
      return "cuda_vmm_fd";
  }
  return "unknown";
}

// Anonymous memory for the arena or the pool, mapped but not yet faulted in; `fill`
// faults it in on several threads (page_fill.h). The memory is only ever written
// through copies, which the daemon starts after the fill, so the two never race.
Result<UnfilledMemory> reserve_anonymous(uint64_t bytes, std::string description,
                                         std::string_view setting) {
  if (bytes == 0) return invalid_argument("{}: bytes is 0", description);
  KVTIER_RETURN_IF_ERROR(check_memory_available(bytes, description, setting));
  auto data = map_pool_memory(bytes, description);
  if (!data.is_ok()) return data.status();
  auto memory = std::make_shared<MappedMemory>(*data, bytes, std::move(description), UniqueFd());
  std::byte* const base = *data;
  return UnfilledMemory{memory, [base, bytes](int threads, std::stop_token stop) {
                          return fill_pages(base, bytes, threads, std::move(stop));
                        }};
}

Result<std::shared_ptr<Memory>> allocate_anonymous(uint64_t bytes, std::string description,
                                                   std::string_view setting) {
  auto reserved = reserve_anonymous(bytes, std::move(description), setting);
  if (!reserved.is_ok()) return reserved.status();
  KVTIER_RETURN_IF_ERROR(reserved->fill(default_fill_threads(), {}));
  return std::move(reserved->memory);
}

// Both ranges are checked with subtraction so that offset + bytes cannot wrap.
bool inside(uint64_t offset, uint64_t bytes, uint64_t size_bytes) {
  return offset <= size_bytes && bytes <= size_bytes - offset;
}

struct AddressRange {
  uintptr_t begin;
  uintptr_t end;
  size_t segment;
};

// Fills `bases` with each memory's bytes; checks every segment against its memories,
// and that no two bytes written by the batch are the same byte (checked on addresses,
// so a memory listed twice is caught too).
Status validate(const CopyBatch& batch, std::vector<std::byte*>& bases) {
  bases.clear();
  bases.reserve(batch.memories.size());
  for (size_t m = 0; m < batch.memories.size(); ++m) {
    const std::shared_ptr<Memory>& memory = batch.memories[m];
    if (!memory) return invalid_argument("memories[{}] is null", m);
    std::byte* data = memory->host_data();
    if (memory->location() != MemoryLocation::kHost || data == nullptr) {
      return invalid_argument("memories[{}] ({}) is not host memory", m, memory->describe());
    }
    bases.push_back(data);
  }
  std::vector<AddressRange> destinations;
  destinations.reserve(batch.segments.size());
  for (size_t s = 0; s < batch.segments.size(); ++s) {
    const CopySegment& seg = batch.segments[s];
    if (seg.src_memory >= bases.size() || seg.dst_memory >= bases.size()) {
      return invalid_argument("segment {}: memory index src {} / dst {} out of range ({} memories)",
                              s, seg.src_memory, seg.dst_memory, bases.size());
    }
    const uint64_t src_size = batch.memories[seg.src_memory]->size_bytes();
    const uint64_t dst_size = batch.memories[seg.dst_memory]->size_bytes();
    if (!inside(seg.src_offset, seg.bytes, src_size)) {
      return invalid_argument("segment {}: source offset {} + {} bytes exceeds {} bytes", s,
                              seg.src_offset, seg.bytes, src_size);
    }
    if (!inside(seg.dst_offset, seg.bytes, dst_size)) {
      return invalid_argument("segment {}: destination offset {} + {} bytes exceeds {} bytes", s,
                              seg.dst_offset, seg.bytes, dst_size);
    }
    if (seg.bytes == 0) continue;
    auto src = reinterpret_cast<uintptr_t>(bases[seg.src_memory] + seg.src_offset);
    auto dst = reinterpret_cast<uintptr_t>(bases[seg.dst_memory] + seg.dst_offset);
    if (src < dst + seg.bytes && dst < src + seg.bytes) {
      return invalid_argument("segment {}: source and destination overlap", s);
    }
    destinations.push_back({dst, dst + seg.bytes, s});
  }
  std::sort(destinations.begin(), destinations.end(),
            [](const AddressRange& a, const AddressRange& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < destinations.size(); ++i) {
    if (destinations[i].begin < destinations[i - 1].end) {
      return invalid_argument("segment {}: destination overlaps segment {}",
                              std::max(destinations[i].segment, destinations[i - 1].segment),
                              std::min(destinations[i].segment, destinations[i - 1].segment));
    }
  }
  return Status::ok();
}

}  // namespace

std::vector<std::vector<CopySegment>> split_into_shards(std::span<const CopySegment> segments,
                                                        size_t max_shards) {
  uint64_t total_bytes = 0;
  for (const CopySegment& seg : segments) total_bytes += seg.bytes;
  size_t shard_count = std::max<size_t>(max_shards, 1);
  if (total_bytes < shard_count) shard_count = std::max<uint64_t>(total_bytes, 1);
  std::vector<std::vector<CopySegment>> shards(shard_count);
  if (total_bytes == 0) return shards;

  // Shard i holds base or base + 1 bytes, so the slowest thread finishes at most one
  // byte after the others; cuts fall wherever the running total crosses a boundary.
  const uint64_t base_bytes = total_bytes / shard_count;
  const uint64_t extra_bytes = total_bytes % shard_count;
  auto capacity = [&](size_t shard) { return base_bytes + (shard < extra_bytes ? 1 : 0); };
  size_t current = 0;
  uint64_t room = capacity(0);
  for (const CopySegment& seg : segments) {
    uint64_t copied = 0;
    while (copied < seg.bytes) {
      const uint64_t take = std::min(seg.bytes - copied, room);
      CopySegment piece = seg;
      piece.src_offset += copied;
      piece.dst_offset += copied;
      piece.bytes = take;
      shards[current].push_back(piece);
      copied += take;
      room -= take;
      if (room == 0 && current + 1 < shard_count) room = capacity(++current);
    }
  }
  return shards;
}

std::unique_ptr<Device> make_host_device(int copy_threads) {
  return std::make_unique<HostDevice>(copy_threads);
}

// Everything one submitted batch needs until its last shard finishes.
struct HostDevice::Batch {
  CopyBatch copies;  // holds the memories alive until the last shard finished
  std::vector<std::byte*> bases;
  std::vector<std::vector<CopySegment>> shards;
  CopyDone done;
  std::atomic<size_t> shards_left{0};
};

HostDevice::HostDevice(int copy_threads) {
  const int thread_count = std::max(copy_threads, 1);
  workers_.reserve(static_cast<size_t>(thread_count));
  for (int i = 0; i < thread_count; ++i) workers_.emplace_back([this] { run_worker(); });
}

HostDevice::~HostDevice() {
  drain();
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

Result<std::shared_ptr<Memory>> HostDevice::open_region(RegionHandle handle) {
  if (handle.kind != RegionHandle::Kind::kMemfd) {
    return not_supported("region kind {}: host backend cannot open cuda regions",
                         kind_name(handle.kind));
  }
  if (handle.size_bytes == 0) return invalid_argument("region size_bytes is 0");
  if (!handle.fd.valid()) return invalid_argument("memfd region has no fd");
  const int fd = handle.fd.get();

  // F_GET_SEALS succeeds only on shmem files (memfds): a pipe, socket or disk file
  // fails here before it can be mapped.
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) return invalid_argument("fd is not a memfd ({})", std::strerror(errno));
  // Without F_SEAL_SHRINK the engine could truncate the file under a copy and the
  // daemon would die of SIGBUS. Seal before fstat so the size checked is final.
  if ((seals & F_SEAL_SHRINK) == 0 && ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    return invalid_argument(
        "memfd cannot be sealed against shrinking; create it with MFD_ALLOW_SEALING ({})",
        std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errno_status(errno, "fstat memfd region");
  if (!S_ISREG(st.st_mode)) return invalid_argument("fd is not a memfd (not a regular file)");
  const auto real_bytes = static_cast<uint64_t>(st.st_size);
  if (real_bytes != handle.size_bytes) {
    return invalid_argument("region size_bytes {} differs from the memfd's real size {}",
                            handle.size_bytes, real_bytes);
  }
  void* mapped =
      ::mmap(nullptr, handle.size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (mapped == MAP_FAILED) {
    return errno_status(errno, fmt::format("mmap memfd region of {} bytes", handle.size_bytes));
  }
  return std::shared_ptr<Memory>(std::make_shared<MappedMemory>(
      static_cast<std::byte*>(mapped), handle.size_bytes,
      fmt::format("memfd region {}", format_bytes(handle.size_bytes)), std::move(handle.fd)));
}

Result<std::shared_ptr<Memory>> HostDevice::allocate_arena(uint64_t bytes_per_gpu,
                                                           uint64_t /*part_alignment*/) {
  return allocate_anonymous(bytes_per_gpu, "hbm arena (host memory)", "hbm-bytes");
}

Result<std::shared_ptr<Memory>> HostDevice::allocate_pinned_pool(uint64_t bytes) {
  return allocate_anonymous(bytes, "ram pool", "ram-bytes");
}

Result<UnfilledMemory> HostDevice::reserve_arena(uint64_t bytes_per_gpu,
                                                 uint64_t /*part_alignment*/) {
  return reserve_anonymous(bytes_per_gpu, "hbm arena (host memory)", "hbm-bytes");
}

Result<UnfilledMemory> HostDevice::reserve_pinned_pool(uint64_t bytes) {
  return reserve_anonymous(bytes, "ram pool", "ram-bytes");
}

Status HostDevice::submit(CopyBatch batch, CopyDone done) {
  auto state = std::make_shared<Batch>();
  KVTIER_RETURN_IF_ERROR(validate(batch, state->bases));
  const uint64_t total_bytes = batch.total_bytes();  // cannot wrap: each segment fits memory
  const size_t max_shards =
      std::min<uint64_t>(workers_.size(), std::max<uint64_t>(total_bytes / kMinShardBytes, 1));
  state->shards = split_into_shards(batch.segments, max_shards);
  state->copies = std::move(batch);
  state->done = std::move(done);
  const size_t shard_count = state->shards.size();
  state->shards_left.store(shard_count, std::memory_order_relaxed);
  {
    MutexLock lock(mu_);
    ++batches_in_flight_;
    for (size_t shard = 0; shard < shard_count; ++shard) queue_.push_back({state, shard});
  }
  if (shard_count == 1) {
    work_ready_.notify_one();
  } else {
    work_ready_.notify_all();
  }
  return Status::ok();
}

void HostDevice::drain() {
  MutexLock lock(mu_);
  while (batches_in_flight_ != 0) all_done_.wait(lock);
}

void HostDevice::run_worker() {
  for (;;) {
    Task task;
    {
      MutexLock lock(mu_);
      while (!stopping_ && queue_.empty()) work_ready_.wait(lock);
      if (queue_.empty()) return;  // stopping, and drained by the destructor
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    const bool finished_batch = run_task(task);
    // Drop this worker's reference before counting the batch as done, so that once
    // drain() returns the batch's memories are no longer held by the device.
    task.batch.reset();
    if (finished_batch) {
      MutexLock lock(mu_);
      if (--batches_in_flight_ == 0) all_done_.notify_all();
    }
  }
}

bool HostDevice::run_task(const Task& task) {
  Batch& batch = *task.batch;
  for (const CopySegment& piece : batch.shards[task.shard]) {
    std::memcpy(batch.bases[piece.dst_memory] + piece.dst_offset,
                batch.bases[piece.src_memory] + piece.src_offset, piece.bytes);
  }
  // acq_rel: the thread that finishes last sees every other shard's bytes before it
  // reports the batch complete.
  if (batch.shards_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return false;
  CopyDone done = std::move(batch.done);
  batch.copies = CopyBatch();  // the device lets go of the memories before `done` (device.h)
  done(Status::ok());
  return true;
}

}  // namespace kvtier
