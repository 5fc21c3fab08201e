#include "bench/soak.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "client/client.h"
#include "client/paged_cache.h"
#include "tests/support/daemon_process.h"

namespace kvtier::bench {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kMaxEngines = 64;
constexpr uint32_t kBlocksPerTurn = 4;
constexpr uint64_t kEngineBlocks = 64;  // blocks [0, 4) take a turn's Save, the rest Loads
constexpr uint32_t kMaxTurns = (kEngineBlocks - kBlocksPerTurn) / kBlocksPerTurn;
constexpr uint64_t kTmpfsBytes = 128ull << 20;

// One engine's tallies, in memory shared with the controller. An engine killed
// mid-request leaves what it had counted.
struct EngineCounters {
  std::atomic<uint64_t> saves{0}, lookups{0}, loads{0}, begin_turns{0}, closes{0};
  std::atomic<uint64_t> blocks_saved{0}, blocks_verified{0}, blocks_verified_after_restart{0};
  std::atomic<uint64_t> blocks_missing{0}, wrong_blocks{0};
  std::atomic<uint64_t> unavailable{0}, busy{0}, reconnects{0}, unexpected_errors{0};
  std::atomic<bool> unexpected_claimed{false}, wrong_claimed{false};
  char first_unexpected[512] = {};
  char first_wrong[512] = {};
};

struct Shared {
  std::atomic<bool> stop{false};
  EngineCounters engines[kMaxEngines];
};

void claim_text(std::atomic<bool>& claimed, char (&out)[512], const std::string& text) {
  bool expected = false;
  if (!claimed.compare_exchange_strong(expected, true)) return;
  std::snprintf(out, sizeof(out), "%s", text.c_str());
}

PagedCacheShape soak_shape() {
  PagedCacheShape shape;
  shape.model_id = "soak/small";
  shape.num_layers = 4;
  shape.num_kv_heads = 2;
  shape.head_dim = 64;  // 32 KiB blocks
  shape.num_blocks = kEngineBlocks;
  return shape;
}

struct SoakSession {
  uint32_t generation = 0;
  uint32_t turns = 0;  // acknowledged
};

// One engine process: random turns until the controller says stop.
class SoakEngine {
 public:
  SoakEngine(Shared& shared, uint32_t index, uint32_t incarnation, std::string socket,
             uint64_t seed, uint32_t sessions)
      : shared_(shared),
        counters_(shared.engines[index]),
        index_(index),
        incarnation_(incarnation),
        socket_(std::move(socket)),
        rng_(seed * 1'000'003 + index * 7919 + incarnation),
        sessions_(sessions) {}

  int run() {
    auto cache = PagedCache::create(soak_shape());
    if (!cache.is_ok()) {
      unexpected("create the engine cache", cache.status());
      return 1;
    }
    cache_.emplace(std::move(*cache));
    milliseconds backoff{5};
    while (!shared_.stop.load()) {
      if (!client_) {
        if (!connect()) {
          std::this_thread::sleep_for(backoff);
          backoff = std::min(backoff * 2, milliseconds{200});
          continue;
        }
        backoff = milliseconds{5};
      }
      step();
      // The client reconnects by itself after a restart (repeating Hello and the region).
      const uint64_t reconnects = client_->reconnects();
      if (reconnects > reconnects_seen_) {
        counters_.reconnects += reconnects - reconnects_seen_;
        reconnects_seen_ = reconnects;
      }
    }
    return 0;
  }

 private:
  bool connect() {
    auto client = Client::connect(socket_);
    if (!client.is_ok()) return note(client.status(), "connect");
    auto hello = (*client)->hello(cache_->layout(), fmt::format("soak-engine-{}", index_));
    if (!hello.is_ok()) return note(hello.status(), "hello");
    Status registered = (*client)->register_memfd_region(cache_->region_id(), cache_->region().fd(),
                                                         cache_->region().size_bytes());
    if (!registered.is_ok()) return note(registered, "register region");
    client_ = std::move(*client);
    reconnects_seen_ = 0;
    return true;
  }

