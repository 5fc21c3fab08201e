/* A C engine rides through a kvtierd restart: the same kvtier_client gets
 * KVTIER_UNAVAILABLE (retryable) while the daemon is away, then reconnects by itself
 * (Hello and region again) and loads, bit-exact, what the daemon had put on NVMe
 * before it was killed. With reconnect off the client stays away. */
#include <string.h>
#include <time.h>

#include "tests/capi/capi_harness.h"

static const char* const kFlags[] = {"--nvme-bytes",
                                     "64MiB",
                                     "--slab-bytes",
                                     "1MiB",
                                     "--hbm-idle-ms",
                                     "0",
                                     "--ram-idle-ms",
                                     "0",
                                     "--plan-interval-ms",
                                     "10ms",
                                     NULL};

static void pause_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

enum { kBlocks = 8 };

static void make_refs(uint8_t hashes[kBlocks][16], kvtier_block_ref* refs, uint32_t first_block) {
  for (uint32_t i = 0; i < kBlocks; ++i) {
    make_hash(7, i, hashes[i]);
    refs[i].hash = hashes[i];
    refs[i].hash_len = 16;
    refs[i].engine_block_id = first_block + i;
  }
}

/* Waits until every block of the session is on NVMe (tier index 2 of the lookup). */
static int wait_on_nvme(kvtier_client* client, uint8_t hashes[kBlocks][16]) {
  kvtier_hash lookup[kBlocks];
  for (uint32_t i = 0; i < kBlocks; ++i) {
    lookup[i].hash = hashes[i];
    lookup[i].hash_len = 16;
  }
  for (int waited = 0; waited < 20000; waited += 10) {
    uint32_t hits = 0;
    kvtier_tier tiers[kBlocks];
    if (kvtier_lookup(client, lookup, kBlocks, &hits, tiers) == KVTIER_OK && hits == kBlocks) {
      int all = 1;
      for (uint32_t i = 0; i < kBlocks; ++i) all &= tiers[i] == KVTIER_TIER_NVME;
      if (all) return 1;
    }
    pause_ms(10);
  }
  return 0;
}

static void test_reconnects_and_loads(void) {
  capi_daemon daemon;
  if (daemon_start_with(&daemon, kFlags) != 0) {
    ++capi_failures;
    return;
  }
  capi_cache cache;
  if (cache_create(&cache) != 0) {
    ++capi_failures;
    daemon_cleanup(&daemon);
    return;
  }
  kvtier_client* client = connect_engine(&daemon, &cache);
  if (client == NULL) {
    cache_destroy(&cache);
    daemon_cleanup(&daemon);
    return;
  }
  uint8_t hashes[kBlocks][16];
  kvtier_block_ref saved[kBlocks];
  make_refs(hashes, saved, 0);
  for (uint32_t i = 0; i < kBlocks; ++i) cache_fill_block(&cache, i, 700 + i);
  CHECK_OK(kvtier_save(client, "c-conversation", saved, kBlocks, 1, NULL));
  CHECK(wait_on_nvme(client, hashes));

  /* SIGKILL and start again: the client learns of the break on its next call, which
   * reconnects (or fails retryably until it can). */
  CHECK(daemon_restart(&daemon, kFlags) == 0);
  CHECK(kvtier_reconnects(client) == 0);
  kvtier_block_ref loaded_refs[kBlocks];
  make_refs(hashes, loaded_refs, 16);
  cache_wipe(&cache);
  kvtier_load_result loaded;
  memset(&loaded, 0, sizeof(loaded));
  kvtier_status status = KVTIER_UNAVAILABLE;
  for (int attempt = 0; attempt < 200 && status == KVTIER_UNAVAILABLE; ++attempt) {
    status = kvtier_load(client, "c-conversation", loaded_refs, kBlocks, &loaded);
    if (status == KVTIER_UNAVAILABLE) {
      CHECK(kvtier_last_error_retryable() == 1);
      pause_ms(20);
    }
  }
  CHECK_OK(status);
  CHECK(kvtier_reconnects(client) == 1);
  CHECK(loaded.loaded_count == kBlocks);
  for (uint32_t i = 0; i < kBlocks; ++i) CHECK(cache_block_matches(&cache, 16 + i, 700 + i));

  kvtier_close(client);
  cache_destroy(&cache);
  daemon_cleanup(&daemon);
}

static void test_reconnect_off(void) {
  capi_daemon daemon;
  if (daemon_start(&daemon) != 0) {
    ++capi_failures;
    return;
  }
  kvtier_client_options options;
  memset(&options, 0, sizeof(options));
  options.reconnect = 0;
  kvtier_client* client = NULL;
  CHECK_OK(kvtier_connect_with_options(daemon.socket_path, &options, &client));
  if (client != NULL) {
    kvtier_stats_info stats;
    CHECK_OK(kvtier_stats(client, &stats));
    CHECK(daemon_restart(&daemon, NULL) == 0);
    for (int i = 0; i < 3; ++i) {
      CHECK_STATUS(kvtier_stats(client, &stats), KVTIER_UNAVAILABLE);
      pause_ms(30);
    }
    CHECK(kvtier_reconnects(client) == 0);
    kvtier_close(client);
  }
  options.reserved = 1;
  CHECK_STATUS(kvtier_connect_with_options(daemon.socket_path, &options, &client),
               KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("reserved");
  options.reserved = 0;
  options.initial_backoff_ms = 500;
  options.max_backoff_ms = 100;
  CHECK_STATUS(kvtier_connect_with_options(daemon.socket_path, &options, &client),
               KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("initial_backoff_ms");
  CHECK(kvtier_reconnects(NULL) == 0);
  daemon_cleanup(&daemon);
}

int main(void) {
  test_reconnects_and_loads();
  test_reconnect_off();
  if (capi_failures > 0) fprintf(stderr, "%d check(s) failed\n", capi_failures);
  return capi_failures == 0 ? 0 : 1;
}
