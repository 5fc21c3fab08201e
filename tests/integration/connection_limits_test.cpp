// The daemon's bounds on connections, against the real kvtierd: past max-connections a
// newcomer gets an Error naming the limit and the others are served; an engine that
// never reads its replies stops being read, everyone else is served meanwhile, and it
// gets every reply once it reads again.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "tests/integration/daemon_harness.h"
#include "tests/integration/raw_connection.h"

namespace kvtier::integration {
namespace {

class ConnectionLimits : public DaemonTest {
 protected:
  std::vector<std::string> daemon_flags() const override {
    std::vector<std::string> flags = small_tier_flags();
    for (const char* flag : {"--max-connections", "3", "--admin-reserved-connections", "0",
                             "--max-reply-bytes-per-connection", "64KiB"}) {
      flags.emplace_back(flag);
    }
    return flags;
  }
  Result<RawConnection> connect_raw() const {
    return RawConnection::connect(daemon_->socket_path());
  }
};

// A Stats request and its reply on `raw`: the connection is being served.
::testing::AssertionResult AnswersStats(RawConnection& raw, uint64_t id) {
  if (Status sent = raw.send(id, [](wire::Request::Builder r) { r.initStats(); }); !sent.is_ok())
    return ::testing::AssertionFailure() << "send: " << sent.to_string();
  auto reply = raw.receive_reply();
  if (!reply.is_ok()) return ::testing::AssertionFailure() << reply.status().to_string();
  if (reply->id != id || reply->which != wire::Response::STATS) {
    return ::testing::AssertionFailure()
           << "reply " << reply->id << " is not Stats: " << reply->error.to_string();
  }
  return ::testing::AssertionSuccess();
}

TEST_F(ConnectionLimits, ANewcomerPastTheCapIsRefusedNamingItAndTheOthersAreServed) {
  // Only this test's connections count (not the start-up probe).
  ASSERT_TRUE(
      daemon_->wait_for_stats([](const StatsInfo& s) { return s.connections == 1; }).is_ok());
  std::vector<RawConnection> admitted;
  for (uint64_t i = 1; i <= 3; ++i) {
    auto raw = connect_raw();
    ASSERT_TRUE(raw.is_ok()) << raw.status().to_string();
    ASSERT_TRUE(AnswersStats(*raw, i));
    admitted.push_back(std::move(*raw));
  }

  auto refused = connect_raw();
  ASSERT_TRUE(refused.is_ok()) << refused.status().to_string();
  auto reply = refused->receive_reply();
  ASSERT_TRUE(reply.is_ok()) << reply.status().to_string();
  EXPECT_EQ(reply->id, 0u);
  EXPECT_TRUE(IsError(reply->error, StatusCode::kResourceExhausted, "max-connections"));
  EXPECT_TRUE(reply->error.retryable());
  auto after = refused->drain_until_closed();
  ASSERT_TRUE(after.is_ok()) << after.status().to_string();
  EXPECT_TRUE(after->empty());

  for (uint64_t i = 0; i < admitted.size(); ++i) EXPECT_TRUE(AnswersStats(admitted[i], 10 + i));
  // One leaves; an engine gets in and works.
  admitted.pop_back();
  EXPECT_TRUE(ServesSaveAndLoad(*daemon_, "after-a-refusal"));
}

TEST_F(ConnectionLimits, AnEngineThatDoesNotReadIsPausedWhileOthersAreServed) {
  auto flooder = connect_raw();
  ASSERT_TRUE(flooder.is_ok()) << flooder.status().to_string();
  // Far more replies than max-reply-bytes-per-connection and the socket buffers hold:
  // sending them all needs the daemon to keep reading, which it must not.
  constexpr uint64_t kRequests = 40'000;
  std::atomic<uint64_t> sent{0};
  std::thread sender([&] {
    for (uint64_t id = 1; id <= kRequests; ++id) {
      if (!flooder->send(id, [](wire::Request::Builder r) { r.initStats(); }).is_ok()) return;
      sent = id;
    }
  });

  // Others are served while the flooder waits.
  EXPECT_TRUE(ServesSaveAndLoad(*daemon_, "beside-a-flood"));
  EXPECT_LT(sent.load(), kRequests) << "the daemon took every request of a peer that reads nothing";

  // Reading again, the flooder gets every reply, in order.
  auto every_reply = [&]() -> ::testing::AssertionResult {
    for (uint64_t next = 1; next <= kRequests; ++next) {
      auto reply = flooder->receive_reply();
      if (!reply.is_ok()) {
        return ::testing::AssertionFailure()
               << "after " << next - 1 << " replies: " << reply.status().to_string();
      }
      if (reply->id != next || reply->which != wire::Response::STATS) {
        return ::testing::AssertionFailure() << "reply " << reply->id << " where " << next
                                             << " was due: " << reply->error.to_string();
      }
    }
    return ::testing::AssertionSuccess();
  }();
  EXPECT_TRUE(every_reply);
  if (!every_reply) ::shutdown(flooder->fd(), SHUT_RDWR);  // unblocks the sender
  sender.join();
  EXPECT_EQ(sent.load(), kRequests);
  EXPECT_TRUE(ServesSaveAndLoad(*daemon_, "after-a-flood"));
}

TEST_F(ConnectionLimits, DescriptorsPastTheQueueLimitCloseOnlyThatConnection) {
  auto other = connect_raw();
  ASSERT_TRUE(other.is_ok()) << other.status().to_string();
  ASSERT_TRUE(AnswersStats(*other, 1));

  // 1100 descriptors that no request claims (Stats declares none), in two requests: more
  // than the 1024 a connection may queue.
  const int memfd = ::memfd_create("unclaimed", MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  auto flooder = connect_raw();
  ASSERT_TRUE(flooder.is_ok()) << flooder.status().to_string();
  Status sent = Status::ok();
  for (uint64_t id : {7, 8}) {
    const std::vector<int> fds(id == 7 ? 1000 : 100, memfd);
    if (sent.is_ok())
      sent = flooder->send(
          id, [](wire::Request::Builder r) { r.initStats(); }, fds);
  }
  ::close(memfd);
  ASSERT_TRUE(sent.is_ok()) << sent.to_string();
  auto replies = flooder->drain_until_closed();
  ASSERT_TRUE(replies.is_ok()) << replies.status().to_string();
  ASSERT_FALSE(replies->empty());
  EXPECT_EQ(replies->back().id, 0u);
  EXPECT_TRUE(
      IsError(replies->back().error, StatusCode::kInvalidArgument, "too many file descriptors"));

  // The daemon holds none of them and serves the others.
  EXPECT_TRUE(AnswersStats(*other, 2));
  EXPECT_TRUE(ServesSaveAndLoad(*daemon_, "beside-a-descriptor-flood"));
}

}  // namespace
}  // namespace kvtier::integration