  // Files an error: the daemon being away (the client reconnects on a later call); a
  // retryable refusal is the daemon being busy; anything else is a finding. Returns
  // false. Before the first connection, Unavailable drops the client not yet made.
  bool note(const Status& status, const std::string& what) {
    if (status.code() == StatusCode::kUnavailable) {
      ++counters_.unavailable;
      if (what == "connect" || what == "hello" || what == "register region") client_.reset();
      // A real engine would recompute that turn meanwhile; this one takes a breath.
      std::this_thread::sleep_for(milliseconds{2});
    } else if (status.code() == StatusCode::kResourceExhausted && status.retryable()) {
      ++counters_.busy;
    } else {
      unexpected(what, status);
    }
    return false;
  }
  void unexpected(const std::string& what, const Status& status) {
    ++counters_.unexpected_errors;
    claim_text(counters_.unexpected_claimed, counters_.first_unexpected,
               fmt::format("engine {} (incarnation {}): {}: {}", index_, incarnation_, what,
                           status.to_string()));
  }

  std::string session_id(uint32_t slot) const {
    return fmt::format("soak-e{}-i{}-s{}-g{}", index_, incarnation_, slot,
                       sessions_[slot].generation);
  }

  void step() {
    const uint32_t slot = std::uniform_int_distribution<uint32_t>(0, sessions_.size() - 1)(rng_);
    const uint32_t dice = std::uniform_int_distribution<uint32_t>(0, 99)(rng_);
    if (dice < 35) {
      save_turn(slot);
    } else if (dice < 65) {
      load(slot);
    } else if (dice < 80) {
      lookup(slot);
    } else if (dice < 95) {
      auto begun = client_->begin_turn(session_id(slot));
      if (begun.is_ok() || begun.status().code() == StatusCode::kNotFound) {
        ++counters_.begin_turns;
      } else {
        note(begun.status(), "begin turn");
      }
    } else {
      close(slot);
    }
  }

  void close(uint32_t slot) {
    auto closed = client_->close_session(session_id(slot));
    if (closed.is_ok() || closed.status().code() == StatusCode::kNotFound) {
      ++counters_.closes;
      ++sessions_[slot].generation;
      sessions_[slot].turns = 0;
    } else {
      note(closed.status(), "close session");
    }
  }

  void save_turn(uint32_t slot) {
    SoakSession& session = sessions_[slot];
    if (session.turns >= kMaxTurns) {
      close(slot);
      return;
    }
    const std::string id = session_id(slot);
    const auto hashes = PagedCache::chain_hashes(id, (session.turns + 1) * kBlocksPerTurn);
    std::vector<BlockRef> refs;
    for (uint32_t i = 0; i < kBlocksPerTurn; ++i) {
      const BlockHash& hash = hashes[session.turns * kBlocksPerTurn + i];
      cache_->fill(i, hash);
      refs.push_back({hash, i});
    }
    auto saved = client_->save(id, refs, /*end_of_turn=*/true);
    if (!saved.is_ok()) {
      note(saved.status(), "save");
      return;
    }
    ++counters_.saves;
    counters_.blocks_saved += saved->stored + saved->deduplicated;
    ++session.turns;
  }

  void lookup(uint32_t slot) {
    const uint32_t held = sessions_[slot].turns * kBlocksPerTurn;
    if (held == 0) return;
    const auto hashes = PagedCache::chain_hashes(session_id(slot), held);
    auto found = client_->lookup(hashes);
    if (!found.is_ok()) {
      note(found.status(), "lookup");
      return;
    }
    ++counters_.lookups;
    if (found->hit_count > held) {
      unexpected("lookup", internal_error("{} hits for {} hashes", found->hit_count, held));
    }
  }

