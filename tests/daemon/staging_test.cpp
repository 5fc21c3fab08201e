// Staged Saves and Loads (schema: Staging), in the in-process daemon (handler_fixture.h).
// A staging engine packs blocks on its CPU into a memfd staging region it registers
// (Hello.dataPath stagingHost; no region of its layout registered): what kvtierd stores
// from the packed rows is what a plane-copying engine loads into its paged cache, and
// the other way round, bit-exact; a staged Load of a plane range packs just that range;
// bad staging is refused naming the field; staging regions need a staging data path.
//
// The test shape (integration::small_shape) has 4 layers × {K, V} = 8 planes of 4 KiB.
#include <cstring>
#include <string>
#include <vector>

#include "client/memfd_region.h"
#include "tests/daemon/handler_fixture.h"

namespace kvtier::daemon {
namespace {

constexpr uint32_t kPlanes = 8;
constexpr uint32_t kStagingRegion = 9;  // no plane of the layout names it

template <typename T>
Status status_of(const Result<T>& result) {
  return result.status();
}
Status status_of(const Status& status) {
  return status;
}

class StagingTest : public HandlerTest {
 protected:
  void SetUp() override {
    HandlerTest::SetUp();
    auto client = daemon_->connect();
    ASSERT_TRUE(client.is_ok()) << client.status().to_string();
    stager_ = std::move(*client);
    auto hello = stager_->hello(engine_->cache.layout(), "staging-engine", 0, DeviceKind::kHost,
                                DataPath::kStagingHost);
    ASSERT_TRUE(hello.is_ok()) << hello.status().to_string();
    hello_ = *hello;
    auto region = MemfdRegion::create("staging", staging_blocks_ * block_bytes());
    ASSERT_TRUE(region.is_ok()) << region.status().to_string();
    staging_ = std::make_unique<MemfdRegion>(std::move(*region));
    Status registered =
        stager_->register_memfd_region(kStagingRegion, staging_->fd(), staging_->size_bytes());
    ASSERT_TRUE(registered.is_ok()) << registered.to_string();
  }

  uint64_t plane_bytes() const { return engine_->cache.shape().plane_bytes(); }
  // Block `hash`'s planes [begin, begin + count) packed, as kvtierd stores them.
  std::vector<std::byte> packed(const BlockHash& hash, uint32_t begin, uint32_t count) const {
    std::vector<std::byte> row(count * plane_bytes());
    for (uint32_t p = 0; p < count; ++p)
      PagedCache::generate(hash, begin + p, row.data() + p * plane_bytes(), plane_bytes());
    return row;
  }
  // Packs `hashes` into the staging region from `offset`, whole blocks.
  void stage(const std::vector<BlockHash>& hashes, uint64_t offset) {
    for (size_t i = 0; i < hashes.size(); ++i) {
      auto row = packed(hashes[i], 0, kPlanes);
      std::memcpy(staging_->data() + offset + i * block_bytes(), row.data(), row.size());
    }
  }
  // Refs whose engine block ids are nonsense: a staged request must not use them.
  static std::vector<BlockRef> unused_ids(const std::vector<BlockHash>& hashes) {
    std::vector<BlockRef> refs;
    for (const BlockHash& hash : hashes) refs.push_back({hash, uint64_t{1} << 40});
    return refs;
  }

