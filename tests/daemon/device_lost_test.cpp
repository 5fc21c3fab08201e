// A device that reports itself lost (a sticky GPU error) stops the daemon with exit
// code 3: the session table is written to NVMe as it stands, nothing is drained from
// RAM or HBM (their bytes can't be trusted), and the server stops serving.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <boost/asio/io_context.hpp>

#include <filesystem>
#include <thread>

#include "client/client.h"
#include "client/paged_cache.h"
#include "daemon/service.h"
#include "ipc/server.h"
#include "tiers/nvme_tier.h"

namespace kvtier::daemon {
namespace {

// The host device, plus a way to fire the fatal-error handler as a device thread would.
class LosableDevice final : public Device {
 public:
  explicit LosableDevice(std::unique_ptr<Device> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  Result<std::shared_ptr<Memory>> open_region(RegionHandle handle) override {
    return inner_->open_region(std::move(handle));
  }
  Result<std::shared_ptr<Memory>> allocate_arena(uint64_t bytes_per_gpu,
                                                 uint64_t part_alignment) override {
    return inner_->allocate_arena(bytes_per_gpu, part_alignment);
  }
  Result<std::shared_ptr<Memory>> allocate_pinned_pool(uint64_t bytes) override {
    return inner_->allocate_pinned_pool(bytes);
  }
  Status submit(CopyBatch batch, CopyDone done) override {
    return inner_->submit(std::move(batch), std::move(done));
  }
  void drain() override { inner_->drain(); }
  void set_fatal_error_handler(std::function<void(const Status&)> handler) override {
    handler_ = std::move(handler);
  }

  // Calls the handler on a thread of its own; false when none was set.
  bool lose(const Status& status) {
    if (!handler_) return false;
    std::thread([&] { handler_(status); }).join();
    return true;
  }

 private:
  std::unique_ptr<Device> inner_;
  std::function<void(const Status&)> handler_;
};

class DeviceLost : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/kvtier-device-lost-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(DeviceLost, WritesTheSessionTableWithoutDrainingAndExitsWithCode3) {
  DaemonConfig config = default_config();
  config.socket_path = dir_ + "/kvtierd.sock";
  config.data_dir = dir_ + "/data";
  config.hbm_bytes = 32ull << 20;
  config.ram_bytes = 64ull << 20;
  config.nvme_bytes = 64ull << 20;
  config.plan_interval_ms = 3'600'000;  // no periodic flush: what is written, the loss wrote
  PagedCacheShape shape;
  shape.model_id = "device-lost/small";
  shape.num_layers = 2;
  shape.num_blocks = 8;
  {
    boost::asio::io_context io(1);
    auto device = std::make_unique<LosableDevice>(make_host_device(2));
    LosableDevice* losable = device.get();
    Service service(io, config, std::move(device));
    ASSERT_TRUE(service.start().is_ok());
    ipc::Server server(io, service);
    ASSERT_TRUE(server.listen(config.socket_path).is_ok());
    int exit_seen = 0;
    service.set_fatal_exit([&](int code) {
      exit_seen = code;
      server.stop();
    });
    std::thread loop([&] { io.run(); });

    auto cache = PagedCache::create(shape);
    ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
    auto client = Client::connect(config.socket_path);
    ASSERT_TRUE(client.is_ok()) << client.status().to_string();
    ASSERT_TRUE((*client)->hello(cache->layout(), "device-lost").is_ok());
    ASSERT_TRUE((*client)
                    ->register_memfd_region(0, cache->region().fd(), cache->region().size_bytes())
                    .is_ok());
    const auto hashes = PagedCache::chain_hashes("lost", 3);
    std::vector<BlockRef> refs;
    for (size_t i = 0; i < hashes.size(); ++i) {
      refs.push_back({hashes[i], i});
      cache->fill(i, hashes[i]);
    }
    ASSERT_TRUE((*client)->save("lost", refs, /*end_of_turn=*/true).is_ok());  // idle now
    ASSERT_TRUE((*client)->begin_turn("lost").is_ok());                        // active again

    ASSERT_TRUE(losable->lose(data_loss("an illegal memory access was encountered")));
    loop.join();  // the loss stops the event loop
    EXPECT_EQ(service.exit_code(), Service::kExitDeviceLost);
    EXPECT_EQ(exit_seen, Service::kExitDeviceLost);
    EXPECT_EQ(server.connection_count(), 0u);
    EXPECT_FALSE((*client)->stats().is_ok()) << "the connection outlived the device";
  }

  NvmeTierOptions options;
  options.dir = config.data_dir + "/nvme";
  options.capacity_bytes = config.nvme_bytes;
  NvmeRecovery recovery;
  auto tier = NvmeTier::open(options, &recovery);
  ASSERT_TRUE(tier.is_ok()) << tier.status().to_string();
  EXPECT_TRUE(recovery.blocks.empty()) << "RAM/HBM blocks were drained to NVMe after the loss";
  ASSERT_EQ(recovery.sessions.size(), 1u);
  EXPECT_EQ(recovery.sessions[0].session_id, "lost");
  EXPECT_EQ(recovery.sessions[0].blocks.size(), 3u);
  EXPECT_EQ(recovery.sessions[0].state, 0u) << "the table was not written as it stood at the loss";
}

}  // namespace
}  // namespace kvtier::daemon
