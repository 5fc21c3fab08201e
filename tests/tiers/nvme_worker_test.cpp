// NvmeWorker's delayed job (the tier's tries at healing): it runs once its delay has
// passed, a later one replaces it, it goes before queued jobs once due, and it is
// dropped, never run, when the worker goes.
#include "tiers/nvme_worker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

namespace kvtier {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

TEST(NvmeWorker, ADelayedJobRunsOnceItsDelayHasPassed) {
  NvmeWorker worker("test-worker");
  std::promise<Clock::time_point> ran;
  const auto posted = Clock::now();
  worker.post_after(milliseconds(30), [&] { ran.set_value(Clock::now()); });
  auto future = ran.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_GE(future.get() - posted, milliseconds(30));
}

TEST(NvmeWorker, ALaterDelayedJobReplacesTheFirst) {
  NvmeWorker worker("test-worker");
  std::atomic<int> first{0};
  std::promise<void> second;
  worker.post_after(std::chrono::hours(1), [&] { ++first; });
  worker.post_after(milliseconds(20), [&] { second.set_value(); });
  ASSERT_EQ(second.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  worker.flush();
  EXPECT_EQ(first.load(), 0);
}

TEST(NvmeWorker, QueuedJobsRunMeanwhileAndADueDelayedJobGoesBeforeTheQueue) {
  NvmeWorker worker("test-worker");
  std::vector<std::string> order;  // touched only by the worker until flush() returns
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  worker.post_after(milliseconds(1), [&] { order.push_back("delayed"); });
  // A job that holds the worker past the delay, then one queued behind it.
  worker.post([&, released] {
    order.push_back("first");
    released.wait();
  });
  worker.post([&] { order.push_back("queued"); });
  std::this_thread::sleep_for(milliseconds(20));
  release.set_value();
  worker.flush();
  // "first" may start before or after the delayed job; "queued" comes after both.
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order.back(), "queued");
}

TEST(NvmeWorker, ADelayedJobNotYetDueIsDroppedWhenTheWorkerGoes) {
  std::atomic<int> ran{0};
  {
    NvmeWorker worker("test-worker");
    worker.post_after(std::chrono::hours(1), [&] { ++ran; });
    worker.post([] {});
    worker.flush();
  }
  EXPECT_EQ(ran.load(), 0);
}

}  // namespace
}  // namespace kvtier
