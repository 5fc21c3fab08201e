// The test-only --fault-copy-delay-ms on the real kvtierd, as a layer-wise connector
// test runs it (--copy-threads 1 --fault-copy-delay-ms 300ms): one Load per layer,
// sent together, are answered layer by layer, no earlier than a delay apart, layer 0
// while the last layer is still pending. Lower bounds and order only: a loaded machine
// only makes replies later. (The delay's own rules are tested in-process:
// tests/daemon/copy_delay_test.cpp.)
#include <gtest/gtest.h>

#include <chrono>

#include "tests/integration/daemon_harness.h"

namespace kvtier::integration {
namespace {

using Clock = std::chrono::steady_clock;

constexpr milliseconds kCopyDelay{300};
constexpr uint32_t kLayers = 4;  // small_shape: 4 layers × {K, V}

class CopyDelayProcessTest : public DaemonTest {
 protected:
  std::vector<std::string> daemon_flags() const override {
    return {"--hbm-bytes",    "32MiB", "--ram-bytes",           "64MiB",
            "--copy-threads", "1",     "--fault-copy-delay-ms", "300ms"};
  }
};

TEST_F(CopyDelayProcessTest, LayerWiseLoadsAreAnsweredADelayApart) {
  auto engine = Engine::connect(daemon_->socket_path(), small_shape(8));
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const auto hashes = PagedCache::chain_hashes("layers", 4);
  const auto refs = Engine::refs(hashes, 0);
  engine->fill(refs);
  Clock::time_point start = Clock::now();
  auto saved = engine->client->save("layers", refs, /*end_of_turn=*/true);
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  EXPECT_GE(Clock::now() - start, kCopyDelay) << "the Save's copy completed without the delay";
  ASSERT_TRUE(daemon_->wait_until_settled().is_ok());

  const auto into = Engine::refs(hashes, 4);
  start = Clock::now();
  std::vector<Pending<LoadResult>> layers;
  for (uint32_t layer = 0; layer < kLayers; ++layer)
    layers.push_back(engine->client->load_async("layers", into, PlaneRange{2 * layer, 2}));
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    auto loaded = layers[layer].wait();
    const auto took = Clock::now() - start;
    ASSERT_TRUE(loaded.is_ok()) << "layer " << layer << ": " << loaded.status().to_string();
    EXPECT_EQ(loaded->loaded_count, 4u) << "layer " << layer;
    EXPECT_GE(took, kCopyDelay * (layer + 1)) << "layer " << layer;
  }
  EXPECT_EQ(engine->count_verified(into, into.size()), into.size());
}

}  // namespace
}  // namespace kvtier::integration
