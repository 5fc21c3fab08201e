// RemoteWorker (tiers/remote_worker.h) against a Redis Cluster the test starts: its
// completions arrive through the caller's post function, the in-flight bound declines
// what would pass it, and a worker started before the cluster exists answers
// Unavailable at once, says it is degraded, and connects by itself once the cluster is
// up. Every request completes once, even when the worker is destroyed with it queued.
#include "tiers/remote_worker.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "tests/support/inbox.h"
#include "tests/support/redis_cluster.h"

namespace kvtier::remote {
namespace {

using ::kvtier::testing::Inbox;

BlockHash hash_of(uint32_t n) {
  std::array<uint8_t, 4> bytes{};
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<uint8_t>(n >> (8 * i));
  return BlockHash(bytes);
}

std::vector<RemoteWorker::OwnedBlock> blocks(uint32_t n, size_t bytes) {
  std::vector<RemoteWorker::OwnedBlock> out;
  for (uint32_t i = 0; i < n; ++i) {
    out.push_back({{"ns", 9, hash_of(i)}, std::vector<std::byte>(bytes, std::byte(i * 7 + 1))});
  }
  return out;
}

RemoteWorkerOptions options_for(const LocalRedisCluster& redis) {
  RemoteWorkerOptions options;
  options.store.cluster.seeds = redis.seeds();
  options.store.cluster.connect_timeout = milliseconds(300);
  options.reconnect_interval = milliseconds(200);
  return options;
}

TEST(RemoteWorker, WritesAndReadsBackWithCompletionsPostedToTheCaller) {
  LocalRedisCluster redis;
  ASSERT_TRUE(redis.start().is_ok());
  Inbox inbox;
  auto worker = RemoteWorker::start(options_for(redis), inbox.post());
  std::vector<Status> written;
  ASSERT_TRUE(worker->put_blocks(blocks(16, 4096), [&](std::vector<Status> s) { written = s; }));
  ASSERT_TRUE(inbox.run_one());
  ASSERT_EQ(written.size(), 16u);
  for (const Status& s : written) EXPECT_TRUE(s.is_ok()) << s.to_string();

  std::vector<RemoteStore::BlockRead> reads;
  for (uint32_t i = 0; i < 16; ++i) reads.push_back({{"ns", 9, hash_of(i)}, 4096});
  std::vector<Result<std::string>> got;
  ASSERT_TRUE(worker->get_blocks(reads, [&](std::vector<Result<std::string>> g) { got = g; }));
  ASSERT_TRUE(inbox.run_one());
  ASSERT_EQ(got.size(), 16u);
  for (uint32_t i = 0; i < 16; ++i) {
    ASSERT_TRUE(got[i].is_ok()) << got[i].status().to_string();
    EXPECT_EQ(*got[i], std::string(4096, static_cast<char>(i * 7 + 1)));
  }
  Status session = internal_error("not run");
  worker->put_session("ns", "chat", "record", [&](Status s) { session = s; });
  ASSERT_TRUE(inbox.run_one());
  EXPECT_TRUE(session.is_ok()) << session.to_string();
  Result<std::string> record = internal_error("not run");
  worker->get_session("ns", "chat", [&](Result<std::string> r) { record = std::move(r); });
  ASSERT_TRUE(inbox.run_one());
  ASSERT_TRUE(record.is_ok());
  EXPECT_EQ(*record, "record");

  const RemoteWorker::Snapshot s = worker->snapshot();
  EXPECT_TRUE(s.connected);
  EXPECT_FALSE(s.degraded);
  EXPECT_EQ(s.in_flight_bytes, 0u);
  EXPECT_EQ(s.write_lag.count(), 0);
  EXPECT_EQ(s.store.hits, 17u);
  EXPECT_EQ(s.masters, 3u);
}

// get_into: the verified bytes land in the caller's buffers on the worker's thread; a
// missing value is NotFound and leaves its buffer alone; exists_blocks says which are
// there without reading them.
TEST(RemoteWorker, ReadsIntoTheCallersBuffersAndSaysWhatExists) {
  LocalRedisCluster redis;
  ASSERT_TRUE(redis.start().is_ok());
  Inbox inbox;
  auto worker = RemoteWorker::start(options_for(redis), inbox.post());
  ASSERT_TRUE(worker->put_blocks(blocks(3, 4096), [](std::vector<Status>) {}));
  ASSERT_TRUE(inbox.run_one());

  std::vector<std::vector<std::byte>> buffers(4, std::vector<std::byte>(4096, std::byte{0xee}));
  std::vector<RemoteWorker::ReadInto> reads;
  for (uint32_t i = 0; i < 4; ++i) reads.push_back({{"ns", 9, hash_of(i)}, buffers[i]});
  std::vector<Status> statuses;
  ASSERT_TRUE(worker->get_into(reads, [&](std::vector<Status> s) { statuses = std::move(s); }));
  ASSERT_TRUE(inbox.run_one());
  ASSERT_EQ(statuses.size(), 4u);
  for (uint32_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(statuses[i].is_ok()) << statuses[i].to_string();
    EXPECT_EQ(buffers[i], std::vector<std::byte>(4096, std::byte(i * 7 + 1))) << i;
  }
  EXPECT_EQ(statuses[3].code(), StatusCode::kNotFound) << statuses[3].to_string();
  EXPECT_EQ(buffers[3], std::vector<std::byte>(4096, std::byte{0xee}));

  std::vector<Result<bool>> found;
  ASSERT_TRUE(worker->exists_blocks({{"ns", 9, hash_of(0)},
                                     {"ns", 9, hash_of(3)},
                                     {"other-ns", 9, hash_of(0)},
                                     {"ns", 8, hash_of(0)}},
                                    [&](std::vector<Result<bool>> f) { found = std::move(f); }));
  ASSERT_TRUE(inbox.run_one());
  ASSERT_EQ(found.size(), 4u);
  for (auto& f : found) ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_TRUE(*found[0]);
  EXPECT_FALSE(*found[1]);
  EXPECT_FALSE(*found[2]) << "another namespace's key";
  EXPECT_FALSE(*found[3]) << "another layout's key";
}

// A read queued behind writes runs before them: an engine waits on a read. Every
// node is paused (SIGSTOP) while the jobs are queued, so the worker is held inside
// the first write and the order does not depend on how fast the test queues.
TEST(RemoteWorker, AReadGoesAheadOfQueuedWrites) {
  LocalRedisCluster redis;
  ASSERT_TRUE(redis.start().is_ok());
  Inbox inbox;
  RemoteWorkerOptions options = options_for(redis);
  options.store.cluster.command_timeout = milliseconds(20'000);  // outlasts the pause
  auto worker = RemoteWorker::start(options, inbox.post());
  ASSERT_TRUE(worker->put_blocks(blocks(1, 4096), [](std::vector<Status>) {}));
  ASSERT_TRUE(inbox.run_one());
  // Every write's 8 MiB is made before the nodes are paused, so that the pause lasts
  // only as long as queueing takes.
  constexpr int kWrites = 6;
  std::vector<std::vector<RemoteWorker::OwnedBlock>> payloads;
  for (int w = 0; w < kWrites; ++w) {
    auto big = blocks(8, 1 << 20);
    for (auto& b : big)
      b.id.hash = hash_of(100 + static_cast<uint32_t>(w * 8) + b.id.hash.bytes()[0]);
    payloads.push_back(std::move(big));
  }
  for (int port : redis.ports()) redis.pause_node(port, true);
  std::vector<std::string> order;
  auto write = [&](int w) {
    return worker->put_blocks(std::move(payloads[w]), [&order, w](std::vector<Status> s) {
      for (const Status& one : s) EXPECT_TRUE(one.is_ok()) << one.to_string();
      order.push_back("write" + std::to_string(w));
    });
  };
  ASSERT_TRUE(write(0));
  // The worker has taken write 0 and waits on a paused node.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (worker->snapshot().queued != 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(1));
  ASSERT_EQ(worker->snapshot().queued, 0u);
  for (int w = 1; w < kWrites; ++w) ASSERT_TRUE(write(w));
  std::vector<RemoteStore::BlockRead> reads{{{"ns", 9, hash_of(0)}, 4096}};
  ASSERT_TRUE(worker->get_blocks(reads, [&](std::vector<Result<std::string>> got) {
    EXPECT_TRUE(got[0].is_ok());
    order.push_back("read");
  }));
  EXPECT_EQ(worker->snapshot().queued, static_cast<uint64_t>(kWrites));
  for (int port : redis.ports()) redis.pause_node(port, false);
  for (int i = 0; i < kWrites + 1; ++i) ASSERT_TRUE(inbox.run_one(milliseconds(30'000)));
  // The write running when the read came finishes first; the queued writes follow the
  // read, in their own order.
  std::vector<std::string> expected{"write0", "read"};
  for (int w = 1; w < kWrites; ++w) expected.push_back("write" + std::to_string(w));
  EXPECT_EQ(order, expected);
}

TEST(RemoteWorker, DeclinesWhatWouldPassTheInFlightBound) {
  LocalRedisCluster redis;
  ASSERT_TRUE(redis.start().is_ok());
  Inbox inbox;
  RemoteWorkerOptions options = options_for(redis);
  options.max_in_flight_bytes = 64 << 10;
  auto worker = RemoteWorker::start(options, inbox.post());
  bool called = false;
  EXPECT_FALSE(worker->put_blocks(blocks(17, 4096), [&](std::vector<Status>) { called = true; }));
  std::vector<RemoteStore::BlockRead> reads(17, {{"ns", 9, hash_of(0)}, 4096});
  EXPECT_FALSE(worker->get_blocks(reads, [&](std::vector<Result<std::string>>) { called = true; }));
  EXPECT_EQ(worker->snapshot().in_flight_bytes, 0u);
  EXPECT_TRUE(worker->put_blocks(blocks(16, 4096), [&](std::vector<Status>) { called = true; }));
  ASSERT_TRUE(inbox.run_one());
  EXPECT_TRUE(called);
  EXPECT_FALSE(inbox.run_one(milliseconds(200))) << "declined requests complete nothing";
  EXPECT_EQ(worker->snapshot().in_flight_bytes, 0u);
}

TEST(RemoteWorker, WithTheClusterDownFailsFastThenConnectsWhenItComesUp) {
  LocalRedisCluster redis;
  ASSERT_TRUE(redis.choose_ports().is_ok());
  Inbox inbox;
  auto worker = RemoteWorker::start(options_for(redis), inbox.post());
  std::vector<Status> written;
  const auto began = std::chrono::steady_clock::now();
  ASSERT_TRUE(worker->put_blocks(blocks(2, 1024), [&](std::vector<Status> s) { written = s; }));
  ASSERT_TRUE(inbox.run_one());
  EXPECT_LT(std::chrono::steady_clock::now() - began, std::chrono::seconds(3));
  ASSERT_EQ(written.size(), 2u);
  EXPECT_EQ(written[0].code(), StatusCode::kUnavailable) << written[0].to_string();
  EXPECT_FALSE(worker->snapshot().connected);
  EXPECT_TRUE(worker->snapshot().degraded);

  ASSERT_TRUE(redis.start().is_ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!worker->snapshot().connected && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  ASSERT_TRUE(worker->snapshot().connected) << "never connected to the cluster once it was up";
  ASSERT_TRUE(worker->put_blocks(blocks(2, 1024), [&](std::vector<Status> s) { written = s; }));
  ASSERT_TRUE(inbox.run_one());
  EXPECT_TRUE(written[0].is_ok()) << written[0].to_string();
  EXPECT_FALSE(worker->snapshot().degraded);
}

TEST(RemoteWorker, EveryRequestCompletesOnceEvenWhenTheWorkerIsDestroyedWithItQueued) {
  LocalRedisCluster redis;
  ASSERT_TRUE(redis.choose_ports().is_ok());  // never started: every request waits to fail
  Inbox inbox;
  RemoteWorkerOptions options = options_for(redis);
  options.reconnect_interval = milliseconds(60'000);
  int completed = 0;
  {
    auto worker = RemoteWorker::start(options, inbox.post());
    for (int i = 0; i < 5; ++i) {
      worker->put_session("ns", std::to_string(i), "r", [&](Status s) {
        EXPECT_EQ(s.code(), StatusCode::kUnavailable);
        ++completed;
      });
    }
  }
  while (inbox.run_one(milliseconds(100))) {
  }
  EXPECT_EQ(completed, 5);
}

}  // namespace
}  // namespace kvtier::remote