  void load(uint32_t slot) {
    const uint32_t held = sessions_[slot].turns * kBlocksPerTurn;
    if (held == 0) return;
    const std::string id = session_id(slot);
    const auto hashes = PagedCache::chain_hashes(id, held);
    std::vector<BlockRef> refs;
    for (uint32_t i = 0; i < held; ++i) refs.push_back({hashes[i], kBlocksPerTurn + i});
    cache_->wipe();  // a block the daemon says it restored and did not write shows as wrong
    auto loaded = client_->load(id, refs);
    if (!loaded.is_ok()) {
      if (loaded.status().code() == StatusCode::kNotFound) {
        ++counters_.loads;
        counters_.blocks_missing += held;
      } else {
        note(loaded.status(), "load");
      }
      return;
    }
    ++counters_.loads;
    const uint32_t restored = std::min(loaded->loaded_count, held);
    uint64_t good = 0;
    for (uint32_t i = 0; i < restored; ++i) {
      if (cache_->verify(refs[i].engine_block_id, refs[i].hash)) {
        ++good;
        continue;
      }
      ++counters_.wrong_blocks;
      claim_text(counters_.wrong_claimed, counters_.first_wrong,
                 fmt::format("engine {}: session {} block {} of {} reported loaded, bytes differ",
                             index_, id, i, restored));
    }
    counters_.blocks_verified += good;
    if (client_->reconnects() > 0) counters_.blocks_verified_after_restart += good;
    counters_.blocks_missing += held - restored;
    if (loaded->loaded_count > held) {
      unexpected("load", internal_error("{} restored of {} asked", loaded->loaded_count, held));
    }
  }

