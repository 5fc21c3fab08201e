// kvtier-bench copy: how close a daemon Save/Load of 2 MiB blocks comes to plain memcpy
// of the same bytes on the same number of threads.
//
// Both sides move the same thing: 64 plane slices of 32 KiB per block, scattered over
// a memfd paged cache (engine blocks at shuffled ids), into or out of contiguous 2 MiB
// slots in pre-touched anonymous memory (the daemon's HBM arena; the baseline's own
// buffer, allocated the same way). Each round times every daemon phase right next to
// its memcpy counterpart (save/gather, load/scatter), alternating which goes first,
// so both see the same machine state; medians over rounds damp the noise of a
// shared machine.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <latch>
#include <numeric>
#include <optional>
#include <random>
#include <thread>

#include "bench/benchmarks.h"
#include "client/client.h"
#include "client/paged_cache.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace kvtier::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Anonymous memory prepared like the daemon's arena (THP hint, then populated), so
// the baseline's slots cost no page faults, as the daemon's don't.
class SlotBuffer {
 public:
  static Result<SlotBuffer> allocate(uint64_t bytes) {
    void* mapped =
        ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) return errno_status(errno, "mmap baseline buffer");
    (void)::madvise(mapped, bytes, MADV_HUGEPAGE);
    if (::madvise(mapped, bytes, MADV_POPULATE_WRITE) != 0) std::memset(mapped, 0, bytes);
    return SlotBuffer(static_cast<std::byte*>(mapped), bytes);
  }
  SlotBuffer(SlotBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  SlotBuffer& operator=(SlotBuffer&&) = delete;
  ~SlotBuffer() {
    if (data_ != nullptr) ::munmap(data_, bytes_);
  }
  std::byte* data() const { return data_; }

 private:
  SlotBuffer(std::byte* data, uint64_t bytes) : data_(data), bytes_(bytes) {}
  std::byte* data_;
  uint64_t bytes_;
};

// Where plane `plane` of engine block `block_id` lives in the cache's region.
std::byte* plane_slice(const PagedCache& cache, size_t plane, uint64_t block_id) {
  const PlaneSpec& spec = cache.layout().planes[plane];
  return cache.region().data() + spec.offset_bytes + block_id * spec.stride_bytes;
}

void zero_blocks(const PagedCache& cache, std::span<const uint64_t> ids) {
  for (uint64_t id : ids) {
    for (size_t p = 0; p < cache.layout().planes.size(); ++p) {
      std::memset(plane_slice(cache, p, id), 0, cache.shape().plane_bytes());
    }
  }
}

// Runs copy_block(i) for i in [0, blocks) on `threads` threads, each taking a
// contiguous share (as the daemon's copy pool splits a batch evenly by bytes).
// Threads are started before the clock and released together; returns seconds.
double timed_parallel(int threads, size_t blocks, const std::function<void(size_t)>& copy_block) {
  std::latch start(1);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    const size_t begin = blocks * t / threads, end = blocks * (t + 1) / threads;
    workers.emplace_back([&, begin, end] {
      start.wait();
      for (size_t i = begin; i < end; ++i) copy_block(i);
    });
  }
  const auto t0 = Clock::now();
  start.count_down();
  for (std::thread& worker : workers) worker.join();
  return seconds_since(t0);
}

// Sends requests of up to `batch` blocks, keeping up to `in_flight` unanswered, and
// checks each reply; returns seconds from the first send to the last reply.
template <typename T>
Result<double> pipelined(std::span<const BlockRef> refs, uint32_t batch, uint32_t in_flight,
                         const std::function<Pending<T>(std::span<const BlockRef>)>& send,
                         const std::function<Status(const T&, size_t)>& check) {
  std::deque<std::pair<Pending<T>, size_t>> waiting;
  auto settle_oldest = [&]() -> Status {
    auto [pending, count] = std::move(waiting.front());
    waiting.pop_front();
    auto reply = pending.wait();
    if (!reply.is_ok()) return reply.status();
    return check(*reply, count);
  };
  const auto t0 = Clock::now();
  for (size_t offset = 0; offset < refs.size(); offset += batch) {
    auto chunk = refs.subspan(offset, std::min<size_t>(batch, refs.size() - offset));
    if (waiting.size() >= in_flight) KVTIER_RETURN_IF_ERROR(settle_oldest());
    waiting.emplace_back(send(chunk), chunk.size());
  }
  while (!waiting.empty()) KVTIER_RETURN_IF_ERROR(settle_oldest());
  return seconds_since(t0);
}

