#include "tests/capi/capi_harness.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int capi_failures = 0;

int last_error_contains(const char* needle) {
  const char* message = kvtier_last_error();
  if (message != NULL && strstr(message, needle) != NULL) return 1;
  fprintf(stderr, "  the message \"%s\" does not contain \"%s\"\n", message ? message : "(null)",
          needle);
  return 0;
}

static void sleep_ms(long ms) {
  struct timespec delay = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&delay, NULL);
}

/* 1 once something accepts connections on `path`. */
static int socket_accepts(const char* path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  struct sockaddr_un address;
  memset(&address, 0, sizeof(address));
  address.sun_family = AF_UNIX;
  snprintf(address.sun_path, sizeof(address.sun_path), "%s", path);
  int ok = connect(fd, (const struct sockaddr*)&address, sizeof(address)) == 0;
  close(fd);
  return ok;
}

static void print_log(const capi_daemon* daemon) {
  char path[128];
  snprintf(path, sizeof(path), "%s/kvtierd.log", daemon->dir);
  FILE* log = fopen(path, "r");
  if (log == NULL) return;
  fprintf(stderr, "---- kvtierd log ----\n");
  char line[512];
  while (fgets(line, sizeof(line), log) != NULL) fputs(line, stderr);
  fprintf(stderr, "---- end of kvtierd log ----\n");
  fclose(log);
}

int daemon_start(capi_daemon* daemon) {
  return daemon_start_with(daemon, NULL);
}

static int launch(capi_daemon* daemon, const char* const* extra_flags, int log_flags);

int daemon_start_with(capi_daemon* daemon, const char* const* extra_flags) {
  memset(daemon, 0, sizeof(*daemon));
  daemon->pid = -1;
  snprintf(daemon->dir, sizeof(daemon->dir), "/tmp/kvtier-capi-XXXXXX");
  if (mkdtemp(daemon->dir) == NULL) {
    perror("mkdtemp");
    return -1;
  }
  snprintf(daemon->socket_path, sizeof(daemon->socket_path), "%s/kvtierd.sock", daemon->dir);
  return launch(daemon, extra_flags, O_TRUNC);
}

int daemon_restart(capi_daemon* daemon, const char* const* extra_flags) {
  daemon_kill(daemon);
  return launch(daemon, extra_flags, O_APPEND);
}

static int launch(capi_daemon* daemon, const char* const* extra_flags, int log_flags) {
  char data_dir[128], log_path[128];
  snprintf(data_dir, sizeof(data_dir), "%s/data", daemon->dir);
  snprintf(log_path, sizeof(log_path), "%s/kvtierd.log", daemon->dir);

  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    return -1;
  }
  if (pid == 0) {
    int log = open(log_path, O_WRONLY | O_CREAT | log_flags, 0644);
    if (log >= 0) {
      dup2(log, STDOUT_FILENO);
      dup2(log, STDERR_FILENO);
    }
    char* argv[40] = {KVTIER_KVTIERD_PATH,
                      "--device",
                      "host",
                      "--socket",
                      daemon->socket_path,
                      "--data-dir",
                      data_dir,
                      "--hbm-bytes",
                      "16MiB",
                      "--ram-bytes",
                      "32MiB",
                      "--copy-threads",
                      "2",
                      "--metrics-addr",
                      "off",
                      NULL};
    int argc = 0;
    while (argv[argc] != NULL) ++argc;
    for (int i = 0; extra_flags != NULL && extra_flags[i] != NULL && i < 16; ++i) {
      argv[argc++] = (char*)extra_flags[i];
    }
    execv(argv[0], argv);
    fprintf(stderr, "execv %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  daemon->pid = pid;
  for (int waited_ms = 0; waited_ms < 20000; waited_ms += 20) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      daemon->pid = -1;
      fprintf(stderr, "kvtierd exited (status 0x%x) before accepting connections\n", status);
      print_log(daemon);
      return -1;
    }
    if (socket_accepts(daemon->socket_path)) return 0;
    sleep_ms(20);
  }
  fprintf(stderr, "kvtierd did not accept connections within 20 s\n");
  print_log(daemon);
  return -1;
}

void daemon_kill(capi_daemon* daemon) {
  if (daemon->pid <= 0) return;
  kill(daemon->pid, SIGKILL);
  waitpid(daemon->pid, NULL, 0);
  daemon->pid = -1;
}

void daemon_cleanup(capi_daemon* daemon) {
  daemon_kill(daemon);
  if (capi_failures > 0) print_log(daemon);
  if (daemon->dir[0] == '\0') return;
  char command[128];
  snprintf(command, sizeof(command), "rm -rf '%s'", daemon->dir);
  if (system(command) != 0) fprintf(stderr, "could not remove %s\n", daemon->dir);
}

