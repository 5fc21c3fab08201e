#include "bench/scale_workload.h"

#include <signal.h>

#include <chrono>
#include <deque>
#include <fstream>
#include <thread>

namespace kvtier::bench {
namespace {

using Clock = std::chrono::steady_clock;

// The policy the measured settings name; everything else is the daemon's default.
constexpr const char* kMeasuredPolicy = "predictive";

double micros_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

std::string session_id(uint64_t s) {
  return fmt::format("scale/{}", s);
}

std::vector<BlockHash> own_hashes(uint64_t s, uint32_t own_blocks) {
  return PagedCache::chain_hashes(session_id(s), own_blocks);
}

std::vector<BlockHash> turn_hashes(uint64_t s, uint32_t turn) {
  return PagedCache::chain_hashes(fmt::format("scale/{}/turn{}", s, turn), kSaveBlocks);
}

// The policy settings the daemon reads on start and SIGHUP; flags set the rest.
Status write_settings(const std::string& path, bool measuring) {
  std::ofstream file(path, std::ios::trunc);
  if (measuring) {
    file << "# kvtier-bench scale, measuring: the daemon's defaults but for the policy named\n"
         << "policy = \"" << kMeasuredPolicy << "\"\n";
  } else {
    // Never over a watermark, no idle rules: the planner leaves the daemon alone.
    file << "# kvtier-bench scale, growing\n"
         << "policy = \"lru\"\nhbm-high-watermark = 1.0\nhbm-low-watermark = 1.0\n";
  }
  file.flush();
  if (!file) return unavailable("cannot write {}", path);
  return Status::ok();
}

}  // namespace

const char* scale_op_name(ScaleOp op) {
  switch (op) {
    case ScaleOp::kBeginTurn:
      return "begin_turn";
    case ScaleOp::kLookup:
      return "lookup";
    case ScaleOp::kLoad:
      return "load";
    case ScaleOp::kSave:
      return "save";
    case ScaleOp::kSaveUntilIdle:
      return "save_until_idle";
    case ScaleOp::kStats:
      return "stats";
  }
  return "unknown";
}

Result<std::unique_ptr<ScaleDaemon>> ScaleDaemon::start(const CommonOptions& common,
                                                        const ScaleDaemonSpec& spec,
                                                        const std::string& config_dir) {
  if (spec.own_blocks == 0 || spec.own_blocks > kMaxOwnBlocks) {
    return invalid_argument("a grown session's own blocks must be 1..{}", kMaxOwnBlocks);
  }
  const std::string config_path = config_dir + "/" + spec.mode + ".toml";
  // The daemon starts on the measured settings; growing switches away from them.
  KVTIER_RETURN_IF_ERROR(write_settings(config_path, /*measuring=*/true));
  support::DaemonProcessOptions options = private_daemon_options(
      common, {"--config", config_path, "--hbm-bytes", std::to_string(spec.hbm_bytes),
               "--ram-bytes", std::to_string(spec.ram_bytes), "--slab-bytes",
               std::to_string(spec.slab_bytes), "--copy-threads", std::to_string(common.threads),
               "--hbm-idle-ms", "1h", "--metrics-addr", "off"});
  // The pools are pre-faulted before the daemon listens (about 2.5 s/GiB today).
  options.ready_timeout = std::chrono::milliseconds{120'000};
  PagedCacheShape shape;
  shape.model_id = "kvtier-bench/scale";
  shape.num_layers = 1;
  shape.num_kv_heads = 1;
  shape.head_dim = 32;  // 16 tokens × 32 × fp16 = 1 KiB per plane, 2 KiB per block
  shape.num_blocks = kPipelineDepth * (kPrefixBlocks + spec.own_blocks) + kSaveBlocks + kLoadBlocks;
  auto cache = PagedCache::create(shape);
  if (!cache.is_ok()) return cache.status();

  auto started = support::DaemonProcess::start(std::move(options));
  if (!started.is_ok()) return started.status();
  auto client = Client::connect(started->socket_path());
  if (!client.is_ok()) return client.status();
  auto hello = (*client)->hello(cache->layout(), "kvtier-bench-scale");
  if (!hello.is_ok()) return hello.status();
  if (hello->block_bytes != shape.block_bytes()) {
    return internal_error("kvtierd took the layout as {}-byte blocks, not {}", hello->block_bytes,
                          shape.block_bytes());
  }
  KVTIER_RETURN_IF_ERROR((*client)->register_memfd_region(cache->region_id(), cache->region().fd(),
                                                          cache->region().size_bytes()));
  std::unique_ptr<ScaleDaemon> daemon(new ScaleDaemon(std::move(*started), std::move(*cache),
                                                      std::move(*client), spec, config_path));
  if (!spec.grow_as_measured) KVTIER_RETURN_IF_ERROR(daemon->use_settings(false));
  return daemon;
}

ScaleDaemon::ScaleDaemon(support::DaemonProcess daemon, PagedCache cache,
                         std::unique_ptr<Client> client, ScaleDaemonSpec spec,
                         std::string config_path)
    : daemon_(std::move(daemon)),
      cache_(std::move(cache)),
      client_(std::move(client)),
      spec_(std::move(spec)),
      config_path_(std::move(config_path)),
      prefix_(PagedCache::chain_hashes("scale/system-prompt", kPrefixBlocks)) {}

ScaleDaemon::~ScaleDaemon() {
  client_.reset();
  (void)daemon_.stop_cleanly(kDaemonStopTimeout);
}

uint64_t ScaleDaemon::session_refs() const {
  uint64_t refs = 0;
  for (uint32_t turns : turns_) refs += grow_blocks() + uint64_t{kSaveBlocks} * turns;
  return refs;
}

Result<uint64_t> ScaleDaemon::rss_bytes() const {
  std::ifstream status(fmt::format("/proc/{}/status", daemon_.pid()));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return unavailable("no VmRSS in /proc/{}/status", daemon_.pid());
}

Status ScaleDaemon::use_settings(bool measuring) {
  if (measuring == measuring_ || spec_.grow_as_measured) return Status::ok();
  KVTIER_RETURN_IF_ERROR(write_settings(config_path_, measuring));
  const std::string policy = measuring ? kMeasuredPolicy : "lru";
  if (::kill(daemon_.pid(), SIGHUP) != 0) return errno_status(errno, "SIGHUP kvtierd");
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (true) {
    auto stats = client_->stats();
    if (!stats.is_ok()) return stats.status();
    if (stats->policy == policy) break;
    if (Clock::now() > deadline) {
      return unavailable(
          "kvtierd runs policy '{}' 10 s after SIGHUP asked for '{}'; end of {}:\n{}",
          stats->policy, policy, daemon_.log_path(), daemon_.log_tail());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  measuring_ = measuring;
  return Status::ok();
}

Status ScaleDaemon::wait_until_settled() {
  // A few plan intervals first, so the plans the new settings call for have started.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (true) {
    auto stats = client_->stats();
    if (!stats.is_ok()) return stats.status();
    if (stats->copies_in_flight == 0 && stats->pinned_blocks == 0) return Status::ok();
    if (Clock::now() > deadline) {
      return unavailable("kvtierd still has {} copies in flight after 120 s",
                         stats->copies_in_flight);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Status ScaleDaemon::grow_to(uint64_t target) {
  KVTIER_RETURN_IF_ERROR(use_settings(false));
  struct InFlight {
    Pending<SaveResult> reply;
    uint32_t group;
    uint64_t session;
  };
  std::deque<InFlight> in_flight;
  std::vector<uint32_t> free_groups;
  for (uint32_t g = kPipelineDepth; g-- > 0;) free_groups.push_back(g);
  auto finish_oldest = [&]() -> Status {
    InFlight& oldest = in_flight.front();
    auto saved = oldest.reply.wait();
    if (!saved.is_ok()) return saved.status();
    if (saved->stored + saved->deduplicated != grow_blocks() || saved->stored < spec_.own_blocks) {
      return internal_error("growing: Save of {} stored {} and deduplicated {} of {} blocks",
                            session_id(oldest.session), saved->stored, saved->deduplicated,
                            grow_blocks());
    }
    free_groups.push_back(oldest.group);
    in_flight.pop_front();
    return Status::ok();
  };
  std::vector<BlockRef> refs(grow_blocks());
  for (uint64_t s = sessions(); s < target; ++s) {
    if (free_groups.empty()) KVTIER_RETURN_IF_ERROR(finish_oldest());
    const uint32_t group = free_groups.back();
    free_groups.pop_back();
    std::vector<BlockHash> hashes = prefix_;
    for (const BlockHash& hash : own_hashes(s, spec_.own_blocks)) hashes.push_back(hash);
    for (uint32_t i = 0; i < grow_blocks(); ++i) {
      const uint64_t block = uint64_t{group} * grow_blocks() + i;
      cache_.fill(block, hashes[i]);
      refs[i] = {hashes[i], block};
    }
    in_flight.push_back({client_->save_async(session_id(s), refs, true), group, s});
    // The first Save stores the shared prefix alone: no two Saves race to store it.
    if (s == 0) KVTIER_RETURN_IF_ERROR(finish_oldest());
  }
  while (!in_flight.empty()) KVTIER_RETURN_IF_ERROR(finish_oldest());
  if (target > turns_.size()) turns_.resize(target, 0);
  return Status::ok();
}

Status ScaleDaemon::prepare_to_measure() {
  KVTIER_RETURN_IF_ERROR(use_settings(true));
  return wait_until_settled();
}

std::vector<BlockHash> ScaleDaemon::chain_prefix(uint64_t s, uint32_t count) const {
  std::vector<BlockHash> chain = prefix_;
  for (const BlockHash& hash : own_hashes(s, spec_.own_blocks)) chain.push_back(hash);
  for (uint32_t turn = 0; chain.size() < count && turn < turns_[s]; ++turn) {
    for (const BlockHash& hash : turn_hashes(s, turn)) chain.push_back(hash);
  }
  chain.resize(std::min<size_t>(chain.size(), count));
  return chain;
}

Status ScaleDaemon::barrier() {
  auto found = client_->lookup(std::span<const BlockHash>(prefix_.data(), 1));
  if (!found.is_ok()) return found.status();
  if (found->hit_count != 1) return internal_error("the shared prefix is no longer held");
  return Status::ok();
}

Status ScaleDaemon::time_lookups(uint32_t count, std::vector<double>& out) {
  std::uniform_int_distribution<uint64_t> pick_session(0, sessions() - 1);
  std::uniform_int_distribution<uint32_t> pick_own(0, spec_.own_blocks - 1);
  for (uint32_t i = 0; i < count; ++i) {
    std::vector<BlockHash> hashes = prefix_;
    while (hashes.size() < kLookupHashes) {
      hashes.push_back(own_hashes(pick_session(random_), spec_.own_blocks)[pick_own(random_)]);
    }
    KVTIER_RETURN_IF_ERROR(barrier());
    const auto t0 = Clock::now();
    auto found = client_->lookup(hashes);
    out.push_back(micros_since(t0));
    if (!found.is_ok()) return found.status();
    if (found->hit_count != kLookupHashes) {
      return internal_error("Lookup hit {} of {} held hashes", found->hit_count, kLookupHashes);
    }
  }
  return Status::ok();
}

Status ScaleDaemon::run_round(ScaleSamples* out) {
  if (sessions() == 0) return internal_error("no sessions to measure against");
  auto record = [out](ScaleOp op, double micros) {
    if (out != nullptr) (*out)[static_cast<size_t>(op)].push_back(micros);
  };
  std::uniform_int_distribution<uint64_t> pick_session(0, sessions() - 1);
  const uint64_t s = pick_session(random_);
  const std::string id = session_id(s);

  KVTIER_RETURN_IF_ERROR(barrier());
  auto t0 = Clock::now();
  auto begun = client_->begin_turn(id);
  record(ScaleOp::kBeginTurn, micros_since(t0));
  if (!begun.is_ok()) return begun.status();
  const uint64_t known = grow_blocks() + uint64_t{kSaveBlocks} * turns_[s];
  if (begun->known_blocks != known) {
    return internal_error("BeginTurn({}) knows {} blocks, not {}", id, begun->known_blocks, known);
  }

  // The shared prefix, then held blocks of sessions across the whole daemon.
  std::vector<BlockHash> hashes = prefix_;
  std::uniform_int_distribution<uint32_t> pick_own(0, spec_.own_blocks - 1);
  while (hashes.size() < kLookupHashes) {
    hashes.push_back(own_hashes(pick_session(random_), spec_.own_blocks)[pick_own(random_)]);
  }
  KVTIER_RETURN_IF_ERROR(barrier());
  t0 = Clock::now();
  auto found = client_->lookup(hashes);
  record(ScaleOp::kLookup, micros_since(t0));
  if (!found.is_ok()) return found.status();
  if (found->hit_count != kLookupHashes) {
    return internal_error("Lookup hit {} of {} held hashes", found->hit_count, kLookupHashes);
  }

  if (!extended_.empty()) {
    std::uniform_int_distribution<size_t> pick_extended(0, extended_.size() - 1);
    const uint64_t e = extended_[pick_extended(random_)];
    const std::vector<BlockHash> chain = chain_prefix(e, kLoadBlocks);
    std::vector<BlockRef> refs;
    for (uint32_t i = 0; i < kLoadBlocks; ++i) refs.push_back({chain[i], load_base() + i});
    cache_.wipe();
    KVTIER_RETURN_IF_ERROR(barrier());
    t0 = Clock::now();
    auto loaded = client_->load(session_id(e), refs);
    record(ScaleOp::kLoad, micros_since(t0));
    if (!loaded.is_ok()) return loaded.status();
    if (loaded->loaded_count != kLoadBlocks) {
      return internal_error("Load({}) restored {} of {} blocks: {}", session_id(e),
                            loaded->loaded_count, kLoadBlocks, loaded->stop_reason.to_string());
    }
    for (uint32_t i = 0; i < kLoadBlocks; ++i) {
      if (!cache_.verify(load_base() + i, chain[i])) {
        return data_loss("Load({}) block {} does not hold the bytes saved", session_id(e), i);
      }
    }
  }

  const std::vector<BlockHash> fresh = turn_hashes(s, turns_[s]);
  std::vector<BlockRef> refs;
  for (uint32_t i = 0; i < kSaveBlocks; ++i) {
    cache_.fill(save_base() + i, fresh[i]);
    refs.push_back({fresh[i], save_base() + i});
  }
  KVTIER_RETURN_IF_ERROR(barrier());
  t0 = Clock::now();
  auto saved = client_->save(id, refs, true);
  record(ScaleOp::kSave, micros_since(t0));
  if (!saved.is_ok()) return saved.status();
  KVTIER_RETURN_IF_ERROR(barrier());
  record(ScaleOp::kSaveUntilIdle, micros_since(t0));
  if (saved->stored != kSaveBlocks) {
    return internal_error("Save({}) stored {} of {} new blocks", id, saved->stored, kSaveBlocks);
  }
  if (turns_[s]++ == 0) extended_.push_back(s);

  KVTIER_RETURN_IF_ERROR(barrier());
  t0 = Clock::now();
  auto stats = client_->stats();
  record(ScaleOp::kStats, micros_since(t0));
  return stats.status();
}

}  // namespace kvtier::bench
