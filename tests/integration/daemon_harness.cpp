#include "tests/integration/daemon_harness.h"

#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace kvtier::integration {
namespace {

using Clock = std::chrono::steady_clock;

// The poll loops below re-check a condition at this interval until their deadline;
// nothing is synchronised by the interval itself.
constexpr milliseconds kPollInterval{2};

std::string describe_stats(const StatsInfo& stats) {
  std::string text;
  for (const TierStatsInfo& tier : stats.tiers) {
    text += fmt::format("{}: {}/{} bytes, {} blocks, {} copy bytes; ", tier_name(tier.tier),
                        tier.used_bytes, tier.capacity_bytes, tier.blocks, tier.copy_bytes);
  }
  return text + fmt::format(
                    "copies_in_flight {}, pinned_blocks {}, demoted {} bytes, evicted {} blocks, "
                    "connections {}",
                    stats.copies_in_flight, stats.pinned_blocks, stats.bytes_demoted,
                    stats.blocks_evicted, stats.connections);
}

}  // namespace

std::string binary_path(const std::string& name) {
  // KVTIER_TEST_BIN_DIR runs the suite against binaries built elsewhere.
  const char* dir = std::getenv("KVTIER_TEST_BIN_DIR");
  return std::string(dir != nullptr && *dir != '\0' ? dir : KVTIER_BIN_DIR) + "/" + name;
}

