// Load of a range of planes (schema: Load.planeBegin/planeCount), in the in-process
// daemon (handler_fixture.h): a range fills exactly its planes' bytes and nothing
// else, ranges pipelined over every plane rebuild whole blocks, bad ranges are refused
// naming the fields, the counters count what a layer-wise load did once, and a
// layer's reply comes while the copies of later layers are still held on the device's
// gate (layer-wise pipelining) — from memory tiers and after NVMe reads.
//
// The test shape (integration::small_shape) has 4 layers × {K, V} = 8 planes of 4 KiB.
#include <cstring>
#include <string>
#include <vector>

#include "tests/daemon/handler_fixture.h"

namespace kvtier::daemon {
namespace {

constexpr uint32_t kPlanes = 8;  // small_shape: 4 layers × {K, V}

// The region as it must read after loading `refs` with `range` into a wiped cache:
// zero everywhere except the range's planes of the named blocks, which hold their
// hash-derived content (PagedCache: plane p of block b at (p × num_blocks + b) × plane).
std::vector<std::byte> expected_region(const PagedCache& cache, const std::vector<BlockRef>& refs,
                                       PlaneRange range) {
  const PagedCacheShape& shape = cache.shape();
  std::vector<std::byte> region(shape.region_bytes());
  const uint32_t end = range.count == 0 ? kPlanes : range.begin + range.count;
  for (const BlockRef& ref : refs) {
    for (uint32_t plane = range.begin; plane < end; ++plane) {
      const uint64_t at = (plane * shape.num_blocks + ref.engine_block_id) * shape.plane_bytes();
      PagedCache::generate(ref.hash, plane, region.data() + at, shape.plane_bytes());
    }
  }
  return region;
}

// The region holds exactly `expected`; says where it first differs otherwise.
::testing::AssertionResult RegionIs(const PagedCache& cache,
                                    const std::vector<std::byte>& expected) {
  const std::byte* actual = cache.region().data();
  const uint64_t plane_bytes = cache.shape().plane_bytes();
  const uint64_t num_blocks = cache.shape().num_blocks;
  for (uint64_t at = 0; at < expected.size(); at += plane_bytes) {
    if (std::memcmp(actual + at, expected.data() + at, plane_bytes) != 0) {
      const uint64_t slice = at / plane_bytes;
      bool zero = true;
      for (uint64_t i = 0; i < plane_bytes; ++i) zero = zero && actual[at + i] == std::byte{0};
      return ::testing::AssertionFailure()
             << "plane " << slice / num_blocks << " of engine block " << slice % num_blocks
             << " differs (it reads " << (zero ? "all zero" : "nonzero bytes") << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

class PlaneRangeLoadTest : public HandlerTest {
 protected:
  uint64_t plane_bytes() const { return engine_->cache.shape().plane_bytes(); }
  StatsInfo stats() {
    auto s = wait_until_settled();
    EXPECT_TRUE(s.is_ok()) << s.status().to_string();
    return s.is_ok() ? *s : StatsInfo{};
  }
};

TEST_F(PlaneRangeLoadTest, HelloSaysTheDaemonHonoursPlaneRanges) {
  auto client = daemon_->connect();
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  auto hello = (*client)->hello(engine_->cache.layout(), "hello-check");
  ASSERT_TRUE(hello.is_ok()) << hello.status().to_string();
  EXPECT_TRUE(hello->load_plane_ranges);
}

// One layer's planes land bit-exact in the engine's blocks; every other byte of the
// region (other planes of those blocks, other blocks) stays zero. It copies only the
// range's bytes and counts no lookup hit: that is the range starting at plane 0's job.
TEST_F(PlaneRangeLoadTest, ARangeFillsExactlyItsPlanesAndLeavesEveryOtherByteZero) {
  const auto hashes = save_and_wipe("one-layer", 4);
  const auto refs = Engine::refs(hashes, 8);
  const StatsInfo before = stats();

  auto loaded = engine_->client->load("one-layer", refs, PlaneRange{2, 2});  // layer 1: K, V
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->loaded_count, 4u) << loaded->stop_reason.to_string();
  EXPECT_TRUE(loaded->stop_reason.is_ok()) << loaded->stop_reason.to_string();
  EXPECT_TRUE(RegionIs(engine_->cache, expected_region(engine_->cache, refs, {2, 2})));

  const StatsInfo after = stats();
  EXPECT_EQ(after.bytes_loaded - before.bytes_loaded, 4 * 2 * plane_bytes());
  EXPECT_EQ(after.lookup_hits, before.lookup_hits);
  EXPECT_EQ(after.lookup_misses, before.lookup_misses);

  // The last plane alone, and a range of planes from two layers.
  engine_->cache.wipe();
  ASSERT_TRUE(engine_->client->load("one-layer", refs, PlaneRange{kPlanes - 1, 1}).is_ok());
  EXPECT_TRUE(RegionIs(engine_->cache, expected_region(engine_->cache, refs, {kPlanes - 1, 1})));
  engine_->cache.wipe();
  ASSERT_TRUE(engine_->client->load("one-layer", refs, PlaneRange{1, 3}).is_ok());
  EXPECT_TRUE(RegionIs(engine_->cache, expected_region(engine_->cache, refs, {1, 3})));
}

// Ranges that cover every plane, pipelined and waited for in reverse, rebuild the
// whole blocks. A layer-wise load counts its blocks once — hits and misses from the
// range at plane 0 only — and bytes_loaded once in total, exactly like one whole Load.
TEST_F(PlaneRangeLoadTest, PipelinedRangesOverEveryPlaneRebuildWholeBlocksCountedOnce) {
  const auto held = save_and_wipe("layers", 4);
  const auto asked = PagedCache::chain_hashes("layers", 6);  // two past the held prefix
  const auto refs = Engine::refs(asked, 8);
  const StatsInfo before = stats();
  const double hits_before = metric("kvtier_lookup_hits_by_tier_total{tier=\"hbm\"}");

  const std::vector<PlaneRange> ranges = {{0, 3}, {3, 1}, {4, 2}, {6, 2}};  // uneven on purpose
  std::vector<Pending<LoadResult>> pending;
  for (const PlaneRange& range : ranges)
    pending.push_back(engine_->client->load_async("layers", refs, range));
  for (size_t i = pending.size(); i-- > 0;) {
    auto loaded = pending[i].wait();
    ASSERT_TRUE(loaded.is_ok()) << "range " << i << ": " << loaded.status().to_string();
    EXPECT_EQ(loaded->loaded_count, 4u) << "range " << i;
    EXPECT_TRUE(IsError(loaded->stop_reason, StatusCode::kNotFound, "blocks[4]"));
  }
  EXPECT_EQ(engine_->count_verified(refs, 4), 4u) << "the ranges did not rebuild every block";
  EXPECT_TRUE(RegionIs(engine_->cache,
                       expected_region(engine_->cache, Engine::refs(held, 8), PlaneRange{})));

  const StatsInfo layered = stats();
  EXPECT_EQ(layered.lookup_hits - before.lookup_hits, 4u);
  EXPECT_EQ(layered.lookup_misses - before.lookup_misses, 2u);
  EXPECT_EQ(layered.bytes_loaded - before.bytes_loaded, 4 * block_bytes());
  EXPECT_EQ(metric("kvtier_lookup_hits_by_tier_total{tier=\"hbm\"}") - hits_before, 4);

  // One whole-block Load of the same prefix counts the same.
  engine_->cache.wipe();
  auto whole = engine_->client->load("layers", refs);
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  EXPECT_EQ(whole->loaded_count, 4u);
  const StatsInfo once = stats();
  EXPECT_EQ(once.lookup_hits - layered.lookup_hits, 4u);
  EXPECT_EQ(once.lookup_misses - layered.lookup_misses, 2u);
  EXPECT_EQ(once.bytes_loaded - layered.bytes_loaded, 4 * block_bytes());
  // planeCount 0 with planeBegin 0, said explicitly, is the same whole-block Load.
  engine_->cache.wipe();
  ASSERT_TRUE(engine_->client->load("layers", refs, PlaneRange{0, 0}).is_ok());
  EXPECT_EQ(engine_->count_verified(refs, 4), 4u);
}

// Every bad range is refused before anything is looked up or copied, naming
// planeBegin/planeCount and the layout's plane count; the connection and the daemon
// serve on.
TEST_F(PlaneRangeLoadTest, BadRangesAreRefusedNamingTheFieldsAndThePlaneCount) {
  const auto hashes = save_and_wipe("bad-ranges", 2);
  const auto refs = Engine::refs(hashes, 8);
  const StatsInfo before = stats();
  struct Case {
    PlaneRange range;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{kPlanes, 1}, "planeBegin 8 is past the layout's 8 planes"},
      {{kPlanes, 0}, "planeBegin is 8 with planeCount 0, which means every plane"},
      {{3, 0},
       "planeBegin is 3 with planeCount 0, which means every plane: planeBegin must "
       "then be 0 (the layout has 8 planes)"},
      {{7, 2},
       "planeBegin 7 + planeCount 2 = 9 passes the layout's 8 planes (at most 1 from "
       "planeBegin)"},
      {{0, kPlanes + 1}, "planeBegin 0 + planeCount 9 = 9 passes the layout's 8 planes"},
      // Would wrap in 32 bits: 1 + 0xffffffff = 0.
      {{1, UINT32_MAX}, "planeBegin 1 + planeCount 4294967295 = 4294967296 passes the layout's 8"},
      {{UINT32_MAX, UINT32_MAX}, "planeBegin 4294967295 is past the layout's 8 planes"},
  };
  for (const Case& bad : cases) {
    SCOPED_TRACE(bad.message);
    auto refused = engine_->client->load("bad-ranges", refs, bad.range);
    EXPECT_TRUE(IsError(refused.status(), StatusCode::kInvalidArgument, bad.message));
    EXPECT_FALSE(refused.status().retryable());
  }
  EXPECT_TRUE(
      RegionIs(engine_->cache, std::vector<std::byte>(engine_->cache.shape().region_bytes())))
      << "a refused Load wrote into the engine's blocks";
  const StatsInfo after = stats();
  EXPECT_EQ(after.bytes_loaded, before.bytes_loaded);
  EXPECT_EQ(after.lookup_hits, before.lookup_hits);
  EXPECT_EQ(after.lookup_misses, before.lookup_misses);
  // A block-list error still comes first and names its entry.
  const std::vector<BlockRef> same_target = {{hashes[0], 8}, {hashes[1], 8}};
  auto twice = engine_->client->load("bad-ranges", same_target, PlaneRange{kPlanes, 1});
  EXPECT_TRUE(IsError(twice.status(), StatusCode::kInvalidArgument, "blocks[1].engineBlockId 8"));

  auto good = engine_->client->load("bad-ranges", refs, PlaneRange{kPlanes - 2, 2});
  ASSERT_TRUE(good.is_ok()) << good.status().to_string();
  EXPECT_EQ(good->loaded_count, 2u);
  EXPECT_TRUE(RegionIs(engine_->cache, expected_region(engine_->cache, refs, {kPlanes - 2, 2})));
}

// Layer-wise pipelining: one Load per layer, each copy held on the device's gate. With
// only layer 0's copy let through, layer 0's reply arrives and its bytes are in place
// bit-exact while the Loads of the later layers — the last one included — are still
// unanswered and their planes untouched.
TEST_F(PlaneRangeLoadTest, ALayersReplyComesWhileLaterLayersAreStillCopying) {
  const auto hashes = save_and_wipe("pipelined", 4);
  const auto refs = Engine::refs(hashes, 8);

  daemon_->hold_copies();
  std::vector<Pending<LoadResult>> layers;
  layers.push_back(engine_->client->load_async("pipelined", refs, PlaneRange{0, 2}));
  // The gate releases in submission order: make layer 0's copy the oldest.
  ASSERT_TRUE(daemon_->wait_for_held_copies(1, kDeadline)) << "layer 0's copy never started";
  for (uint32_t layer = 1; layer < kPlanes / 2; ++layer)
    layers.push_back(engine_->client->load_async("pipelined", refs, PlaneRange{2 * layer, 2}));
  ASSERT_TRUE(daemon_->wait_for_held_copies(kPlanes / 2, kDeadline));
  EXPECT_FALSE(layers[0].ready()) << "layer 0 was answered before its copy landed";

  daemon_->release_oldest_copies(1);
  auto first = layers[0].wait();
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  EXPECT_EQ(first->loaded_count, 4u) << first->stop_reason.to_string();
  EXPECT_TRUE(RegionIs(engine_->cache, expected_region(engine_->cache, refs, {0, 2})))
      << "layer 0's bytes are not in place (or a later layer's are) at its reply";
  EXPECT_EQ(daemon_->held_copies(), kPlanes / 2 - 1);
  for (size_t layer = 1; layer < layers.size(); ++layer) {
    EXPECT_FALSE(layers[layer].ready()) << "layer " << layer << " answered with its copy held";
  }

  daemon_->release_copies();
  for (size_t layer = 1; layer < layers.size(); ++layer) {
    auto loaded = layers[layer].wait();
    ASSERT_TRUE(loaded.is_ok()) << "layer " << layer << ": " << loaded.status().to_string();
    EXPECT_EQ(loaded->loaded_count, 4u);
  }
  EXPECT_EQ(engine_->count_verified(refs, refs.size()), refs.size());
}

// After an NVMe read: the blocks of a range Load wait for their read into RAM like a
// whole-block Load's, and then only the range's planes are scattered. Layer-wise Loads
// sent together while the blocks are on NVMe join one read and rebuild the blocks.
class PlaneRangeNvmeLoadTest : public PlaneRangeLoadTest {
 protected:
  DaemonConfig daemon_config() const override { return nvme_below_ram_config(); }
  // Saves `count` blocks of `session`, drains them to NVMe and wipes the cache.
  std::vector<BlockHash> save_to_nvme(const std::string& session, size_t count) {
    auto hashes = save_and_wipe(session, count);
    EXPECT_TRUE(engine_->client->drain().is_ok());
    EXPECT_TRUE(wait_until_in_tier(session, Tier::kNvme, static_cast<uint32_t>(count)).is_ok());
    return hashes;
  }
};

TEST_F(PlaneRangeNvmeLoadTest, ARangeLoadedFromNvmeFillsExactlyItsPlanes) {
  const auto hashes = save_to_nvme("nvme-range", 4);
  const auto refs = Engine::refs(hashes, 8);
  const StatsInfo before = stats();
  auto loaded = engine_->client->load("nvme-range", refs, PlaneRange{4, 2});
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->loaded_count, 4u) << loaded->stop_reason.to_string();
  EXPECT_TRUE(RegionIs(engine_->cache, expected_region(engine_->cache, refs, {4, 2})));
  const StatsInfo after = stats();
  EXPECT_EQ(after.bytes_loaded - before.bytes_loaded, 4 * 2 * plane_bytes());
  EXPECT_EQ(after.lookup_hits, before.lookup_hits);
}

TEST_F(PlaneRangeNvmeLoadTest, LayerWiseLoadsOfBlocksOnNvmeRebuildThem) {
  const auto hashes = save_to_nvme("nvme-layers", 4);
  const auto refs = Engine::refs(hashes, 8);
  const StatsInfo before = stats();
  std::vector<Pending<LoadResult>> layers;
  for (uint32_t layer = 0; layer < kPlanes / 2; ++layer)
    layers.push_back(engine_->client->load_async("nvme-layers", refs, PlaneRange{2 * layer, 2}));
  for (size_t layer = 0; layer < layers.size(); ++layer) {
    auto loaded = layers[layer].wait();
    ASSERT_TRUE(loaded.is_ok()) << "layer " << layer << ": " << loaded.status().to_string();
    EXPECT_EQ(loaded->loaded_count, 4u) << loaded->stop_reason.to_string();
  }
  EXPECT_EQ(engine_->count_verified(refs, refs.size()), refs.size());
  const StatsInfo after = stats();
  EXPECT_EQ(after.lookup_hits - before.lookup_hits, 4u);
  EXPECT_EQ(after.bytes_loaded - before.bytes_loaded, 4 * block_bytes());
}

}  // namespace
}  // namespace kvtier::daemon
