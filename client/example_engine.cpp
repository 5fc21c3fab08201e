// kvtier-example-engine: a stand-in inference engine. It registers a paged KV cache
// (memfd shared memory), saves a multi-turn session block by block as an engine would
// at the end of each turn, wipes its cache, then looks the session up and loads it
// back into different engine blocks and checks every byte. Exit status 0 only when
// every byte matched.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <numeric>
#include <random>

#include "client/client.h"
#include "client/paged_cache.h"
#include "common/units.h"

namespace {

using kvtier::BlockRef;

struct Options {
  std::string socket = kvtier::Client::default_socket_path();
  std::string device = "host";
  std::string session = "example-session";
  bool save_only = false;
  bool verify_only = false;
  uint32_t turns = 3;
  uint32_t blocks_per_turn = 4;
  kvtier::PagedCacheShape shape;
};

int fail(const std::string& what, const kvtier::Status& status) {
  std::fprintf(stderr, "kvtier-example-engine: %s: %s\n", what.c_str(), status.to_string().c_str());
  return 1;
}

int run(const Options& options) {
  if (options.device != "host") {
    std::fprintf(stderr,
                 "kvtier-example-engine: --device %s is not available in this build "
                 "(the host backend is)\n",
                 options.device.c_str());
    return 2;
  }
  const uint64_t total_blocks = uint64_t{options.turns} * options.blocks_per_turn;
  if (total_blocks * 2 > options.shape.num_blocks) {
    std::fprintf(stderr, "kvtier-example-engine: %llu session blocks need --num-blocks >= %llu\n",
                 static_cast<unsigned long long>(total_blocks),
                 static_cast<unsigned long long>(total_blocks * 2));
    return 2;
  }
  auto cache = kvtier::PagedCache::create(options.shape);
  if (!cache.is_ok()) return fail("create KV cache", cache.status());
  auto client = kvtier::Client::connect(options.socket);
  if (!client.is_ok()) return fail("connect", client.status());
  auto hello = (*client)->hello(cache->layout(), "kvtier-example-engine");
  if (!hello.is_ok()) return fail("hello", hello.status());
  auto registered = (*client)->register_memfd_region(cache->region_id(), cache->region().fd(),
                                                     cache->region().size_bytes());
  if (!registered.is_ok()) return fail("register region", registered);

  auto hashes = kvtier::PagedCache::chain_hashes(options.session, total_blocks);
  // Blocks live at scattered engine block ids, as they do in a paged cache; the load
  // restores them into a different set of ids.
  std::vector<uint64_t> ids(options.shape.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(std::hash<std::string>()(options.session)));
  std::vector<BlockRef> saved_refs, load_refs;
  for (uint64_t i = 0; i < total_blocks; ++i) {
    saved_refs.push_back({hashes[i], ids[i]});
    load_refs.push_back({hashes[i], ids[total_blocks + i]});
  }

  if (!options.verify_only) {
    uint64_t stored = 0;
    for (uint32_t turn = 0; turn < options.turns; ++turn) {
      size_t end = size_t{turn + 1} * options.blocks_per_turn;
      for (size_t i = size_t{turn} * options.blocks_per_turn; i < end; ++i) {
        cache->fill(saved_refs[i].engine_block_id, saved_refs[i].hash);
      }
      // An engine saves the whole prefix at each turn's end; the daemon dedups.
      auto saved = (*client)->save(options.session, std::span(saved_refs).first(end), true);
      if (!saved.is_ok()) return fail(fmt::format("save turn {}", turn + 1), saved.status());
      stored += saved->stored;
    }
    std::printf("saved session '%s': %u turns, %llu blocks of %s (digest %016llx)\n",
                options.session.c_str(), options.turns, static_cast<unsigned long long>(stored),
                kvtier::format_bytes(hello->block_bytes).c_str(),
                static_cast<unsigned long long>(hello->layout_digest));
    if (options.save_only) return 0;
  }

  cache->wipe();
  auto begun = (*client)->begin_turn(options.session);
  if (!begun.is_ok()) return fail("begin turn", begun.status());
  auto found = (*client)->lookup(hashes);
  if (!found.is_ok()) return fail("lookup", found.status());
  auto loaded = (*client)->load(options.session, load_refs);
  if (!loaded.is_ok()) return fail("load", loaded.status());
  uint64_t matched = 0;
  for (uint64_t i = 0; i < loaded->loaded_count; ++i) {
    if (cache->verify(load_refs[i].engine_block_id, load_refs[i].hash)) ++matched;
  }
  std::printf("loaded session '%s': lookup hit %u/%llu, loaded %u, bit-exact %llu\n",
              options.session.c_str(), found->hit_count,
              static_cast<unsigned long long>(total_blocks), loaded->loaded_count,
              static_cast<unsigned long long>(matched));
  if (!loaded->stop_reason.is_ok()) {
    std::printf("load stopped early: %s\n", loaded->stop_reason.to_string().c_str());
  }
  bool ok = matched == total_blocks && loaded->loaded_count == total_blocks;
  std::printf("%s\n", ok ? "OK: every byte matched" : "FAILED: the session did not round-trip");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"kvtier example engine: save a multi-turn session, reload it, verify bit-exact"};
  app.add_option("--socket", options.socket, "kvtierd socket path");
  app.add_option("--device", options.device, "host (memfd) or cuda")
      ->check(CLI::IsMember({"host", "cuda"}));
  app.add_option("--session", options.session, "session id");
  app.add_flag("--save-only", options.save_only, "save the session and exit");
  app.add_flag("--verify-only", options.verify_only, "load a session saved earlier and verify it");
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
  return run(options);
}