pid_t fork_child(const std::function<int()>& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  int code = 98;
  try {
    code = body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[child %d] exception: %s\n", ::getpid(), e.what());
  } catch (...) {
    std::fprintf(stderr, "[child %d] unknown exception\n", ::getpid());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(code);
}

std::vector<std::string> small_tier_flags() {
  return {"--hbm-bytes", "32MiB", "--ram-bytes", "64MiB", "--copy-threads", "2"};
}

Result<std::unique_ptr<Daemon>> Daemon::start(const std::vector<std::string>& flags) {
  support::DaemonProcessOptions options;
  options.binary = binary_path("kvtierd");
  // In /tmp whatever $TMPDIR says: ops tests let other uids reach the socket.
  options.temp_parent = "/tmp";
  options.temp_prefix = "kvtier-it";
  options.flags = flags;
  auto process = support::DaemonProcess::start(std::move(options));
  if (!process.is_ok()) return process.status();
  return std::unique_ptr<Daemon>(new Daemon(std::move(*process)));
}

Daemon::~Daemon() {
  process_.kill();
  if (::testing::Test::HasFailure()) {
    std::fprintf(stderr, "---- kvtierd log (%s) ----\n%s---- end of kvtierd log ----\n",
                 dir().c_str(), log().c_str());
  }
}

Status Daemon::open_to_all_users() const {
  if (::chmod(dir().c_str(), 0755) != 0) return errno_status(errno, "chmod " + dir());
  if (::chmod(socket_path().c_str(), 0666) != 0) {
    return errno_status(errno, "chmod " + socket_path());
  }
  return Status::ok();
}

Result<StatsInfo> Daemon::wait_for_stats(const std::function<bool(const StatsInfo&)>& done,
                                         milliseconds timeout) const {
  auto client = connect();
  if (!client.is_ok()) return client.status();
  const auto deadline = Clock::now() + timeout;
  while (true) {
    auto stats = (*client)->stats();
    if (!stats.is_ok()) return stats.status();
    if (done(*stats)) return stats;
    if (Clock::now() >= deadline) {
      return internal_error("condition not reached within {} ms; last stats: {}", timeout.count(),
                            describe_stats(*stats));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

Result<StatsInfo> Daemon::wait_until_settled(milliseconds timeout) const {
  return wait_for_stats(
      [](const StatsInfo& s) { return s.copies_in_flight == 0 && s.pinned_blocks == 0; }, timeout);
}

std::string read_pipe_until(int fd, std::string_view text, milliseconds timeout) {
  std::string seen;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while ((text.empty() || seen.find(text) == std::string::npos) &&
         std::chrono::steady_clock::now() < deadline) {
    pollfd readable{fd, POLLIN, 0};
    if (::poll(&readable, 1, 100) <= 0) continue;
    char buffer[512];
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n <= 0) break;
    seen.append(buffer, static_cast<size_t>(n));
  }
  return seen;
}

ProcessResult Daemon::run_example_engine(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {binary_path("kvtier-example-engine"), "--socket", socket_path()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv);
}

ProcessResult Daemon::run_kvtierctl(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {binary_path("kvtierctl"), "--socket", socket_path()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv);
}

void DaemonTest::SetUp() {
  auto daemon = Daemon::start(daemon_flags());
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  daemon_ = std::move(*daemon);
}

void DaemonTest::TearDown() {
  if (!daemon_) return;
  ExitStatus stopped = daemon_->stop();
  EXPECT_TRUE(stopped.ok()) << "kvtierd " << stopped.describe();
  daemon_.reset();
}

Result<Engine> Engine::connect(const std::string& socket_path, const PagedCacheShape& shape,
                               const std::string& name) {
  auto client = Client::connect(socket_path);
  if (!client.is_ok()) return client.status();
  return start(std::move(*client), shape, name);
}

Result<Engine> Engine::start(std::unique_ptr<Client> client, const PagedCacheShape& shape,
                             const std::string& name) {
  auto cache = PagedCache::create(shape);
  if (!cache.is_ok()) return cache.status();
  auto hello = client->hello(cache->layout(), name);
  if (!hello.is_ok()) return hello.status();
  KVTIER_RETURN_IF_ERROR(client->register_memfd_region(cache->region_id(), cache->region().fd(),
                                                       cache->region().size_bytes()));
  return Engine{std::move(client), std::move(*cache), *hello};
}

std::vector<BlockRef> Engine::refs(std::span<const BlockHash> hashes, uint64_t first_block_id) {
  std::vector<BlockRef> out;
  for (size_t i = 0; i < hashes.size(); ++i) out.push_back({hashes[i], first_block_id + i});
  return out;
}

void Engine::fill(std::span<const BlockRef> refs) {
  for (const BlockRef& ref : refs) cache.fill(ref.engine_block_id, ref.hash);
}

size_t Engine::count_verified(std::span<const BlockRef> refs, size_t count) const {
  for (size_t i = 0; i < count && i < refs.size(); ++i) {
    if (!cache.verify(refs[i].engine_block_id, refs[i].hash)) return i;
  }
  return std::min(count, refs.size());
}

PagedCacheShape small_shape(uint64_t num_blocks) {
  PagedCacheShape shape;
  shape.model_id = "integration/small";
  shape.num_layers = 4;
  shape.num_kv_heads = 2;
  shape.head_dim = 64;
  shape.num_blocks = num_blocks;
  return shape;
}

PagedCacheShape example_shape(uint64_t num_blocks) {
  PagedCacheShape shape;  // the example engine's defaults: 2 MiB blocks
  shape.num_blocks = num_blocks;
  return shape;
}

const TierStatsInfo* find_tier(const StatsInfo& stats, Tier tier) {
  for (const TierStatsInfo& info : stats.tiers) {
    if (info.tier == tier) return &info;
  }
  return nullptr;
}

uint64_t total_blocks(const StatsInfo& stats) {
  uint64_t blocks = 0;
  for (const TierStatsInfo& info : stats.tiers) blocks += info.blocks;
  return blocks;
}

::testing::AssertionResult NoLeakedSlots(const StatsInfo& stats, uint64_t block_bytes) {
  for (const TierStatsInfo& info : stats.tiers) {
    // Copies (NVMe) hold slots of blocks that live above.
    if (info.used_bytes != info.blocks * block_bytes + info.copy_bytes ||
        info.copy_bytes % block_bytes != 0) {
      return ::testing::AssertionFailure()
             << "tier " << tier_name(info.tier) << " uses " << info.used_bytes << " bytes for "
             << info.blocks << " blocks of " << block_bytes << " bytes and " << info.copy_bytes
             << " bytes of copies (expected " << info.blocks * block_bytes + info.copy_bytes
             << "); stats: " << describe_stats(stats);
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult ServesSaveAndLoad(const Daemon& daemon, const std::string& session) {
  auto engine = Engine::connect(daemon.socket_path(), small_shape(8), "health-check");
  if (!engine.is_ok()) {
    return ::testing::AssertionFailure() << "connect: " << engine.status().to_string();
  }
  auto stats = engine->client->stats();
  if (!stats.is_ok()) {
    return ::testing::AssertionFailure() << "stats: " << stats.status().to_string();
  }
  const std::vector<BlockHash> hashes = PagedCache::chain_hashes(session, 4);
  const std::vector<BlockRef> saved = Engine::refs(hashes, 0);
  engine->fill(saved);
  auto save = engine->client->save(session, saved, true);
  if (!save.is_ok()) return ::testing::AssertionFailure() << "save: " << save.status().to_string();
  const std::vector<BlockRef> restored = Engine::refs(hashes, 4);
  auto load = engine->client->load(session, restored);
  if (!load.is_ok()) return ::testing::AssertionFailure() << "load: " << load.status().to_string();
  if (load->loaded_count != hashes.size() ||
      engine->count_verified(restored, hashes.size()) != hashes.size()) {
    return ::testing::AssertionFailure()
           << "loaded " << load->loaded_count << " of " << hashes.size() << " blocks ("
           << load->stop_reason.to_string() << "), "
           << engine->count_verified(restored, load->loaded_count) << " bit-exact";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult IsError(const Status& status, StatusCode code,
                                   std::string_view fragment) {
  if (status.is_ok()) {
    return ::testing::AssertionFailure()
           << "expected " << status_code_name(code) << " mentioning '" << fragment << "', got OK";
  }
  if (status.code() != code || status.message().find(fragment) == std::string::npos) {
    return ::testing::AssertionFailure() << "expected " << status_code_name(code) << " mentioning '"
                                         << fragment << "', got " << status.to_string();
  }
  return ::testing::AssertionSuccess() << status.to_string();
}

int child_failure(int code, const std::string& what, const Status& status) {
  std::fprintf(stderr, "[child %d] %s%s%s\n", ::getpid(), what.c_str(), status.is_ok() ? "" : ": ",
               status.is_ok() ? "" : status.to_string().c_str());
  return code;
}

}  // namespace kvtier::integration