  Shared& shared_;
  EngineCounters& counters_;
  const uint32_t index_;
  const uint32_t incarnation_;
  const std::string socket_;
  std::mt19937_64 rng_;
  std::vector<SoakSession> sessions_;
  std::optional<PagedCache> cache_;
  std::unique_ptr<Client> client_;
  uint64_t reconnects_seen_ = 0;
};

pid_t fork_engine(Shared& shared, uint32_t index, uint32_t incarnation, const std::string& socket,
                  const SoakOptions& options) {
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  int code =
      SoakEngine(shared, index, incarnation, socket, options.seed, options.sessions_per_engine)
          .run();
  ::_exit(code);
}

// The data directory on a tmpfs of its own, unmounted when this goes.
class TmpfsMount {
 public:
  // Empty `why_not` when mounted.
  TmpfsMount(const std::string& path, uint64_t bytes, std::string& why_not) : path_(path) {
    if (::geteuid() != 0) {
      why_not = "skipped: mounting a tmpfs needs root";
      return;
    }
    const std::string data = fmt::format("size={},mode=0700", bytes);
    if (::mount("tmpfs", path.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, data.c_str()) != 0) {
      why_not = fmt::format("skipped: mount tmpfs: {}", std::strerror(errno));
      return;
    }
    mounted_ = true;
  }
  ~TmpfsMount() {
    if (mounted_) (void)::umount2(path_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }

 private:
  std::string path_;
  bool mounted_ = false;
};

// Writes `path` until the file system is full; the bytes it took.
uint64_t fill_disk(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return 0;
  std::vector<char> chunk(1 << 20, 'x');
  uint64_t written = 0;
  for (;;) {
    ssize_t n = ::write(fd, chunk.data(), chunk.size());
    if (n <= 0) break;
    written += static_cast<uint64_t>(n);
  }
  // What is left below a whole chunk.
  for (;;) {
    ssize_t n = ::write(fd, chunk.data(), 4096);
    if (n <= 0) break;
    written += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return written;
}

std::vector<std::string> soak_daemon_flags() {
  return {"--hbm-bytes",        "4MiB", "--ram-bytes",    "8MiB", "--nvme-bytes",   "48MiB",
          "--slab-bytes",       "1MiB", "--hbm-idle-ms",  "20ms", "--ram-idle-ms",  "40ms",
          "--plan-interval-ms", "10ms", "--copy-threads", "2",    "--metrics-addr", "off",
          "--drain-timeout",    "5s",   "--log-level",    "warn"};
}

}  // namespace

Result<SoakReport> run_soak(const SoakOptions& options) {
  if (options.engines == 0 || options.engines > kMaxEngines) {
    return invalid_argument("engines: {} (1 to {})", options.engines, kMaxEngines);
  }
  if (options.sessions_per_engine == 0) return invalid_argument("sessions per engine: 0");
  if (options.min_uptime > options.max_uptime) {
    return invalid_argument("min uptime is above max uptime");
  }
  namespace fs = std::filesystem;
  const std::string parent = !options.temp_parent.empty() ? options.temp_parent
                             : std::getenv("TMPDIR")      ? std::getenv("TMPDIR")
                                                          : "/tmp";
  std::string pattern = parent + "/kvtier-soak-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) return errno_status(errno, "mkdtemp " + pattern);
  const std::string dir = pattern;
  struct RemoveDir {
    std::string dir;
    bool keep;
    ~RemoveDir() {
      std::error_code ignored;
      if (!keep) fs::remove_all(dir, ignored);
    }
  } remove_dir{dir, options.keep_dir};
  const std::string data_dir = dir + "/data";
  fs::create_directories(data_dir);

  SoakReport report;
  std::string why_no_tmpfs;
  std::optional<TmpfsMount> tmpfs;
  if (options.disk_full_cycles > 0) {
    tmpfs.emplace(data_dir, kTmpfsBytes, why_no_tmpfs);
    report.disk_full =
        tmpfs->mounted() ? fmt::format("tmpfs {}MiB", kTmpfsBytes >> 20) : why_no_tmpfs;
  } else {
    report.disk_full = "off";
  }

  support::DaemonProcessOptions daemon_options;
  daemon_options.binary = options.kvtierd;
  daemon_options.dir = dir;
  daemon_options.keep_dir = true;  // RemoveDir decides
  daemon_options.socket_path = dir + "/kvtierd.sock";
  daemon_options.data_dir = data_dir;
  daemon_options.log_path = dir + "/kvtierd.log";
  daemon_options.flags = soak_daemon_flags();
  daemon_options.die_with_parent = true;
  daemon_options.ready_timeout = milliseconds{30'000};
  auto first = support::DaemonProcess::start(daemon_options);
  if (!first.is_ok()) return first.status();
  std::optional<support::DaemonProcess> daemon(std::move(*first));

  void* memory =
      ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) return errno_status(errno, "mmap the soak's shared counters");
  Shared* shared = new (memory) Shared();
  struct Unmap {
    void* memory;
    ~Unmap() { ::munmap(memory, sizeof(Shared)); }
  } unmap{memory};

  const auto started = Clock::now();
  std::vector<pid_t> engines(options.engines, -1);
  std::vector<uint32_t> incarnations(options.engines, 0);
  for (uint32_t i = 0; i < options.engines; ++i) {
    engines[i] = fork_engine(*shared, i, 0, daemon_options.socket_path, options);
    if (engines[i] < 0) return errno_status(errno, "fork an engine");
  }
  auto stop_engines = [&] {
    shared->stop = true;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    for (pid_t& pid : engines) {
      if (pid <= 0) continue;
      int status = 0;
      while (::waitpid(pid, &status, WNOHANG) == 0) {
        if (Clock::now() > deadline) {
          ::kill(pid, SIGKILL);
          ::waitpid(pid, &status, 0);
          break;
        }
        std::this_thread::sleep_for(milliseconds{10});
      }
      pid = -1;
    }
  };
  struct StopEngines {
    std::function<void()> stop;
    ~StopEngines() { stop(); }
  } engines_guard{stop_engines};

  std::mt19937_64 rng(options.seed);
  auto uniform = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  // The disk fills in cycles spread over the run.
  std::vector<bool> full_cycle(options.cycles, false);
  if (tmpfs && tmpfs->mounted()) {
    const uint32_t count = std::min(options.disk_full_cycles, options.cycles);
    for (uint32_t k = 0; k < count; ++k) {
      full_cycle[(static_cast<uint64_t>(k) + 1) * options.cycles / (count + 1)] = true;
    }
  }
  const std::string filler = data_dir + "/filler";
  // Disk-fault cycles: never the first (its daemon is already running), never a
  // disk-full one or the one after it (whose disk stays full); alternately injected
  // errors and (with the tmpfs) fill-and-free.
  enum class DiskFault : uint8_t { kNone, kInjected, kFillAndFree };
  std::vector<DiskFault> fault_cycle(options.cycles, DiskFault::kNone);
  {
    const uint32_t count = std::min(options.disk_fault_cycles, options.cycles - 1);
    const bool can_fill = tmpfs && tmpfs->mounted();
    for (uint32_t k = 0; k < count; ++k) {
      uint64_t at = 1 + (static_cast<uint64_t>(k) * 2 + 1) * (options.cycles - 1) / (2 * count);
      while (at < options.cycles &&
             (full_cycle[at] || full_cycle[at - 1] || fault_cycle[at] != DiskFault::kNone)) {
        ++at;
      }
      if (at >= options.cycles) break;
      fault_cycle[at] = can_fill && k % 2 == 1 ? DiskFault::kFillAndFree : DiskFault::kInjected;
    }
  }
  const std::vector<std::string> base_flags = daemon_options.flags;
  // The flags of the daemon that runs cycle `cycle`: injected faults on a range of
  // operations early in its life, which then pass.
  auto flags_for = [&](uint32_t cycle) {
    std::vector<std::string> flags = base_flags;
    if (cycle < options.cycles && fault_cycle[cycle] == DiskFault::kInjected) {
      const uint64_t write_from = uniform(2, 6), index_from = uniform(2, 5);
      flags.insert(
          flags.end(),
          {"--fault-nvme", fmt::format("write:{}-{}:EIO", write_from, write_from + uniform(2, 10)),
           "--fault-nvme", fmt::format("index:{}-{}:EIO", index_from, index_from + uniform(0, 2))});
    }
    return flags;
  };
  // At the end of a disk-fault cycle: the tier must take writes again, without a restart.
  auto wait_healed = [&]() {
    const auto until = Clock::now() + std::chrono::seconds(30);
    std::string last = "no Stats reply";
    while (Clock::now() < until && daemon->running()) {
      auto client = Client::connect(daemon_options.socket_path);
      auto stats = client.is_ok() ? (*client)->stats() : Result<StatsInfo>(client.status());
      if (stats.is_ok()) {
        if (!stats->nvme.degraded) {
          report.nvme_degradations += stats->nvme.degradations;
          report.nvme_heals += stats->nvme.heals;
          return;
        }
        last = stats->nvme.reason;
      } else {
        last = stats.status().to_string();
      }
      std::this_thread::sleep_for(milliseconds{50});
    }
    ++report.not_healed;
    if (report.first_not_healed.empty()) {
      report.first_not_healed =
          fmt::format("still degraded 30 s after the fault ended: {}; its log ends:\n{}", last,
                      daemon->log_tail());
    }
  };

  // Runs the daemon for `duration`, noticing an exit it makes by itself.
  auto run_for = [&](milliseconds duration) -> Status {
    const auto until = Clock::now() + duration;
    while (Clock::now() < until) {
      if (!daemon->running()) {
        ++report.daemon_self_exits;
        return unavailable("kvtierd exited by itself ({}); its log ends:\n{}",
                           daemon->exit_status() ? daemon->exit_status()->describe() : "?",
                           daemon->log_tail());
      }
      std::this_thread::sleep_for(milliseconds{10});
    }
    return Status::ok();
  };

  Status failure;
  for (uint32_t cycle = 0; cycle < options.cycles && failure.is_ok(); ++cycle) {
    const milliseconds uptime{uniform(options.min_uptime.count(), options.max_uptime.count())};
    if (full_cycle[cycle]) {
      failure = run_for(uptime / 3);
      if (failure.is_ok()) {
        fill_disk(filler);
        ++report.disk_full_cycles;
        failure = run_for(uptime - uptime / 3);
      }
    } else if (fault_cycle[cycle] == DiskFault::kFillAndFree) {
      failure = run_for(uptime / 3);
      if (failure.is_ok()) {
        fill_disk(filler);
        failure = run_for(uptime / 3);
      }
      std::error_code ignored;
      fs::remove(filler, ignored);
      if (failure.is_ok()) failure = run_for(uptime - 2 * (uptime / 3));
      ++report.fill_and_free_cycles;
      if (failure.is_ok()) wait_healed();
    } else if (fault_cycle[cycle] == DiskFault::kInjected) {
      failure = run_for(uptime);
      ++report.injected_fault_cycles;
      if (failure.is_ok()) wait_healed();
    } else {
      failure = run_for(uptime);
    }
    if (!failure.is_ok()) break;
    if (uniform(0, 99) < options.sigterm_percent) {
      daemon->stop(milliseconds{20'000});
      ++report.sigterm_restarts;
    } else {
      daemon->kill();
      ++report.sigkill_restarts;
    }
    // A disk filled in this cycle stays full across the restart that follows.
    std::error_code ignored;
    if (!full_cycle[cycle]) fs::remove(filler, ignored);
    if (options.engine_kill_every > 0 && (cycle + 1) % options.engine_kill_every == 0) {
      const uint32_t victim = static_cast<uint32_t>(uniform(0, options.engines - 1));
      ::kill(engines[victim], SIGKILL);
      ::waitpid(engines[victim], nullptr, 0);
      engines[victim] =
          fork_engine(*shared, victim, ++incarnations[victim], daemon_options.socket_path, options);
      ++report.engine_kills;
    }
    daemon.reset();
    daemon_options.flags = flags_for(cycle + 1);
    auto restarted = support::DaemonProcess::start(daemon_options);
    if (!restarted.is_ok()) {
      failure = unavailable("cycle {}: kvtierd did not restart: {}", cycle + 1,
                            restarted.status().message());
      break;
    }
    daemon.emplace(std::move(*restarted));
    ++report.cycles;
  }
  // A last stretch on the final daemon, so the engines meet it too.
  if (failure.is_ok()) failure = run_for(options.max_uptime);
  stop_engines();
  if (daemon) daemon->stop(milliseconds{20'000});
  report.seconds = std::chrono::duration<double>(Clock::now() - started).count();

  for (uint32_t i = 0; i < options.engines; ++i) {
    const EngineCounters& c = shared->engines[i];
    report.saves += c.saves;
    report.lookups += c.lookups;
    report.loads += c.loads;
    report.begin_turns += c.begin_turns;
    report.closes += c.closes;
    report.blocks_saved += c.blocks_saved;
    report.blocks_verified += c.blocks_verified;
    report.blocks_verified_after_restart += c.blocks_verified_after_restart;
    report.blocks_missing += c.blocks_missing;
    report.wrong_blocks += c.wrong_blocks;
    report.unavailable += c.unavailable;
    report.busy += c.busy;
    report.reconnects += c.reconnects;
    report.unexpected_errors += c.unexpected_errors;
    if (report.first_unexpected.empty() && c.unexpected_claimed) {
      report.first_unexpected = c.first_unexpected;
    }
    if (report.first_wrong.empty() && c.wrong_claimed) report.first_wrong = c.first_wrong;
  }
  report.bytes_verified = report.blocks_verified * soak_shape().block_bytes();
  if (!failure.is_ok() && report.daemon_self_exits == 0) return failure;
  if (!failure.is_ok())
    report.first_unexpected = failure.message() + "\n" + report.first_unexpected;
  return report;
}

}  // namespace kvtier::bench
