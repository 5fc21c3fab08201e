// The per-connection request handlers in the in-process daemon (handler_fixture.h):
// Hello (and what a connection may do before it), RegisterRegion and UnregisterRegion,
// each asserted through what the connection can do afterwards, not only through the
// handler's own reply.
#include <functional>
#include <string>
#include <vector>

#include "tests/daemon/handler_fixture.h"
#include "tests/integration/raw_connection.h"

namespace kvtier::daemon {
namespace {

using integration::RawConnection;

// --- Hello ---------------------------------------------------------------------------

TEST_F(HandlerTest, HelloWithAnotherProtocolVersionIsRefusedAndTheConnectionMayRetry) {
  auto raw = RawConnection::connect(daemon_->socket_path());
  ASSERT_TRUE(raw.is_ok()) << raw.status().to_string();
  const LayoutSpec layout = engine_->cache.layout();
  auto hello = [&](uint64_t id, uint32_t version) {
    return raw->send(id, [&](wire::Request::Builder request) {
      auto out = request.initHello();
      out.setProtocolVersion(version);
      integration::fill_layout(out.initLayout(), layout);
      out.setEngineName("version-test");
    });
  };
  ASSERT_TRUE(hello(1, wire::PROTOCOL_VERSION + 1).is_ok());
  auto refused = raw->receive_reply();
  ASSERT_TRUE(refused.is_ok()) << refused.status().to_string();
  EXPECT_EQ(refused->id, 1u);
  EXPECT_TRUE(IsError(refused->error, StatusCode::kInvalidArgument,
                      fmt::format("protocolVersion {} is not supported; this daemon speaks "
                                  "version {}",
                                  wire::PROTOCOL_VERSION + 1, wire::PROTOCOL_VERSION)));
  // Version 0 (a client that never set the field) likewise.
  ASSERT_TRUE(hello(2, 0).is_ok());
  refused = raw->receive_reply();
  ASSERT_TRUE(refused.is_ok()) << refused.status().to_string();
  EXPECT_TRUE(IsError(refused->error, StatusCode::kInvalidArgument, "protocolVersion 0"));

  // The refusals declared nothing: the connection may say Hello again, correctly.
  ASSERT_TRUE(hello(3, wire::PROTOCOL_VERSION).is_ok());
  auto accepted = raw->receive_reply();
  ASSERT_TRUE(accepted.is_ok()) << accepted.status().to_string();
  EXPECT_EQ(accepted->id, 3u);
  EXPECT_TRUE(accepted->error.is_ok()) << accepted->error.to_string();
  EXPECT_EQ(accepted->which, wire::Response::HELLO);
}

TEST_F(HandlerTest, HelloWithABadLayoutIsRefusedNamingTheFieldAndLeavesNoState) {
  const LayoutSpec good = engine_->cache.layout();
  ASSERT_GE(good.planes.size(), 3u);
  struct Case {
    std::string fragment;
    std::function<void(LayoutSpec&)> spoil;
  };
  const uint64_t slab_bytes = daemon_->config().slab_bytes;
  const std::vector<Case> cases = {
      {"layout.modelId is empty", [](LayoutSpec& l) { l.model_id.clear(); }},
      {"layout.modelId is longer than 256 bytes",
       [](LayoutSpec& l) { l.model_id = std::string(257, 'm'); }},
      {"layout.dtype is longer than 32 bytes",
       [](LayoutSpec& l) { l.dtype = std::string(33, 'd'); }},
      {"layout.extraKey is longer than 256 bytes",
       [](LayoutSpec& l) { l.extra_key = std::string(257, 'x'); }},
      {"layout.numBlocks 0 is outside", [](LayoutSpec& l) { l.num_blocks = 0; }},
      {"layout.tpRank 2 is not below layout.tpSize 2",
       [](LayoutSpec& l) {
         l.tp_rank = 2;
         l.tp_size = 2;
       }},
      {"layout.tpRank 0 is not below layout.tpSize 0", [](LayoutSpec& l) { l.tp_size = 0; }},
      {"layout.planes has 0 entries", [](LayoutSpec& l) { l.planes.clear(); }},
      {"layout.planes[1].bytesPerBlock is 0",
       [](LayoutSpec& l) { l.planes[1].bytes_per_block = 0; }},
      {"layout.planes[2].strideBytes",
       [](LayoutSpec& l) { l.planes[2].stride_bytes = l.planes[2].bytes_per_block - 1; }},
      {fmt::format("layout blocks exceed the largest block size of {} bytes (at planes[0])",
                   slab_bytes),
       [slab_bytes](LayoutSpec& l) {
         l.planes[0].bytes_per_block = slab_bytes + 1;
         l.planes[0].stride_bytes = slab_bytes + 1;
       }},
  };
  auto client = daemon_->connect();
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fragment);
    LayoutSpec bad = good;
    c.spoil(bad);
    auto refused = (*client)->hello(bad, "bad-layout");
    EXPECT_TRUE(IsError(refused.status(), StatusCode::kInvalidArgument, c.fragment));
    EXPECT_FALSE(refused.status().retryable());
  }
  auto long_name = (*client)->hello(good, std::string(129, 'n'));
  EXPECT_TRUE(IsError(long_name.status(), StatusCode::kInvalidArgument,
                      "engineName is longer than 128 bytes"));
  auto wrong_backend = (*client)->hello(good, "gpu-engine", 0, DeviceKind::kCuda);
  EXPECT_TRUE(IsError(wrong_backend.status(), StatusCode::kNotSupported,
                      "deviceKind cuda: this kvtierd runs the host backend"));

