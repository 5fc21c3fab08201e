// Well-framed but bad requests: each gets an Error reply whose code says what to do
// and whose message names the bad field; the connection and the daemon keep serving.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <array>

#include <cerrno>
#include <cstring>

#include "tests/integration/daemon_harness.h"
#include "tests/integration/raw_connection.h"

namespace kvtier::integration {
namespace {

class BadRequest : public DaemonTest {
 protected:
  // An engine with small blocks, connected, Hello done, region 0 registered.
  Result<Engine> engine() const { return Engine::connect(daemon_->socket_path(), small_shape(8)); }
};

TEST_F(BadRequest, WrongProtocolVersionIsRefusedAndTheConnectionSurvives) {
  auto cache = PagedCache::create(small_shape(8));
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  auto raw = RawConnection::connect(daemon_->socket_path());
  ASSERT_TRUE(raw.is_ok()) << raw.status().to_string();
  auto send_hello = [&](uint64_t id, uint32_t version) {
    return raw->send(id, [&](wire::Request::Builder request) {
      auto hello = request.initHello();
      hello.setProtocolVersion(version);
      hello.setEngineName("engine-from-the-future");
      fill_layout(hello.initLayout(), cache->layout());
    });
  };
  ASSERT_TRUE(send_hello(5, 99).is_ok());
  auto reply = raw->receive_reply();
  ASSERT_TRUE(reply.is_ok()) << reply.status().to_string();
  EXPECT_EQ(reply->id, 5u);
  EXPECT_TRUE(IsError(reply->error, StatusCode::kInvalidArgument, "protocolVersion 99"));

  ASSERT_TRUE(send_hello(6, wire::PROTOCOL_VERSION).is_ok());
  reply = raw->receive_reply();
  ASSERT_TRUE(reply.is_ok()) << reply.status().to_string();
  EXPECT_EQ(reply->id, 6u);
  EXPECT_EQ(reply->which, wire::Response::HELLO) << reply->error.to_string();
  EXPECT_TRUE(ServesSaveAndLoad(*daemon_, "after-bad-version"));
}

TEST_F(BadRequest, RequestIdZeroAndMissingDescriptorsAreRefused) {
  auto raw = RawConnection::connect(daemon_->socket_path());
  ASSERT_TRUE(raw.is_ok()) << raw.status().to_string();
  ASSERT_TRUE(raw->send(0, [](wire::Request::Builder request) { request.initStats(); }).is_ok());
  auto reply = raw->receive_reply();
  ASSERT_TRUE(reply.is_ok()) << reply.status().to_string();
  EXPECT_TRUE(IsError(reply->error, StatusCode::kInvalidArgument, "id 0"));

  auto cache = PagedCache::create(small_shape(8));
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  ASSERT_TRUE(raw->send(1,
                        [&](wire::Request::Builder request) {
                          auto hello = request.initHello();
                          hello.setProtocolVersion(wire::PROTOCOL_VERSION);
                          fill_layout(hello.initLayout(), cache->layout());
                        })
                  .is_ok());
  reply = raw->receive_reply();
  ASSERT_TRUE(reply.is_ok()) << reply.status().to_string();
  ASSERT_EQ(reply->which, wire::Response::HELLO) << reply->error.to_string();
  // fdCount 1, but no descriptor travels with the frame.
  ASSERT_TRUE(raw->send(2,
                        [&](wire::Request::Builder request) {
                          auto region = request.initRegisterRegion();
                          region.setRegionId(0);
                          region.setSizeBytes(cache->region().size_bytes());
                          region.setKind(wire::RegisterRegion::RegionKind::MEMFD);
                          region.setFdCount(1);
                        })
                  .is_ok());
  reply = raw->receive_reply();
  ASSERT_TRUE(reply.is_ok()) << reply.status().to_string();
  EXPECT_EQ(reply->id, 2u);
  EXPECT_TRUE(IsError(reply->error, StatusCode::kInvalidArgument, "descriptors arrived"));
  EXPECT_TRUE(ServesSaveAndLoad(*daemon_, "after-missing-fd"));
}

TEST_F(BadRequest, EngineBlockIdBeyondTheLayoutIsRefused) {
  auto engine = this->engine();
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const auto hashes = PagedCache::chain_hashes("beyond", 4);
  std::vector<BlockRef> refs = Engine::refs(hashes, 0);
  engine->fill(std::span(refs).first(3));
  refs[3].engine_block_id = 8;  // the layout has blocks 0..7
  EXPECT_TRUE(IsError(engine->client->save("beyond", refs, true).status(),
                      StatusCode::kInvalidArgument, "blocks[3].engineBlockId 8"));
  refs[3].engine_block_id = 1'000'000;
  EXPECT_TRUE(IsError(engine->client->load("beyond", refs).status(), StatusCode::kInvalidArgument,
                      "engineBlockId 1000000"));
  // Nothing of the refused save was stored.
  auto found = engine->client->lookup(hashes);
  ASSERT_TRUE(found.is_ok()) << found.status().to_string();
  EXPECT_EQ(found->hit_count, 0u);

  // The same connection still saves and loads.
  refs[3].engine_block_id = 3;
  engine->fill(refs);
  auto saved = engine->client->save("beyond", refs, true);
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  EXPECT_EQ(saved->stored, 4u);
  const auto restored = Engine::refs(hashes, 4);
  auto loaded = engine->client->load("beyond", restored);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(engine->count_verified(restored, loaded->loaded_count), 4u);
}

// Two blocks of one Load restored into the same engine block: the request is refused,
// and the reply must name the field at fault (today it describes the daemon's internal
// copy batch instead: "segment N: destination overlaps segment M").
TEST_F(BadRequest, LoadNamingOneEngineBlockTwiceNamesTheField) {
  auto engine = this->engine();
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const auto hashes = PagedCache::chain_hashes("twice", 2);
  const auto saved = Engine::refs(hashes, 0);
  engine->fill(saved);
  ASSERT_TRUE(engine->client->save("twice", saved, true).is_ok());
  auto refs = Engine::refs(hashes, 4);
  refs[1].engine_block_id = 4;
  EXPECT_TRUE(IsError(engine->client->load("twice", refs).status(), StatusCode::kInvalidArgument,
                      "engineBlockId"));
  // Refused without side effects: no pin or copy is left behind, and the connection
  // still loads.
  auto settled = daemon_->wait_until_settled();
  ASSERT_TRUE(settled.is_ok()) << settled.status().to_string();
  const auto restored = Engine::refs(hashes, 4);
  auto loaded = engine->client->load("twice", restored);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(engine->count_verified(restored, loaded->loaded_count), 2u);
}

TEST_F(BadRequest, PlaneOutsideTheRegionIsRefused) {
  auto cache = PagedCache::create(small_shape(8));
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  LayoutSpec layout = cache->layout();
  // Shift the last plane by one block: its last block ends past the region's end.
  layout.planes.back().offset_bytes += layout.planes.back().stride_bytes;
  const size_t last = layout.planes.size() - 1;
  auto client = daemon_->connect();
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  ASSERT_TRUE((*client)->hello(layout, "misplaced-plane").is_ok());
  Status registered =
      (*client)->register_memfd_region(0, cache->region().fd(), cache->region().size_bytes());
  EXPECT_TRUE(
      IsError(registered, StatusCode::kInvalidArgument, fmt::format("layout.planes[{}]", last)));
  EXPECT_TRUE(IsError(registered, StatusCode::kInvalidArgument, "does not fit region 0"));
  // Without its region the layout cannot move blocks, and says why.
  auto refs = Engine::refs(PagedCache::chain_hashes("misplaced", 1), 0);
  EXPECT_TRUE(IsError((*client)->save("misplaced", refs, true).status(),
                      StatusCode::kInvalidArgument, "not registered"));
  EXPECT_TRUE((*client)->stats().is_ok());
  EXPECT_TRUE(ServesSaveAndLoad(*daemon_, "after-misplaced-plane"));
}

TEST_F(BadRequest, DescriptorThatIsNotAMemfdIsRefused) {
  auto cache = PagedCache::create(small_shape(8));
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  auto client = daemon_->connect();
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  ASSERT_TRUE((*client)->hello(cache->layout(), "wrong-fds").is_ok());
  const uint64_t size = cache->region().size_bytes();

  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  UniqueFd pipe_read(pipe_fds[0]), pipe_write(pipe_fds[1]);
  EXPECT_TRUE(IsError((*client)->register_memfd_region(0, pipe_read.get(), size),
                      StatusCode::kInvalidArgument, "not a memfd"));

  // A regular file of the right size is not shared memory either.
  UniqueFd file(::open(daemon_->dir().c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  ASSERT_TRUE(file.valid()) << std::strerror(errno);
  ASSERT_EQ(::ftruncate(file.get(), static_cast<off_t>(size)), 0);
  EXPECT_TRUE(IsError((*client)->register_memfd_region(0, file.get(), size),
                      StatusCode::kInvalidArgument, "memfd"));

  // Region 0 is still free: the real memfd registers and blocks move through it.
  ASSERT_TRUE((*client)->register_memfd_region(0, cache->region().fd(), size).is_ok());
  auto refs = Engine::refs(PagedCache::chain_hashes("after-wrong-fds", 2), 0);
  for (const BlockRef& ref : refs) cache->fill(ref.engine_block_id, ref.hash);
  auto saved = (*client)->save("after-wrong-fds", refs, true);
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  EXPECT_EQ(saved->stored, 2u);
}

TEST_F(BadRequest, GpuRegionsOnTheHostBackendAreRefused) {
  auto cache = PagedCache::create(small_shape(8));
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  auto client = daemon_->connect();
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  ASSERT_TRUE((*client)->hello(cache->layout(), "gpu-on-host").is_ok());
  const uint64_t size = cache->region().size_bytes();
  std::array<std::byte, 64> handle{};
  EXPECT_TRUE(IsError((*client)->register_cuda_ipc_region(0, handle, 0, size, ""),
                      StatusCode::kNotSupported, "cannot open cuda regions"));
  // A VMM handle travels as an fd; the host backend refuses it and does not keep it.
  const VmmChunkFd chunk{cache->region().fd(), size};
  EXPECT_TRUE(IsError((*client)->register_cuda_vmm_region(0, std::span(&chunk, 1), 0, size, ""),
                      StatusCode::kNotSupported, "cannot open cuda regions"));
  ASSERT_TRUE((*client)->register_memfd_region(0, cache->region().fd(), size).is_ok());
  auto refs = Engine::refs(PagedCache::chain_hashes("after-gpu-regions", 2), 0);
  for (const BlockRef& ref : refs) cache->fill(ref.engine_block_id, ref.hash);
  auto saved = (*client)->save("after-gpu-regions", refs, true);
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  EXPECT_EQ(saved->stored, 2u);
}

TEST_F(BadRequest, MemfdWhoseSizeDiffersFromSizeBytesIsRefused) {
  auto cache = PagedCache::create(small_shape(8));
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  auto client = daemon_->connect();
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  ASSERT_TRUE((*client)->hello(cache->layout(), "wrong-size").is_ok());
  const uint64_t size = cache->region().size_bytes();

  // Announced larger than the memfd really is.
  EXPECT_TRUE(IsError((*client)->register_memfd_region(0, cache->region().fd(), size + 4096),
                      StatusCode::kInvalidArgument, "differs from the memfd's real size"));
  // Announced smaller than a memfd that is larger than the layout needs.
  auto bigger = MemfdRegion::create("bigger", size + 8192);
  ASSERT_TRUE(bigger.is_ok()) << bigger.status().to_string();
  EXPECT_TRUE(IsError((*client)->register_memfd_region(0, bigger->fd(), size),
                      StatusCode::kInvalidArgument, "differs from the memfd's real size"));

  ASSERT_TRUE((*client)->register_memfd_region(0, cache->region().fd(), size).is_ok());
  EXPECT_TRUE(ServesSaveAndLoad(*daemon_, "after-wrong-size"));
}

TEST_F(BadRequest, UnknownSessionIsNotFound) {
  auto engine = this->engine();
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  EXPECT_TRUE(IsError(engine->client->begin_turn("no-such-session").status(), StatusCode::kNotFound,
                      "unknown session 'no-such-session'"));
  EXPECT_TRUE(IsError(engine->client->close_session("no-such-session").status(),
                      StatusCode::kNotFound, "unknown session 'no-such-session'"));

  // The same requests succeed once the session exists, and fail again once closed.
  const auto refs = Engine::refs(PagedCache::chain_hashes("real-session", 3), 0);
  engine->fill(refs);
  ASSERT_TRUE(engine->client->save("real-session", refs, true).is_ok());
  auto begun = engine->client->begin_turn("real-session");
  ASSERT_TRUE(begun.is_ok()) << begun.status().to_string();
  EXPECT_EQ(begun->known_blocks, 3u);
  auto closed = engine->client->close_session("real-session");
  ASSERT_TRUE(closed.is_ok()) << closed.status().to_string();
  EXPECT_EQ(*closed, 3u);
  EXPECT_TRUE(IsError(engine->client->begin_turn("real-session").status(), StatusCode::kNotFound,
                      "unknown session 'real-session'"));
}

TEST_F(BadRequest, SessionOfAnotherLayoutIsRefusedInItsTurnAndReplacedBetweenTurns) {
  auto engine = this->engine();
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const auto refs = Engine::refs(PagedCache::chain_hashes("one-layout", 2), 0);
  engine->fill(refs);
  ASSERT_TRUE(engine->client->save("one-layout", refs, /*end_of_turn=*/false).is_ok());
  PagedCacheShape other_shape = small_shape(8);
  other_shape.model_id = "integration/other-model";
  auto other = Engine::connect(daemon_->socket_path(), other_shape, "other-model");
  ASSERT_TRUE(other.is_ok()) << other.status().to_string();
  other->fill(refs);
  EXPECT_TRUE(IsError(other->client->save("one-layout", refs, true).status(),
                      StatusCode::kInvalidArgument,
                      "belongs to another layout, which is in a turn"));
  EXPECT_TRUE(other->client->save("its-own-session", refs, true).is_ok());
  ASSERT_TRUE(engine->client->save("one-layout", refs, /*end_of_turn=*/true).is_ok());
  EXPECT_TRUE(other->client->save("one-layout", refs, true).is_ok());
}

TEST_F(BadRequest, DuplicateRegionRegistrationIsRefused) {
  auto engine = this->engine();
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const auto& region = engine->cache.region();
  EXPECT_TRUE(IsError(engine->client->register_memfd_region(0, region.fd(), region.size_bytes()),
                      StatusCode::kInvalidArgument, "already registered"));
  EXPECT_TRUE(IsError(engine->client->register_memfd_region(5, region.fd(), region.size_bytes()),
                      StatusCode::kInvalidArgument, "regionId 5 is not named by any plane"));
  // The first registration still stands.
  const auto hashes = PagedCache::chain_hashes("after-duplicate", 2);
  const auto refs = Engine::refs(hashes, 0);
  engine->fill(refs);
  ASSERT_TRUE(engine->client->save("after-duplicate", refs, true).is_ok());
  const auto restored = Engine::refs(hashes, 2);
  auto loaded = engine->client->load("after-duplicate", restored);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(engine->count_verified(restored, loaded->loaded_count), 2u);
}

TEST_F(BadRequest, RequestsBeforeHelloAreRefused) {
  auto client = daemon_->connect();
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  const auto refs = Engine::refs(PagedCache::chain_hashes("early", 2), 0);
  EXPECT_TRUE(IsError((*client)->load("early", refs).status(), StatusCode::kInvalidArgument,
                      "Hello first"));
  EXPECT_TRUE(IsError((*client)->save("early", refs, true).status(), StatusCode::kInvalidArgument,
                      "Hello first"));
  EXPECT_TRUE(IsError((*client)->begin_turn("early").status(), StatusCode::kInvalidArgument,
                      "Hello first"));
  // Stats needs no Hello; a Hello is accepted once, then refused.
  EXPECT_TRUE((*client)->stats().is_ok());
  auto cache = PagedCache::create(small_shape(8));
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  ASSERT_TRUE((*client)->hello(cache->layout(), "late").is_ok());
  EXPECT_TRUE(IsError((*client)->hello(cache->layout(), "late").status(),
                      StatusCode::kInvalidArgument, "already sent"));
  EXPECT_TRUE(ServesSaveAndLoad(*daemon_, "after-early"));
}

}  // namespace
}  // namespace kvtier::integration
