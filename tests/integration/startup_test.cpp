// Start-up and region opening off the control thread, on the real daemon:
//  * kvtierd answers on its socket while its tier memory is still being filled (the
//    test-only --fault-fill-delay-ms holds the fill's completion, so the window is wide
//    and the test never races the fill): Hello, RegisterRegion, Lookup and Stats
//    (which says `starting`) are served at once; a Save waits for the fill and lands
//    after it; past --startup-wait-ms a Save gets Unavailable; SIGTERM during the fill
//    stops the daemon cleanly.
//  * While one engine's large region is being opened (a memfd whose pages do not exist
//    yet, so the daemon's MAP_POPULATE allocates them all), another engine is served
//    start to finish; a Save pipelined right behind a RegisterRegion waits for the
//    region instead of failing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>

#include "common/unique_fd.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/raw_connection.h"

namespace kvtier::integration {
namespace {

std::vector<std::string> with(std::vector<std::string> flags, std::vector<std::string> more) {
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

class SlowFill : public DaemonTest {
 protected:
  // The fill itself takes milliseconds (96 MiB); its completion is held for kHoldMs, so
  // that the requests made before the Save's reply is awaited (a kvtierctl process
  // among them) surely come while the daemon is starting, even on a loaded machine or
  // a sanitizer build. A data request waits longer than that for the fill.
  static constexpr uint64_t kHoldMs = 10'000;
  std::vector<std::string> daemon_flags() const override {
    return with(small_tier_flags(), {"--fault-fill-delay-ms", std::to_string(kHoldMs) + "ms",
                                     "--startup-wait-ms", "120s"});
  }
};

TEST_F(SlowFill, ServesTheSocketAtOnceAndDataRequestsWaitForTheFill) {
  // Hello and RegisterRegion are served while the memory fills.
  auto engine = Engine::connect(daemon_->socket_path(), small_shape(8));
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  auto observer = daemon_->connect();
  ASSERT_TRUE(observer.is_ok()) << observer.status().to_string();
  auto stats = (*observer)->stats();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_TRUE(stats->starting);
  EXPECT_EQ(stats->fill_bytes, (32ull + 64ull) << 20);
  auto status_text =
      run_process({binary_path("kvtierctl"), "--socket", daemon_->socket_path(), "status"});
  ASSERT_TRUE(status_text.status.ok()) << status_text.describe();
  EXPECT_NE(status_text.stdout_text.find("starting: filling"), std::string::npos)
      << status_text.stdout_text;

  const auto hashes = PagedCache::chain_hashes("early", 4);
  const auto refs = Engine::refs(hashes, 0);
  engine->fill(refs);
  auto save = engine->client->save_async("early", refs, /*end_of_turn=*/true);
  ASSERT_TRUE(save.send_status().is_ok());
  // Another engine's Lookup is answered while the Save waits (the index is there).
  auto other = Engine::connect(daemon_->socket_path(), small_shape(8), "other");
  ASSERT_TRUE(other.is_ok()) << other.status().to_string();
  auto lookup = other->client->lookup(hashes);
  ASSERT_TRUE(lookup.is_ok()) << lookup.status().to_string();
  EXPECT_EQ(lookup->hit_count, 0u);
  stats = (*observer)->stats();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  ASSERT_TRUE(stats->starting) << "the fill finished early: the test cannot see it wait";
  EXPECT_FALSE(save.ready()) << "a Save was served before the tier memory was filled";

  auto saved = save.wait();
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  EXPECT_EQ(saved->stored, refs.size());
  stats = (*observer)->stats();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_FALSE(stats->starting);
  EXPECT_GE(stats->uptime_ms, kHoldMs) << "the Save was answered before the fill was done";
  auto loaded = other->client->load("early", refs);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(other->count_verified(refs, loaded->loaded_count), refs.size());
  EXPECT_NE(daemon_->log().find("tier memory filled: 96.0 MiB"), std::string::npos)
      << daemon_->log();
}

class VerySlowFill : public DaemonTest {
 protected:
  std::vector<std::string> daemon_flags() const override {
    return with(small_tier_flags(), {"--fault-fill-delay-ms", "10m", "--startup-wait-ms", "300ms"});
  }
};

TEST_F(VerySlowFill, DataRequestsGetUnavailableAfterTheStartupWaitAndStopWorks) {
  auto engine = Engine::connect(daemon_->socket_path(), small_shape(8));
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const auto hashes = PagedCache::chain_hashes("too-early", 2);
  const auto refs = Engine::refs(hashes, 0);
  engine->fill(refs);
  const auto sent = std::chrono::steady_clock::now();
  EXPECT_TRUE(IsError(engine->client->save("too-early", refs, true).status(),
                      StatusCode::kUnavailable, "kvtierd is starting"));
  EXPECT_GE(std::chrono::steady_clock::now() - sent, std::chrono::milliseconds(300));
  EXPECT_TRUE(
      IsError(engine->client->load("too-early", refs).status(), StatusCode::kUnavailable, "retry"));
  // The connection survives and keeps serving what needs no tier memory.
  auto lookup = engine->client->lookup(hashes);
  ASSERT_TRUE(lookup.is_ok()) << lookup.status().to_string();
  auto stats = engine->client->stats();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_TRUE(stats->starting);

  // SIGTERM while filling: the fill is given up and the daemon exits 0 promptly.
  const ExitStatus stopped = daemon_->stop(std::chrono::seconds(20));
  EXPECT_TRUE(stopped.ok()) << stopped.describe() << "\n" << daemon_->log();
}

// A memfd of `bytes` whose pages were never touched: the daemon's MAP_POPULATE has to
// allocate and zero all of them, which takes a while on any machine.
UniqueFd untouched_memfd(uint64_t bytes) {
  UniqueFd fd(::memfd_create("kvtier-big-region", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid() || ::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) return UniqueFd();
  (void)::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
  return fd;
}

// A 1 GiB memfd the daemon must fault in is slow to open on most machines, but not on
// all: the open is also held for 2 s (test-only flag), so the window is always wide.
class RegionOpening : public DaemonTest {
 protected:
  std::vector<std::string> daemon_flags() const override {
    return with(small_tier_flags(), {"--fault-region-open-delay-ms", "2s"});
  }
};

TEST_F(RegionOpening, OtherEnginesAreServedWhileALargeRegionOpens) {
  const PagedCacheShape big_shape = small_shape(32768);  // 1 GiB
  const LayoutSpec big_layout = PagedCache::make_layout(big_shape, 0);
  UniqueFd big = untouched_memfd(big_shape.region_bytes());
  ASSERT_TRUE(big.valid());
  // The other engine is connected and registered up front: its round trips below take
  // milliseconds, the big region's open far longer.
  auto other = Engine::connect(daemon_->socket_path(), small_shape(8), "other");
  ASSERT_TRUE(other.is_ok()) << other.status().to_string();
  auto raw = RawConnection::connect(daemon_->socket_path());
  ASSERT_TRUE(raw.is_ok()) << raw.status().to_string();
  ASSERT_TRUE(raw->send(1,
                        [&](wire::Request::Builder request) {
                          auto hello = request.initHello();
                          hello.setProtocolVersion(wire::PROTOCOL_VERSION);
                          fill_layout(hello.initLayout(), big_layout);
                        })
                  .is_ok());
  auto hello = raw->receive_reply();
  ASSERT_TRUE(hello.is_ok()) << hello.status().to_string();
  ASSERT_TRUE(hello->error.is_ok()) << hello->error.to_string();
  const int fds[] = {big.get()};
  ASSERT_TRUE(raw->send(
                     2,
                     [&](wire::Request::Builder request) {
                       auto region = request.initRegisterRegion();
                       region.setRegionId(0);
                       region.setSizeBytes(big_shape.region_bytes());
                       region.setKind(wire::RegisterRegion::RegionKind::MEMFD);
                       region.setFdCount(1);
                     },
                     fds)
                  .is_ok());
  // Pipelined behind the RegisterRegion: it must wait for the region, not fail.
  const auto hashes = PagedCache::chain_hashes("big", 2);
  const auto refs = Engine::refs(hashes, 0);
  ASSERT_TRUE(raw->send(3,
                        [&](wire::Request::Builder request) {
                          fill_save(request, "big", refs, /*end_of_turn=*/true);
                        })
                  .is_ok());

  // Meanwhile the other engine saves and loads back bit-exact, and reads Stats.
  const auto other_hashes = PagedCache::chain_hashes("meanwhile", 2);
  const auto other_refs = Engine::refs(other_hashes, 0);
  other->fill(other_refs);
  ASSERT_TRUE(other->client->save("meanwhile", other_refs, true).is_ok());
  auto loaded = other->client->load("meanwhile", other_refs);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(other->count_verified(other_refs, loaded->loaded_count), other_refs.size());
  ASSERT_TRUE(other->client->stats().is_ok());
  // Checked without consuming a reply: poll() says whether one is waiting.
  pollfd readable{raw->fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&readable, 1, 0), 0)
      << "the 1 GiB region was opened before the other engine's round trips ended: the "
         "test could not tell whether the control thread was free";

  for (uint64_t id : {2, 3}) {
    auto reply = raw->receive_reply(std::chrono::seconds(60));
    ASSERT_TRUE(reply.is_ok()) << reply.status().to_string();
    EXPECT_EQ(reply->id, id);
    EXPECT_TRUE(reply->error.is_ok()) << "request " << id << ": " << reply->error.to_string();
  }
  // The region is closed off the control thread too, and Unregister still replies only
  // after that.
  ASSERT_TRUE(raw->send(4,
                        [](wire::Request::Builder request) {
                          request.initUnregisterRegion().setRegionId(0);
                        })
                  .is_ok());
  auto unregistered = raw->receive_reply(std::chrono::seconds(60));
  ASSERT_TRUE(unregistered.is_ok()) << unregistered.status().to_string();
  EXPECT_EQ(unregistered->which, wire::Response::UNREGISTER_REGION)
      << unregistered->error.to_string();
}

}  // namespace
}  // namespace kvtier::integration
