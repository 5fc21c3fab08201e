/* libkvtier from C: the non-blocking forms. Save and Load polled until ready then
 * waited for, pipelined requests waited for out of order, poll while the daemon is
 * stopped (must not block), wrong-kind and repeated waits, freeing unwaited pendings,
 * and one client shared by threads that wait, poll and free at once. */
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>

#include "tests/capi/capi_harness.h"

enum { kBlocks = 8 };

static void sleep_ms(long ms) {
  struct timespec delay = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&delay, NULL);
}

/* Polls until ready (1) or about 20 s passed (0). */
static int poll_until_ready(kvtier_pending* pending) {
  for (int i = 0; i < 20000; ++i) {
    int ready = -1;
    if (kvtier_pending_poll(pending, &ready) != KVTIER_OK) return 0;
    if (ready == 1) return 1;
    CHECK(ready == 0);
    sleep_ms(1);
  }
  return 0;
}

typedef struct turn {
  uint8_t hashes[kBlocks][16];
  kvtier_block_ref refs[kBlocks];
  kvtier_hash lookup[kBlocks];
} turn;

static void make_turn(turn* t, uint32_t conversation, uint32_t first_block) {
  for (uint32_t i = 0; i < kBlocks; ++i) {
    make_hash(conversation, i, t->hashes[i]);
    t->refs[i].hash = t->hashes[i];
    t->refs[i].hash_len = 16;
    t->refs[i].engine_block_id = first_block + i;
    t->lookup[i].hash = t->hashes[i];
    t->lookup[i].hash_len = 16;
  }
}

