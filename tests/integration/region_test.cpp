// Engine regions on the real daemon: UnregisterRegion replies only once the daemon's
// mapping is closed (after the copies in flight on it), later requests naming the
// region fail clearly, the id can be registered again; Hello must name the daemon's
// backend; RegisterRegion's fields are checked and a refused request with hundreds of
// descriptors leaves none behind in the daemon.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <array>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/integration/daemon_harness.h"
#include "tests/integration/raw_connection.h"

namespace kvtier::integration {
namespace {

ino_t inode_of(int fd) {
  struct stat info {};
  return ::fstat(fd, &info) == 0 ? info.st_ino : 0;
}

// Whether process `pid` maps the file with inode `inode` (a memfd region it opened).
bool maps_inode(pid_t pid, ino_t inode) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream fields(line);
    std::string range, perms, offset, device;
    uint64_t line_inode = 0;
    if (fields >> range >> perms >> offset >> device >> line_inode && line_inode == inode) {
      return true;
    }
  }
  return false;
}

size_t open_fds(pid_t pid) {
  size_t count = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++count;
  }
  return count;
}

// Polls `value` until it equals `expected` or 10 s pass; returns the last value seen.
size_t wait_for_value(const std::function<size_t()>& value, size_t expected) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  size_t seen = value();
  while (seen != expected && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
    seen = value();
  }
  return seen;
}

class Regions : public DaemonTest {};

TEST_F(Regions, UnregisterClosesTheMappingAndTheIdCanBeRegisteredAgain) {
  auto engine = Engine::connect(daemon_->socket_path(), small_shape(8));
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const ino_t region_inode = inode_of(engine->cache.region().fd());
  ASSERT_TRUE(maps_inode(daemon_->pid(), region_inode)) << "the daemon does not map the region";
  const auto hashes = PagedCache::chain_hashes("unregister", 4);
  const auto saved = Engine::refs(hashes, 0);
  engine->fill(saved);
  ASSERT_TRUE(engine->client->save("unregister", saved, true).is_ok());

  ASSERT_TRUE(engine->client->unregister_region(0).is_ok());
  EXPECT_FALSE(maps_inode(daemon_->pid(), region_inode))
      << "the Unregister reply came while the daemon still maps the region";
  // Nothing can move through the region now, and the errors say why.
  EXPECT_TRUE(IsError(engine->client->save("unregister", saved, true).status(),
                      StatusCode::kInvalidArgument, "regionId 0 is not registered"));
  const auto restored = Engine::refs(hashes, 4);
  EXPECT_TRUE(IsError(engine->client->load("unregister", restored).status(),
                      StatusCode::kInvalidArgument, "regionId 0 is not registered"));
  auto found = engine->client->lookup(hashes);  // needs no region
  ASSERT_TRUE(found.is_ok()) << found.status().to_string();
  EXPECT_EQ(found->hit_count, 4u);

  // Registered again, the same id carries blocks both ways.
  ASSERT_TRUE(engine->client
                  ->register_memfd_region(0, engine->cache.region().fd(),
                                          engine->cache.region().size_bytes())
                  .is_ok());
  auto loaded = engine->client->load("unregister", restored);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(engine->count_verified(restored, loaded->loaded_count), 4u);
  const auto more = Engine::refs(PagedCache::chain_hashes("after-reregister", 2), 0);
  engine->fill(more);
  auto stored = engine->client->save("after-reregister", more, true);
  ASSERT_TRUE(stored.is_ok()) << stored.status().to_string();
  EXPECT_EQ(stored->stored, 2u);
}

TEST_F(Regions, UnregisterOfAnUnknownRegionIsNotFound) {
  auto engine = Engine::connect(daemon_->socket_path(), small_shape(8));
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  EXPECT_TRUE(IsError(engine->client->unregister_region(7), StatusCode::kNotFound,
                      "regionId 7 is not registered"));
  ASSERT_TRUE(engine->client->unregister_region(0).is_ok());
  EXPECT_TRUE(IsError(engine->client->unregister_region(0), StatusCode::kNotFound,
                      "regionId 0 is not registered"));
  EXPECT_TRUE(ServesSaveAndLoad(*daemon_, "after-unknown-unregister"));
}