  // None of the refusals counted as the connection's Hello: it says one now and serves.
  auto hello = (*client)->hello(good, "good-layout");
  ASSERT_TRUE(hello.is_ok()) << hello.status().to_string();
  EXPECT_EQ(hello->layout_digest, engine_->hello.layout_digest);
  EXPECT_EQ(hello->block_bytes, engine_->hello.block_bytes);
  EXPECT_EQ(hello->namespace_name, engine_->hello.namespace_name);
  auto cache = PagedCache::create(shape());
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  Engine late{std::move(*client), std::move(*cache), *hello};
  ASSERT_TRUE(late.client
                  ->register_memfd_region(late.cache.region_id(), late.cache.region().fd(),
                                          late.cache.region().size_bytes())
                  .is_ok());
  auto saved = save(late, "after-bad-hellos", 4);
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  EXPECT_EQ(saved->stored, 4u);
}

TEST_F(HandlerTest, SecondHelloIsRefusedAndTheFirstLayoutStays) {
  PagedCacheShape other_shape = shape();
  other_shape.model_id = "integration/another-model";
  auto other = PagedCache::create(other_shape);
  ASSERT_TRUE(other.is_ok()) << other.status().to_string();
  for (const LayoutSpec& layout : {engine_->cache.layout(), other->layout()}) {
    auto again = engine_->client->hello(layout, "second-hello");
    EXPECT_TRUE(IsError(again.status(), StatusCode::kInvalidArgument,
                        "Hello was already sent on this connection"));
  }
  // Still the first layout: its blocks save and load bit-exact, and a Lookup in the
  // other model's layout (another digest) would not find them from here anyway.
  auto saved = save(*engine_, "first-layout", 4);
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  auto loaded = load(*engine_, "first-layout", PagedCache::chain_hashes("first-layout", 4), 8);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->reply.loaded_count, 4u);
  EXPECT_EQ(loaded->verified, 4u);
  auto session = engine_->client->get_session("first-layout");
  ASSERT_TRUE(session.is_ok()) << session.status().to_string();
  EXPECT_EQ(session->layout_digest, engine_->hello.layout_digest);
}

