// FaultInjectingDevice: fails exactly the submit it was told to, without copying, and
// otherwise behaves like the device it wraps.
#include <cstring>
#include <future>
#include <vector>

#include <gtest/gtest.h>

#include "device/device.h"
#include "tests/device/device_test_util.h"

namespace kvtier {
namespace {

using testing::bytes_of;
using testing::fill_random;
using testing::make_memfd;
using testing::memfd_handle;
using testing::submit_async;

constexpr uint64_t kSliceBytes = 1 << 20;

class FaultInjection : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = device_.allocate_pinned_pool(kSliceBytes);
    auto d = device_.allocate_arena(8 * kSliceBytes);
    ASSERT_TRUE(s.is_ok() && d.is_ok());
    source_ = *s;
    destination_ = *d;
    fill_random(bytes_of(*source_), 5);
  }
  // Copies the source into destination slice `slice`.
  CopyBatch copy_to_slice(uint64_t slice) {
    CopyBatch batch;
    const uint32_t s = batch.memory_index(source_), d = batch.memory_index(destination_);
    batch.segments.push_back({s, d, 0, slice * kSliceBytes, kSliceBytes});
    return batch;
  }
  bool slice_copied(uint64_t slice) {
    return std::memcmp(bytes_of(*destination_).data() + slice * kSliceBytes,
                       bytes_of(*source_).data(), kSliceBytes) == 0;
  }

  FaultInjectingDevice device_{make_host_device(2)};
  std::shared_ptr<Memory> source_, destination_;
};

TEST_F(FaultInjection, FailsExactlyTheNthSubmitWithoutCopying) {
  EXPECT_EQ(device_.name(), "host");
  device_.fail_nth_submit(3, data_loss("injected"));
  std::vector<std::future<Status>> results;
  for (uint64_t slice = 0; slice < 5; ++slice) {
    results.push_back(submit_async(device_, copy_to_slice(slice)));
  }
  for (uint64_t slice = 0; slice < 5; ++slice) {
    Status st = results[slice].get();
    if (slice == 2) {
      EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.to_string();
      EXPECT_EQ(st.message(), "injected");
      EXPECT_FALSE(slice_copied(slice)) << "a failed submit must not copy";
    } else {
      EXPECT_TRUE(st.is_ok()) << "submit " << slice + 1 << ": " << st.to_string();
      EXPECT_TRUE(slice_copied(slice)) << "slice " << slice;
    }
  }
  // The failure was one-shot.
  EXPECT_TRUE(submit_async(device_, copy_to_slice(5)).get().is_ok());
}

TEST_F(FaultInjection, DisarmingCancelsAnArmedFailure) {
  device_.fail_nth_submit(1, data_loss("injected"));
  device_.fail_nth_submit(0, Status::ok());
  EXPECT_TRUE(submit_async(device_, copy_to_slice(0)).get().is_ok());
  EXPECT_TRUE(slice_copied(0));
}

// As every Device: the batch's memories are let go before `done` runs (device/device.h), so
// the daemon's reference is the last one when it handles the completion.
TEST_F(FaultInjection, FailedBatchLetsGoOfItsMemoriesBeforeDone) {
  device_.fail_nth_submit(1, unavailable("injected"));
  std::weak_ptr<Memory> weak_source = source_;
  std::promise<bool> alive_in_done;
  CopyBatch batch = copy_to_slice(0);
  source_.reset();
  Status submitted = device_.submit(std::move(batch), [&](Status st) {
    EXPECT_EQ(st.code(), StatusCode::kUnavailable);
    alive_in_done.set_value(!weak_source.expired());
  });
  ASSERT_TRUE(submitted.is_ok());
  EXPECT_FALSE(alive_in_done.get_future().get());
  device_.drain();
  EXPECT_TRUE(weak_source.expired());
}

// The gate: held batches copy nothing until released; releasing the oldest ones lets
// exactly those through, in submission order, and keeps holding the rest.
TEST_F(FaultInjection, ReleasingTheOldestHeldSubmitsKeepsHoldingTheRest) {
  device_.hold_submits();
  std::vector<std::future<Status>> results;
  for (uint64_t slice = 0; slice < 3; ++slice) {
    results.push_back(submit_async(device_, copy_to_slice(slice)));
  }
  EXPECT_EQ(device_.held_submits(), 3u);
  device_.release_oldest_submits(1);
  EXPECT_TRUE(results[0].get().is_ok());
  EXPECT_TRUE(slice_copied(0));
  EXPECT_EQ(device_.held_submits(), 2u);
  EXPECT_FALSE(slice_copied(1)) << "a batch still held was copied";
  EXPECT_FALSE(slice_copied(2));
  // Still holding: a later submit waits behind the gate too.
  results.push_back(submit_async(device_, copy_to_slice(3)));
  EXPECT_EQ(device_.held_submits(), 3u);
  device_.release_oldest_submits(10);  // more than are held: all of them
  for (uint64_t slice = 1; slice < 4; ++slice) {
    EXPECT_TRUE(results[slice].get().is_ok()) << "slice " << slice;
    EXPECT_TRUE(slice_copied(slice)) << "slice " << slice;
  }
  EXPECT_EQ(device_.held_submits(), 0u);
  device_.release_submits();
}

TEST_F(FaultInjection, OpenRegionFailsUntilCleared) {
  UniqueFd memfd = make_memfd(4096);
  device_.fail_open_region(resource_exhausted("injected"));
  EXPECT_EQ(device_.open_region(memfd_handle(memfd, 4096)).status().code(),
            StatusCode::kResourceExhausted);
  device_.fail_open_region(Status::ok());
  EXPECT_TRUE(device_.open_region(memfd_handle(memfd, 4096)).is_ok());
}

}  // namespace
}  // namespace kvtier