int cache_create(capi_cache* cache) {
  memset(cache, 0, sizeof(*cache));
  cache->fd = memfd_create("capi-kv-cache", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (cache->fd < 0 || ftruncate(cache->fd, (off_t)kRegionBytes) != 0) {
    perror("memfd");
    return -1;
  }
  void* mapped = mmap(NULL, kRegionBytes, PROT_READ | PROT_WRITE, MAP_SHARED, cache->fd, 0);
  if (mapped == MAP_FAILED) {
    perror("mmap");
    return -1;
  }
  cache->bytes = mapped;
  for (uint32_t p = 0; p < kPlanes; ++p) {
    cache->planes[p].region_id = 0;
    cache->planes[p].offset_bytes = (uint64_t)p * kNumBlocks * kPlaneBytes;
    cache->planes[p].stride_bytes = kPlaneBytes;
    cache->planes[p].bytes_per_block = kPlaneBytes;
  }
  cache->layout.model_id = "capi-test-model";
  cache->layout.dtype = "fp16";
  cache->layout.num_layers = kPlanes / 2;
  cache->layout.num_kv_heads = 2;
  cache->layout.head_dim = 32;
  cache->layout.tokens_per_block = 16;
  cache->layout.tp_rank = 0;
  cache->layout.tp_size = 1;
  cache->layout.num_blocks = kNumBlocks;
  cache->layout.planes = cache->planes;
  cache->layout.plane_count = kPlanes;
  return 0;
}

void cache_destroy(capi_cache* cache) {
  if (cache->bytes != NULL) munmap(cache->bytes, kRegionBytes);
  if (cache->fd >= 0) close(cache->fd);
  cache->bytes = NULL;
  cache->fd = -1;
}

static uint8_t pattern_byte(uint32_t seed, uint32_t plane, uint32_t i) {
  uint32_t x = seed * 2654435761u ^ (plane + 1) * 40503u ^ i * 2246822519u;
  x ^= x >> 13;
  return (uint8_t)(x * 3266489917u >> 24);
}

static uint8_t* plane_bytes(const capi_cache* cache, uint32_t plane, uint32_t block) {
  return cache->bytes + cache->planes[plane].offset_bytes +
         (uint64_t)block * cache->planes[plane].stride_bytes;
}

void cache_fill_block(capi_cache* cache, uint32_t block, uint32_t seed) {
  for (uint32_t p = 0; p < kPlanes; ++p) {
    uint8_t* bytes = plane_bytes(cache, p, block);
    for (uint32_t i = 0; i < kPlaneBytes; ++i) bytes[i] = pattern_byte(seed, p, i);
  }
}

int cache_block_matches(const capi_cache* cache, uint32_t block, uint32_t seed) {
  for (uint32_t p = 0; p < kPlanes; ++p) {
    const uint8_t* bytes = plane_bytes(cache, p, block);
    for (uint32_t i = 0; i < kPlaneBytes; ++i) {
      if (bytes[i] != pattern_byte(seed, p, i)) return 0;
    }
  }
  return 1;
}

void cache_wipe(capi_cache* cache) {
  memset(cache->bytes, 0, kRegionBytes);
}

void make_hash(uint32_t conversation, uint32_t index, uint8_t out[16]) {
  for (uint32_t i = 0; i < 16; ++i) out[i] = (uint8_t)(conversation * 31 + index * 7 + i * 13 + 1);
  memcpy(out, &conversation, sizeof(conversation));
  memcpy(out + 4, &index, sizeof(index));
}

kvtier_client* connect_engine(const capi_daemon* daemon, capi_cache* cache) {
  kvtier_client* client = NULL;
  kvtier_status status = kvtier_connect(daemon->socket_path, &client);
  if (status != KVTIER_OK) {
    fprintf(stderr, "kvtier_connect: %s: %s\n", kvtier_status_name(status), kvtier_last_error());
    ++capi_failures;
    return NULL;
  }
  kvtier_hello_info info;
  status = kvtier_hello(client, &cache->layout, "capi-test", KVTIER_DEVICE_HOST, 0, &info);
  if (status == KVTIER_OK) status = kvtier_register_memfd(client, 0, cache->fd, kRegionBytes);
  if (status != KVTIER_OK) {
    fprintf(stderr, "hello/register: %s: %s\n", kvtier_status_name(status), kvtier_last_error());
    ++capi_failures;
    kvtier_close(client);
    return NULL;
  }
  return client;
}
