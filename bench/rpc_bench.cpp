// kvtier-bench rpc: the control round trip an engine pays before every prefill — a
// Lookup of a 32-block prefix that hits — against the floor the kernel sets: a
// blocking ping-pong of the same request and reply sizes over a socketpair between
// two threads of this process.
//
// The two are measured in alternating chunks, so a burst of load from other
// processes lands on both rather than on whichever happened to run then. The
// socketpair is measured twice: with both threads free to run anywhere (the scheduler
// usually keeps such a pair on one CPU), and pinned to two different CPUs, which is
// the floor for a daemon and an engine that the scheduler places apart.
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <functional>
#include <numeric>
#include <optional>
#include <thread>

#include "bench/benchmarks.h"
#include "client/client.h"
#include "client/paged_cache.h"
#include "common/unique_fd.h"

namespace kvtier::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kChunk = 1000;  // round trips per alternation

double micros_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

// Wire sizes of a Lookup of `hashes` 16-byte hashes and of its all-hit reply, as the
// client and daemon encode them.
std::pair<size_t, size_t> lookup_frame_bytes(uint32_t hashes) {
  capnp::MallocMessageBuilder request_message;
  auto request = request_message.initRoot<wire::Request>();
  request.setId(1'000'000);
  auto list = request.initLookup().initHashes(hashes);
  const uint8_t hash[16] = {};
  for (uint32_t i = 0; i < hashes; ++i) list.set(i, capnp::Data::Reader(hash, sizeof(hash)));
  capnp::MallocMessageBuilder reply_message;
  auto reply = reply_message.initRoot<wire::Response>();
  reply.setId(1'000'000);
  auto lookup = reply.initLookup();
  lookup.setHitCount(hashes);
  lookup.initTiers(hashes);
  return {capnp::computeSerializedSizeInWords(request_message) * sizeof(capnp::word),
          capnp::computeSerializedSizeInWords(reply_message) * sizeof(capnp::word)};
}

