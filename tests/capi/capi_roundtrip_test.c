/* libkvtier from C: connect, Hello, a memfd region, Save, Lookup, Load bit-exact,
 * BeginTurn, CloseSession, Stats, against a real kvtierd --device host. */
#include <string.h>

#include "tests/capi/capi_harness.h"

enum { kTurnBlocks = 12 };

static void test_version(void) {
  const char* version = kvtier_version();
  CHECK(version != NULL && strcmp(version, KVTIER_EXPECTED_VERSION) == 0);
  CHECK(strcmp(kvtier_status_name(KVTIER_DATA_LOSS), "DATA_LOSS") == 0);
  CHECK(strcmp(kvtier_status_name(KVTIER_NOT_SUPPORTED), "NOT_SUPPORTED") == 0);
  CHECK(KVTIER_NOT_SUPPORTED == 8); /* appended after INTERNAL: values never move */
  CHECK(strcmp(kvtier_status_name((kvtier_status)99), "UNKNOWN") == 0);
}

static void test_session_roundtrip(const capi_daemon* daemon) {
  capi_cache cache;
  CHECK(cache_create(&cache) == 0);
  kvtier_client* client = NULL;
  CHECK_OK(kvtier_connect(daemon->socket_path, &client));
  CHECK(strcmp(kvtier_last_error(), "") == 0);
  if (client == NULL) return;

  kvtier_hello_info info;
  memset(&info, 0xff, sizeof(info));
  CHECK_OK(kvtier_hello(client, &cache.layout, "capi-roundtrip", KVTIER_DEVICE_HOST, 5000, &info));
  CHECK(info.block_bytes == (uint64_t)kPlanes * kPlaneBytes);
  CHECK(info.layout_digest != 0 && info.layout_digest != UINT64_MAX);
  CHECK(info.device_kind == KVTIER_DEVICE_HOST);
  CHECK(info.gpu_count == 0);
  CHECK(info.max_blocks_per_request >= kTurnBlocks);
  CHECK(info.namespace_name[0] != '\0' && memchr(info.namespace_name, 0, KVTIER_NAME_BYTES));
  CHECK(strcmp(info.device_name, "host") == 0);
  CHECK_OK(kvtier_register_memfd(client, 0, cache.fd, kRegionBytes));

  /* Turn 1: blocks 0..11 hold the prefix. */
  uint8_t hashes[kTurnBlocks][16];
  kvtier_block_ref refs[kTurnBlocks];
  kvtier_hash lookup_hashes[kTurnBlocks];
  for (uint32_t i = 0; i < kTurnBlocks; ++i) {
    make_hash(1, i, hashes[i]);
    cache_fill_block(&cache, i, 100 + i);
    refs[i].hash = hashes[i];
    refs[i].hash_len = 16;
    refs[i].engine_block_id = i;
    lookup_hashes[i].hash = hashes[i];
    lookup_hashes[i].hash_len = 16;
  }
  kvtier_save_result saved = {0, 0};
  CHECK_OK(kvtier_save(client, "capi-conv", refs, kTurnBlocks, 1, &saved));
  CHECK(saved.stored == kTurnBlocks && saved.deduplicated == 0);
  /* Saving the same blocks again stores nothing new. */
  CHECK_OK(kvtier_save(client, "capi-conv", refs, kTurnBlocks, 1, &saved));
  CHECK(saved.stored == 0 && saved.deduplicated == kTurnBlocks);

  /* The engine drops its cache; the next turn arrives. */
  cache_wipe(&cache);
  kvtier_begin_turn_result begun = {0, 0};
  CHECK_OK(kvtier_begin_turn(client, "capi-conv", &begun));
  CHECK(begun.known_blocks == kTurnBlocks);

  uint32_t hits = 0;
  kvtier_tier tiers[kTurnBlocks + 1];
  kvtier_hash with_unknown[kTurnBlocks + 1];
  memcpy(with_unknown, lookup_hashes, sizeof(lookup_hashes));
  uint8_t unknown[16];
  make_hash(2, 0, unknown);
  with_unknown[kTurnBlocks].hash = unknown;
  with_unknown[kTurnBlocks].hash_len = 16;
  CHECK_OK(kvtier_lookup(client, with_unknown, kTurnBlocks + 1, &hits, tiers));
  CHECK(hits == kTurnBlocks);
  for (uint32_t i = 0; i < kTurnBlocks; ++i) {
    CHECK(tiers[i] == KVTIER_TIER_HBM || tiers[i] == KVTIER_TIER_RAM);
  }
  CHECK(tiers[kTurnBlocks] == KVTIER_TIER_NONE);
  CHECK_OK(kvtier_lookup(client, lookup_hashes, kTurnBlocks, &hits, NULL));
  CHECK(hits == kTurnBlocks);

  /* Restore into other engine blocks (16..27): bit-exact. */
  for (uint32_t i = 0; i < kTurnBlocks; ++i) refs[i].engine_block_id = 16 + i;
  kvtier_load_result loaded;
  memset(&loaded, 0xff, sizeof(loaded));
  CHECK_OK(kvtier_load(client, "capi-conv", refs, kTurnBlocks, &loaded));
  CHECK(loaded.loaded_count == kTurnBlocks);
  CHECK(loaded.stop_code == KVTIER_OK);
  CHECK(loaded.stop_message[0] == '\0');
  for (uint32_t i = 0; i < kTurnBlocks; ++i) CHECK(cache_block_matches(&cache, 16 + i, 100 + i));
  CHECK(!cache_block_matches(&cache, 0, 100)); /* the wiped blocks stayed wiped */

  /* A prefix that ends: the stop reason says where and why. */
  kvtier_block_ref partial[3] = {refs[0], refs[1], {unknown, 16, 30}};
  CHECK_OK(kvtier_load(client, "capi-conv", partial, 3, &loaded));
  CHECK(loaded.loaded_count == 2);
  CHECK(loaded.stop_code == KVTIER_NOT_FOUND);
  CHECK(strstr(loaded.stop_message, "blocks[2]") != NULL);

  kvtier_stats_info stats;
  CHECK_OK(kvtier_stats(client, &stats));
  CHECK(stats.tiers[KVTIER_TIER_HBM].blocks + stats.tiers[KVTIER_TIER_RAM].blocks >= kTurnBlocks);
  CHECK(stats.tiers[KVTIER_TIER_HBM].capacity_bytes == 16u << 20);
  CHECK(stats.bytes_saved >= (uint64_t)kTurnBlocks * kPlanes * kPlaneBytes);
  CHECK(stats.bytes_loaded >= (uint64_t)kTurnBlocks * kPlanes * kPlaneBytes);
  CHECK(stats.connections >= 1);
  CHECK(strcmp(stats.device_name, "host") == 0);
  CHECK(stats.policy[0] != '\0');

  uint32_t released = 0;
  CHECK_OK(kvtier_close_session(client, "capi-conv", &released));
  CHECK(released == kTurnBlocks);
  CHECK_OK(kvtier_unregister_region(client, 0));
  kvtier_close(client);
  cache_destroy(&cache);
}

