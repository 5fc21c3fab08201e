// kvtier-example-engine: a stand-in inference engine. It registers a paged KV cache
// (memfd shared memory, or GPU memory with --device cuda: one cuMemAlloc shared through
// legacy IPC, or VMM chunks shared as fds), saves a multi-turn session block by block
// as an engine would at the end of each turn, wipes its cache, then looks the session
// up and loads it back into different engine blocks and checks every byte. Before it
// exits it unregisters its regions, as an engine must before freeing them. Exit status
// 0 only when every byte (and, on a GPU, every canary byte around the KV tensors)
// matched.
//
// Like a serving engine it rides through kvtierd restarts: Unavailable from a call (the
// daemon is down or restarting) means "recompute" — a turn not saved, a prefix not
// restored — never an exit, and the client reconnects by itself on a later call.
// --pause-before-load stops between saving and loading until SIGUSR1, so kvtierd can be
// restarted under the running engine.
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <optional>
#include <random>
#include <span>

#include "client/client.h"
#include "client/paged_cache.h"
#include "common/units.h"
#ifdef KVTIER_HAVE_CUDA
#include "client/gpu_stager.h"
#include "examples/engine/gpu_paged_cache.h"
#endif

namespace {

using kvtier::BlockRef;

struct Options {
  std::string socket = kvtier::Client::default_socket_path();
  std::string device = "host";
  int gpu = 0;                     // --device cuda: index among the CUDA devices
  std::string gpu_memory = "ipc";  // --device cuda: ipc or vmm
  std::string session = "example-session";
  bool save_only = false;
  bool verify_only = false;
  bool pause_before_load = false;
  bool staging_kernels = false;  // --device cuda: pack blocks with the staging kernels
  bool layer_wise = false;       // load one layer's planes at a time
  uint64_t staging_ring_bytes = uint64_t{64} << 20;
  uint32_t turns = 3;
  uint32_t blocks_per_turn = 4;
  kvtier::PagedCacheShape shape;
};

// The engine's KV cache: memfd shared memory (host) or GPU memory (cuda).
class EngineCache {
 public:
  virtual ~EngineCache() = default;
  virtual const kvtier::LayoutSpec& layout() const = 0;
  virtual kvtier::Status register_with(kvtier::Client& client) = 0;
  virtual kvtier::Status fill(uint64_t block_id, const kvtier::BlockHash& hash) = 0;
  virtual kvtier::Result<bool> verify(uint64_t block_id, const kvtier::BlockHash& hash) = 0;
  virtual kvtier::Status wipe() = 0;
  virtual kvtier::Status synchronize() { return kvtier::Status::ok(); }
  // Sends UnregisterRegion for every region register_with registered and waits for
  // each reply: only then may the memory be freed.
  virtual kvtier::Status unregister(kvtier::Client& client) = 0;
  // DataLoss naming the memory around the KV cache that something overwrote.
  virtual kvtier::Status check_guards() { return kvtier::Status::ok(); }
  // How blocks move: kvtierd's plane copies here; a staging cache packs them itself.
  virtual kvtier::Result<kvtier::SaveResult> save(kvtier::Client& client,
                                                  const std::string& session,
                                                  std::span<const BlockRef> refs) {
    return client.save(session, refs, /*end_of_turn=*/true);
  }
  // One Load, or with `layer_wise` one per layer (K and V planes), pipelined; the
  // result is the smallest count of them.
  virtual kvtier::Result<kvtier::LoadResult> load(kvtier::Client& client,
                                                  const std::string& session,
                                                  std::span<const BlockRef> refs, bool layer_wise) {
    if (!layer_wise) return client.load(session, refs);
    std::vector<kvtier::Pending<kvtier::LoadResult>> layers;
    const auto planes = static_cast<uint32_t>(layout().planes.size());
    for (uint32_t plane = 0; plane < planes; plane += 2)
      layers.push_back(client.load_async(session, refs, {plane, std::min(2u, planes - plane)}));
    return smallest(layers);
  }

