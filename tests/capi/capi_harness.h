/* What the C tests of libkvtier share: a real kvtierd on a temporary socket, a memfd
 * region with a small paged layout, and CHECK macros that count failures.
 *
 * Single-threaded use; one daemon per test program (its paths live in the struct). */
#ifndef KVTIER_TESTS_CAPI_HARNESS_H_
#define KVTIER_TESTS_CAPI_HARNESS_H_

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "client/kvtier.h"

extern int capi_failures;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
      ++capi_failures;                                                         \
    }                                                                          \
  } while (0)

/* Checks that `call` returns `expected`; prints the status names and the message. */
#define CHECK_STATUS(call, expected)                                                         \
  do {                                                                                       \
    kvtier_status got_ = (call);                                                             \
    if (got_ != (expected)) {                                                                \
      fprintf(stderr, "%s:%d: %s returned %s, expected %s: %s\n", __FILE__, __LINE__, #call, \
              kvtier_status_name(got_), kvtier_status_name(expected), kvtier_last_error());  \
      ++capi_failures;                                                                       \
    }                                                                                        \
  } while (0)

#define CHECK_OK(call) CHECK_STATUS(call, KVTIER_OK)

/* True when kvtier_last_error() contains `needle`; prints the message when not. */
int last_error_contains(const char* needle);
#define CHECK_MESSAGE(needle) CHECK(last_error_contains(needle))

/* A kvtierd started by daemon_start. */
typedef struct capi_daemon {
  pid_t pid;
  char dir[64];         /* temporary directory: socket, data, log */
  char socket_path[96]; /* fits sockaddr_un.sun_path */
} capi_daemon;

/* Starts kvtierd --device host on a fresh temporary directory and returns once its
 * socket accepts connections (0), or -1 with a message on stderr. */
int daemon_start(capi_daemon* daemon);
/* The same with more kvtierd flags: a NULL-terminated list of at most 16 strings. */
int daemon_start_with(capi_daemon* daemon, const char* const* extra_flags);
/* SIGKILLs the daemon if it runs, then starts it again on the same directory (socket,
 * data, log appended) with `extra_flags`; 0 once it accepts connections. */
int daemon_restart(capi_daemon* daemon, const char* const* extra_flags);
/* SIGKILL and reap the daemon (kill -9: no drain, no clean close). */
void daemon_kill(capi_daemon* daemon);
/* SIGKILL if still running, then remove the directory. */
void daemon_cleanup(capi_daemon* daemon);

/* The paged cache of the tests: kNumBlocks engine blocks of kPlanes planes, planes
 * stored one after another in one memfd ([plane][block][bytes], like vLLM's [2, blocks,
 * ...] per layer). */
enum { kNumBlocks = 32, kPlanes = 4, kPlaneBytes = 2048 };
#define kRegionBytes ((uint64_t)kNumBlocks * kPlanes * kPlaneBytes)

typedef struct capi_cache {
  int fd;
  uint8_t* bytes; /* kRegionBytes, mapped shared */
  kvtier_plane planes[kPlanes];
  kvtier_layout layout;
} capi_cache;

/* memfd_create + mmap, and the layout describing it (model "capi-test-model"). */
int cache_create(capi_cache* cache);
void cache_destroy(capi_cache* cache);
/* Fills block `block`'s bytes (every plane) with a pattern derived from `seed`. */
void cache_fill_block(capi_cache* cache, uint32_t block, uint32_t seed);
/* 1 when block `block` holds exactly the pattern of `seed`. */
int cache_block_matches(const capi_cache* cache, uint32_t block, uint32_t seed);
void cache_wipe(capi_cache* cache);

/* A 16-byte hash for block `index` of conversation `conversation`, written to out. */
void make_hash(uint32_t conversation, uint32_t index, uint8_t out[16]);

/* Connects, says Hello with the cache's layout and registers the memfd as region 0. */
kvtier_client* connect_engine(const capi_daemon* daemon, capi_cache* cache);

#endif /* KVTIER_TESTS_CAPI_HARNESS_H_ */