class RegionsWithRoom : public DaemonTest {
 protected:
  std::vector<std::string> daemon_flags() const override {
    return {"--hbm-bytes", "128MiB", "--ram-bytes", "64MiB", "--copy-threads", "2"};
  }
};

// Save (64 MiB) and Unregister pipelined: the Unregister is handled while the Save's copy
// is in flight, and its reply must wait for that copy and the mapping to close.
TEST_F(RegionsWithRoom, UnregisterWaitsForTheSaveInFlight) {
  auto cache = PagedCache::create(example_shape(32));
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  auto raw = RawConnection::connect(daemon_->socket_path());
  ASSERT_TRUE(raw.is_ok()) << raw.status().to_string();
  ASSERT_TRUE(raw->send(1,
                        [&](wire::Request::Builder request) {
                          auto hello = request.initHello();
                          hello.setProtocolVersion(wire::PROTOCOL_VERSION);
                          fill_layout(hello.initLayout(), cache->layout());
                        })
                  .is_ok());
  const int fds[] = {cache->region().fd()};
  ASSERT_TRUE(raw->send(
                     2,
                     [&](wire::Request::Builder request) {
                       auto region = request.initRegisterRegion();
                       region.setRegionId(0);
                       region.setSizeBytes(cache->region().size_bytes());
                       region.setKind(wire::RegisterRegion::RegionKind::MEMFD);
                       region.setFdCount(1);
                     },
                     fds)
                  .is_ok());
  for (uint64_t id : {1, 2}) {
    auto reply = raw->receive_reply();
    ASSERT_TRUE(reply.is_ok()) << reply.status().to_string();
    ASSERT_EQ(reply->id, id);
    ASSERT_TRUE(reply->error.is_ok()) << reply->error.to_string();
  }
  const ino_t region_inode = inode_of(cache->region().fd());
  const auto hashes = PagedCache::chain_hashes("in-flight", 32);
  const auto refs = Engine::refs(hashes, 0);
  for (const BlockRef& ref : refs) cache->fill(ref.engine_block_id, ref.hash);

  ASSERT_TRUE(raw->send(3,
                        [&](wire::Request::Builder request) {
                          fill_save(request, "in-flight", refs, /*end_of_turn=*/true);
                        })
                  .is_ok());
  ASSERT_TRUE(
      raw->send(4, [](wire::Request::Builder request) { request.initUnregisterRegion(); }).is_ok());

  auto first = raw->receive_reply();
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  EXPECT_EQ(first->id, 3u) << "the Unregister was answered before the Save that used the region";
  EXPECT_EQ(first->which, wire::Response::SAVE) << first->error.to_string();
  auto second = raw->receive_reply();
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  EXPECT_EQ(second->id, 4u);
  EXPECT_EQ(second->which, wire::Response::UNREGISTER_REGION) << second->error.to_string();
  EXPECT_FALSE(maps_inode(daemon_->pid(), region_inode));

  // The Save landed in full: another engine loads it bit-exact.
  auto reader = Engine::connect(daemon_->socket_path(), example_shape(32), "reader");
  ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
  auto loaded = reader->client->load("in-flight", refs);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(reader->count_verified(refs, loaded->loaded_count), refs.size());
}