 protected:
  static kvtier::Result<kvtier::LoadResult> smallest(
      std::vector<kvtier::Pending<kvtier::LoadResult>>& layers) {
    kvtier::Result<kvtier::LoadResult> result =
        kvtier::LoadResult{UINT32_MAX, kvtier::Status::ok()};
    for (auto& layer : layers) {
      auto reply = layer.wait();
      if (!reply.is_ok()) {
        if (result.is_ok()) result = reply.status();
      } else if (result.is_ok() && reply->loaded_count < result->loaded_count) {
        result = *reply;
      }
    }
    return result;
  }
};

class HostCache final : public EngineCache {
 public:
  explicit HostCache(kvtier::PagedCache cache) : cache_(std::move(cache)) {}
  const kvtier::LayoutSpec& layout() const override { return cache_.layout(); }
  kvtier::Status register_with(kvtier::Client& client) override {
    return client.register_memfd_region(cache_.region_id(), cache_.region().fd(),
                                        cache_.region().size_bytes());
  }
  kvtier::Status fill(uint64_t block_id, const kvtier::BlockHash& hash) override {
    cache_.fill(block_id, hash);
    return kvtier::Status::ok();
  }
  kvtier::Result<bool> verify(uint64_t block_id, const kvtier::BlockHash& hash) override {
    return cache_.verify(block_id, hash);
  }
  kvtier::Status wipe() override {
    cache_.wipe();
    return kvtier::Status::ok();
  }
  kvtier::Status unregister(kvtier::Client& client) override {
    auto reply = client.unregister_region_async(cache_.region_id()).wait();
    if (!reply.is_ok()) return reply.status();
    if (*reply != cache_.region_id()) {
      return kvtier::internal_error("UnregisterRegion {}: the reply names region {}",
                                    cache_.region_id(), *reply);
    }
    return kvtier::Status::ok();
  }

 private:
  kvtier::PagedCache cache_;
};

#ifdef KVTIER_HAVE_CUDA
class GpuCache final : public EngineCache {
 public:
  explicit GpuCache(std::unique_ptr<kvtier::GpuPagedCache> cache) : cache_(std::move(cache)) {}
  const kvtier::LayoutSpec& layout() const override { return cache_->layout(); }
  kvtier::Status register_with(kvtier::Client& client) override {
    KVTIER_RETURN_IF_ERROR(cache_->register_with(client));
    for (const kvtier::CudaRegionInfo& region : cache_->regions()) {
      const std::string shared =
          region.kind == kvtier::CudaRegionKind::kVmm
              ? fmt::format("VMM, {} chunks of {} in all", region.chunk_count,
                            kvtier::format_bytes(region.allocation_bytes))
              : fmt::format("legacy IPC, a {} allocation",
                            kvtier::format_bytes(region.allocation_bytes));
      std::printf("registered %s of GPU %d (%s) at +%llu (%s)\n",
                  kvtier::format_bytes(region.size_bytes).c_str(), region.device_ordinal,
                  region.gpu_uuid.c_str(), static_cast<unsigned long long>(region.offset_bytes),
                  shared.c_str());
    }
    return kvtier::Status::ok();
  }
  kvtier::Status fill(uint64_t block_id, const kvtier::BlockHash& hash) override {
    return cache_->fill(block_id, hash);
  }
  kvtier::Result<bool> verify(uint64_t block_id, const kvtier::BlockHash& hash) override {
    return cache_->verify(block_id, hash);
  }
  kvtier::Status wipe() override { return cache_->wipe(); }
  kvtier::Status synchronize() override { return cache_->synchronize(); }
  kvtier::Status unregister(kvtier::Client& client) override {
    stager_.reset();  // its staging region goes first
    return cache_->unregister(client);
  }
  // Whether the staging kernels run for this cache (before the Hello names the path).
  kvtier::Status probe_staging_kernels() const {
    return kvtier::GpuStager::probe(cache_->region_bases().begin()->second);
  }
  // Saves and Loads through a GpuStager from now on.
  kvtier::Status use_staging_kernels(kvtier::Client& client, const kvtier::HelloInfo& hello,
                                     uint64_t ring_bytes) {
    kvtier::GpuStagerOptions options;
    options.ring_bytes = ring_bytes;
    auto stager =
        kvtier::GpuStager::create(client, hello, cache_->layout(), cache_->region_bases(), options);
    if (!stager.is_ok()) return stager.status();
    stager_ = std::move(*stager);
    return kvtier::Status::ok();
  }
  kvtier::Result<kvtier::SaveResult> save(kvtier::Client& client, const std::string& session,
                                          std::span<const BlockRef> refs) override {
    if (!stager_) return EngineCache::save(client, session, refs);
    return stager_->save(session, refs, /*end_of_turn=*/true, /*stream=*/nullptr);
  }
  kvtier::Result<kvtier::LoadResult> load(kvtier::Client& client, const std::string& session,
                                          std::span<const BlockRef> refs,
                                          bool layer_wise) override {
    if (!stager_) return EngineCache::load(client, session, refs, layer_wise);
    if (!layer_wise) return stager_->load(session, refs, /*stream=*/nullptr);
    std::vector<kvtier::PlaneRange> ranges;
    const auto planes = static_cast<uint32_t>(layout().planes.size());
    for (uint32_t plane = 0; plane < planes; plane += 2)
      ranges.push_back({plane, std::min(2u, planes - plane)});
    KVTIER_RETURN_IF_ERROR(stager_->begin_load(session, refs, ranges));
    kvtier::Result<kvtier::LoadResult> result =
        kvtier::LoadResult{UINT32_MAX, kvtier::Status::ok()};
    for (size_t layer = 0; layer < ranges.size(); ++layer) {
      // An engine runs layer `layer`'s attention here, behind the scatter on its stream.
      auto reply = stager_->finish_range(layer, /*stream=*/nullptr);
      if (!reply.is_ok()) {
        if (result.is_ok()) result = reply.status();
      } else if (result.is_ok() && reply->loaded_count < result->loaded_count) {
        result = *reply;
      }
    }
    KVTIER_RETURN_IF_ERROR(stager_->end_load());
    return result;
  }
  kvtier::Status check_guards() override {
    auto damaged = cache_->damaged_canaries();
    if (!damaged.is_ok()) return damaged.status();
    if (damaged->empty()) return kvtier::Status::ok();
    return kvtier::data_loss("canaries overwritten: {}", fmt::join(*damaged, "; "));
  }