static void test_save_and_load_polled(const capi_daemon* daemon) {
  capi_cache cache;
  CHECK(cache_create(&cache) == 0);
  kvtier_client* client = connect_engine(daemon, &cache);
  if (client == NULL) return;
  turn t;
  make_turn(&t, 10, 0);
  for (uint32_t i = 0; i < kBlocks; ++i) cache_fill_block(&cache, i, 500 + i);

  kvtier_pending* save = NULL;
  CHECK_OK(kvtier_save_async(client, "async-conv", t.refs, kBlocks, 1, &save));
  CHECK(save != NULL);
  CHECK(poll_until_ready(save));
  kvtier_save_result saved = {0, 0};
  CHECK_OK(kvtier_pending_wait_save(save, &saved));
  CHECK(saved.stored == kBlocks);
  kvtier_pending_free(save);

  /* Next turn: BeginTurn, Lookup and Load pipelined, waited for in reverse order. */
  cache_wipe(&cache);
  for (uint32_t i = 0; i < kBlocks; ++i) t.refs[i].engine_block_id = 20 + i;
  kvtier_pending *begin = NULL, *lookup = NULL, *load = NULL;
  CHECK_OK(kvtier_begin_turn_async(client, "async-conv", &begin));
  CHECK_OK(kvtier_lookup_async(client, t.lookup, kBlocks, &lookup));
  CHECK_OK(kvtier_load_async(client, "async-conv", t.refs, kBlocks, &load));
  CHECK(poll_until_ready(load));
  kvtier_load_result loaded;
  CHECK_OK(kvtier_pending_wait_load(load, &loaded));
  CHECK(loaded.loaded_count == kBlocks && loaded.stop_code == KVTIER_OK);
  for (uint32_t i = 0; i < kBlocks; ++i) CHECK(cache_block_matches(&cache, 20 + i, 500 + i));
  uint32_t hits = 0;
  kvtier_tier tiers[kBlocks];
  CHECK_OK(kvtier_pending_wait_lookup(lookup, &hits, tiers));
  CHECK(hits == kBlocks);
  CHECK(tiers[0] != KVTIER_TIER_NONE && tiers[kBlocks - 1] != KVTIER_TIER_NONE);
  kvtier_begin_turn_result begun = {0, 0};
  CHECK_OK(kvtier_pending_wait_begin_turn(begin, &begun));
  CHECK(begun.known_blocks == kBlocks);
  kvtier_pending_free(load);
  kvtier_pending_free(lookup);
  kvtier_pending_free(begin);

  /* One wait per pending, of its kind. */
  kvtier_pending* close = NULL;
  CHECK_OK(kvtier_close_session_async(client, "async-conv", &close));
  CHECK_STATUS(kvtier_pending_wait_save(close, &saved), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("close_session");
  uint32_t released = 0;
  CHECK_OK(kvtier_pending_wait_close_session(close, &released));
  CHECK(released == kBlocks);
  CHECK_STATUS(kvtier_pending_wait_close_session(close, &released), KVTIER_INVALID_ARGUMENT);
  CHECK_MESSAGE("already waited");
  int ready = 0;
  CHECK_STATUS(kvtier_pending_poll(close, &ready), KVTIER_INVALID_ARGUMENT);
  kvtier_pending_free(close);

  /* An unknown session's error comes back through the wait. */
  kvtier_pending* unknown = NULL;
  CHECK_OK(kvtier_begin_turn_async(client, "async-conv", &unknown));
  CHECK(poll_until_ready(unknown));
  CHECK_STATUS(kvtier_pending_wait_begin_turn(unknown, NULL), KVTIER_NOT_FOUND);
  CHECK_MESSAGE("async-conv");
  kvtier_pending_free(unknown);

  kvtier_close(client);
  cache_destroy(&cache);
}

/* While the daemon is stopped no reply can come: poll answers 0 at once. */
static void test_poll_never_blocks(capi_daemon* daemon) {
  capi_cache cache;
  CHECK(cache_create(&cache) == 0);
  kvtier_client* client = connect_engine(daemon, &cache);
  if (client == NULL) return;
  turn t;
  make_turn(&t, 11, 0);
  for (uint32_t i = 0; i < kBlocks; ++i) cache_fill_block(&cache, i, 900 + i);

  CHECK(kill(daemon->pid, SIGSTOP) == 0);
  kvtier_pending* save = NULL;
  CHECK_OK(kvtier_save_async(client, "stopped-conv", t.refs, kBlocks, 1, &save));
  for (int i = 0; i < 50; ++i) {
    int ready = -1;
    CHECK_OK(kvtier_pending_poll(save, &ready));
    CHECK(ready == 0);
  }
  CHECK(kill(daemon->pid, SIGCONT) == 0);
  CHECK(poll_until_ready(save));
  kvtier_save_result saved = {0, 0};
  CHECK_OK(kvtier_pending_wait_save(save, &saved));
  CHECK(saved.stored == kBlocks);
  kvtier_pending_free(save);

  /* A pending freed unwaited: its reply is dropped, later calls get their own. */
  kvtier_pending* dropped = NULL;
  CHECK_OK(kvtier_lookup_async(client, t.lookup, kBlocks, &dropped));
  kvtier_pending_free(dropped);
  uint32_t hits = 0;
  CHECK_OK(kvtier_lookup(client, t.lookup, 1, &hits, NULL));
  CHECK(hits == 1);

  /* A pending outlives kvtier_close of its client; waiting on it still works. */
  kvtier_pending* late = NULL;
  CHECK_OK(kvtier_close_session_async(client, "stopped-conv", &late));
  kvtier_close(client);
  uint32_t released = 0;
  CHECK_OK(kvtier_pending_wait_close_session(late, &released));
  CHECK(released == kBlocks);
  kvtier_pending_free(late);
  cache_destroy(&cache);
}

typedef struct worker {
  kvtier_client* client;
  const turn* t;
  uint32_t index;
  int failures;
} worker;

/* Mixes blocking calls, polled pendings and pendings freed unwaited. */
static void* worker_main(void* arg) {
  worker* w = arg;
  for (int round = 0; round < 200; ++round) {
    uint32_t hits = 0;
    kvtier_pending* pending = NULL;
    switch ((round + w->index) % 3) {
      case 0:
        if (kvtier_lookup(w->client, w->t->lookup, kBlocks, &hits, NULL) != KVTIER_OK ||
            hits != kBlocks) {
          ++w->failures;
        }
        break;
      case 1:
        if (kvtier_lookup_async(w->client, w->t->lookup, kBlocks, &pending) != KVTIER_OK) {
          ++w->failures;
          break;
        }
        for (int ready = 0; !ready;) {
          if (kvtier_pending_poll(pending, &ready) != KVTIER_OK) {
            ++w->failures;
            break;
          }
        }
        if (kvtier_pending_wait_lookup(pending, &hits, NULL) != KVTIER_OK || hits != kBlocks) {
          ++w->failures;
        }
        kvtier_pending_free(pending);
        break;
      default:
        if (kvtier_lookup_async(w->client, w->t->lookup, 1, &pending) != KVTIER_OK) ++w->failures;
        kvtier_pending_free(pending);
        break;
    }
  }
  return NULL;
}

static void test_threads_share_a_client(const capi_daemon* daemon) {
  capi_cache cache;
  CHECK(cache_create(&cache) == 0);
  kvtier_client* client = connect_engine(daemon, &cache);
  if (client == NULL) return;
  turn t;
  make_turn(&t, 12, 0);
  for (uint32_t i = 0; i < kBlocks; ++i) cache_fill_block(&cache, i, 1300 + i);
  CHECK_OK(kvtier_save(client, "threads-conv", t.refs, kBlocks, 1, NULL));
  enum { kThreads = 6 };
  pthread_t threads[kThreads];
  worker workers[kThreads];
  for (uint32_t i = 0; i < kThreads; ++i) {
    workers[i] = (worker){client, &t, i, 0};
    CHECK(pthread_create(&threads[i], NULL, worker_main, &workers[i]) == 0);
  }
  for (uint32_t i = 0; i < kThreads; ++i) {
    CHECK(pthread_join(threads[i], NULL) == 0);
    CHECK(workers[i].failures == 0);
  }
  uint32_t released = 0;
  CHECK_OK(kvtier_close_session(client, "threads-conv", &released));
  CHECK(released == kBlocks);
  kvtier_close(client);
  cache_destroy(&cache);
}

int main(void) {
  capi_daemon daemon;
  if (daemon_start(&daemon) != 0) return 1;
  test_save_and_load_polled(&daemon);
  test_poll_never_blocks(&daemon);
  test_threads_share_a_client(&daemon);
  daemon_cleanup(&daemon);
  if (capi_failures > 0) fprintf(stderr, "%d check(s) failed\n", capi_failures);
  return capi_failures == 0 ? 0 : 1;
}
