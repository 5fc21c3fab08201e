// Descriptor passing: a request may carry up to kMaxFdsPerRequest descriptors, sent in
// several sendmsg calls; the receiver gets all of them in order, reports descriptors
// lost in transit, and a Connection bounds how many may wait unclaimed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <capnp/message.h>
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <vector>

#include "ipc/client_transport.h"
#include "ipc/server.h"
#include "ipc/unix_socket.h"
#include "schema/kvtier.capnp.h"

namespace kvtier::ipc {
namespace {

// Enough descriptors for the test process to hold a request's worth twice over.
void raise_descriptor_limit() {
  rlimit limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, 8192);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &limit), 0);
  ASSERT_GE(limit.rlim_cur, 3 * kMaxFdsPerRequest) << "the hard RLIMIT_NOFILE is too low";
}

// Memfds of distinct sizes (4096 × (i + 1)), so a received descriptor says which it is.
std::vector<UniqueFd> sized_memfds(size_t count) {
  std::vector<UniqueFd> fds;
  for (size_t i = 0; i < count; ++i) {
    UniqueFd fd(::memfd_create("fd-passing-test", MFD_CLOEXEC));
    EXPECT_TRUE(fd.valid());
    EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(4096 * (i + 1))), 0);
    fds.push_back(std::move(fd));
  }
  return fds;
}

off_t size_of(int fd) {
  struct stat info {};
  if (::fstat(fd, &info) != 0) return -1;
  return info.st_size;
}

struct SocketPair {
  UniqueFd a, b;
  SocketPair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    a = UniqueFd(fds[0]);
    b = UniqueFd(fds[1]);
  }
};

TEST(FdPassing, ManyDescriptorsArriveAllAndInOrder) {
  raise_descriptor_limit();
  const auto distinct = sized_memfds(7);
  const size_t count = kMaxFdsPerRequest;  // five sendmsg calls' worth
  std::vector<int> to_send;
  for (size_t i = 0; i < count; ++i) to_send.push_back(distinct[i % distinct.size()].get());
  std::vector<std::byte> bytes(64);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i);

  SocketPair pair;
  ASSERT_TRUE(send_all(pair.a.get(), bytes, to_send).is_ok());

  std::vector<std::byte> received_bytes;
  std::vector<UniqueFd> received_fds;
  size_t recvmsg_calls = 0;
  while (received_bytes.size() < bytes.size()) {
    std::vector<std::byte> buffer(bytes.size());
    const size_t fds_before = received_fds.size();
    auto received = receive_some(pair.b.get(), buffer, received_fds, /*wait=*/true);
    ASSERT_TRUE(received.is_ok()) << received.status().to_string();
    ASSERT_GT(received->bytes, 0u);
    EXPECT_FALSE(received->fds_truncated);
    EXPECT_LE(received_fds.size() - fds_before, kMaxFdsPerRecvmsg);
    received_bytes.insert(received_bytes.end(), buffer.begin(), buffer.begin() + received->bytes);
    ++recvmsg_calls;
  }
  EXPECT_EQ(received_bytes, bytes);
  EXPECT_GE(recvmsg_calls, (count + kMaxFdsPerSendmsg - 1) / kMaxFdsPerSendmsg);
  ASSERT_EQ(received_fds.size(), count);
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(size_of(received_fds[i].get()), static_cast<off_t>(4096 * (i % distinct.size() + 1)))
        << "descriptor " << i << " arrived out of order";
  }
}

TEST(FdPassing, RequestsTheSenderCannotCarryAreRefused) {
  const auto distinct = sized_memfds(1);
  SocketPair pair;
  std::vector<int> too_many(kMaxFdsPerRequest + 1, distinct[0].get());
  std::vector<std::byte> bytes(64);
  Status refused = send_all(pair.a.get(), bytes, too_many);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.to_string();
  // 600 descriptors need three sendmsg calls, so at least three bytes to ride on.
  std::vector<int> six_hundred(600, distinct[0].get());
  refused = send_all(pair.a.get(), std::span(bytes).first(2), six_hundred);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.to_string();
  EXPECT_NE(refused.message().find("at least 3 bytes"), std::string::npos) << refused.message();
}

TEST(FdPassing, DescriptorsLostInTransitAreReported) {
  raise_descriptor_limit();
  const auto distinct = sized_memfds(1);
  SocketPair pair;
  std::vector<int> to_send(50, distinct[0].get());
  std::vector<std::byte> bytes(8);
  ASSERT_TRUE(send_all(pair.a.get(), bytes, to_send).is_ok());

  // A receiver with room for only a few more descriptors: the kernel installs what it
  // can and flags the message truncated.
  size_t open_fds = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)entry;
    ++open_fds;
  }
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit tight = saved;
  tight.rlim_cur = open_fds + 10;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  std::vector<std::byte> buffer(bytes.size());
  std::vector<UniqueFd> received_fds;
  auto received = receive_some(pair.b.get(), buffer, received_fds, /*wait=*/true);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_TRUE(received.is_ok()) << received.status().to_string();
  EXPECT_TRUE(received->fds_truncated);
  EXPECT_LT(received_fds.size(), to_send.size());
}

// A Server whose handler takes every queued descriptor with each frame.
class ServerFds : public ::testing::Test, public RequestHandler {
 protected:
  void SetUp() override {
    raise_descriptor_limit();
    char pattern[] = "/tmp/kvtier-ipc-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  void start(ConnectionLimits limits) {
    server_ = std::make_unique<Server>(io_, *this, limits);
    ASSERT_TRUE(server_->listen(dir_ + "/test.sock").is_ok());
  }
  Result<ClientTransport> connect() { return ClientTransport::connect(dir_ + "/test.sock"); }