 private:
  std::unique_ptr<kvtier::GpuPagedCache> cache_;
  std::unique_ptr<kvtier::GpuStager> stager_;
};
#endif

kvtier::Result<std::unique_ptr<EngineCache>> make_cache(const Options& options) {
  if (options.device == "cuda") {
#ifdef KVTIER_HAVE_CUDA
    auto mode =
        options.gpu_memory == "vmm" ? kvtier::GpuMemoryMode::kVmm : kvtier::GpuMemoryMode::kIpc;
    auto cache = kvtier::GpuPagedCache::create(options.shape, options.gpu, mode);
    if (!cache.is_ok()) return cache.status();
    return std::unique_ptr<EngineCache>(std::make_unique<GpuCache>(std::move(*cache)));
#else
    return kvtier::invalid_argument(
        "--device cuda: this kvtier-example-engine was built without the CUDA toolkit headers "
        "(rebuild with -DKVTIER_CUDA=ON on a machine that has them)");
#endif
  }
  auto cache = kvtier::PagedCache::create(options.shape);
  if (!cache.is_ok()) return cache.status();
  return std::unique_ptr<EngineCache>(std::make_unique<HostCache>(std::move(*cache)));
}

int fail(const std::string& what, const kvtier::Status& status) {
  std::fprintf(stderr, "kvtier-example-engine: %s: %s\n", what.c_str(), status.to_string().c_str());
  return 1;
}

// kvtierd is away (stopped, crashed, restarting): a serving engine computes instead of
// restoring, and goes on.
bool recompute_instead(const std::string& what, const kvtier::Status& status) {
  if (status.code() != kvtier::StatusCode::kUnavailable) return false;
  std::printf("%s: kvtierd unavailable (%s); the engine recomputes\n", what.c_str(),
              status.message().c_str());
  return true;
}

// Blocks until SIGUSR1 (blocked in main() before any thread exists, so it queues).
void pause_until_sigusr1() {
  std::printf("paused before load: send SIGUSR1 to go on\n");
  std::fflush(stdout);
  sigset_t wanted;
  sigemptyset(&wanted);
  sigaddset(&wanted, SIGUSR1);
  int received = 0;
  while (sigwait(&wanted, &received) != 0) {
  }
}

// The session's blocks: their hashes, where the engine keeps them while it saves them,
// and where the load restores them.
struct SessionBlocks {
  std::vector<kvtier::BlockHash> hashes;
  std::vector<BlockRef> saved_refs;
  std::vector<BlockRef> load_refs;
};

SessionBlocks place_session_blocks(const Options& options, uint64_t total_blocks) {
  SessionBlocks blocks;
  blocks.hashes = kvtier::PagedCache::chain_hashes(options.session, total_blocks);
  // Blocks live at scattered engine block ids, as they do in a paged cache; the load
  // restores them into a different set of ids.
  std::vector<uint64_t> ids(options.shape.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(std::hash<std::string>()(options.session)));
  for (uint64_t i = 0; i < total_blocks; ++i) {
    blocks.saved_refs.push_back({blocks.hashes[i], ids[i]});
    blocks.load_refs.push_back({blocks.hashes[i], ids[total_blocks + i]});
  }
  return blocks;
}

// Fills and saves the session turn by turn. The exit status when the run ends here (a
// failure, or --save-only); nothing when it goes on to the load.
std::optional<int> save_turns(const Options& options, EngineCache& cache, kvtier::Client& client,
                              const kvtier::HelloInfo& hello,
                              const std::vector<BlockRef>& saved_refs) {
  uint64_t stored = 0;
  uint32_t unsaved_turns = 0;
  for (uint32_t turn = 0; turn < options.turns; ++turn) {
    size_t end = size_t{turn + 1} * options.blocks_per_turn;
    for (size_t i = size_t{turn} * options.blocks_per_turn; i < end; ++i) {
      auto filled = cache.fill(saved_refs[i].engine_block_id, saved_refs[i].hash);
      if (!filled.is_ok()) return fail("fill block", filled);
    }
    // The engine's writes must be complete before the daemon reads the blocks.
    if (auto synced = cache.synchronize(); !synced.is_ok()) return fail("synchronize", synced);
    // An engine saves the whole prefix at each turn's end; the daemon dedups.
    auto saved = cache.save(client, options.session, std::span(saved_refs).first(end));
    if (!saved.is_ok()) {
      if (recompute_instead(fmt::format("save turn {}", turn + 1), saved.status())) {
        ++unsaved_turns;
        continue;
      }
      return fail(fmt::format("save turn {}", turn + 1), saved.status());
    }
    stored += saved->stored;
    if (saved->saved() < end) {
      // A partial Save: kvtierd's tiers were full of blocks sessions hold, and it kept
      // the prefix that fit. The rest would be recomputed at the next turn.
      std::fprintf(stderr, "example-engine: save turn %u kept %u of %zu blocks (no room)\n",
                   turn + 1, saved->saved(), end);
      ++unsaved_turns;
    }
  }
  std::printf("saved session '%s': %u turns, %llu blocks of %s (digest %016llx)\n",
              options.session.c_str(), options.turns, static_cast<unsigned long long>(stored),
              kvtier::format_bytes(hello.block_bytes).c_str(),
              static_cast<unsigned long long>(hello.layout_digest));
  if (options.save_only) return unsaved_turns == 0 ? 0 : 1;
  return std::nullopt;
}

// Wipes the cache, looks the session up, loads it into `blocks.load_refs` and checks
// every byte; the exit status.
int load_and_verify(const Options& options, EngineCache& cache, kvtier::Client& client,
                    const SessionBlocks& blocks, uint64_t total_blocks) {
  const std::vector<BlockRef>& load_refs = blocks.load_refs;
  if (options.pause_before_load) pause_until_sigusr1();
  if (auto wiped = cache.wipe(); !wiped.is_ok()) return fail("wipe", wiped);
  if (auto synced = cache.synchronize(); !synced.is_ok()) return fail("synchronize", synced);
  auto begun = client.begin_turn(options.session);
  if (!begun.is_ok() && !recompute_instead("begin turn", begun.status())) {
    return fail("begin turn", begun.status());
  }
  auto found = client.lookup(blocks.hashes);
  kvtier::Result<kvtier::LoadResult> loaded = kvtier::LoadResult{0, kvtier::Status::ok()};
  if (found.is_ok()) {
    loaded = cache.load(client, options.session, load_refs, options.layer_wise);
  } else if (!recompute_instead("lookup", found.status())) {
    return fail("lookup", found.status());
  } else {
    found = kvtier::LookupResult{0, {}};
  }
  if (!loaded.is_ok()) {
    if (!recompute_instead("load", loaded.status())) return fail("load", loaded.status());
    loaded = kvtier::LoadResult{0, loaded.status()};
  }
  uint64_t matched = 0;
  for (uint64_t i = 0; i < loaded->loaded_count; ++i) {
    auto same = cache.verify(load_refs[i].engine_block_id, load_refs[i].hash);
    if (!same.is_ok()) return fail("verify", same.status());
    if (*same) ++matched;
  }
  std::printf("loaded session '%s': lookup hit %u/%llu, loaded %u, bit-exact %llu\n",
              options.session.c_str(), found->hit_count,
              static_cast<unsigned long long>(total_blocks), loaded->loaded_count,
              static_cast<unsigned long long>(matched));
  if (!loaded->stop_reason.is_ok()) {
    std::printf("load stopped early: %s\n", loaded->stop_reason.to_string().c_str());
  }
  std::printf("connection: %llu reconnects\n",
              static_cast<unsigned long long>(client.reconnects()));
  bool ok = matched == total_blocks && loaded->loaded_count == total_blocks;
  std::printf("%s\n", ok ? "OK: every byte matched" : "FAILED: the session did not round-trip");
  return ok ? 0 : 1;
}

// Saves and/or loads the session through the registered cache; the exit status.
int save_and_load(const Options& options, EngineCache& cache, kvtier::Client& client,
                  const kvtier::HelloInfo& hello) {
  const uint64_t total_blocks = uint64_t{options.turns} * options.blocks_per_turn;
  const SessionBlocks blocks = place_session_blocks(options, total_blocks);
  if (!options.verify_only) {
    const std::optional<int> exit_status =
        save_turns(options, cache, client, hello, blocks.saved_refs);
    if (exit_status) return *exit_status;
  }
  return load_and_verify(options, cache, client, blocks, total_blocks);
}

int run(const Options& options) {
  const uint64_t total_blocks = uint64_t{options.turns} * options.blocks_per_turn;
  if (total_blocks * 2 > options.shape.num_blocks) {
    std::fprintf(stderr, "kvtier-example-engine: %llu session blocks need --num-blocks >= %llu\n",
                 static_cast<unsigned long long>(total_blocks),
                 static_cast<unsigned long long>(total_blocks * 2));
    return 2;
  }
  // Declared before the client: should anything below return early, the connection
  // closes (and the daemon drops its mappings) before the cache's memory is freed.
  auto made = make_cache(options);
  if (!made.is_ok()) return fail("create KV cache", made.status());
  EngineCache& cache = **made;
  auto client = kvtier::Client::connect(options.socket);
  if (!client.is_ok()) return fail("connect", client.status());
  const auto device_kind =
      options.device == "cuda" ? kvtier::DeviceKind::kCuda : kvtier::DeviceKind::kHost;
  // --staging-kernels where they run here; otherwise (a build without nvcc, a driver
  // without code for this GPU) the plane-copy path, as any engine would fall back.
  bool staging_kernels = false;
#ifdef KVTIER_HAVE_CUDA
  if (options.staging_kernels) {
    kvtier::Status probed = static_cast<GpuCache&>(cache).probe_staging_kernels();
    staging_kernels = probed.is_ok();
    if (!staging_kernels) {
      std::printf("staging kernels unavailable (%s): data path: plane copies\n",
                  probed.to_string().c_str());
    }
  }
#endif
  const auto data_path =
      staging_kernels ? kvtier::DataPath::kStagingKernels : kvtier::DataPath::kPlaneCopies;
  auto hello = (*client)->hello(cache.layout(), "kvtier-example-engine", 0, device_kind, data_path);
  if (!hello.is_ok()) return fail("hello", hello.status());
  auto registered = cache.register_with(**client);
  if (!registered.is_ok()) return fail("register region", registered);
#ifdef KVTIER_HAVE_CUDA
  if (staging_kernels) {
    auto staged = static_cast<GpuCache&>(cache).use_staging_kernels(**client, *hello,
                                                                    options.staging_ring_bytes);
    if (!staged.is_ok()) return fail("load the staging kernels", staged);
    std::printf("data path: staging kernels\n");
  }
#endif

  int exit_code = save_and_load(options, cache, **client, *hello);
  if (auto guards = cache.check_guards(); !guards.is_ok()) {
    fail("check the memory around the KV cache", guards);
    exit_code = 1;
  } else if (options.device == "cuda") {
    std::printf("canaries around the KV cache intact\n");
  }
  if (auto unregistered = cache.unregister(**client);
      !unregistered.is_ok() && !recompute_instead("unregister regions", unregistered)) {
    fail("unregister regions", unregistered);
    exit_code = 1;
  }
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"kvtier example engine: save a multi-turn session, reload it, verify bit-exact"};
  app.add_option("--socket", options.socket, "kvtierd socket path");
  app.add_option("--device", options.device, "host (memfd) or cuda")
      ->check(CLI::IsMember({"host", "cuda"}));
  app.add_option("--gpu", options.gpu, "--device cuda: GPU index among the CUDA devices")
      ->check(CLI::Range(0, 1023));
  app.add_option("--gpu-memory", options.gpu_memory,
                 "--device cuda: ipc (one cuMemAlloc, K and V regions at offsets, legacy IPC) or "
                 "vmm (cuMemCreate chunks shared as fds)")
      ->check(CLI::IsMember({"ipc", "vmm"}));
  app.add_option("--session", options.session, "session id");
  app.add_flag("--save-only", options.save_only, "save the session and exit");
  app.add_flag("--staging-kernels", options.staging_kernels,
               "--device cuda: pack blocks into a staging buffer with GPU kernels (one copy per "
               "block for kvtierd) instead of kvtierd copying every plane");
  app.add_flag("--layer-wise", options.layer_wise, "load one layer (K and V planes) at a time");
  app.add_option("--staging-ring-bytes", options.staging_ring_bytes,
                 "--staging-kernels: the staging buffer (a Save or Load larger than it streams "
                 "through it in chunks)")
      ->check(CLI::Range(uint64_t{1} << 10, uint64_t{1} << 36));
  app.add_flag("--verify-only", options.verify_only, "load a session saved earlier and verify it");
  app.add_flag("--pause-before-load", options.pause_before_load,
               "between saving and loading, wait for SIGUSR1 (restart kvtierd meanwhile)");
  app.add_option("--turns", options.turns, "turns to save")->check(CLI::Range(1u, 1000u));
  app.add_option("--blocks-per-turn", options.blocks_per_turn, "new blocks per turn")
      ->check(CLI::Range(1u, 4096u));
  app.add_option("--num-blocks", options.shape.num_blocks, "engine blocks in the paged cache")
      ->check(CLI::Range(2ull, 1ull << 20));
  app.add_option("--layers", options.shape.num_layers, "layers (2 planes each)")
      ->check(CLI::Range(1u, 256u));
  app.add_option("--kv-heads", options.shape.num_kv_heads, "KV heads")->check(CLI::Range(1u, 256u));
  app.add_option("--head-dim", options.shape.head_dim, "head dimension")
      ->check(CLI::Range(1u, 1024u));
  app.add_option("--tokens-per-block", options.shape.tokens_per_block, "tokens per block")
      ->check(CLI::Range(1u, 1024u));
  app.add_option("--model-id", options.shape.model_id, "model id (part of the layout digest)");
  app.get_option("--save-only")->excludes(app.get_option("--verify-only"));
  CLI11_PARSE(app, argc, argv);
  if (options.staging_kernels && options.device != "cuda") {
    std::fprintf(stderr, "kvtier-example-engine: --staging-kernels needs --device cuda\n");
    return 2;
  }
  if (options.pause_before_load) {
    // Before any thread exists, so that no thread takes the signal's default action.
    sigset_t blocked;
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
  }
  return run(options);
}
