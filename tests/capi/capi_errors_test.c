/* libkvtier from C: every failure is a status and a message, never a crash. NULL
 * arguments, bad hashes, bad layouts (the message names the field), unknown sessions
 * and regions, CUDA pointers without a driver or on the host daemon, the retryable flag,
 * a dead daemon. */
#include <string.h>

#include "tests/capi/capi_harness.h"

static void test_null_arguments(const capi_daemon* daemon) {
  capi_cache cache;
  CHECK(cache_create(&cache) == 0);
  kvtier_client* client = connect_engine(daemon, &cache);
  if (client == NULL) return;
  uint8_t hash[16];
  make_hash(1, 1, hash);
  kvtier_block_ref ref = {hash, 16, 0};
  kvtier_hash lookup = {hash, 16};
  uint32_t hits = 0;
  kvtier_load_result loaded;
  kvtier_pending* pending = NULL;
  int ready = 0;

  CHECK_STATUS(kvtier_connect(daemon->socket_path, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("out is NULL");
  CHECK_STATUS(kvtier_hello(NULL, &cache.layout, "x", KVTIER_DEVICE_HOST, 0, NULL),
               KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("client is NULL");
  CHECK_STATUS(kvtier_hello(client, NULL, "x", KVTIER_DEVICE_HOST, 0, NULL),
               KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("layout is NULL");
  CHECK_STATUS(kvtier_register_memfd(NULL, 0, cache.fd, kRegionBytes), KVTIER_INVALID_ARGUMENT);
  CHECK_STATUS(kvtier_register_memfd(client, 1, -1, kRegionBytes), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("fd is -1");
  CHECK_STATUS(kvtier_register_cuda_ipc(client, 1, NULL, 0, 4096, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("handle is NULL");
  CHECK_STATUS(kvtier_register_cuda_vmm(client, 1, NULL, NULL, 2, 0, 4096, NULL),
               KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("fds is NULL");
  CHECK_STATUS(kvtier_register_cuda_pointer(NULL, 1, 0x1000, 4096), KVTIER_INVALID_ARGUMENT);
  CHECK_STATUS(kvtier_unregister_region(NULL, 0), KVTIER_INVALID_ARGUMENT);

  CHECK_STATUS(kvtier_save(client, NULL, &ref, 1, 1, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("session_id is NULL");
  CHECK_STATUS(kvtier_save(client, "s", NULL, 3, 1, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("refs is NULL but count is 3");
  CHECK_STATUS(kvtier_lookup(client, NULL, 2, &hits, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("hashes is NULL");
  CHECK_STATUS(kvtier_lookup(client, &lookup, 1, NULL, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("hit_count is NULL");
  CHECK_STATUS(kvtier_load(client, "s", &ref, 1, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("out is NULL");
  CHECK_STATUS(kvtier_begin_turn(client, NULL, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_STATUS(kvtier_close_session(NULL, "s", NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_STATUS(kvtier_stats(client, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_STATUS(kvtier_save_async(client, "s", &ref, 1, 1, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_STATUS(kvtier_lookup_async(NULL, &lookup, 1, &pending), KVTIER_INVALID_ARGUMENT);
  CHECK(pending == NULL);
  CHECK_STATUS(kvtier_load_async(client, "s", NULL, 1, &pending), KVTIER_INVALID_ARGUMENT);
  CHECK_STATUS(kvtier_begin_turn_async(client, NULL, &pending), KVTIER_INVALID_ARGUMENT);
  CHECK_STATUS(kvtier_close_session_async(client, NULL, &pending), KVTIER_INVALID_ARGUMENT);
  CHECK_STATUS(kvtier_pending_poll(NULL, &ready), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("pending is NULL");
  CHECK_STATUS(kvtier_pending_wait_save(NULL, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_STATUS(kvtier_pending_wait_lookup(NULL, &hits, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_STATUS(kvtier_pending_wait_load(NULL, &loaded), KVTIER_INVALID_ARGUMENT);
  CHECK_STATUS(kvtier_pending_wait_begin_turn(NULL, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_STATUS(kvtier_pending_wait_close_session(NULL, NULL), KVTIER_INVALID_ARGUMENT);
  kvtier_pending_free(NULL);
  kvtier_close(NULL);

  /* Hashes: 1..32 bytes, not NULL; the message names the entry. */
  kvtier_block_ref bad[2] = {ref, {hash, 0, 1}};
  CHECK_STATUS(kvtier_save(client, "s", bad, 2, 1, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("refs[1].hash_len is 0");
  bad[1].hash_len = 33;
  CHECK_STATUS(kvtier_load(client, "s", bad, 2, &loaded), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("refs[1].hash_len is 33");
  bad[1].hash = NULL;
  bad[1].hash_len = 16;
  CHECK_STATUS(kvtier_save_async(client, "s", bad, 2, 1, &pending), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("refs[1].hash is NULL");
  CHECK(pending == NULL);
  kvtier_hash bad_lookup[1] = {{hash, 40}};
  CHECK_STATUS(kvtier_lookup(client, bad_lookup, 1, &hits, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("hashes[0].hash_len is 40");

  /* After all of that the connection still works, and the last message is cleared. */
  CHECK_OK(kvtier_lookup(client, &lookup, 1, &hits, NULL));
  CHECK(hits == 0);
  CHECK(strcmp(kvtier_last_error(), "") == 0);
  kvtier_close(client);
  cache_destroy(&cache);
}

/* Retention priorities (ABI 0.4): bad ones are refused by the library with the field
 * named, before anything is sent; good ones reach the daemon and the save succeeds. */
static void test_save_with_retention(const capi_daemon* daemon) {
  capi_cache cache;
  CHECK(cache_create(&cache) == 0);
  kvtier_client* client = connect_engine(daemon, &cache);
  if (client == NULL) return;
  uint8_t hashes[3][16];
  kvtier_block_ref refs[3];
  for (uint32_t i = 0; i < 3; ++i) {
    make_hash(9, i, hashes[i]);
    refs[i] = (kvtier_block_ref){hashes[i], 16, i};
  }
  kvtier_retention too_high = {101, 0, 0};
  CHECK_STATUS(kvtier_save_with_retention(client, "p", refs, 3, 1, &too_high, NULL, 0, NULL),
               KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("session_retention.priority is 101");
  kvtier_retention no_priority = {0, 0, 1000};
  CHECK_STATUS(kvtier_save_with_retention(client, "p", refs, 3, 1, &no_priority, NULL, 0, NULL),
               KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("without a priority");
  kvtier_range_retention ranges[2] = {{0, 1, {90, 0, 0}}, {2, 2, {5, 0, 0}}};
  CHECK_STATUS(kvtier_save_with_retention(client, "p", refs, 3, 1, NULL, ranges, 2, NULL),
               KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("ranges[1] covers refs 2..3; the save has 3");
  CHECK_STATUS(kvtier_save_with_retention(client, "p", refs, 3, 1, NULL, NULL, 1, NULL),
               KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("ranges is NULL");
  kvtier_range_retention overlapping[2] = {{0, 3, {50, 0, 0}}, {1, 1, {60, 0, 0}}};
  CHECK_STATUS(kvtier_save_with_retention(client, "p", refs, 3, 1, NULL, overlapping, 2, NULL),
               KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("ranges cover 4 refs in total by ranges[1]; at most the save's 3");
  kvtier_retention reserved = {50, 1, 0};
  CHECK_STATUS(kvtier_save_with_retention(client, "p", refs, 3, 1, &reserved, NULL, 0, NULL),
               KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("session_retention.reserved is 1");
  kvtier_pending* pending = NULL;
  CHECK_STATUS(
      kvtier_save_with_retention_async(client, "p", refs, 3, 1, &too_high, NULL, 0, &pending),
      KVTIER_INVALID_ARGUMENT);
  CHECK(pending == NULL);
  uint32_t hits = 7;
  kvtier_hash first = {hashes[0], 16};
  CHECK_OK(kvtier_lookup(client, &first, 1, &hits, NULL));
  CHECK(hits == 0); /* none of the refused saves stored anything */

  kvtier_retention not_given = {0, 0, 0}; /* zero-initialized: the same as NULL */
  CHECK_OK(kvtier_save_with_retention(client, "q", refs, 1, 1, &not_given, NULL, 0, NULL));
  kvtier_retention durable = {80, 0, 60000};
  ranges[1].count = 1;
  kvtier_save_result saved = {0, 0};
  CHECK_OK(kvtier_save_with_retention(client, "p", refs, 3, 1, &durable, ranges, 2, &saved));
  CHECK(saved.stored == 2); /* refs[0] came with "q" */
  CHECK_OK(kvtier_save_with_retention_async(client, "p", refs, 3, 1, NULL, ranges, 2, &pending));
  CHECK_OK(kvtier_pending_wait_save(pending, &saved));
  CHECK(saved.deduplicated == 3);
  kvtier_pending_free(pending);
  kvtier_close(client);
  cache_destroy(&cache);
}

/* Says Hello with `layout` on a fresh connection; returns the status. */
static kvtier_status hello_with(const capi_daemon* daemon, const kvtier_layout* layout,
                                kvtier_device_kind kind) {
  kvtier_client* client = NULL;
  kvtier_status status = kvtier_connect(daemon->socket_path, &client);
  if (status != KVTIER_OK) return status;
  status = kvtier_hello(client, layout, "bad-layout", kind, 0, NULL);
  kvtier_close(client);
  return status;
}

static void test_bad_layouts(const capi_daemon* daemon) {
  capi_cache cache;
  CHECK(cache_create(&cache) == 0);
  kvtier_layout layout = cache.layout;
  kvtier_plane planes[kPlanes];
  memcpy(planes, cache.planes, sizeof(planes));
  layout.planes = planes;

  planes[2].bytes_per_block = 0;
  CHECK_STATUS(hello_with(daemon, &layout, KVTIER_DEVICE_HOST), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("layout.planes[2].bytesPerBlock");
  planes[2] = cache.planes[2];

  planes[1].stride_bytes = kPlaneBytes / 2;
  CHECK_STATUS(hello_with(daemon, &layout, KVTIER_DEVICE_HOST), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("layout.planes[1].strideBytes");
  planes[1] = cache.planes[1];

  layout.model_id = NULL;
  CHECK_STATUS(hello_with(daemon, &layout, KVTIER_DEVICE_HOST), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("layout.modelId");
  layout.model_id = cache.layout.model_id;

  layout.tp_rank = 2;
  CHECK_STATUS(hello_with(daemon, &layout, KVTIER_DEVICE_HOST), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("layout.tpRank");
  layout.tp_rank = 0;

  layout.planes = NULL;
  CHECK_STATUS(hello_with(daemon, &layout, KVTIER_DEVICE_HOST), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("layout.planes is NULL");
  layout.plane_count = 0;
  CHECK_STATUS(hello_with(daemon, &layout, KVTIER_DEVICE_HOST), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("layout.planes");
  layout.planes = planes;
  layout.plane_count = kPlanes;

  planes[0].reserved = 1;
  CHECK_STATUS(hello_with(daemon, &layout, KVTIER_DEVICE_HOST), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("layout.planes[0].reserved");
  planes[0].reserved = 0;

  CHECK_STATUS(hello_with(daemon, &layout, (kvtier_device_kind)7), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("device_kind");
  /* The host daemon does not serve GPU engines and says which backend it runs; asking
   * again will not help. */
  CHECK_STATUS(hello_with(daemon, &layout, KVTIER_DEVICE_CUDA), KVTIER_NOT_SUPPORTED);
  CHECK_MESSAGE("host");
  CHECK(kvtier_last_error_retryable() == 0);
  /* The layout itself was fine all along. */
  CHECK_OK(hello_with(daemon, &layout, KVTIER_DEVICE_HOST));

  /* A region smaller than the planes need. */
  kvtier_client* client = NULL;
  CHECK_OK(kvtier_connect(daemon->socket_path, &client));
  CHECK_OK(kvtier_hello(client, &layout, "small-region", KVTIER_DEVICE_HOST, 0, NULL));
  CHECK_STATUS(kvtier_register_memfd(client, 0, cache.fd, kRegionBytes / 2),
               KVTIER_INVALID_ARGUMENT);
  kvtier_close(client);
  cache_destroy(&cache);
}

static void test_unknown_names(const capi_daemon* daemon) {
  capi_cache cache;
  CHECK(cache_create(&cache) == 0);
  kvtier_client* client = connect_engine(daemon, &cache);
  if (client == NULL) return;
  CHECK_STATUS(kvtier_begin_turn(client, "no-such-session", NULL), KVTIER_NOT_FOUND);
  CHECK_MESSAGE("no-such-session");
  uint32_t released = 7;
  CHECK_STATUS(kvtier_close_session(client, "no-such-session", &released), KVTIER_NOT_FOUND);
  CHECK(released == 7); /* untouched on failure */
  CHECK_STATUS(kvtier_unregister_region(client, 42), KVTIER_NOT_FOUND);
  CHECK_MESSAGE("42");
  kvtier_close(client);
  cache_destroy(&cache);
}

static void test_cuda_pointer_on_host(const capi_daemon* daemon) {
  capi_cache cache;
  CHECK(cache_create(&cache) == 0);
  kvtier_client* client = connect_engine(daemon, &cache);
  if (client == NULL) return;
  CHECK_STATUS(kvtier_register_cuda_pointer(client, 3, 0, 4096), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("device_ptr is 0");
  /* No CUDA in this build: NotSupported; no driver here: Unavailable; both name CUDA.
   * With a driver, a host address is not device memory the daemon could open, or the
   * host daemon does not take GPU regions. Never OK. */
  kvtier_status status =
      kvtier_register_cuda_pointer(client, 3, (uint64_t)(uintptr_t)cache.bytes, 4096);
  CHECK(status == KVTIER_UNAVAILABLE || status == KVTIER_NOT_SUPPORTED ||
        status == KVTIER_INVALID_ARGUMENT);
  if (status == KVTIER_UNAVAILABLE || status == KVTIER_NOT_SUPPORTED) CHECK_MESSAGE("CUDA");
  if (status == KVTIER_NOT_SUPPORTED) CHECK(kvtier_last_error_retryable() == 0);
  CHECK(strlen(kvtier_last_error()) > 10);
  fprintf(stderr, "register_cuda_pointer here: %s: %s\n", kvtier_status_name(status),
          kvtier_last_error());
  /* The connection serves on. */
  uint32_t hits = 0;
  CHECK_OK(kvtier_lookup(client, NULL, 0, &hits, NULL));
  kvtier_close(client);
  cache_destroy(&cache);
}

/* The retryable flag the daemon puts on the wire reaches kvtier_last_error_retryable:
 * the region limit (1 here) is RESOURCE_EXHAUSTED, which alone would say retryable,
 * but the daemon marks it final: waiting does not lift it. */
static void test_retryable_flag(const capi_daemon* daemon) {
  capi_cache cache;
  CHECK(cache_create(&cache) == 0);
  kvtier_client* client = connect_engine(daemon, &cache);
  if (client == NULL) return;
  CHECK_STATUS(kvtier_register_memfd(client, 1, cache.fd, kRegionBytes), KVTIER_RESOURCE_EXHAUSTED);
  CHECK_MESSAGE("the limit");
  CHECK(kvtier_last_error_retryable() == 0);
  uint32_t hits = 7;
  CHECK_OK(kvtier_lookup(client, NULL, 0, &hits, NULL));
  CHECK(kvtier_last_error_retryable() == 0); /* a success clears it */
  kvtier_close(client);
  cache_destroy(&cache);
}

static void test_dead_daemon(capi_daemon* daemon) {
  capi_cache cache;
  CHECK(cache_create(&cache) == 0);
  kvtier_client* client = connect_engine(daemon, &cache);
  if (client == NULL) return;
  uint8_t hash[16];
  make_hash(4, 0, hash);
  kvtier_block_ref ref = {hash, 16, 0};
  kvtier_hash lookup = {hash, 16};
  CHECK_OK(kvtier_save(client, "doomed", &ref, 1, 1, NULL));

  daemon_kill(daemon);
  uint32_t hits = 0;
  CHECK_STATUS(kvtier_lookup(client, &lookup, 1, &hits, NULL), KVTIER_UNAVAILABLE);
  CHECK(kvtier_last_error()[0] != '\0');
  CHECK(kvtier_last_error_retryable() == 1); /* reconnect and ask again */
  CHECK_STATUS(kvtier_save(client, "doomed", &ref, 1, 1, NULL), KVTIER_UNAVAILABLE);
  CHECK_STATUS(kvtier_begin_turn(client, "doomed", NULL), KVTIER_UNAVAILABLE);
  kvtier_pending* pending = NULL;
  kvtier_status sent = kvtier_load_async(client, "doomed", &ref, 1, &pending);
  if (sent == KVTIER_OK) {
    int ready = 0;
    CHECK_OK(kvtier_pending_poll(pending, &ready));
    CHECK(ready == 1);
    kvtier_load_result loaded;
    CHECK_STATUS(kvtier_pending_wait_load(pending, &loaded), KVTIER_UNAVAILABLE);
    kvtier_pending_free(pending);
  } else {
    CHECK(sent == KVTIER_UNAVAILABLE);
    CHECK(pending == NULL);
  }
  kvtier_close(client);

  kvtier_client* again = NULL;
  CHECK_STATUS(kvtier_connect(daemon->socket_path, &again), KVTIER_UNAVAILABLE);
  CHECK_MESSAGE(daemon->socket_path);
  CHECK(kvtier_last_error_retryable() == 1); /* a restarted daemon will answer */
  CHECK(again == NULL);
  cache_destroy(&cache);
}

int main(void) {
  kvtier_client* client = (kvtier_client*)1;
  CHECK_STATUS(kvtier_connect("/nonexistent/kvtierd.sock", &client), KVTIER_UNAVAILABLE);
  CHECK_MESSAGE("/nonexistent/kvtierd.sock");
  CHECK(client == NULL);

  capi_daemon daemon;
  const char* const flags[] = {"--max-regions-per-connection", "1", NULL};
  if (daemon_start_with(&daemon, flags) != 0) return 1;
  test_null_arguments(&daemon);
  test_save_with_retention(&daemon);
  test_bad_layouts(&daemon);
  test_unknown_names(&daemon);
  test_cuda_pointer_on_host(&daemon);
  test_retryable_flag(&daemon);
  test_dead_daemon(&daemon); /* last: kills the daemon */
  daemon_cleanup(&daemon);
  if (capi_failures > 0) fprintf(stderr, "%d check(s) failed\n", capi_failures);
  return capi_failures == 0 ? 0 : 1;
}