/* A second engine with the same layout shares the first one's blocks. */
static void test_second_engine_dedup(const capi_daemon* daemon) {
  capi_cache first, second;
  CHECK(cache_create(&first) == 0 && cache_create(&second) == 0);
  kvtier_client* a = connect_engine(daemon, &first);
  kvtier_client* b = connect_engine(daemon, &second);
  if (a == NULL || b == NULL) return;
  uint8_t hash[16];
  make_hash(3, 0, hash);
  cache_fill_block(&first, 5, 77);
  kvtier_block_ref ref = {hash, 16, 5};
  CHECK_OK(kvtier_save(a, "engine-a", &ref, 1, 1, NULL));
  kvtier_save_result saved;
  CHECK_OK(kvtier_save(b, "engine-b", &ref, 1, 1, &saved));
  CHECK(saved.deduplicated == 1);
  ref.engine_block_id = 9;
  kvtier_load_result loaded;
  CHECK_OK(kvtier_load(b, "", &ref, 1, &loaded));
  CHECK(loaded.loaded_count == 1);
  CHECK(cache_block_matches(&second, 9, 77));
  kvtier_close(a);
  kvtier_close(b);
  cache_destroy(&first);
  cache_destroy(&second);
}

/* kvtier_load_planes (ABI 0.5): a range of planes fills only those planes' bytes; ranges
 * pipelined with kvtier_load_planes_async over every plane rebuild the blocks; a range
 * past the layout's planes is refused naming the fields. */