TEST_F(HandlerTest, EngineRequestsBeforeHelloAreRefusedButStatsIsServed) {
  auto client = daemon_->connect();
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  const auto hashes = PagedCache::chain_hashes("no-hello", 2);
  const auto refs = Engine::refs(hashes, 0);
  constexpr std::string_view kHelloFirst = "send Hello first";
  EXPECT_TRUE(IsError((*client)->save("no-hello", refs, true).status(),
                      StatusCode::kInvalidArgument, kHelloFirst));
  EXPECT_TRUE(
      IsError((*client)->lookup(hashes).status(), StatusCode::kInvalidArgument, kHelloFirst));
  EXPECT_TRUE(IsError((*client)->load("no-hello", refs).status(), StatusCode::kInvalidArgument,
                      kHelloFirst));
  EXPECT_TRUE(IsError((*client)->begin_turn("no-hello").status(), StatusCode::kInvalidArgument,
                      kHelloFirst));
  EXPECT_TRUE(IsError((*client)->close_session("no-hello").status(), StatusCode::kInvalidArgument,
                      kHelloFirst));
  EXPECT_TRUE(IsError((*client)->register_memfd_region(0, engine_->cache.region().fd(),
                                                       engine_->cache.region().size_bytes()),
                      StatusCode::kInvalidArgument, kHelloFirst));
  EXPECT_TRUE(IsError((*client)->unregister_region(0), StatusCode::kInvalidArgument, kHelloFirst));
  auto stats = (*client)->stats();
  EXPECT_TRUE(stats.is_ok()) << stats.status().to_string();
}

// --- RegisterRegion / UnregisterRegion -------------------------------------------------

TEST_F(HandlerTest, RegisterRegionChecksTheRequestAgainstTheLayoutAndTheMemfd) {
  auto cache = PagedCache::create(shape());
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  auto client = daemon_->connect();
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  auto hello = (*client)->hello(cache->layout(), "region-checks");
  ASSERT_TRUE(hello.is_ok()) << hello.status().to_string();
  const auto& region = cache->region();

  EXPECT_TRUE(IsError((*client)->register_memfd_region(7, region.fd(), region.size_bytes()),
                      StatusCode::kInvalidArgument,
                      "regionId 7 is not named by any plane of the layout"));
  EXPECT_TRUE(IsError((*client)->register_memfd_region(0, region.fd(), 0),
                      StatusCode::kInvalidArgument, "sizeBytes 0 is outside"));
  // A memfd half the size the layout needs: the first plane that does not fit is named.
  PagedCacheShape half = shape();
  half.num_blocks /= 2;
  auto small = PagedCache::create(half);
  ASSERT_TRUE(small.is_ok()) << small.status().to_string();
  const uint64_t plane_span = shape().num_blocks * shape().plane_bytes();
  const uint64_t first_outside = small->region().size_bytes() / plane_span;
  EXPECT_TRUE(IsError(
      (*client)->register_memfd_region(0, small->region().fd(), small->region().size_bytes()),
      StatusCode::kInvalidArgument,
      fmt::format("layout.planes[{}] does not fit region 0", first_outside)));
  // A size that is not the memfd's: the device refuses to open it.
  EXPECT_TRUE(IsError((*client)->register_memfd_region(0, region.fd(), region.size_bytes() * 2),
                      StatusCode::kInvalidArgument, "differs from the memfd's real size"));

  // None of that registered anything: the right request does, once.
  ASSERT_TRUE((*client)->register_memfd_region(0, region.fd(), region.size_bytes()).is_ok());
  EXPECT_TRUE(IsError((*client)->register_memfd_region(0, region.fd(), region.size_bytes()),
                      StatusCode::kInvalidArgument,
                      "regionId 0 is already registered on this connection"));
  Engine registered{std::move(*client), std::move(*cache), *hello};
  auto saved = save(registered, "registered-once", 4);
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  EXPECT_EQ(saved->stored, 4u);
  auto loaded =
      load(registered, "registered-once", PagedCache::chain_hashes("registered-once", 4), 8);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->verified, 4u);
}