TEST_F(Regions, HelloMustNameTheDaemonsBackend) {
  auto cache = PagedCache::create(small_shape(8));
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  auto client = daemon_->connect();
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  auto refused = (*client)->hello(cache->layout(), "gpu-engine", 0, DeviceKind::kCuda);
  EXPECT_TRUE(IsError(refused.status(), StatusCode::kNotSupported, "runs the host backend"));
  EXPECT_FALSE(refused.status().retryable());
  auto hello = (*client)->hello(cache->layout(), "host-engine", 0, DeviceKind::kHost);
  ASSERT_TRUE(hello.is_ok()) << hello.status().to_string();
  EXPECT_EQ(hello->device_kind, DeviceKind::kHost);
  EXPECT_TRUE(hello->gpu_uuids.empty());
  EXPECT_EQ(hello->device_name, "host");
}

// RegisterRegion requests whose fields contradict each other, sent raw so that any
// field can be set; the connection keeps serving after each.
class RegisterRegionFields : public DaemonTest {
 protected:
  void SetUp() override {
    DaemonTest::SetUp();
    auto cache = PagedCache::create(small_shape(8));
    ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
    cache_ = std::make_unique<PagedCache>(std::move(*cache));
    auto raw = RawConnection::connect(daemon_->socket_path());
    ASSERT_TRUE(raw.is_ok()) << raw.status().to_string();
    raw_ = std::make_unique<RawConnection>(std::move(*raw));
    ASSERT_TRUE(raw_->send(next_id_++,
                           [&](wire::Request::Builder request) {
                             auto hello = request.initHello();
                             hello.setProtocolVersion(wire::PROTOCOL_VERSION);
                             fill_layout(hello.initLayout(), cache_->layout());
                           })
                    .is_ok());
    auto reply = raw_->receive_reply();
    ASSERT_TRUE(reply.is_ok()) << reply.status().to_string();
    ASSERT_TRUE(reply->error.is_ok()) << reply->error.to_string();
  }

  // Sends a RegisterRegion for region 0 of the cache's size with `fd_count` copies of
  // the cache's memfd; `fill` sets the rest. Returns the reply's error (OK for success).
  Status register_region(wire::RegisterRegion::RegionKind kind, size_t fd_count,
                         const std::function<void(wire::RegisterRegion::Builder)>& fill) {
    std::vector<int> fds(fd_count, cache_->region().fd());
    const uint64_t id = next_id_++;
    Status sent = raw_->send(
        id,
        [&](wire::Request::Builder request) {
          auto region = request.initRegisterRegion();
          region.setRegionId(0);
          region.setSizeBytes(cache_->region().size_bytes());
          region.setKind(kind);
          region.setFdCount(static_cast<uint32_t>(fd_count));
          fill(region);
        },
        fds);
    if (!sent.is_ok()) return sent;
    auto reply = raw_->receive_reply();
    if (!reply.is_ok()) return reply.status();
    if (reply->id != id) return internal_error("reply {} to request {}", reply->id, id);
    return reply->error;
  }

  static std::function<void(wire::RegisterRegion::Builder)> chunks(std::vector<uint64_t> sizes,
                                                                   uint64_t offset = 0) {
    return [sizes, offset](wire::RegisterRegion::Builder region) {
      region.setOffsetBytes(offset);
      auto list = region.initChunkBytes(static_cast<unsigned>(sizes.size()));
      for (unsigned i = 0; i < sizes.size(); ++i) list.set(i, sizes[i]);
    };
  }

  std::unique_ptr<PagedCache> cache_;
  std::unique_ptr<RawConnection> raw_;
  uint64_t next_id_ = 1;
};

