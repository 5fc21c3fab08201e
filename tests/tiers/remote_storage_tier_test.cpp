// RemoteStorageTier (tiers/remote_tier.h) against a Redis Cluster the test starts: blocks
// go in and come back by key through the StorageTier interface, probe says which are
// there, a value of another size reads as corrupt, and a batch past the worker's
// in-flight bound is declined by try_write (nothing queued) and answered
// ResourceExhausted by write().
#include "tiers/remote_tier.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <vector>

#include "tests/support/inbox.h"
#include "tests/support/redis_cluster.h"

namespace kvtier {
namespace {

using std::chrono::milliseconds;

using ::kvtier::testing::Inbox;

constexpr LayoutKey kLayout{3, 77};
constexpr uint64_t kBlockBytes = 4096;

BlockKey key_of(uint8_t n) {
  const uint8_t bytes[16] = {n, 1, 2, 3};
  return {kLayout, BlockHash(std::span<const uint8_t>(bytes, sizeof(bytes)))};
}

RemoteStorageTier::Namer namer() {
  return [](const BlockKey& key) {
    return remote::RemoteBlockId{"ns-" + std::to_string(key.layout.namespace_id),
                                 key.layout.layout_digest, key.hash};
  };
}

std::unique_ptr<remote::RemoteWorker> start_worker(const remote::LocalRedisCluster& redis,
                                                   Inbox& inbox, uint64_t max_in_flight_bytes) {
  remote::RemoteWorkerOptions options;
  options.store.cluster.seeds = redis.seeds();
  options.store.cluster.connect_timeout = milliseconds(300);
  options.max_in_flight_bytes = max_in_flight_bytes;
  return remote::RemoteWorker::start(options, inbox.post());
}

TEST(RemoteStorageTier, BlocksGoInAndComeBackByKey) {
  remote::LocalRedisCluster redis;
  ASSERT_TRUE(redis.start().is_ok());
  Inbox inbox;
  auto worker = start_worker(redis, inbox, 1 << 20);
  RemoteStorageTier tier(*worker, namer(), 1 << 30);
  EXPECT_EQ(tier.id(), Tier::kRemote);
  EXPECT_TRUE(tier.key_addressed());
  EXPECT_EQ(tier.capacity_bytes(), 1u << 30);

  std::vector<std::vector<std::byte>> sources;
  std::vector<StorageTier::WriteItem> writes;
  for (uint8_t n = 0; n < 4; ++n) {
    sources.emplace_back(kBlockBytes, std::byte(n * 11 + 5));
    writes.push_back({{key_of(n), 0, kBlockBytes}, sources.back().data(), 0});
  }
  std::vector<Status> written;
  tier.write(writes, [&](std::vector<Status> s) { written = std::move(s); });
  ASSERT_TRUE(inbox.run_one());
  ASSERT_EQ(written.size(), 4u);
  for (const Status& s : written) EXPECT_TRUE(s.is_ok()) << s.to_string();

  // Blocks 0..3 were written, 9 was not; 2 is read with another size (it does not verify).
  std::vector<std::vector<std::byte>> into(4, std::vector<std::byte>(kBlockBytes, std::byte{0}));
  std::vector<StorageTier::ReadItem> reads = {{{key_of(0), 0, kBlockBytes}, into[0].data()},
                                              {{key_of(3), 0, kBlockBytes}, into[1].data()},
                                              {{key_of(9), 0, kBlockBytes}, into[2].data()},
                                              {{key_of(2), 0, kBlockBytes / 2}, into[3].data()}};
  std::vector<StorageTier::ReadOutcome> outcomes;
  ASSERT_TRUE(tier.try_read(
      reads, [&](std::vector<StorageTier::ReadOutcome> o) { outcomes = std::move(o); }));
  ASSERT_TRUE(inbox.run_one());
  ASSERT_EQ(outcomes.size(), 4u);
  ASSERT_TRUE(outcomes[0].status.is_ok()) << outcomes[0].status.to_string();
  EXPECT_EQ(into[0], sources[0]);
  ASSERT_TRUE(outcomes[1].status.is_ok()) << outcomes[1].status.to_string();
  EXPECT_EQ(into[1], sources[3]);
  EXPECT_EQ(outcomes[2].status.code(), StatusCode::kNotFound);
  EXPECT_FALSE(outcomes[2].corrupt);
  EXPECT_EQ(outcomes[3].status.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(outcomes[3].corrupt);

  std::vector<Result<bool>> found;
  tier.probe({{key_of(1), 0, 0}, {key_of(9), 0, 0}},
             [&](std::vector<Result<bool>> f) { found = std::move(f); });
  ASSERT_TRUE(inbox.run_one());
  ASSERT_EQ(found.size(), 2u);
  ASSERT_TRUE(found[0].is_ok() && found[1].is_ok());
  EXPECT_TRUE(*found[0]);
  EXPECT_FALSE(*found[1]);
}

TEST(RemoteStorageTier, ABatchPastTheInFlightBoundIsDeclined) {
  remote::LocalRedisCluster redis;
  ASSERT_TRUE(redis.start().is_ok());
  Inbox inbox;
  auto worker = start_worker(redis, inbox, kBlockBytes);  // one block in flight at most
  RemoteStorageTier tier(*worker, namer(), 1 << 30);
  std::vector<std::byte> source(kBlockBytes, std::byte{7});
  const std::vector<StorageTier::WriteItem> two = {{{key_of(1), 0, kBlockBytes}, source.data(), 0},
                                                   {{key_of(2), 0, kBlockBytes}, source.data(), 0}};
  bool ran = false;
  EXPECT_FALSE(tier.try_write(two, [&](std::vector<Status>) { ran = true; }));
  std::vector<Status> answered;
  tier.write(two, [&](std::vector<Status> s) { answered = std::move(s); });
  ASSERT_EQ(answered.size(), 2u);  // at once, on this thread
  for (const Status& s : answered) EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  // One block fits. The worker answers in order, so once its answer is in, a declined
  // batch that had been queued after all would have answered already.
  std::vector<Status> one;
  EXPECT_TRUE(tier.try_write({two[0]}, [&](std::vector<Status> s) { one = std::move(s); }));
  ASSERT_TRUE(inbox.run_one());
  EXPECT_FALSE(ran);  // nothing was queued for the declined batch
  EXPECT_EQ(inbox.pending(), 0u);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_TRUE(one[0].is_ok()) << one[0].to_string();
}

}  // namespace
}  // namespace kvtier