TEST_F(HandlerTest, UnregisterRegionOfAnUnknownRegionIsNotFoundAndUnregisteredRegionsRefuseCopies) {
  EXPECT_TRUE(IsError(engine_->client->unregister_region(5), StatusCode::kNotFound,
                      "regionId 5 is not registered on this connection"));
  const uint32_t region_id = engine_->cache.region_id();
  // Another connection's registration of the same id is not this one's.
  auto other = daemon_->connect();
  ASSERT_TRUE(other.is_ok()) << other.status().to_string();
  ASSERT_TRUE((*other)->hello(engine_->cache.layout(), "other").is_ok());
  EXPECT_TRUE(IsError((*other)->unregister_region(region_id), StatusCode::kNotFound,
                      fmt::format("regionId {} is not registered", region_id)));

  auto unregistered = engine_->client->unregister_region_async(region_id).wait();
  ASSERT_TRUE(unregistered.is_ok()) << unregistered.status().to_string();
  EXPECT_EQ(*unregistered, region_id);
  EXPECT_TRUE(IsError(engine_->client->unregister_region(region_id), StatusCode::kNotFound,
                      "is not registered on this connection"));
  const std::string not_registered =
      fmt::format("regionId {} is not registered (layout.planes[0] names it)", region_id);
  EXPECT_TRUE(IsError(save(*engine_, "unregistered", 2).status(), StatusCode::kInvalidArgument,
                      not_registered));
  EXPECT_TRUE(IsError(
      engine_->client
          ->load("unregistered", Engine::refs(PagedCache::chain_hashes("unregistered", 2), 0))
          .status(),
      StatusCode::kInvalidArgument, not_registered));

  // Registered again, the id serves again.
  ASSERT_TRUE(engine_->client
                  ->register_memfd_region(region_id, engine_->cache.region().fd(),
                                          engine_->cache.region().size_bytes())
                  .is_ok());
  auto saved = save(*engine_, "registered-again", 4);
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  EXPECT_EQ(saved->stored, 4u);
}

// The Load's copy is held in flight by the device's gate while the engine unregisters
// the region it is copying into: the reply must wait for the copy (after the reply the
// engine may free the memory the daemon is still writing).
TEST_F(HandlerTest, UnregisterWhileALoadCopiesIntoTheRegionRepliesOnlyAfterTheCopyFinished) {
  const std::string session = "unregister-under-load";
  auto saved = save(*engine_, session, 4);
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  ASSERT_TRUE(wait_until_settled().is_ok());
  const auto hashes = PagedCache::chain_hashes(session, 4);
  const auto refs = Engine::refs(hashes, 8);
  const uint32_t region_id = engine_->cache.region_id();
  engine_->cache.wipe();

  daemon_->hold_copies();
  auto load = engine_->client->load_async(session, refs);
  ASSERT_TRUE(daemon_->wait_for_held_copies(1, kDeadline)) << "the Load's copy never started";
  auto unregister = engine_->client->unregister_region_async(region_id);
  // One control thread serves a connection's requests in order: once this Lookup is
  // answered, the Unregister before it has been handled.
  auto lookup = engine_->client->lookup(hashes);
  ASSERT_TRUE(lookup.is_ok()) << lookup.status().to_string();
  EXPECT_EQ(lookup->hit_count, 4u);
  EXPECT_FALSE(unregister.ready())
      << "UnregisterRegion was answered while a Load was still copying into the region";
  EXPECT_FALSE(load.ready());
  // The region already left the connection: nothing new may start on it.
  EXPECT_TRUE(IsError(save(*engine_, "during-unregister", 1).status(), StatusCode::kInvalidArgument,
                      fmt::format("regionId {} is not registered", region_id)));
  EXPECT_EQ(engine_->count_verified(refs, 4), 0u) << "the held copy ran";

  daemon_->release_copies();
  auto unregistered = unregister.wait();
  ASSERT_TRUE(unregistered.is_ok()) << unregistered.status().to_string();
  EXPECT_EQ(*unregistered, region_id);
  // The Load's reply came first, and its bytes were in the engine's memory by then.
  EXPECT_TRUE(load.ready()) << "UnregisterRegion was answered before the Load using the region";
  EXPECT_EQ(engine_->count_verified(refs, 4), 4u);
  auto loaded = load.wait();
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->loaded_count, 4u);
  auto stats = wait_until_settled();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->bytes_loaded, 4 * block_bytes());
}

}  // namespace
}  // namespace kvtier::daemon