TEST_F(RegisterRegionFields, EachContradictionIsNamed) {
  using Kind = wire::RegisterRegion::RegionKind;
  const uint64_t size = cache_->region().size_bytes();
  EXPECT_TRUE(IsError(register_region(Kind::CUDA_VMM_FD, 1, chunks({size, size})),
                      StatusCode::kInvalidArgument, "chunkBytes has 2 entries but fdCount is 1"));
  EXPECT_TRUE(IsError(register_region(Kind::CUDA_VMM_FD, 2, chunks({size, 0})),
                      StatusCode::kInvalidArgument, "chunkBytes[1] is 0"));
  EXPECT_TRUE(IsError(register_region(Kind::CUDA_VMM_FD, 2, chunks({1ull << 63, 1ull << 63})),
                      StatusCode::kInvalidArgument, "chunkBytes overflow"));
  EXPECT_TRUE(
      IsError(register_region(Kind::CUDA_VMM_FD, 2, chunks({size / 2, size / 2}, 4096)),
              StatusCode::kInvalidArgument,
              fmt::format("offsetBytes 4096 + sizeBytes {} is beyond the {} bytes", size, size)));
  EXPECT_TRUE(IsError(register_region(Kind::MEMFD, 1, chunks({}, 4096)),
                      StatusCode::kInvalidArgument, "offsetBytes is 4096"));
  EXPECT_TRUE(IsError(register_region(Kind::MEMFD, 1, chunks({size})), StatusCode::kInvalidArgument,
                      "only a cudaVmmFd region has chunks"));
  // Well-formed GPU regions: this daemon runs the host backend, which does not take them.
  EXPECT_TRUE(IsError(register_region(Kind::CUDA_VMM_FD, 2, chunks({size / 2, size / 2})),
                      StatusCode::kNotSupported, "cannot open cuda regions"));
  EXPECT_TRUE(IsError(
      register_region(Kind::CUDA_IPC, 0,
                      [](wire::RegisterRegion::Builder region) {
                        std::array<uint8_t, 64> handle{};
                        region.setIpcHandle(capnp::Data::Reader(handle.data(), handle.size()));
                        region.setGpuUuid("GPU-00000000-0000-0000-0000-000000000000");
                      }),
      StatusCode::kNotSupported, "cannot open cuda regions"));
  // The connection still registers its memfd.
  EXPECT_TRUE(register_region(Kind::MEMFD, 1, chunks({})).is_ok());
}

TEST_F(Regions, ARefusedRequestWithHundredsOfDescriptorsLeavesNoneBehind) {
  auto engine = Engine::connect(daemon_->socket_path(), small_shape(8));
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const pid_t pid = daemon_->pid();
  const size_t fds_before = open_fds(pid);
  ASSERT_GT(fds_before, 0u);
  // 300 descriptors: more than one sendmsg carries.
  const uint64_t chunk_bytes = 2ull << 20;
  std::vector<VmmChunkFd> chunks(300, VmmChunkFd{engine->cache.region().fd(), chunk_bytes});
  EXPECT_TRUE(
      IsError(engine->client->register_cuda_vmm_region(1, chunks, 0, chunk_bytes * 300, "GPU-0"),
              StatusCode::kInvalidArgument, "regionId 1 is not named by any plane"));
  EXPECT_EQ(wait_for_value([&] { return open_fds(pid); }, fds_before), fds_before);
  ASSERT_TRUE(engine->client->unregister_region(0).is_ok());
  const size_t fds_without_region = open_fds(pid);
  EXPECT_TRUE(IsError(engine->client->register_cuda_vmm_region(
                          0, chunks, 0, engine->cache.region().size_bytes(), ""),
                      StatusCode::kNotSupported, "cannot open cuda regions"));
  EXPECT_EQ(wait_for_value([&] { return open_fds(pid); }, fds_without_region), fds_without_region);

  // The connection goes on: the memfd registers and blocks move both ways.
  ASSERT_TRUE(engine->client
                  ->register_memfd_region(0, engine->cache.region().fd(),
                                          engine->cache.region().size_bytes())
                  .is_ok());
  const auto hashes = PagedCache::chain_hashes("after-many-fds", 3);
  const auto saved = Engine::refs(hashes, 0);
  engine->fill(saved);
  ASSERT_TRUE(engine->client->save("after-many-fds", saved, true).is_ok());
  const auto restored = Engine::refs(hashes, 3);
  auto loaded = engine->client->load("after-many-fds", restored);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(engine->count_verified(restored, loaded->loaded_count), 3u);
}

}  // namespace
}  // namespace kvtier::integration