  const uint64_t staging_blocks_ = 8;
  std::unique_ptr<Client> stager_;
  HelloInfo hello_;
  std::unique_ptr<MemfdRegion> staging_;
};

TEST_F(StagingTest, HelloSaysTheDaemonHonoursStagingAndDigestsMatchThePlaneEngine) {
  EXPECT_TRUE(hello_.staging);
  EXPECT_EQ(hello_.layout_digest, engine_->hello.layout_digest);
}

// Packed rows saved from staging load bit-exact into a plane-copying engine's cache.
TEST_F(StagingTest, AStagedSaveStoresWhatAPlaneEngineLoads) {
  const auto hashes = PagedCache::chain_hashes("staged-save", 5);
  const uint64_t offset = 3 * block_bytes() / 2;  // not a multiple of the block size
  stage(hashes, offset);
  SaveOptions options;
  options.staging = StagingRef{kStagingRegion, offset};
  auto saved = stager_->save("staged-save", unused_ids(hashes), true, options);
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  EXPECT_EQ(saved->stored, 5u);
  ASSERT_TRUE(wait_until_settled().is_ok());
  auto loaded = load(*engine_, "staged-save", hashes, /*first_block_id=*/3);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->reply.loaded_count, 5u);
  EXPECT_EQ(loaded->verified, 5u);
  // The metrics tell the paths apart: this engine said it stages; one staged request.
  EXPECT_EQ(metric("kvtier_staged_requests_total{kind=\"save\"}"), 1);
  EXPECT_EQ(metric("kvtier_staged_requests_total{kind=\"load\"}"), 0);
  EXPECT_EQ(metric("kvtier_hellos_total{data_path=\"stagingHost\"}"), 1);
  EXPECT_GE(metric("kvtier_hellos_total{data_path=\"planeCopies\"}"), 1);
}

// A plane engine's blocks load packed into staging: whole blocks, then one layer's
// range, each row at its place and nothing written past the rows.
TEST_F(StagingTest, AStagedLoadPacksWholeBlocksOrOnePlaneRange) {
  const auto hashes = save_and_wipe("staged-load", 4);
  std::memset(staging_->data(), 0x5a, staging_->size_bytes());
  auto whole = stager_
                   ->load_async("staged-load", unused_ids(hashes), {},
                                StagingRef{kStagingRegion, block_bytes()})
                   .wait();
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  ASSERT_EQ(whole->loaded_count, 4u);
  for (size_t i = 0; i < 4; ++i) {
    auto row = packed(hashes[i], 0, kPlanes);
    EXPECT_EQ(std::memcmp(staging_->data() + (i + 1) * block_bytes(), row.data(), row.size()), 0)
        << "staged block " << i;
  }
  EXPECT_EQ(staging_->data()[0], std::byte{0x5a});                  // before the offset: untouched
  EXPECT_EQ(staging_->data()[5 * block_bytes()], std::byte{0x5a});  // after the rows

  std::memset(staging_->data(), 0x5a, staging_->size_bytes());
  auto layer = stager_
                   ->load_async("staged-load", unused_ids(hashes), PlaneRange{4, 2},
                                StagingRef{kStagingRegion, 0})
                   .wait();
  ASSERT_TRUE(layer.is_ok()) << layer.status().to_string();
  ASSERT_EQ(layer->loaded_count, 4u);
  const uint64_t row_bytes = 2 * plane_bytes();
  for (size_t i = 0; i < 4; ++i) {
    auto row = packed(hashes[i], 4, 2);
    EXPECT_EQ(std::memcmp(staging_->data() + i * row_bytes, row.data(), row.size()), 0)
        << "staged block " << i << " of planes 4..5";
  }
  EXPECT_EQ(staging_->data()[4 * row_bytes], std::byte{0x5a});
}

// A staged Load stops at the first block not held, like any Load.
TEST_F(StagingTest, AStagedLoadStopsAtTheFirstMissingBlock) {
  auto hashes = save_and_wipe("staged-prefix", 3);
  hashes.push_back(PagedCache::chain_hashes("never-saved", 1)[0]);
  auto loaded =
      stager_->load_async("staged-prefix", unused_ids(hashes), {}, StagingRef{kStagingRegion, 0})
          .wait();
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->loaded_count, 3u);
  EXPECT_FALSE(loaded->stop_reason.is_ok());
}

TEST_F(StagingTest, BadStagingIsRefusedNamingTheField) {
  const auto hashes = PagedCache::chain_hashes("bad-staging", 2);
  SaveOptions options;
  options.staging = StagingRef{kStagingRegion + 1, 0};
  EXPECT_TRUE(IsError(status_of(stager_->save("bad-staging", unused_ids(hashes), true, options)),
                      StatusCode::kInvalidArgument, "staging.regionId"));
  // Two blocks from the last block's place pass the region's end by one block.
  options.staging = StagingRef{kStagingRegion, (staging_blocks_ - 1) * block_bytes()};
  EXPECT_TRUE(IsError(status_of(stager_->save("bad-staging", unused_ids(hashes), true, options)),
                      StatusCode::kInvalidArgument, "pass the end of region"));
  options.staging = StagingRef{kStagingRegion, ~uint64_t{0}};
  EXPECT_TRUE(IsError(status_of(stager_->save("bad-staging", unused_ids(hashes), true, options)),
                      StatusCode::kInvalidArgument, "pass the end of region"));
  EXPECT_TRUE(IsError(status_of(stager_
                                    ->load_async("bad-staging", unused_ids(hashes), {},
                                                 StagingRef{kStagingRegion, staging_->size_bytes()})
                                    .wait()),
                      StatusCode::kInvalidArgument, "pass the end of region"));
  // Without staging the same engine names engine blocks, and its layout's region is
  // not registered here.
  EXPECT_TRUE(IsError(status_of(stager_->save("bad-staging", Engine::refs(hashes, 0), true)),
                      StatusCode::kInvalidArgument, "not registered"));
  // Nothing was stored by the refused Saves.
  auto lookup = stager_->lookup(hashes);
  ASSERT_TRUE(lookup.is_ok());
  EXPECT_EQ(lookup->hit_count, 0u);
}

// A plane-copying engine may not register a region its layout does not name.
TEST_F(StagingTest, StagingRegionsNeedAStagingDataPath) {
  auto region = MemfdRegion::create("not-staging", block_bytes());
  ASSERT_TRUE(region.is_ok());
  EXPECT_TRUE(IsError(status_of(engine_->client->register_memfd_region(kStagingRegion, region->fd(),
                                                                       region->size_bytes())),
                      StatusCode::kInvalidArgument, "Hello.dataPath"));
}

}  // namespace
}  // namespace kvtier::daemon
