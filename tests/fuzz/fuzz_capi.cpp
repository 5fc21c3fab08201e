// The C ABI (client/kvtier.h) as an engine written in C drives it, against the real
// daemon in this process (tests/daemon/inprocess_harness.h: the real Service and
// ipc::Server on a Unix socket). Each input is a program of calls — saves, lookups,
// loads, turns, region (un)registrations, async requests waited for with the right or
// the wrong kind, a second Hello with a layout made of input bytes, NULL arguments,
// connection options — with session ids, hashes, block ids, counts, sizes and region
// ids taken from the input, in range and out of it.
//
// Invariants, after every call:
//  * the status is one of kvtier_status's values; an error has a message
//    (kvtier_last_error) and the retryable flag is 0 after a success;
//  * results are within the request: stored + deduplicated == count, a lookup's hits
//    <= count with tiers for the hits and NONE after, a load's loaded_count <= count
//    with a stop code that says why it stopped early;
//  * never a wrong byte: every block this target ever saves holds content derived from
//    its hash (the target fills it so), so every block a load restores must hold
//    exactly that content, whichever input saved it and whatever happened since;
//  * a wait of the wrong kind is refused and consumes nothing (the right wait after it
//    gets the reply);
//  * the daemon still answers Stats when the input's program is done.
// The target closes the sessions it opened, so the daemon's state stays bounded over
// millions of inputs (its tiers evict blocks; evicted blocks are misses, never wrong).
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "client/kvtier.h"
#include "common/log.h"
#include "tests/daemon/inprocess_harness.h"
#include "tests/fuzz/fuzz_check.h"

using kvtier::fuzz::Input;

namespace {

constexpr uint32_t kPlanes = 2;
constexpr uint64_t kPlaneBytes = 1024;  // bytes of one block in one plane
constexpr uint64_t kBlocks = 16;        // engine blocks 0..15; 16.. are out of range
constexpr uint64_t kRegionBytes = kPlanes * kBlocks * kPlaneBytes;
constexpr uint32_t kMaxRefs = 8;

bool known_status(kvtier_status status) {
  return status >= KVTIER_OK && status <= KVTIER_NOT_SUPPORTED;
}

// Checks what every call must leave behind.
void check_call(kvtier_status status, const char* call) {
  KVTIER_FUZZ_CHECK(known_status(status), "%s returned %d", call, static_cast<int>(status));
  const char* message = kvtier_last_error();
  KVTIER_FUZZ_CHECK(message != nullptr, "%s: kvtier_last_error() is NULL", call);
  if (status == KVTIER_OK) {
    KVTIER_FUZZ_CHECK(kvtier_last_error_retryable() == 0, "%s succeeded but is retryable", call);
  } else {
    KVTIER_FUZZ_CHECK(message[0] != '\0', "%s failed (%s) without a message", call,
                      kvtier_status_name(status));
  }
  // The daemon is in this process and answers: a call is never Internal.
  KVTIER_FUZZ_CHECK(status != KVTIER_INTERNAL, "%s: INTERNAL: %s", call, message);
}

// Not instrumented for coverage: the fill and the check run over every byte of a block,
// and their branches say nothing about the code under test.
#define KVTIER_NOT_COVERED __attribute__((no_sanitize("coverage")))

// The content of plane `plane` of the block whose hash is `hash`.
KVTIER_NOT_COVERED uint8_t content_byte(const uint8_t* hash, uint32_t hash_len, uint32_t plane,
                                        uint64_t i) {
  uint64_t x = 0x9e3779b97f4a7c15ull * (plane + 1) ^ (i * 0xbf58476d1ce4e5b9ull);
  for (uint32_t b = 0; b < hash_len; ++b) x = (x ^ hash[b]) * 0x100000001b3ull;
  x ^= x >> 31;
  x *= 0x94d049bb133111ebull;
  return static_cast<uint8_t>(x >> 56);
}

// The daemon, the engine's KV cache (a memfd) and its layout: made once per process.
struct Fixture {
  std::unique_ptr<kvtier::daemon::InProcessDaemon> daemon;
  int memfd = -1;
  int spare_memfd = -1;  // registered under other region ids; no plane names them
  uint8_t* cache = nullptr;
  std::array<kvtier_plane, kPlanes> planes{};
  kvtier_layout layout{};