bool write_all(int fd, const std::byte* data, size_t bytes) {
  while (bytes > 0) {
    ssize_t n = ::write(fd, data, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

bool read_all(int fd, std::byte* data, size_t bytes) {
  while (bytes > 0) {
    ssize_t n = ::read(fd, data, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

// The CPUs this process may run on.
std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

// Pins the calling thread to one CPU until destroyed, then restores its old mask.
class PinCallingThread {
 public:
  explicit PinCallingThread(int cpu) {
    ::pthread_getaffinity_np(::pthread_self(), sizeof(saved_), &saved_);
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    ::pthread_setaffinity_np(::pthread_self(), sizeof(one), &one);
  }
  ~PinCallingThread() { ::pthread_setaffinity_np(::pthread_self(), sizeof(saved_), &saved_); }
  PinCallingThread(const PinCallingThread&) = delete;
  PinCallingThread& operator=(const PinCallingThread&) = delete;

 private:
  cpu_set_t saved_;
};

// The baseline's other end: answers every request_bytes read with reply_bytes, until
// the socket closes. Its thread runs on `peer_cpu` when one is given.
class EchoPeer {
 public:
  static Result<std::unique_ptr<EchoPeer>> start(size_t request_bytes, size_t reply_bytes,
                                                 std::optional<int> peer_cpu = std::nullopt) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
      return errno_status(errno, "socketpair");
    }
    return std::unique_ptr<EchoPeer>(
        new EchoPeer(UniqueFd(fds[0]), UniqueFd(fds[1]), request_bytes, reply_bytes, peer_cpu));
  }
  ~EchoPeer() {
    ::shutdown(near_.get(), SHUT_RDWR);
    thread_.join();
  }

  // One round trip; its latency in microseconds, or an error.
  Result<double> round_trip() {
    const auto t0 = Clock::now();
    if (!write_all(near_.get(), request_.data(), request_.size()) ||
        !read_all(near_.get(), reply_.data(), reply_.size())) {
      return errno_status(errno, "socketpair round trip");
    }
    return micros_since(t0);
  }

 private:
  EchoPeer(UniqueFd near, UniqueFd far, size_t request_bytes, size_t reply_bytes,
           std::optional<int> peer_cpu)
      : near_(std::move(near)), far_(std::move(far)), request_(request_bytes), reply_(reply_bytes) {
    thread_ = std::thread([this, request_bytes, reply_bytes, peer_cpu] {
      std::optional<PinCallingThread> pin;
      if (peer_cpu) pin.emplace(*peer_cpu);
      std::vector<std::byte> in(request_bytes), out(reply_bytes);
      while (read_all(far_.get(), in.data(), in.size()) &&
             write_all(far_.get(), out.data(), out.size())) {
      }
    });
  }
  UniqueFd near_, far_;
  std::vector<std::byte> request_, reply_;
  std::thread thread_;
};

// REQUIRES: `micros` is sorted and not empty.
void add_latency_results(BenchReport& report, const std::string& prefix,
                         const std::vector<double>& micros, bool full) {
  const double mean =
      std::accumulate(micros.begin(), micros.end(), 0.0) / static_cast<double>(micros.size());
  report.result(prefix + "_p50_us", percentile_of_sorted(micros, 0.50));
  if (full) report.result(prefix + "_p90_us", percentile_of_sorted(micros, 0.90));
  report.result(prefix + "_p99_us", percentile_of_sorted(micros, 0.99));
  if (full) report.result(prefix + "_p999_us", percentile_of_sorted(micros, 0.999));
  report.result(prefix + "_mean_us", mean);
  if (full) report.result(prefix + "_max_us", micros.back());
}

}  // namespace

Result<BenchReport> run_rpc_bench(const CommonOptions& common, const RpcOptions& options) {
  if (options.iterations == 0 || options.hashes == 0) {
    return invalid_argument("--iterations and --hashes must be positive");
  }
  // A small layout: one layer, 2 KiB planes, 4 KiB blocks. The round trip, not the
  // copy, is what is measured.
  PagedCacheShape shape;
  shape.model_id = "kvtier-bench/rpc";
  shape.num_layers = 1;
  shape.num_kv_heads = 1;
  shape.head_dim = 64;
  shape.num_blocks = options.hashes;

  std::optional<support::DaemonProcess> daemon;
  std::string socket = common.socket;
  if (socket.empty()) {
    auto started = support::DaemonProcess::start(private_daemon_options(
        common, {"--hbm-bytes", "64MiB", "--ram-bytes", "64MiB", "--copy-threads",
                 std::to_string(common.threads), "--hbm-idle-ms", "1h"}));
    if (!started.is_ok()) return started.status();
    daemon.emplace(std::move(*started));
    socket = daemon->socket_path();
  }

  auto cache = PagedCache::create(shape);
  if (!cache.is_ok()) return cache.status();
  auto client = Client::connect(socket);
  if (!client.is_ok()) return client.status();
  auto hello = (*client)->hello(cache->layout(), "kvtier-bench-rpc");
  if (!hello.is_ok()) return hello.status();
  KVTIER_RETURN_IF_ERROR((*client)->register_memfd_region(cache->region_id(), cache->region().fd(),
                                                          cache->region().size_bytes()));
  const std::string session =
      fmt::format("kvtier-bench-rpc/{}-{}", ::getpid(), Clock::now().time_since_epoch().count());
  const auto hashes = PagedCache::chain_hashes(session, options.hashes);
  std::vector<BlockRef> refs;
  for (uint32_t i = 0; i < options.hashes; ++i) {
    cache->fill(i, hashes[i]);
    refs.push_back({hashes[i], i});
  }
  auto saved = (*client)->save(session, refs, true);
  if (!saved.is_ok()) return saved.status();

  auto lookup_once = [&]() -> Result<double> {
    const auto t0 = Clock::now();
    auto found = (*client)->lookup(hashes);
    const double micros = micros_since(t0);
    if (!found.is_ok()) return found.status();
    if (found->hit_count != options.hashes) {
      return internal_error("lookup hit {} of {} saved blocks", found->hit_count, options.hashes);
    }
    return micros;
  };

  const auto [request_bytes, reply_bytes] = lookup_frame_bytes(options.hashes);
  auto peer = EchoPeer::start(request_bytes, reply_bytes);
  if (!peer.is_ok()) return peer.status();
  // The cross-CPU pair: this thread on the first allowed CPU, the peer on the second.
  const std::vector<int> cpus = allowed_cpus();
  std::unique_ptr<EchoPeer> cross_peer;
  if (cpus.size() >= 2) {
    auto started = EchoPeer::start(request_bytes, reply_bytes, cpus[1]);
    if (!started.is_ok()) return started.status();
    cross_peer = std::move(*started);
  }

  // Runs `count` round trips of `once`, appending each latency to `out` (if any).
  auto measure = [](uint32_t count, const std::function<Result<double>()>& once,
                    std::vector<double>* out) -> Status {
    for (uint32_t i = 0; i < count; ++i) {
      auto micros = once();
      if (!micros.is_ok()) return micros.status();
      if (out != nullptr) out->push_back(*micros);
    }
    return Status::ok();
  };
  auto socketpair_once = [&] { return (*peer)->round_trip(); };
  auto cross_once = [&] { return cross_peer->round_trip(); };
  std::vector<double> lookup_us, socketpair_us, cross_us;
  // Warmup chunks first (results dropped), then timed ones.
  uint32_t warmup_left = options.warmup, timed_left = options.iterations;
  while (warmup_left + timed_left > 0) {
    const bool warm = warmup_left > 0;
    uint32_t& left = warm ? warmup_left : timed_left;
    const uint32_t count = std::min(kChunk, left);
    left -= count;
    KVTIER_RETURN_IF_ERROR(measure(count, lookup_once, warm ? nullptr : &lookup_us));
    KVTIER_RETURN_IF_ERROR(measure(count, socketpair_once, warm ? nullptr : &socketpair_us));
    if (cross_peer) {
      PinCallingThread pin(cpus[0]);
      KVTIER_RETURN_IF_ERROR(measure(count, cross_once, warm ? nullptr : &cross_us));
    }
  }
  peer->reset();
  cross_peer.reset();
  client->reset();
  Status stopped = daemon ? daemon->stop_cleanly(kDaemonStopTimeout) : Status::ok();
  if (!stopped.is_ok()) return stopped;

  BenchReport report("rpc");
  report.config("daemon", daemon ? std::string("spawned") : "external " + socket);
  report.config("threads", int64_t{common.threads});
  report.config("hashes_per_lookup", int64_t{options.hashes});
  report.config("iterations", int64_t{options.iterations});
  report.config("warmup", int64_t{options.warmup});
  report.config("request_bytes", static_cast<int64_t>(request_bytes));
  report.config("reply_bytes", static_cast<int64_t>(reply_bytes));
  report.config("baseline",
                std::string("blocking socketpair ping-pong between two threads, same sizes"));
  report.config("interleave_chunk", int64_t{kChunk});
  report.config("cpus", static_cast<int64_t>(cpus.size()));
  std::sort(lookup_us.begin(), lookup_us.end());
  std::sort(socketpair_us.begin(), socketpair_us.end());
  std::sort(cross_us.begin(), cross_us.end());
  add_latency_results(report, "lookup", lookup_us, /*full=*/true);
  add_latency_results(report, "socketpair", socketpair_us, /*full=*/false);
  if (!cross_us.empty()) {
    add_latency_results(report, "socketpair_cross_cpu", cross_us, /*full=*/false);
    report.note(fmt::format(
        "socketpair: threads placed by the scheduler; socketpair_cross_cpu: pinned to CPUs {} "
        "and {}",
        cpus[0], cpus[1]));
  }
  report.result("lookup_p50_over_socketpair_p50",
                percentile_of_sorted(lookup_us, 0.5) / percentile_of_sorted(socketpair_us, 0.5));
  report.target("lookup_p50_over_socketpair_p50", "<=", 1.3);
  report.target("lookup_p50_us", "<=", 20);
  report.target("lookup_p99_us", "<=", 100);
  return report;
}

}  // namespace kvtier::bench