struct RoundResult {
  double save_gbps, load_gbps, gather_gbps, scatter_gbps;
};

// Checks `sample` blocks of `ids` against `hashes`; DataLoss names the first mismatch.
Status verify_sample(const PagedCache& cache, std::span<const uint64_t> ids,
                     std::span<const BlockHash> hashes, uint32_t every, const char* what,
                     uint64_t* verified) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i % every != 0 && i + 1 != ids.size()) continue;
    if (!cache.verify(ids[i], hashes[i])) {
      return data_loss("{}: block {} (engine block {}) is not bit-exact", what, i, ids[i]);
    }
    ++*verified;
  }
  return Status::ok();
}

}  // namespace

Result<BenchReport> run_copy_bench(const CommonOptions& common, const CopyOptions& options) {
  if (options.blocks == 0 || options.rounds == 0 || options.batch == 0 || options.in_flight == 0 ||
      options.verify_every == 0) {
    return invalid_argument(
        "--blocks, --rounds, --batch, --in-flight and --verify-every must be positive");
  }
  PagedCacheShape shape;  // 32 layers × K/V planes of 32 KiB: 2 MiB blocks
  shape.model_id = "kvtier-bench/copy";
  shape.num_blocks = uint64_t{options.blocks} * 2;  // saved blocks, then the blocks loaded into
  const uint64_t block_bytes = shape.block_bytes();
  const uint64_t plane_bytes = shape.plane_bytes();
  const uint64_t round_bytes = uint64_t{options.blocks} * block_bytes;
  const size_t planes = size_t{2} * shape.num_layers;
  // Every round stays in HBM: 25% headroom, rounded up to whole 64 MiB slabs.
  const uint64_t slab = 64ull << 20;
  const uint64_t hbm_bytes = (options.rounds * round_bytes * 5 / 4 + slab - 1) / slab * slab;

  std::optional<support::DaemonProcess> daemon;
  std::string socket = common.socket;
  if (socket.empty()) {
    auto started = support::DaemonProcess::start(private_daemon_options(
        common, {"--hbm-bytes", std::to_string(hbm_bytes), "--ram-bytes", "64MiB", "--copy-threads",
                 std::to_string(common.threads), "--hbm-high-watermark", "1.0",
                 "--hbm-low-watermark", "0.95", "--hbm-idle-ms", "1h"}));
    if (!started.is_ok()) return started.status();
    daemon.emplace(std::move(*started));
    socket = daemon->socket_path();
  }

  auto cache = PagedCache::create(shape);
  if (!cache.is_ok()) return cache.status();
  auto client = Client::connect(socket);
  if (!client.is_ok()) return client.status();
  auto hello = (*client)->hello(cache->layout(), "kvtier-bench-copy");
  if (!hello.is_ok()) return hello.status();
  if (hello->block_bytes != block_bytes) {
    return internal_error("kvtierd says blocks are {} bytes; expected {}", hello->block_bytes,
                          block_bytes);
  }
  if (hello->max_blocks_per_request < options.batch) {
    return invalid_argument("--batch {} exceeds the daemon's {} blocks per request", options.batch,
                            hello->max_blocks_per_request);
  }
  KVTIER_RETURN_IF_ERROR((*client)->register_memfd_region(cache->region_id(), cache->region().fd(),
                                                          cache->region().size_bytes()));
  auto buffer = SlotBuffer::allocate(round_bytes);
  if (!buffer.is_ok()) return buffer.status();

  // Engine blocks at shuffled ids, as in a paged cache: saves read the first half of
  // the permutation, loads (daemon and baseline) write the second half.
  std::vector<uint64_t> ids(shape.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(42));
  std::span<const uint64_t> save_ids(ids.data(), options.blocks);
  std::span<const uint64_t> load_ids(ids.data() + options.blocks, options.blocks);
  // Seeds unique to this run, so a shared daemon never dedups against an earlier run.
  const std::string run_id =
      fmt::format("{}-{}", ::getpid(), Clock::now().time_since_epoch().count());

  std::vector<RoundResult> rounds;
  uint64_t verified = 0;
  const double gb = static_cast<double>(round_bytes) / 1e9;
  std::byte* slots = buffer->data();
  auto memcpy_gather = [&] {
    return timed_parallel(common.threads, options.blocks, [&](size_t i) {
      for (size_t p = 0; p < planes; ++p) {
        std::memcpy(slots + i * block_bytes + p * plane_bytes, plane_slice(*cache, p, save_ids[i]),
                    plane_bytes);
      }
    });
  };
  auto memcpy_scatter = [&] {
    return timed_parallel(common.threads, options.blocks, [&](size_t i) {
      for (size_t p = 0; p < planes; ++p) {
        std::memcpy(plane_slice(*cache, p, load_ids[i]), slots + i * block_bytes + p * plane_bytes,
                    plane_bytes);
      }
    });
  };

  for (uint32_t round = 0; round < options.rounds; ++round) {
    const std::string session = fmt::format("kvtier-bench-copy/{}/round-{}", run_id, round);
    const auto hashes = PagedCache::chain_hashes(session, options.blocks);
    std::vector<BlockRef> save_refs, load_refs;
    for (uint32_t i = 0; i < options.blocks; ++i) {
      cache->fill(save_ids[i], hashes[i]);
      save_refs.push_back({hashes[i], save_ids[i]});
      load_refs.push_back({hashes[i], load_ids[i]});
    }
    auto daemon_save = [&] {
      return pipelined<SaveResult>(
          save_refs, options.batch, options.in_flight,
          [&](std::span<const BlockRef> chunk) {
            // The turn ends with the last chunk, as when an engine saves a long prefix.
            const bool end_of_turn =
                chunk.data() + chunk.size() == save_refs.data() + save_refs.size();
            return (*client)->save_async(session, chunk, end_of_turn);
          },
          [](const SaveResult& reply, size_t count) -> Status {
            if (reply.stored != count) {
              return internal_error("save stored {} of {} fresh blocks ({} deduplicated)",
                                    reply.stored, count, reply.deduplicated);
            }
            return Status::ok();
          });
    };
    // Loads into zeroed blocks, so a load that copied nothing cannot pass verification.
    auto daemon_load = [&]() -> Result<double> {
      zero_blocks(*cache, load_ids);
      auto seconds = pipelined<LoadResult>(
          load_refs, options.batch, options.in_flight,
          [&](std::span<const BlockRef> chunk) { return (*client)->load_async(session, chunk); },
          [](const LoadResult& reply, size_t count) -> Status {
            if (reply.loaded_count != count || !reply.stop_reason.is_ok()) {
              return data_loss("load restored {} of {} blocks: {}", reply.loaded_count, count,
                               reply.stop_reason.to_string());
            }
            return Status::ok();
          });
      if (!seconds.is_ok()) return seconds;
      KVTIER_RETURN_IF_ERROR(
          verify_sample(*cache, load_ids, hashes, options.verify_every, "daemon load", &verified));
      return seconds;
    };
    auto baseline_scatter = [&]() -> Result<double> {
      zero_blocks(*cache, load_ids);
      const double seconds = memcpy_scatter();
      KVTIER_RETURN_IF_ERROR(verify_sample(*cache, load_ids, hashes, options.verify_every,
                                           "memcpy scatter", &verified));
      return seconds;
    };

    // Each daemon phase runs right next to its baseline, and which of the two goes
    // first alternates by round, so neither always meets the same machine state.
    const bool daemon_first = round % 2 == 0;
    Result<double> save_seconds = 0.0, load_seconds = 0.0, scatter_seconds = 0.0;
    double gather_seconds = 0;
    if (daemon_first) {
      save_seconds = daemon_save();
      if (!save_seconds.is_ok()) return save_seconds.status();
      gather_seconds = memcpy_gather();
      load_seconds = daemon_load();
      if (!load_seconds.is_ok()) return load_seconds.status();
      scatter_seconds = baseline_scatter();
      if (!scatter_seconds.is_ok()) return scatter_seconds.status();
    } else {
      gather_seconds = memcpy_gather();
      save_seconds = daemon_save();
      if (!save_seconds.is_ok()) return save_seconds.status();
      scatter_seconds = baseline_scatter();
      if (!scatter_seconds.is_ok()) return scatter_seconds.status();
      load_seconds = daemon_load();
      if (!load_seconds.is_ok()) return load_seconds.status();
    }
    if (auto closed = (*client)->close_session(session); !closed.is_ok()) return closed.status();
    rounds.push_back(
        {gb / *save_seconds, gb / *load_seconds, gb / gather_seconds, gb / *scatter_seconds});
  }

  Status stopped = daemon ? daemon->stop_cleanly(kDaemonStopTimeout) : Status::ok();
  if (!stopped.is_ok()) return stopped;

  BenchReport report("copy");
  report.config("daemon", daemon ? std::string("spawned") : "external " + socket);
  report.config("threads", int64_t{common.threads});
  report.config("block_bytes", static_cast<int64_t>(block_bytes));
  report.config("plane_bytes", static_cast<int64_t>(plane_bytes));
  report.config("blocks_per_round", int64_t{options.blocks});
  report.config("bytes_per_round", static_cast<int64_t>(round_bytes));
  report.config("rounds", int64_t{options.rounds});
  report.config("batch_blocks", int64_t{options.batch});
  report.config("in_flight", int64_t{options.in_flight});
  report.config("verify_every", int64_t{options.verify_every});
  if (daemon) report.config("hbm_bytes", static_cast<int64_t>(hbm_bytes));
  report.config("order",
                std::string("save|gather then load|scatter; first of each pair alternates"));
  report.config("aggregate",
                std::string("median over rounds; ratios are medians of per-round ratios"));
  report.config("gb", std::string("1e9 bytes"));

  std::vector<double> save, load, gather, scatter, save_ratio, load_ratio;
  report.note(fmt::format("  {:<6} {:>10} {:>10} {:>10} {:>10} {:>11} {:>12}", "round", "save GB/s",
                          "load GB/s", "gather", "scatter", "save/gather", "load/scatter"));
  for (size_t r = 0; r < rounds.size(); ++r) {
    const RoundResult& x = rounds[r];
    save.push_back(x.save_gbps);
    load.push_back(x.load_gbps);
    gather.push_back(x.gather_gbps);
    scatter.push_back(x.scatter_gbps);
    save_ratio.push_back(x.save_gbps / x.gather_gbps);
    load_ratio.push_back(x.load_gbps / x.scatter_gbps);
    report.note(fmt::format("  {:<6} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f} {:>11.3f} {:>12.3f}",
                            r + 1, x.save_gbps, x.load_gbps, x.gather_gbps, x.scatter_gbps,
                            save_ratio.back(), load_ratio.back()));
  }
  report.result("daemon_save_gbps", median(save));
  report.result("daemon_load_gbps", median(load));
  report.result("memcpy_gather_gbps", median(gather));
  report.result("memcpy_scatter_gbps", median(scatter));
  report.result("save_vs_gather_ratio", median(save_ratio));
  report.result("load_vs_scatter_ratio", median(load_ratio));
  report.result("save_vs_gather_ratio_min",
                *std::min_element(save_ratio.begin(), save_ratio.end()));
  report.result("load_vs_scatter_ratio_min",
                *std::min_element(load_ratio.begin(), load_ratio.end()));
  report.result("verified_blocks", static_cast<double>(verified));
  report.target("save_vs_gather_ratio", ">=", 0.8);
  report.target("load_vs_scatter_ratio", ">=", 0.8);
  return report;
}

}  // namespace kvtier::bench