  Fixture() {
    kvtier::set_log_level(
        kvtier::LogLevel::kError);  // an engine joining per input is news to no one
    auto started = kvtier::daemon::InProcessDaemon::start();
    KVTIER_FUZZ_CHECK(started.is_ok(), "the daemon did not start: %s",
                      started.status().to_string().c_str());
    daemon = std::move(*started);
    memfd = ::memfd_create("fuzz-capi-cache", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    spare_memfd = ::memfd_create("fuzz-capi-spare", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    KVTIER_FUZZ_CHECK(memfd >= 0 && spare_memfd >= 0, "memfd_create failed");
    KVTIER_FUZZ_CHECK(
        ::ftruncate(memfd, kRegionBytes) == 0 && ::ftruncate(spare_memfd, kRegionBytes) == 0,
        "ftruncate failed");
    void* mapped = ::mmap(nullptr, kRegionBytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    KVTIER_FUZZ_CHECK(mapped != MAP_FAILED, "mmap failed");
    cache = static_cast<uint8_t*>(mapped);
    for (uint32_t p = 0; p < kPlanes; ++p) {
      planes[p].region_id = 0;
      planes[p].offset_bytes = p * kBlocks * kPlaneBytes;
      planes[p].stride_bytes = kPlaneBytes;
      planes[p].bytes_per_block = kPlaneBytes;
    }
    layout.model_id = "fuzz-capi-model";
    layout.dtype = "fp16";
    layout.num_layers = 1;
    layout.num_kv_heads = 2;
    layout.head_dim = 16;
    layout.tokens_per_block = 16;
    layout.tp_size = 1;
    layout.num_blocks = kBlocks;
    layout.planes = planes.data();
    layout.plane_count = kPlanes;
  }

  uint8_t* plane_of(uint64_t block, uint32_t plane) const {
    return cache + planes[plane].offset_bytes + block * kPlaneBytes;
  }
  KVTIER_NOT_COVERED void fill(uint64_t block, const uint8_t* hash, uint32_t hash_len) {
    for (uint32_t p = 0; p < kPlanes; ++p) {
      uint8_t* out = plane_of(block, p);
      for (uint64_t i = 0; i < kPlaneBytes; ++i) out[i] = content_byte(hash, hash_len, p, i);
    }
  }
  KVTIER_NOT_COVERED bool holds(uint64_t block, const uint8_t* hash, uint32_t hash_len) const {
    for (uint32_t p = 0; p < kPlanes; ++p) {
      const uint8_t* in = plane_of(block, p);
      for (uint64_t i = 0; i < kPlaneBytes; ++i) {
        if (in[i] != content_byte(hash, hash_len, p, i)) return false;
      }
    }
    return true;
  }
};

Fixture& fixture() {
  static Fixture* fixture = new Fixture();  // lives until exit: the daemon keeps running
  return *fixture;
}

// A session id from the input: up to 40 bytes of anything (a NUL ends the C string
// early); one of a few short names most of the time, so sessions get reused.
std::string session_id(Input& in) {
  const uint8_t kind = in.byte();
  if (kind < 192) return "session-" + std::to_string(kind % 6);
  std::string id;
  const size_t length = in.byte() % 41;
  for (size_t i = 0; i < length; ++i) id.push_back(static_cast<char>(in.byte()));
  return id;
}

// A hash from the input: usually 16 bytes from a small alphabet (so saves, lookups and
// loads meet), sometimes any length 0..33 (0 and 33 are invalid).
struct Hash {
  std::array<uint8_t, 40> bytes{};
  uint32_t length = 16;
};
Hash hash_of(Input& in) {
  Hash hash;
  const uint8_t kind = in.byte();
  if (kind < 224) {
    hash.bytes[0] = kind % 24;  // one of 24 hashes
    hash.bytes[1] = 0x5a;
    return hash;
  }
  hash.length = in.byte() % 34;
  for (uint32_t i = 0; i < hash.length; ++i) hash.bytes[i] = in.byte();
  return hash;
}

// Engine block ids: mostly in range, sometimes just past it or anywhere.
uint64_t block_id(Input& in) {
  const uint8_t kind = in.byte();
  if (kind < 240) return kind % (kBlocks + 2);
  return (uint64_t{in.u32()} << 32) | in.u32();
}

struct Program {
  Program(Fixture& fixture, Input& input) : f(fixture), in(input) {}
  Fixture& f;
  Input& in;
  kvtier_client* client = nullptr;
  bool region_zero_is_cache = true;  // region 0 is the cache's memfd while registered
  std::set<std::string> sessions;    // to close at the end

  // refs with distinct in-range block ids (a block cannot hold two hashes' bytes).
  void make_refs(std::vector<Hash>& hashes, std::vector<kvtier_block_ref>& refs) {
    const uint32_t count = in.byte() % (kMaxRefs + 1);
    std::set<uint64_t> used;
    hashes.reserve(count);  // refs point into hashes
    for (uint32_t i = 0; i < count; ++i) {
      Hash hash = hash_of(in);
      const uint64_t block = block_id(in);
      if (block < kBlocks && !used.insert(block).second) continue;
      hashes.push_back(hash);
      refs.push_back({hashes.back().bytes.data(), hashes.back().length, block});
    }
  }

  void save() {
    const std::string session = session_id(in);
    std::vector<Hash> hashes;
    std::vector<kvtier_block_ref> refs;
    make_refs(hashes, refs);
    for (const kvtier_block_ref& ref : refs) {
      if (ref.engine_block_id < kBlocks) f.fill(ref.engine_block_id, ref.hash, ref.hash_len);
    }
    kvtier_save_result result{~0u, ~0u};
    const int end_of_turn = in.byte() & 1;
    kvtier_status status;
    if (in.byte() < 16) {
      status = kvtier_save(client, session.c_str(), refs.empty() ? nullptr : refs.data(),
                           static_cast<uint32_t>(refs.size()), end_of_turn, nullptr);
    } else {
      status = kvtier_save(client, session.c_str(), refs.data(), static_cast<uint32_t>(refs.size()),
                           end_of_turn, &result);
      if (status == KVTIER_OK) {
        KVTIER_FUZZ_CHECK(uint64_t{result.stored} + result.deduplicated == refs.size(),
                          "save of %zu: stored %u + deduplicated %u", refs.size(), result.stored,
                          result.deduplicated);
      }
    }
    check_call(status, "kvtier_save");
    if (status == KVTIER_OK) {
      KVTIER_FUZZ_CHECK(region_zero_is_cache, "a save succeeded without the cache's region");
      sessions.insert(session);
    }
  }

  void lookup() {
    std::vector<Hash> hashes;
    const uint32_t count = in.byte() % (kMaxRefs + 1);
    for (uint32_t i = 0; i < count; ++i) hashes.push_back(hash_of(in));
    std::vector<kvtier_hash> list;
    for (const Hash& hash : hashes) list.push_back({hash.bytes.data(), hash.length});
    uint32_t hits = ~0u;
    std::vector<kvtier_tier> tiers(count + 1, static_cast<kvtier_tier>(77));
    const bool want_tiers = in.byte() & 1;
    const kvtier_status status =
        kvtier_lookup(client, list.data(), count, &hits, want_tiers ? tiers.data() : nullptr);
    check_call(status, "kvtier_lookup");
    if (status != KVTIER_OK) return;
    KVTIER_FUZZ_CHECK(hits <= count, "lookup of %u hashes: %u hits", count, hits);
    if (!want_tiers) return;
    for (uint32_t i = 0; i < count; ++i) {
      if (i < hits) {
        KVTIER_FUZZ_CHECK(tiers[i] <= KVTIER_TIER_NVME, "hit %u in tier %d", i, tiers[i]);
      } else {
        KVTIER_FUZZ_CHECK(tiers[i] == KVTIER_TIER_NONE, "miss %u in tier %d", i, tiers[i]);
      }
    }
    KVTIER_FUZZ_CHECK(tiers[count] == static_cast<kvtier_tier>(77), "wrote past tiers_out");
  }

  void load() {
    const std::string session = in.byte() < 32 ? std::string() : session_id(in);
    std::vector<Hash> hashes;
    std::vector<kvtier_block_ref> refs;
    make_refs(hashes, refs);
    // Poison the blocks the load names: what it restores must overwrite all of it.
    for (const kvtier_block_ref& ref : refs) {
      if (ref.engine_block_id >= kBlocks) continue;
      for (uint32_t p = 0; p < kPlanes; ++p) {
        std::memset(f.plane_of(ref.engine_block_id, p), 0xEE, kPlaneBytes);
      }
    }
    kvtier_load_result result{};
    result.loaded_count = ~0u;
    const kvtier_status status = kvtier_load(client, session.c_str(), refs.data(),
                                             static_cast<uint32_t>(refs.size()), &result);
    check_call(status, "kvtier_load");
    if (status != KVTIER_OK) return;
    KVTIER_FUZZ_CHECK(region_zero_is_cache, "a load succeeded without the cache's region");
    KVTIER_FUZZ_CHECK(result.loaded_count <= refs.size(), "load of %zu: loaded %u", refs.size(),
                      result.loaded_count);
    const auto stop = static_cast<kvtier_status>(result.stop_code);
    KVTIER_FUZZ_CHECK(known_status(stop), "stop code %u", result.stop_code);
    if (result.loaded_count < refs.size()) {
      KVTIER_FUZZ_CHECK(stop != KVTIER_OK && result.stop_message[0] != '\0',
                        "load stopped at %u of %zu with %s '%s'", result.loaded_count, refs.size(),
                        kvtier_status_name(stop), result.stop_message);
    } else {
      KVTIER_FUZZ_CHECK(stop == KVTIER_OK, "every block loaded but stop code %s",
                        kvtier_status_name(stop));
    }
    for (uint32_t i = 0; i < result.loaded_count; ++i) {
      const kvtier_block_ref& ref = refs[i];
      KVTIER_FUZZ_CHECK(ref.engine_block_id < kBlocks, "loaded into block %llu of %llu",
                        static_cast<unsigned long long>(ref.engine_block_id),
                        static_cast<unsigned long long>(kBlocks));
      KVTIER_FUZZ_CHECK(f.holds(ref.engine_block_id, ref.hash, ref.hash_len),
                        "WRONG BYTES: block %u of the load (engine block %llu) differs from "
                        "what was saved under its hash",
                        i, static_cast<unsigned long long>(ref.engine_block_id));
    }
  }

  void turn_or_close() {
    const std::string session = session_id(in);
    if (in.byte() & 1) {
      kvtier_begin_turn_result result{~0u, ~0u};
      const kvtier_status status = kvtier_begin_turn(client, session.c_str(), &result);
      check_call(status, "kvtier_begin_turn");
      if (status == KVTIER_OK) {
        KVTIER_FUZZ_CHECK(result.promoted_blocks <= result.known_blocks, "promoted %u of %u",
                          result.promoted_blocks, result.known_blocks);
      }
    } else {
      uint32_t released = ~0u;
      const kvtier_status status = kvtier_close_session(client, session.c_str(), &released);
      check_call(status, "kvtier_close_session");
      if (status == KVTIER_OK) sessions.erase(session);
    }
  }

  void stats() {
    kvtier_stats_info info;
    const kvtier_status status = kvtier_stats(client, &info);
    check_call(status, "kvtier_stats");
    KVTIER_FUZZ_CHECK(status == KVTIER_OK, "stats: %s", kvtier_last_error());
    for (const kvtier_tier_stats& tier : info.tiers) {
      KVTIER_FUZZ_CHECK(tier.used_bytes <= tier.capacity_bytes, "a tier over its capacity");
    }
  }

  void register_region() {
    const uint32_t region_id = in.byte() % 4;
    const uint8_t which = in.byte() % 4;
    uint64_t size = kRegionBytes;
    if (in.byte() < 64) size = (uint64_t{in.u32()} << 32) | in.u32();
    // Region 0 is named by the layout: only the cache's memfd, at its size, may be it,
    // or saves would read (and loads write) other memory than the target checks.
    int fd = f.spare_memfd;
    if (region_id == 0) {
      fd = f.memfd;
      size = kRegionBytes;
    } else if (which == 1) {
      fd = -1;
    } else if (which == 2) {
      fd = STDIN_FILENO;  // not a memfd
    }
    const kvtier_status status = kvtier_register_memfd(client, region_id, fd, size);
    check_call(status, "kvtier_register_memfd");
    if (status == KVTIER_OK) {
      KVTIER_FUZZ_CHECK(fd == f.memfd || fd == f.spare_memfd, "a non-memfd fd was accepted");
      KVTIER_FUZZ_CHECK(size == kRegionBytes, "a memfd of %llu bytes was accepted as %llu",
                        static_cast<unsigned long long>(kRegionBytes),
                        static_cast<unsigned long long>(size));
      if (region_id == 0) region_zero_is_cache = true;
    }
  }

  void unregister_region() {
    const uint32_t region_id = in.byte() % 5;
    const kvtier_status status = kvtier_unregister_region(client, region_id);
    check_call(status, "kvtier_unregister_region");
    if (status == KVTIER_OK && region_id == 0) region_zero_is_cache = false;
  }

  // An async request, then waits of any kind: a wrong kind is refused and consumes
  // nothing; the right one gets the reply; or the pending is freed unwaited.
  void async_request() {
    const uint8_t kind = in.byte() % 5;
    std::vector<Hash> hashes;
    std::vector<kvtier_block_ref> refs;
    make_refs(hashes, refs);
    for (const kvtier_block_ref& ref : refs) {
      if (ref.engine_block_id >= kBlocks) continue;
      if (kind == 2) {
        for (uint32_t p = 0; p < kPlanes; ++p) {
          std::memset(f.plane_of(ref.engine_block_id, p), 0xEE, kPlaneBytes);
        }
      } else {
        f.fill(ref.engine_block_id, ref.hash, ref.hash_len);
      }
    }
    std::vector<kvtier_hash> list;
    for (const kvtier_block_ref& ref : refs) list.push_back({ref.hash, ref.hash_len});
    const std::string session = session_id(in);
    const auto count = static_cast<uint32_t>(refs.size());
    kvtier_pending* pending = nullptr;
    kvtier_status sent = KVTIER_OK;
    switch (kind) {
      case 0:
        sent = kvtier_save_async(client, session.c_str(), refs.data(), count, 1, &pending);
        break;
      case 1:
        sent = kvtier_lookup_async(client, list.data(), count, &pending);
        break;
      case 2:
        sent = kvtier_load_async(client, session.c_str(), refs.data(), count, &pending);
        break;
      case 3:
        sent = kvtier_begin_turn_async(client, session.c_str(), &pending);
        break;
      default:
        sent = kvtier_close_session_async(client, session.c_str(), &pending);
        break;
    }
    check_call(sent, "kvtier_*_async");
    if (sent != KVTIER_OK) {
      KVTIER_FUZZ_CHECK(pending == nullptr, "a failed send left a pending");
      return;
    }
    KVTIER_FUZZ_CHECK(pending != nullptr, "a sent request has no pending");
    if (kind == 0) sessions.insert(session);
    // A save reads the engine's blocks and a load writes them until the reply: those two
    // always end with the right wait (the engine may not touch the blocks before), the
    // others may be freed unwaited.
    const bool must_wait = kind == 0 || kind == 2;
    const uint8_t waits = in.byte() % 4;
    for (uint8_t w = 0; w <= waits; ++w) {
      const uint8_t wait_kind = must_wait && w == waits ? kind : in.byte() % 6;
      if (wait_kind == 5) {
        int ready = -1;
        check_call(kvtier_pending_poll(pending, &ready), "kvtier_pending_poll");
        KVTIER_FUZZ_CHECK(ready == 0 || ready == 1, "ready = %d", ready);
        continue;
      }
      const bool right = wait_kind == kind;
      kvtier_status status = KVTIER_OK;
      kvtier_save_result saved{};
      uint32_t hits = 0;
      std::vector<kvtier_tier> tiers(count + 1);
      kvtier_load_result loaded{};
      kvtier_begin_turn_result begun{};
      uint32_t released = 0;
      switch (wait_kind) {
        case 0:
          status = kvtier_pending_wait_save(pending, &saved);
          break;
        case 1:
          status = kvtier_pending_wait_lookup(pending, &hits, tiers.data());
          break;
        case 2:
          status = kvtier_pending_wait_load(pending, &loaded);
          break;
        case 3:
          status = kvtier_pending_wait_begin_turn(pending, &begun);
          break;
        default:
          status = kvtier_pending_wait_close_session(pending, &released);
          break;
      }
      check_call(status, "kvtier_pending_wait_*");
      if (!right) {
        KVTIER_FUZZ_CHECK(status == KVTIER_INVALID_ARGUMENT, "a wait of the wrong kind returned %s",
                          kvtier_status_name(status));
        continue;
      }
      if (status == KVTIER_OK && kind == 0) {
        KVTIER_FUZZ_CHECK(uint64_t{saved.stored} + saved.deduplicated == count,
                          "async save of %u: %u + %u", count, saved.stored, saved.deduplicated);
      }
      if (status == KVTIER_OK && kind == 1) KVTIER_FUZZ_CHECK(hits <= count, "%u hits", hits);
      if (status == KVTIER_OK && kind == 2) {
        KVTIER_FUZZ_CHECK(loaded.loaded_count <= count, "async load: %u", loaded.loaded_count);
        for (uint32_t i = 0; i < loaded.loaded_count; ++i) {
          KVTIER_FUZZ_CHECK(f.holds(refs[i].engine_block_id, refs[i].hash, refs[i].hash_len),
                            "WRONG BYTES from an async load, block %u", i);
        }
      }
      break;  // waited with the right kind: the pending is spent
    }
    kvtier_pending_free(pending);
  }

  // A second client says Hello with a layout made of input bytes: accepted or refused
  // with a message; the first client's Hello cannot be repeated.
  void hello_with_any_layout() {
    if (in.byte() & 1) {
      const kvtier_status again =
          kvtier_hello(client, &f.layout, "fuzz", KVTIER_DEVICE_HOST, 0, nullptr);
      check_call(again, "kvtier_hello (again)");
      KVTIER_FUZZ_CHECK(again != KVTIER_OK, "a second Hello on one connection was accepted");
      return;
    }
    kvtier_client* other = nullptr;
    const kvtier_status connected = kvtier_connect(f.daemon->socket_path().c_str(), &other);
    check_call(connected, "kvtier_connect");
    if (connected != KVTIER_OK) return;
    std::array<kvtier_plane, 6> planes{};
    const uint32_t plane_count = in.byte() % 7;
    for (uint32_t p = 0; p < plane_count && p < planes.size(); ++p) {
      planes[p].region_id = in.byte() % 3;
      planes[p].reserved = in.byte() < 8 ? in.u32() : 0;
      planes[p].offset_bytes = in.byte() < 32 ? (uint64_t{in.u32()} << 32) | in.u32() : in.u32();
      planes[p].stride_bytes = in.byte() < 32 ? (uint64_t{in.u32()} << 32) | in.u32() : in.u32();
      planes[p].bytes_per_block = in.u32();
    }
    std::string strings[3];
    for (std::string& s : strings) {
      const size_t length = in.byte() % 24;
      for (size_t i = 0; i < length; ++i) s.push_back(static_cast<char>(in.byte()));
    }
    kvtier_layout layout{};
    layout.model_id = (in.byte() & 1) ? strings[0].c_str() : nullptr;
    layout.dtype = (in.byte() & 1) ? strings[1].c_str() : nullptr;
    layout.extra_key = (in.byte() & 1) ? strings[2].c_str() : nullptr;
    layout.num_layers = in.byte() < 200 ? in.byte() % 4 : in.u32();
    layout.num_kv_heads = in.byte() < 200 ? in.byte() % 4 : in.u32();
    layout.head_dim = in.byte() < 200 ? in.byte() : in.u32();
    layout.tokens_per_block = in.byte() < 200 ? in.byte() : in.u32();
    layout.tp_rank = in.byte() % 3;
    layout.tp_size = in.byte() % 3;
    layout.num_blocks = in.byte() < 200 ? in.byte() : (uint64_t{in.u32()} << 32) | in.u32();
    layout.planes = plane_count == 0 && (in.byte() & 1) ? nullptr : planes.data();
    layout.plane_count = plane_count;
    layout.reserved = in.byte() < 8 ? in.byte() : 0;
    kvtier_hello_info info;
    const auto device = static_cast<kvtier_device_kind>(in.byte() % 3);
    const kvtier_status status = kvtier_hello(other, &layout, nullptr, device, 0, &info);
    check_call(status, "kvtier_hello (any layout)");
    if (status == KVTIER_OK) {
      KVTIER_FUZZ_CHECK(info.block_bytes > 0, "a layout of 0-byte blocks was accepted");
      KVTIER_FUZZ_CHECK(plane_count > 0, "a layout without planes was accepted");
    }
    kvtier_close(other);
  }

  // NULL where the header says a pointer is required: INVALID_ARGUMENT naming it.
  void null_arguments() {
    const kvtier_hash hash{nullptr, 16};
    const kvtier_block_ref ref{nullptr, 16, 0};
    uint32_t hits = 0;
    kvtier_save_result saved{};
    kvtier_pending* pending = reinterpret_cast<kvtier_pending*>(uintptr_t{1});
    kvtier_status status = KVTIER_OK;
    const uint8_t which = in.byte() % 10;
    switch (which) {
      case 0:
        status = kvtier_save(nullptr, "s", nullptr, 0, 1, &saved);
        break;
      case 1:
        status = kvtier_save(client, nullptr, nullptr, 0, 1, &saved);
        break;
      case 2:
        status = kvtier_save(client, "s", nullptr, 2, 1, &saved);
        break;
      case 3:
        status = kvtier_save(client, "s", &ref, 1, 1, &saved);
        break;
      case 4:
        status = kvtier_lookup(client, &hash, 1, &hits, nullptr);
        break;
      case 5:
        status = kvtier_lookup(client, nullptr, 0, nullptr, nullptr);
        break;
      case 6:
        status = kvtier_lookup_async(client, nullptr, 0, nullptr);
        break;
      case 7:
        status = kvtier_stats(client, nullptr);
        break;
      case 8:
        status = kvtier_pending_poll(nullptr, nullptr);
        break;
      default:
        status = kvtier_begin_turn_async(nullptr, "s", &pending);
        break;
    }
    check_call(status, "a call with a NULL argument");
    KVTIER_FUZZ_CHECK(status == KVTIER_INVALID_ARGUMENT, "NULL case %u returned %s: %s", which,
                      kvtier_status_name(status), kvtier_last_error());
    KVTIER_FUZZ_CHECK(std::strstr(kvtier_last_error(), "NULL") != nullptr,
                      "NULL case %u: the message does not say what is NULL: %s", which,
                      kvtier_last_error());
    if (which == 9) KVTIER_FUZZ_CHECK(pending == nullptr, "a failed send left *out set");
  }

  void options_and_names() {
    const auto status = static_cast<kvtier_status>(in.u32() & 0x7fffffff);  // the enum's range
    const char* name = kvtier_status_name(status);
    KVTIER_FUZZ_CHECK(name != nullptr && name[0] != '\0', "no name for status %u",
                      static_cast<unsigned>(status));
    kvtier_client_options options{};
    options.reconnect = static_cast<int32_t>(in.byte()) - 1;
    options.initial_backoff_ms = in.byte() < 128 ? in.byte() : in.u32();
    options.max_backoff_ms = in.byte() < 128 ? in.byte() : in.u32();
    options.reserved = in.byte() < 16 ? in.byte() : 0;
    kvtier_client* other = reinterpret_cast<kvtier_client*>(uintptr_t{1});  // must be reset
    const kvtier_status connected = kvtier_connect_with_options(
        f.daemon->socket_path().c_str(), (in.byte() & 1) ? &options : nullptr, &other);
    check_call(connected, "kvtier_connect_with_options");
    KVTIER_FUZZ_CHECK((connected == KVTIER_OK) == (other != nullptr),
                      "connect returned %s with client %p", kvtier_status_name(connected),
                      static_cast<void*>(other));
    kvtier_close(other);
  }

  void run() {
    const kvtier_status connected = kvtier_connect(f.daemon->socket_path().c_str(), &client);
    check_call(connected, "kvtier_connect");
    KVTIER_FUZZ_CHECK(connected == KVTIER_OK, "connect: %s", kvtier_last_error());
    check_call(kvtier_hello(client, &f.layout, "fuzz-capi", KVTIER_DEVICE_HOST, 0, nullptr),
               "kvtier_hello");
    check_call(kvtier_register_memfd(client, 0, f.memfd, kRegionBytes), "kvtier_register_memfd");
    for (int step = 0; step < 24 && in.left() > 0; ++step) {
      switch (in.byte() % 11) {
        case 0:
        case 1:
          save();
          break;
        case 2:
          lookup();
          break;
        case 3:
        case 4:
          load();
          break;
        case 5:
          turn_or_close();
          break;
        case 6:
          register_region();
          break;
        case 7:
          unregister_region();
          break;
        case 8:
          async_request();
          break;
        case 9:
          hello_with_any_layout();
          break;
        default:
          if (in.byte() & 1)
            null_arguments();
          else
            options_and_names();
          break;
      }
    }
    stats();
    for (const std::string& session : sessions) {
      check_call(kvtier_close_session(client, session.c_str(), nullptr), "kvtier_close_session");
    }
    kvtier_close(client);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  Program program{fixture(), in};
  program.run();
  return 0;
}
