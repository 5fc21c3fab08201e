// The remote tier's store (tiers/remote_store.h, remote_format.h): the value format
// refuses every kind of wrong bytes, and against a real Redis Cluster the test starts:
// blocks and session records round-trip bit-exact, a value corrupted, truncated or
// copied under another key with redis-cli is DataLoss and deleted, namespaces never see
// each other's keys, values expire with the TTL, and the byte budget deletes this
// node's oldest values first.
#include "tiers/remote_store.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "tests/support/redis_cluster.h"
#include "tiers/remote_format.h"

namespace kvtier::remote {
namespace {

BlockHash hash_of(uint32_t n) {
  std::array<uint8_t, 8> bytes{};
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<uint8_t>(n >> (8 * i));
  bytes[7] = 0xB1;
  return BlockHash(bytes);
}

// A block's bytes, derived from its number.
std::vector<std::byte> payload_of(uint32_t n, size_t bytes) {
  std::vector<std::byte> out(bytes);
  uint64_t x = 0x9E3779B97F4A7C15ull * (n + 1);
  for (size_t i = 0; i < bytes; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = static_cast<std::byte>(x);
  }
  return out;
}

std::string as_string(const std::vector<std::byte>& bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

TEST(RemoteFormat, KeysAreUnambiguousAcrossNamespacesAndIds) {
  const BlockHash h = hash_of(1);
  EXPECT_EQ(block_key("uid:1000", 0xabc, h),
            "kvtier:8:uid:1000:b:0000000000000abc:01000000000000b1");
  // A namespace that looks like another's key prefix does not make the same key.
  EXPECT_NE(session_key("a", "b:s:c"), session_key("a:s:b", "c"));
  EXPECT_NE(block_key("a", 1, h), block_key("b", 1, h));
  EXPECT_NE(block_key("a", 1, h), block_key("a", 2, h));
  // Braces in names are escaped: no part of a key becomes a hash tag, so a namespace's
  // blocks spread over every master.
  for (const std::string& key :
       {block_key("{x}", 1, h), session_key("ns{", "id}{y}"), session_key("%7B", "s")}) {
    EXPECT_EQ(key.find_first_of("{}"), std::string::npos) << key;
    EXPECT_EQ(hash_tag(key), key);
  }
  EXPECT_NE(session_key("{", "s"), session_key("%7B", "s"));
}

TEST(RemoteFormat, OnlyTheBytesWrittenUnderTheKeyVerify) {
  const std::string key = block_key("ns", 7, hash_of(3));
  const auto payload = payload_of(3, 4096);
  const std::string value = encode_block_value(key, payload, 1234);
  auto ok = verify_block_value(key, value, 4096);
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(*ok, as_string(payload));

  auto expect_loss = [](const Result<std::string_view>& r, std::string_view says) {
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(r.status().message().find(says), std::string::npos) << r.status().message();
  };
  expect_loss(verify_block_value(key, value.substr(0, value.size() - 1), 4096), "truncated");
  expect_loss(verify_block_value(key, value.substr(0, 10), 4096), "shorter than its header");
  expect_loss(verify_block_value(key, value, 2048), "where its layout has 2048");
  expect_loss(verify_block_value(block_key("ns", 7, hash_of(4)), value, 4096), "another key");
  std::string flipped = value;
  flipped[kRemoteHeaderBytes + 100] ^= 1;
  expect_loss(verify_block_value(key, flipped, 4096), "checksum");
  // Another format version is not corruption: a node of another release wrote it.
  std::string version = value;
  version[4] = 9;
  auto other_release = verify_block_value(key, version, 4096);
  ASSERT_FALSE(other_release.is_ok());
  EXPECT_EQ(other_release.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(other_release.status().message().find("format version 9"), std::string::npos);
  expect_loss(verify_block_value(key, "hello world, not a kvtier value at all!!!!", 0),
              "not a kvtier block");
  // A session value is not a block value, and the other way round.
  const std::string record = encode_session_value(key, "record");
  expect_loss(verify_block_value(key, record, 0), "not a kvtier block");
  EXPECT_FALSE(verify_session_value(key, value).is_ok());
  auto session = verify_session_value(key, record);
  ASSERT_TRUE(session.is_ok());
  EXPECT_EQ(*session, "record");
}

class RemoteStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Status started = redis_.start();
    ASSERT_TRUE(started.is_ok()) << started.to_string();
  }
  std::unique_ptr<RemoteStore> open(uint64_t budget = 64 << 20,
                                    milliseconds ttl = std::chrono::hours(1)) {
    RemoteStoreOptions options;
    options.cluster.seeds = redis_.seeds();
    options.budget_bytes = budget;
    options.ttl = ttl;
    auto store = RemoteStore::open(options);
    EXPECT_TRUE(store.is_ok()) << store.status().to_string();
    return store.is_ok() ? std::move(*store) : nullptr;
  }
  // Writes blocks 0..n-1 of `bytes` each in namespace `ns`.
  void put(RemoteStore& store, const std::string& ns, uint32_t n, size_t bytes,
           uint32_t first = 0) {
    std::vector<std::vector<std::byte>> payloads;
    std::vector<RemoteStore::BlockWrite> writes;
    for (uint32_t i = first; i < first + n; ++i) payloads.push_back(payload_of(i, bytes));
    for (uint32_t i = first; i < first + n; ++i) {
      writes.push_back({{ns, 42, hash_of(i)}, payloads[i - first]});
    }
    for (const Status& s : store.put_blocks(writes)) ASSERT_TRUE(s.is_ok()) << s.to_string();
  }
  Result<std::string> get(RemoteStore& store, const std::string& ns, uint32_t i, size_t bytes) {
    return std::move(store.get_blocks({{{ns, 42, hash_of(i)}, bytes}})[0]);
  }

  LocalRedisCluster redis_;
};

TEST_F(RemoteStoreTest, BlocksAndSessionRecordsRoundTripBitExactFromAnotherStore) {
  auto writer = open();
  ASSERT_NE(writer, nullptr);
  put(*writer, "uid:1000", 64, 16 << 10);
  ASSERT_TRUE(writer->put_session("uid:1000", "chat-1", "a session record").is_ok());
  // Another node: its own store on the same cluster.
  auto reader = open();
  ASSERT_NE(reader, nullptr);
  std::vector<RemoteStore::BlockRead> reads;
  for (uint32_t i = 0; i < 64; ++i) reads.push_back({{"uid:1000", 42, hash_of(i)}, 16 << 10});
  auto got = reader->get_blocks(reads);
  ASSERT_EQ(got.size(), 64u);
  for (uint32_t i = 0; i < 64; ++i) {
    ASSERT_TRUE(got[i].is_ok()) << i << ": " << got[i].status().to_string();
    EXPECT_EQ(*got[i], as_string(payload_of(i, 16 << 10))) << i;
  }
  EXPECT_EQ(reader->stats().hits, 64u);
  auto record = reader->get_session("uid:1000", "chat-1");
  ASSERT_TRUE(record.is_ok()) << record.status().to_string();
  EXPECT_EQ(*record, "a session record");
  EXPECT_EQ(reader->get_session("uid:1000", "chat-2").status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(reader->degraded());
}

TEST_F(RemoteStoreTest, CorruptTruncatedOrMovedValuesAreDataLossAndDeleted) {
  auto store = open();
  ASSERT_NE(store, nullptr);
  put(*store, "ns", 3, 4096);
  const std::string k0 = block_key("ns", 42, hash_of(0));
  const std::string k1 = block_key("ns", 42, hash_of(1));
  const std::string k2 = block_key("ns", 42, hash_of(2));
  const Endpoint& m0 = *store->cluster().slots().master_of(key_slot(k0));
  // Overwritten by hand, as an operator or another program might.
  EXPECT_EQ(redis_.cli(m0.port, {"set", k0, "not kvtier bytes"}), "OK");
  auto raw = store->cluster().command({"GET", k1});
  ASSERT_TRUE(raw.is_ok());
  ASSERT_EQ(raw->kind, Reply::Kind::kString);
  // Block 1's good value copied under block 2's key, then block 1 cut short by a byte.
  ASSERT_TRUE(store->cluster().command({"SET", k2, raw->str}).is_ok());
  ASSERT_TRUE(
      store->cluster().command({"SET", k1, raw->str.substr(0, raw->str.size() - 1)}).is_ok());

  for (uint32_t i = 0; i < 3; ++i) {
    auto r = get(*store, "ns", i, 4096);
    ASSERT_FALSE(r.is_ok()) << i;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().to_string();
  }
  EXPECT_EQ(store->stats().corrupt, 3u);
  // Deleted: every node now misses instead of reading them again.
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(get(*store, "ns", i, 4096).status().code(), StatusCode::kNotFound) << i;
  }
  // A corrupt session record too.
  ASSERT_TRUE(store->put_session("ns", "s", "record").is_ok());
  const std::string sk = session_key("ns", "s");
  ASSERT_TRUE(store->cluster().command({"SET", sk, "garbage"}).is_ok());
  EXPECT_EQ(store->get_session("ns", "s").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(store->get_session("ns", "s").status().code(), StatusCode::kNotFound);
}

// A value of another format version (a node of another release wrote it) is a miss
// here and is left in place, not deleted as corrupt.
TEST_F(RemoteStoreTest, AnotherFormatVersionIsAMissAndIsNotDeleted) {
  auto store = open();
  ASSERT_NE(store, nullptr);
  put(*store, "ns", 1, 1024);
  const std::string key = block_key("ns", 42, hash_of(0));
  auto raw = store->cluster().command({"GET", key});
  ASSERT_TRUE(raw.is_ok());
  std::string newer = raw->str;
  newer[4] = static_cast<char>(kRemoteFormatVersion + 1);
  ASSERT_TRUE(store->cluster().command({"SET", key, newer}).is_ok());
  EXPECT_EQ(get(*store, "ns", 0, 1024).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->stats().corrupt, 0u);
  auto still = store->cluster().command({"GET", key});
  ASSERT_TRUE(still.is_ok());
  EXPECT_EQ(still->str, newer) << "another release's value was deleted";
}

// A master that hangs (SIGSTOP: it accepts connections and answers nothing) costs one
// command timeout, then fails at once for the back-off; the other masters are served
// throughout, and a write whose outcome is unknown stays counted against the budget.
TEST_F(RemoteStoreTest, AHungMasterCostsOneTimeoutThenFailsFast) {
  // The test runs for seconds with the master hung, past the cluster's node timeout:
  // no replica may take its slots over (the write below must still reach the hung
  // master), and the other masters keep serving theirs while a slot has no master
  // that answers.
  for (int port : redis_.ports()) {
    ASSERT_EQ(redis_.cli(port, {"config", "set", "cluster-replica-no-failover", "yes"}), "OK");
    ASSERT_EQ(redis_.cli(port, {"config", "set", "cluster-require-full-coverage", "no"}), "OK");
  }
  constexpr milliseconds kTimeout{1000};
  RemoteStoreOptions options;
  options.cluster.seeds = redis_.seeds();
  options.cluster.connect_timeout = milliseconds(300);
  options.cluster.command_timeout = kTimeout;
  auto opened = RemoteStore::open(options);
  ASSERT_TRUE(opened.is_ok()) << opened.status().to_string();
  RemoteStore& store = **opened;
  put(store, "ns", 32, 1024);
  const std::string key = block_key("ns", 42, hash_of(0));
  const Endpoint hung = *store.cluster().slots().master_of(key_slot(key));
  redis_.pause_node(hung.port, true);
  std::vector<RemoteStore::BlockRead> reads;
  for (uint32_t i = 0; i < 32; ++i) reads.push_back({{"ns", 42, hash_of(i)}, 1024});
  for (int call = 0; call < 4; ++call) {
    const auto began = std::chrono::steady_clock::now();
    auto got = store.get_blocks(reads);
    const auto took = std::chrono::steady_clock::now() - began;
    if (call == 0) {
      // The first call waits out one command timeout (plus a map refresh that skips
      // the hung node), not two.
      EXPECT_GE(took, kTimeout - milliseconds(100)) << "call 0 did not wait for the hung master";
      EXPECT_LT(took, 2 * kTimeout) << "call 0";
    } else {
      // The next ones, inside the back-off, do not wait for the hung master: each
      // takes clearly less than the timeout a call that tried it again would cost.
      EXPECT_LT(took, kTimeout * 7 / 10) << "call " << call;
    }
    EXPECT_TRUE(store.degraded());
    size_t served = 0;
    for (uint32_t i = 0; i < 32; ++i) {
      if (got[i].is_ok()) {
        ++served;
        EXPECT_EQ(*got[i], as_string(payload_of(i, 1024)));
      } else {
        EXPECT_EQ(got[i].status().code(), StatusCode::kUnavailable);
      }
    }
    EXPECT_GT(served, 0u);
    EXPECT_LT(served, 32u);
  }
  // A write to the hung master: its outcome is unknown, so it stays counted.
  const uint64_t before = store.stats().stored_bytes;
  std::this_thread::sleep_for(milliseconds(1100));  // past the back-off: a real attempt
  const auto payload = payload_of(0, 1024);
  const auto statuses = store.put_blocks({{{"ns", 42, hash_of(0)}, payload}});
  EXPECT_EQ(statuses[0].code(), StatusCode::kUnavailable) << statuses[0].to_string();
  EXPECT_EQ(store.stats().stored_bytes, before) << "the rewrite is counted once, not dropped";
  redis_.pause_node(hung.port, false);
}

TEST_F(RemoteStoreTest, NamespacesNeverSeeEachOthersBlocks) {
  auto a = open();
  auto b = open();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  put(*a, "uid:1000", 8, 1024);
  put(*b, "uid:1001", 8, 1024, 100);
  for (uint32_t i = 0; i < 8; ++i) {
    // Same layout digest and hash, other namespace: a miss, never the other's bytes.
    EXPECT_EQ(get(*b, "uid:1001", i, 1024).status().code(), StatusCode::kNotFound) << i;
    EXPECT_EQ(get(*a, "uid:1000", 100 + i, 1024).status().code(), StatusCode::kNotFound) << i;
    auto own = get(*a, "uid:1000", i, 1024);
    ASSERT_TRUE(own.is_ok());
    EXPECT_EQ(*own, as_string(payload_of(i, 1024)));
  }
}

TEST_F(RemoteStoreTest, ValuesExpireWithTheTtl) {
  // A value is written with the store's TTL: checked on a long one, so that the value
  // is surely still there to be read and asked for its PTTL.
  auto lasting = open(64 << 20, std::chrono::seconds(60));
  ASSERT_NE(lasting, nullptr);
  put(*lasting, "ns", 4, 1024);
  ASSERT_TRUE(get(*lasting, "ns", 0, 1024).is_ok());
  const std::string key = block_key("ns", 42, hash_of(1));
  const Endpoint& master = *lasting->cluster().slots().master_of(key_slot(key));
  const int pttl = std::stoi(redis_.cli(master.port, {"pttl", key}));
  EXPECT_GT(pttl, 0);
  EXPECT_LE(pttl, 60'000);

  // With a short TTL the values are gone once it has passed. Redis expires by wall
  // clock: poll for that with a deadline rather than sleeping a fixed time.
  auto brief = open(64 << 20, milliseconds(300));
  ASSERT_NE(brief, nullptr);
  put(*brief, "ns", 4, 1024, 100);
  const std::string brief_key = block_key("ns", 42, hash_of(101));
  const Endpoint& brief_master = *brief->cluster().slots().master_of(key_slot(brief_key));
  // Set with that TTL (-2: expired already; -1 would be a value without one).
  const int brief_pttl = std::stoi(redis_.cli(brief_master.port, {"pttl", brief_key}));
  EXPECT_TRUE(brief_pttl == -2 || (brief_pttl > 0 && brief_pttl <= 300)) << brief_pttl;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    bool all_gone = true;
    for (uint32_t i = 100; i < 104; ++i) {
      all_gone = all_gone && get(*brief, "ns", i, 1024).status().code() == StatusCode::kNotFound;
    }
    if (all_gone || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(milliseconds(20));
  }
  for (uint32_t i = 100; i < 104; ++i) {
    EXPECT_EQ(get(*brief, "ns", i, 1024).status().code(), StatusCode::kNotFound) << i;
  }
  // The values written with the long TTL are still there.
  for (uint32_t i = 0; i < 4; ++i) EXPECT_TRUE(get(*lasting, "ns", i, 1024).is_ok()) << i;
}

TEST_F(RemoteStoreTest, TheBudgetDeletesThisNodesOldestValuesFirst) {
  constexpr size_t kBlock = 1024;
  const uint64_t value_bytes = kBlock + kRemoteHeaderBytes;
  auto store = open(10 * value_bytes);
  ASSERT_NE(store, nullptr);
  for (uint32_t i = 0; i < 25; ++i) put(*store, "ns", 1, kBlock, i);
  EXPECT_EQ(store->stats().stored_bytes, 10 * value_bytes);
  EXPECT_EQ(store->stats().budget_deletes, 15u);
  for (uint32_t i = 0; i < 15; ++i) {
    EXPECT_EQ(get(*store, "ns", i, kBlock).status().code(), StatusCode::kNotFound) << i;
  }
  for (uint32_t i = 15; i < 25; ++i) EXPECT_TRUE(get(*store, "ns", i, kBlock).is_ok()) << i;
  // Writing a block again counts it once.
  put(*store, "ns", 1, kBlock, 24);
  EXPECT_EQ(store->stats().stored_bytes, 10 * value_bytes);
  // One write larger than the budget: the blocks past it are refused, not stored.
  std::vector<std::vector<std::byte>> payloads;
  std::vector<RemoteStore::BlockWrite> writes;
  for (uint32_t i = 0; i < 12; ++i) payloads.push_back(payload_of(100 + i, kBlock));
  for (uint32_t i = 0; i < 12; ++i) writes.push_back({{"ns", 42, hash_of(100 + i)}, payloads[i]});
  const auto statuses = store->put_blocks(writes);
  for (uint32_t i = 0; i < 12; ++i) {
    EXPECT_EQ(statuses[i].is_ok(), i < 10) << i << ": " << statuses[i].to_string();
  }
  EXPECT_EQ(store->stats().stored_bytes, 10 * value_bytes);
}

TEST_F(RemoteStoreTest, AStoppedMasterMakesTheStoreDegradedAndReadsFailFast) {
  auto store = open();
  ASSERT_NE(store, nullptr);
  put(*store, "ns", 32, 1024);
  const std::string key = block_key("ns", 42, hash_of(0));
  const Endpoint master = *store->cluster().slots().master_of(key_slot(key));
  redis_.kill_node(master.port);
  std::vector<RemoteStore::BlockRead> reads;
  for (uint32_t i = 0; i < 32; ++i) reads.push_back({{"ns", 42, hash_of(i)}, 1024});
  const auto began = std::chrono::steady_clock::now();
  auto got = store->get_blocks(reads);
  EXPECT_LT(std::chrono::steady_clock::now() - began, std::chrono::seconds(3));
  EXPECT_TRUE(store->degraded());
  size_t served = 0, unavailable = 0;
  for (uint32_t i = 0; i < 32; ++i) {
    if (got[i].is_ok()) {
      ++served;
      EXPECT_EQ(*got[i], as_string(payload_of(i, 1024))) << i;
    } else {
      EXPECT_EQ(got[i].status().code(), StatusCode::kUnavailable) << got[i].status().to_string();
      ++unavailable;
    }
  }
  EXPECT_GT(served, 0u) << "the other masters' blocks are still served";
  EXPECT_GT(unavailable, 0u);
}

// After the cluster fails the dead master over to its replica, the store finds the new
// master by itself: reads return the right bytes or a miss (a write the replica had not
// received), never wrong bytes and no longer Unavailable, and it is no longer degraded.
TEST_F(RemoteStoreTest, AfterFailoverReadsAreRightBytesOrMissesAndDegradedClears) {
  auto store = open();
  ASSERT_NE(store, nullptr);
  put(*store, "ns", 64, 1024);
  const std::string key = block_key("ns", 42, hash_of(0));
  const Endpoint master = *store->cluster().slots().master_of(key_slot(key));
  redis_.kill_node(master.port);
  const int survivor = master.port == redis_.ports()[0] ? redis_.ports()[1] : redis_.ports()[0];
  std::vector<RemoteStore::BlockRead> reads;
  for (uint32_t i = 0; i < 64; ++i) reads.push_back({{"ns", 42, hash_of(i)}, 1024});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool failed_over = false;
  while (std::chrono::steady_clock::now() < deadline) {
    auto got = store->get_blocks(reads);
    bool all_reachable = true;
    for (uint32_t i = 0; i < 64; ++i) {
      if (got[i].is_ok()) {
        ASSERT_EQ(*got[i], as_string(payload_of(i, 1024))) << "wrong bytes for block " << i;
      } else if (got[i].status().code() == StatusCode::kUnavailable) {
        all_reachable = false;
      } else {
        ASSERT_EQ(got[i].status().code(), StatusCode::kNotFound) << got[i].status().to_string();
      }
    }
    if (all_reachable &&
        redis_.cli(survivor, {"cluster", "info"}).find("cluster_state:ok") != std::string::npos) {
      failed_over = true;
      EXPECT_FALSE(store->degraded());
      EXPECT_FALSE(store->cluster().slots().master_of(key_slot(key)) == nullptr);
      EXPECT_NE(store->cluster().slots().master_of(key_slot(key))->port, master.port);
      break;
    }
    EXPECT_TRUE(store->degraded());
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_TRUE(failed_over) << "the cluster never failed over: "
                           << redis_.cli(survivor, {"cluster", "nodes"})
                           << redis_.cli(survivor, {"cluster", "info"});
}

}  // namespace
}  // namespace kvtier::remote