static void test_load_planes(const capi_daemon* daemon) {
  enum { kBlocks = 4, kTarget = 16 };
  capi_cache cache;
  CHECK(cache_create(&cache) == 0);
  kvtier_client* client = connect_engine(daemon, &cache);
  if (client == NULL) return;
  uint8_t hashes[kBlocks][16];
  kvtier_block_ref refs[kBlocks];
  for (uint32_t i = 0; i < kBlocks; ++i) {
    make_hash(4, i, hashes[i]); /* a conversation no other test saves */
    cache_fill_block(&cache, i, 300 + i);
    refs[i].hash = hashes[i];
    refs[i].hash_len = 16;
    refs[i].engine_block_id = i;
  }
  CHECK_OK(kvtier_save(client, "capi-planes", refs, kBlocks, 1, NULL));
  /* What block i's planes hold, before the wipe: plane p of block b at [p][b]. */
  static uint8_t saved[kPlanes][kBlocks][kPlaneBytes];
  for (uint32_t p = 0; p < kPlanes; ++p) {
    for (uint32_t b = 0; b < kBlocks; ++b) {
      memcpy(saved[p][b], cache.bytes + ((uint64_t)p * kNumBlocks + b) * kPlaneBytes, kPlaneBytes);
    }
  }
  cache_wipe(&cache);
  for (uint32_t i = 0; i < kBlocks; ++i) refs[i].engine_block_id = kTarget + i;

  kvtier_load_result loaded;
  CHECK_OK(kvtier_load_planes(client, "capi-planes", refs, kBlocks, 1, 2, &loaded));
  CHECK(loaded.loaded_count == kBlocks && loaded.stop_code == KVTIER_OK);
  static const uint8_t zero[kPlaneBytes];
  for (uint32_t p = 0; p < kPlanes; ++p) {
    for (uint32_t b = 0; b < kBlocks; ++b) {
      const uint8_t* at = cache.bytes + ((uint64_t)p * kNumBlocks + kTarget + b) * kPlaneBytes;
      CHECK(memcmp(at, p == 1 || p == 2 ? saved[p][b] : zero, kPlaneBytes) == 0);
    }
  }

  cache_wipe(&cache);
  kvtier_pending* first = NULL;
  kvtier_pending* rest = NULL;
  CHECK_OK(kvtier_load_planes_async(client, "capi-planes", refs, kBlocks, 0, 1, &first));
  CHECK_OK(kvtier_load_planes_async(client, "capi-planes", refs, kBlocks, 1, 3, &rest));
  CHECK_OK(kvtier_pending_wait_load(rest, &loaded));
  CHECK(loaded.loaded_count == kBlocks);
  CHECK_OK(kvtier_pending_wait_load(first, &loaded));
  CHECK(loaded.loaded_count == kBlocks);
  kvtier_pending_free(first);
  kvtier_pending_free(rest);
  for (uint32_t i = 0; i < kBlocks; ++i) CHECK(cache_block_matches(&cache, kTarget + i, 300 + i));

  CHECK_STATUS(kvtier_load_planes(client, "capi-planes", refs, kBlocks, kPlanes, 1, &loaded),
               KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("planeBegin 4 is past the layout's 4 planes");
  CHECK_STATUS(kvtier_load_planes(client, "capi-planes", refs, kBlocks, 3, 2, &loaded),
               KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("planeBegin 3 + planeCount 2 = 5 passes the layout's 4 planes");
  kvtier_pending* bad = NULL;
  CHECK_OK(kvtier_load_planes_async(client, "capi-planes", refs, kBlocks, 2, 0, &bad));
  CHECK_STATUS(kvtier_pending_wait_load(bad, &loaded), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("planeBegin is 2 with planeCount 0");
  kvtier_pending_free(bad);
  CHECK_STATUS(kvtier_load_planes(client, "capi-planes", refs, kBlocks, 0, 1, NULL),
               KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("out is NULL");

  CHECK_OK(kvtier_unregister_region(client, 0));
  kvtier_close(client);
  cache_destroy(&cache);
}

int main(void) {
  test_version();
  capi_daemon daemon;
  if (daemon_start(&daemon) != 0) return 1;
  test_session_roundtrip(&daemon);
  test_second_engine_dedup(&daemon);
  test_load_planes(&daemon);
  daemon_cleanup(&daemon);
  if (capi_failures > 0) fprintf(stderr, "%d check(s) failed\n", capi_failures);
  return capi_failures == 0 ? 0 : 1;
}
