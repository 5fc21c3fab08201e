// fault-copy-delay-ms (TESTS ONLY; daemon/copy_delay.h): an engine's copies complete
// that much later, one at a time in submission order.
//  * CopyCompletionDelay alone, on an io_context: completions are handed on in the
//    order their places were taken, whatever order the copies landed in, each a delay
//    after the one before; a refused copy leaves the line; held completions die with it.
//  * In the in-process daemon with one copy thread: a Save's and a Load's reply come no
//    earlier than the delay, and pipelined Loads are answered in order a delay apart —
//    layer 0 of a layer-wise load while the last layer is still pending.
// Every timing assertion is a lower bound or an order, never an upper bound: a loaded
// machine only makes replies later.
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "daemon/copy_delay.h"
#include "tests/daemon/handler_fixture.h"

namespace kvtier::daemon {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

milliseconds since(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start);
}

TEST(CopyCompletionDelayTest, HandsCompletionsOnInSubmissionOrderADelayApart) {
  constexpr milliseconds kDelay{50};
  boost::asio::io_context io;
  CopyCompletionDelay delay(io, kDelay);
  std::vector<std::shared_ptr<CopyCompletionDelay::Place>> places;
  for (int i = 0; i < 3; ++i) places.push_back(delay.enter());
  std::vector<int> order;
  std::vector<milliseconds> at;
  const Clock::time_point start = Clock::now();
  // The copies land last-submitted first: the line still goes in submission order.
  for (int i = 2; i >= 0; --i) {
    delay.copied(places[static_cast<size_t>(i)], [&, i] {
      order.push_back(i);
      at.push_back(since(start));
    });
  }
  EXPECT_TRUE(order.empty()) << "a completion was handed on before the delay";
  io.run();
  ASSERT_EQ(order, (std::vector<int>{0, 1, 2}));
  for (size_t i = 0; i < at.size(); ++i) {
    EXPECT_GE(at[i], kDelay * static_cast<int>(i + 1)) << "completion " << i;
  }
}

TEST(CopyCompletionDelayTest, ARefusedCopyLeavesTheLineAndTheNextGoesOn) {
  boost::asio::io_context io;
  CopyCompletionDelay delay(io, milliseconds{1});
  auto refused = delay.enter();
  auto next = delay.enter();
  bool delivered = false;
  delay.copied(next, [&] { delivered = true; });
  delay.leave(refused);
  io.run();
  EXPECT_TRUE(delivered);
}

TEST(CopyCompletionDelayTest, CompletionsStillHeldAreDroppedWithIt) {
  boost::asio::io_context io;
  bool delivered = false;
  {
    CopyCompletionDelay delay(io, milliseconds{1});
    delay.copied(delay.enter(), [&] { delivered = true; });
  }
  io.run();  // the cancelled wait's handler runs and touches nothing
  EXPECT_FALSE(delivered);
}

constexpr uint32_t kPlanes = 8;  // integration::small_shape: 4 layers × {K, V}
constexpr milliseconds kCopyDelay{300};

class CopyDelayTest : public HandlerTest {
 protected:
  DaemonConfig daemon_config() const override {
    DaemonConfig config = inprocess_config();
    config.copy_threads = 1;
    config.fault_copy_delay_ms = kCopyDelay.count();
    return config;
  }
};

TEST_F(CopyDelayTest, ASavesAndALoadsReplyComeNoEarlierThanTheDelay) {
  const auto hashes = PagedCache::chain_hashes("late", 4);
  const auto refs = Engine::refs(hashes, 0);
  engine_->fill(refs);
  Clock::time_point start = Clock::now();
  auto saved = engine_->client->save("late", refs, /*end_of_turn=*/true);
  const milliseconds save_took = since(start);
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  EXPECT_EQ(saved->stored, refs.size());
  EXPECT_GE(save_took, kCopyDelay) << "the Save's copy completed without the delay";
  ASSERT_TRUE(wait_until_settled().is_ok());

  engine_->cache.wipe();
  start = Clock::now();
  auto loaded = engine_->client->load("late", refs);
  const milliseconds load_took = since(start);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->loaded_count, refs.size());
  EXPECT_GE(load_took, kCopyDelay) << "the Load's copy completed without the delay";
  EXPECT_EQ(engine_->count_verified(refs, refs.size()), refs.size());
}

// Two Loads pipelined on one copy thread: the second is answered no earlier than two
// delays after both were sent, and by then the first's reply is already there.
TEST_F(CopyDelayTest, TwoPipelinedLoadsCompleteInOrderADelayApart) {
  const auto hashes = save_and_wipe("two", 4);
  const auto refs = Engine::refs(hashes, 8);
  const Clock::time_point start = Clock::now();
  auto first = engine_->client->load_async("two", refs, PlaneRange{0, 4});
  auto second = engine_->client->load_async("two", refs, PlaneRange{4, 4});

  auto last = second.wait();
  const milliseconds second_took = since(start);
  ASSERT_TRUE(last.is_ok()) << last.status().to_string();
  EXPECT_GE(second_took, 2 * kCopyDelay) << "the second Load was not a delay behind the first";
  EXPECT_TRUE(first.ready()) << "the second Load was answered before the first";
  auto earlier = first.wait();
  ASSERT_TRUE(earlier.is_ok()) << earlier.status().to_string();
  EXPECT_EQ(earlier->loaded_count, 4u);
  EXPECT_EQ(last->loaded_count, 4u);
  EXPECT_EQ(engine_->count_verified(refs, refs.size()), refs.size());
}

// What a layer-wise connector test relies on: one Load per layer, sent together, are
// answered layer by layer — layer i no earlier than (i + 1) delays after they were
// sent, and layer 0 while the last layer is still pending (three delays away).
TEST_F(CopyDelayTest, LayerWiseLoadsAreAnsweredLayerByLayer) {
  const auto hashes = save_and_wipe("layers", 4);
  const auto refs = Engine::refs(hashes, 8);
  const Clock::time_point start = Clock::now();
  std::vector<Pending<LoadResult>> layers;
  for (uint32_t layer = 0; layer < kPlanes / 2; ++layer)
    layers.push_back(engine_->client->load_async("layers", refs, PlaneRange{2 * layer, 2}));

  for (size_t layer = 0; layer < layers.size(); ++layer) {
    auto loaded = layers[layer].wait();
    const milliseconds took = since(start);
    ASSERT_TRUE(loaded.is_ok()) << "layer " << layer << ": " << loaded.status().to_string();
    EXPECT_EQ(loaded->loaded_count, 4u) << "layer " << layer;
    EXPECT_GE(took, kCopyDelay * static_cast<int>(layer + 1)) << "layer " << layer;
  }
  EXPECT_EQ(engine_->count_verified(refs, refs.size()), refs.size());
}

}  // namespace
}  // namespace kvtier::daemon