  // Runs the event loop until `done` holds (false after a deadline).
  bool run_until(const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      io_.run_for(std::chrono::milliseconds(10));
      io_.restart();
    }
    return true;
  }

  void on_connect(const std::shared_ptr<Connection>&) override { ++connected_; }
  void on_frame(const std::shared_ptr<Connection>& connection, Frame) override {
    size_t taken = 0;
    while (connection->take_fd().is_ok()) ++taken;
    fds_per_frame_.push_back(taken);
    connection->request_done();
  }
  void on_disconnect(const std::shared_ptr<Connection>&) override { ++disconnects_; }

  static Status send_stats(ClientTransport& transport, std::span<const int> fds) {
    capnp::MallocMessageBuilder message;
    auto request = message.initRoot<wire::Request>();
    request.setId(1);
    request.initStats();
    return transport.send(message, fds);
  }

  boost::asio::io_context io_{1};
  std::string dir_;
  std::unique_ptr<Server> server_;
  std::vector<size_t> fds_per_frame_;
  int connected_ = 0;
  int disconnects_ = 0;
};

TEST_F(ServerFds, ARequestsDescriptorsAreAllQueuedBeforeItsFrame) {
  start({});
  auto client = connect();
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  const auto distinct = sized_memfds(1);
  std::vector<int> chunks(300, distinct[0].get());
  ASSERT_TRUE(send_stats(*client, chunks).is_ok());
  ASSERT_TRUE(send_stats(*client, {}).is_ok());
  ASSERT_TRUE(run_until([&] { return fds_per_frame_.size() == 2; }));
  EXPECT_EQ(fds_per_frame_, (std::vector<size_t>{300, 0}));
  EXPECT_EQ(disconnects_, 0);
}

// Linux ends a read at a message that carries descriptors, so a read shorter than its
// room does not mean the socket is empty when descriptors came with it: requests queued
// back to back before the server reads, each with a descriptor, are all read although
// nothing more arrives (no new readiness event) after the first read.
TEST_F(ServerFds, RequestsQueuedBehindADescriptorAreReadWithoutFurtherTraffic) {
  start({});
  auto client = connect();
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  const auto distinct = sized_memfds(1);
  const int one[] = {distinct[0].get()};
  ASSERT_TRUE(send_stats(*client, {}).is_ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(send_stats(*client, one).is_ok());
  ASSERT_TRUE(send_stats(*client, {}).is_ok());
  ASSERT_TRUE(run_until([&] { return fds_per_frame_.size() == 6; }))
      << fds_per_frame_.size() << " of 6 requests were read";
  // This handler takes whatever is queued with each frame, and one read may carry a frame
  // with none and the next frame's descriptor: count them together.
  EXPECT_EQ(std::accumulate(fds_per_frame_.begin(), fds_per_frame_.end(), size_t{0}), 4u);
  // The socket is now empty; a request sent afterwards is read on its readiness event.
  ASSERT_TRUE(send_stats(*client, one).is_ok());
  ASSERT_TRUE(run_until([&] { return fds_per_frame_.size() == 7; }));
  EXPECT_EQ(fds_per_frame_.back(), 1u);
  EXPECT_EQ(disconnects_, 0);
}

// A peer that shuts its end down right after its last request: the end of stream comes
// with the same readiness event as the request's bytes, so the server must not take the
// read that returned those bytes as proof that nothing follows.
TEST_F(ServerFds, AnEndOfStreamRightBehindTheLastRequestIsSeen) {
  ConnectionLimits limits;
  limits.introduction_timeout_ms = 600'000;  // only the end of stream may close it
  start(limits);
  auto client = connect();
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  // Accepted: Connection::start() made its first read, which found nothing and now
  // waits for an event.
  ASSERT_TRUE(run_until([&] { return connected_ == 1; }));
  ASSERT_TRUE(send_stats(*client, {}).is_ok());
  ASSERT_TRUE(send_stats(*client, {}).is_ok());
  client->shutdown_write();
  ASSERT_TRUE(run_until([&] { return disconnects_ == 1; }))
      << "the connection was not closed; " << fds_per_frame_.size() << " requests were read";
  EXPECT_EQ(fds_per_frame_.size(), 2u);
}

TEST_F(ServerFds, TooManyUnclaimedDescriptorsCloseTheConnection) {
  ConnectionLimits limits;
  limits.max_queued_fds = 100;
  start(limits);
  auto client = connect();
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  const auto distinct = sized_memfds(1);
  std::vector<int> too_many(150, distinct[0].get());
  ASSERT_TRUE(send_stats(*client, too_many).is_ok());
  ASSERT_TRUE(run_until([&] { return disconnects_ == 1; }));
  EXPECT_TRUE(fds_per_frame_.empty());  // the frame never reached the handler
  auto reply = client->receive();
  ASSERT_TRUE(reply.is_ok()) << reply.status().to_string();
  auto response = reply->reader().getRoot<wire::Response>();
  EXPECT_EQ(response.getId(), 0u);
  ASSERT_TRUE(response.isError());
  EXPECT_NE(std::string(response.getError().getMessage().cStr()).find("too many file descriptors"),
            std::string::npos)
      << response.getError().getMessage().cStr();
  EXPECT_EQ(client->receive().status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kvtier::ipc
