// What one connection can make the server hold, and how many connections it takes:
// each bound holds while the peer misbehaves, another connection is served meanwhile,
// and nothing is lost once the peer behaves again.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <capnp/message.h>
#include <fmt/format.h>
#include <boost/asio/io_context.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "ipc/client_transport.h"
#include "ipc/server.h"
#include "schema/kvtier.capnp.h"

namespace kvtier::ipc {
namespace {

constexpr size_t kWordsPerBigReply = (1 << 20) / sizeof(capnp::word);  // 1 MiB replies

// A server whose handler answers each frame as the test says: connections named
// "quiet" by id get a 1 MiB reply per frame, "keeping" ones have their frames kept
// (not dropped) after request_done, and every other connection gets a small reply.
class ServerLimits : public ::testing::Test, public RequestHandler {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/kvtier-ipc-limits-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    kept_frames_.clear();
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  void start(ConnectionLimits limits) {
    server_ = std::make_unique<Server>(io_, *this, limits);
    server_->set_admin_check([this](const PeerCredentials&) { return admin_now_; });
    ASSERT_TRUE(server_->listen(dir_ + "/test.sock").is_ok());
  }
  Result<ClientTransport> connect() { return ClientTransport::connect(dir_ + "/test.sock"); }

  // Connects and waits until the server has accepted; the server-side connection.
  std::shared_ptr<Connection> connect_accepted(std::optional<ClientTransport>& client) {
    const size_t before = accepted_.size();
    auto connected = connect();
    EXPECT_TRUE(connected.is_ok()) << connected.status().to_string();
    if (!connected.is_ok()) return nullptr;
    client.emplace(std::move(*connected));
    if (!run_until([&] { return accepted_.size() > before; })) return nullptr;
    return accepted_.back();
  }

  bool run_until(const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      io_.run_for(std::chrono::milliseconds(5));
      io_.restart();
    }
    return true;
  }
  // Runs the loop for a while with nothing expected to change the outcome.
  void run_for(std::chrono::milliseconds duration) {
    io_.run_for(duration);
    io_.restart();
  }

  void on_connect(const std::shared_ptr<Connection>& connection) override {
    accepted_.push_back(connection);
  }
  void on_frame(const std::shared_ptr<Connection>& connection, Frame frame) override {
    ++frames_[connection->id()];
    // Every frame says who the peer is, except from the connections the test calls strangers.
    if (strangers_.count(connection->id()) == 0) connection->introduced();
    if (patterned_.count(connection->id()) != 0) {
      // Every word names its reply and its place: a byte sent twice, lost or out of
      // order shows.
      auto reply = kj::heapArray<capnp::word>(kWordsPerBigReply);
      const uint64_t n = frames_[connection->id()] - 1;  // counted above
      for (size_t i = 0; i < reply.size(); ++i) {
        const uint64_t value = n << 32 | i;
        std::memcpy(static_cast<void*>(&reply[i]), &value, sizeof(value));
      }
      connection->send(kj::mv(reply));
    } else if (quiet_.count(connection->id()) != 0) {
      connection->send(kj::heapArray<capnp::word>(kWordsPerBigReply));
    } else if (keeping_.count(connection->id()) != 0) {
      kept_frames_.push_back(std::move(frame));
    } else {
      connection->send(kj::heapArray<capnp::word>(1));
    }
    connection->request_done();
  }
  void on_disconnect(const std::shared_ptr<Connection>&) override { ++disconnects_; }

  static Status send_stats(ClientTransport& transport) {
    capnp::MallocMessageBuilder message;
    auto request = message.initRoot<wire::Request>();
    request.setId(1);
    request.initStats();
    return transport.send(message);
  }
  // A Lookup of `hashes` 32-byte hashes: a request of about hashes * 40 bytes.
  static Status send_lookup(ClientTransport& transport, uint32_t hashes) {
    capnp::MallocMessageBuilder message;
    auto request = message.initRoot<wire::Request>();
    request.setId(2);
    auto list = request.initLookup().initHashes(hashes);
    for (uint32_t i = 0; i < hashes; ++i) list.init(i, 32);
    return transport.send(message);
  }
  // Reads raw bytes from `fd` until `total` arrived (false on a 30 s deadline or EOF).
  static bool read_bytes(int fd, size_t total) {
    std::vector<char> buffer(1 << 16);
    size_t got = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (got < total) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      ssize_t n = ::recv(fd, buffer.data(), buffer.size(), 0);
      if (n <= 0) return false;
      got += static_cast<size_t>(n);
    }
    return true;
  }

  boost::asio::io_context io_{1};
  std::string dir_;
  std::unique_ptr<Server> server_;
  std::vector<std::shared_ptr<Connection>> accepted_;
  std::map<uint64_t, int> frames_;  // frames handled, by connection id
  std::set<uint64_t> quiet_;
  std::set<uint64_t> strangers_;  // their frames do not introduce them
  bool admin_now_ = false;        // what the server's admin check answers
  std::set<uint64_t> patterned_;
  std::set<uint64_t> keeping_;
  std::vector<Frame> kept_frames_;
  int disconnects_ = 0;
};

TEST_F(ServerLimits, APeerThatDoesNotReadItsRepliesIsNoLongerReadAndOthersAreServed) {
  ConnectionLimits limits;
  limits.max_queued_reply_bytes = 4 << 20;
  start(limits);
  std::optional<ClientTransport> quiet_client;
  auto quiet = connect_accepted(quiet_client);
  ASSERT_NE(quiet, nullptr);
  quiet_.insert(quiet->id());

  constexpr int kRequests = 200;  // 200 MiB of replies if they were all queued
  for (int i = 0; i < kRequests; ++i) ASSERT_TRUE(send_stats(*quiet_client).is_ok());
  ASSERT_TRUE(run_until([&] { return quiet->reading_paused(); }));
  run_for(std::chrono::milliseconds(200));  // nothing more is taken while paused
  EXPECT_TRUE(quiet->reading_paused());
  EXPECT_LT(frames_[quiet->id()], kRequests);
  EXPECT_GE(quiet->queued_reply_bytes(), limits.max_queued_reply_bytes);
  // The bound: the limit plus the one reply that crossed it.
  EXPECT_LE(quiet->queued_reply_bytes(),
            limits.max_queued_reply_bytes + kWordsPerBigReply * sizeof(capnp::word));

  std::optional<ClientTransport> other_client;
  auto other = connect_accepted(other_client);
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(send_stats(*other_client).is_ok());
  ASSERT_TRUE(run_until([&] { return frames_[other->id()] == 1; }));
  EXPECT_TRUE(read_bytes(other_client->fd(), sizeof(capnp::word)));

  // Once the peer reads, every request is handled and every reply arrives.
  std::atomic<bool> all_read{false};
  std::thread reader([&] {
    all_read = read_bytes(quiet_client->fd(), kRequests * kWordsPerBigReply * sizeof(capnp::word));
  });
  const bool handled = run_until([&] { return frames_[quiet->id()] == kRequests; });
  const bool drained = run_until([&] { return quiet->queued_reply_bytes() == 0; });
  reader.join();
  EXPECT_TRUE(handled);
  EXPECT_TRUE(drained);
  EXPECT_TRUE(all_read);
  EXPECT_FALSE(quiet->reading_paused());
  EXPECT_EQ(disconnects_, 0);
}

// A reply goes out at once when nothing is queued ahead of it; one the socket takes only
// part of is finished by the asynchronous write, and replies behind it follow in order.
TEST_F(ServerLimits, RepliesLargerThanTheSocketBufferArriveWholeAndInOrder) {
  start(ConnectionLimits{});
  std::optional<ClientTransport> client;
  auto connection = connect_accepted(client);
  ASSERT_NE(connection, nullptr);
  patterned_.insert(connection->id());
  constexpr uint64_t kReplies = 8;  // 8 MiB: far more than a socket buffer
  for (uint64_t i = 0; i < kReplies; ++i) ASSERT_TRUE(send_stats(*client).is_ok());
  std::vector<uint64_t> words(kReplies * kWordsPerBigReply);
  std::atomic<bool> all_read{false};
  std::thread reader([&] {
    auto* out = reinterpret_cast<char*>(words.data());
    const size_t total = words.size() * sizeof(uint64_t);
    size_t got = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (got < total && std::chrono::steady_clock::now() < deadline) {
      pollfd p{client->fd(), POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = ::recv(client->fd(), out + got, total - got, 0);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    all_read = got == total;
  });
  const bool handled = run_until([&] { return frames_[connection->id()] == kReplies; });
  const bool drained = run_until([&] { return connection->queued_reply_bytes() == 0; });
  reader.join();
  ASSERT_TRUE(handled);
  ASSERT_TRUE(drained);
  ASSERT_TRUE(all_read);
  size_t wrong = 0;
  for (uint64_t n = 0; n < kReplies; ++n) {
    for (uint64_t i = 0; i < kWordsPerBigReply; ++i) {
      if (words[n * kWordsPerBigReply + i] != (n << 32 | i)) ++wrong;
    }
  }
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(disconnects_, 0);
}

TEST_F(ServerLimits, FramesTheHandlerHoldsAreBoundedAndReadingResumesWhenItLetsGo) {
  ConnectionLimits limits;
  limits.max_held_request_bytes = 1 << 20;
  start(limits);
  std::optional<ClientTransport> keeping_client;
  auto keeping = connect_accepted(keeping_client);
  ASSERT_NE(keeping, nullptr);
  keeping_.insert(keeping->id());

  // About 120 KiB each; the sends go through a thread, as the server stops reading.
  constexpr int kRequests = 60;
  std::atomic<int> sent{0};
  std::thread sender([&] {
    for (int i = 0; i < kRequests; ++i) {
      if (!send_lookup(*keeping_client, 3000).is_ok()) return;
      ++sent;
    }
  });
  ASSERT_TRUE(run_until([&] { return keeping->reading_paused(); }));
  run_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(keeping->reading_paused());
  const size_t held = keeping->held_request_bytes();
  EXPECT_GE(held, limits.max_held_request_bytes);
  EXPECT_LE(held, limits.max_held_request_bytes + kept_frames_.back().size_bytes());
  EXPECT_LT(frames_[keeping->id()], kRequests);

  std::optional<ClientTransport> other_client;
  auto other = connect_accepted(other_client);
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(send_stats(*other_client).is_ok());
  ASSERT_TRUE(run_until([&] { return frames_[other->id()] == 1; }));

  // The handler lets go of what it held, again and again, until all arrived.
  const bool all_handled = run_until([&] {
    kept_frames_.clear();
    return frames_[keeping->id()] == kRequests;
  });
  sender.join();
  EXPECT_TRUE(all_handled);
  EXPECT_EQ(sent.load(), kRequests);
  kept_frames_.clear();
  EXPECT_EQ(keeping->held_request_bytes(), 0u);
  EXPECT_EQ(disconnects_, 0);
}

TEST_F(ServerLimits, ConnectionsPastTheCapAreRefusedNamingTheLimit) {
  ConnectionLimits limits;
  limits.max_connections = 2;
  limits.admin_reserved_connections = 0;
  start(limits);
  std::optional<ClientTransport> a;
  std::optional<ClientTransport> b;
  ASSERT_NE(connect_accepted(a), nullptr);
  auto b_server = connect_accepted(b);
  ASSERT_NE(b_server, nullptr);

  auto c = connect();
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  ASSERT_TRUE(run_until([&] { return server_->refused_connections() == 1; }));
  EXPECT_EQ(accepted_.size(), 2u);  // the handler never saw it
  auto reply = c->receive();
  ASSERT_TRUE(reply.is_ok()) << reply.status().to_string();
  auto response = reply->reader().getRoot<wire::Response>();
  EXPECT_EQ(response.getId(), 0u);
  ASSERT_TRUE(response.isError());
  EXPECT_EQ(response.getError().getCode(), wire::ErrorCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(response.getError().getRetryable());
  const std::string message = response.getError().getMessage().cStr();
  EXPECT_NE(message.find("max-connections"), std::string::npos) << message;
  EXPECT_NE(message.find("2 connections"), std::string::npos) << message;
  EXPECT_EQ(c->receive().status().code(), StatusCode::kUnavailable);

  // Those already in are served meanwhile.
  ASSERT_TRUE(send_stats(*a).is_ok());
  ASSERT_TRUE(run_until([&] { return frames_[accepted_[0]->id()] == 1; }));

  // When one leaves, a newcomer gets in.
  b.reset();
  ASSERT_TRUE(run_until([&] { return server_->connection_count() == 1; }));
  std::optional<ClientTransport> d;
  auto d_server = connect_accepted(d);
  ASSERT_NE(d_server, nullptr);
  ASSERT_TRUE(send_stats(*d).is_ok());
  ASSERT_TRUE(run_until([&] { return frames_[d_server->id()] == 1; }));
  EXPECT_EQ(server_->refused_connections(), 1u);
}

// The refusal `client` got: its message (empty when it got something else).
std::string refusal_message(ClientTransport& client) {
  auto reply = client.receive();
  if (!reply.is_ok()) return {};
  auto response = reply->reader().getRoot<wire::Response>();
  if (response.getId() != 0 || !response.isError() ||
      response.getError().getCode() != wire::ErrorCode::RESOURCE_EXHAUSTED ||
      !response.getError().getRetryable()) {
    return {};
  }
  return response.getError().getMessage().cStr();
}

// Every connection here comes from this process's uid: one tenant.
TEST_F(ServerLimits, OneUidPastItsLimitIsRefusedNamingItAndAnAdminIsNot) {
  ConnectionLimits limits;
  limits.max_connections_per_uid = 2;
  start(limits);
  std::optional<ClientTransport> a;
  std::optional<ClientTransport> b;
  ASSERT_NE(connect_accepted(a), nullptr);
  ASSERT_NE(connect_accepted(b), nullptr);
  EXPECT_EQ(server_->connection_count(::getuid()), 2u);

  auto c = connect();
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  ASSERT_TRUE(run_until([&] { return server_->refused_connections() == 1; }));
  EXPECT_EQ(server_->refused_connections(Refusal::kPerUid), 1u);
  const std::string message = refusal_message(*c);
  EXPECT_NE(message.find("max-connections-per-tenant"), std::string::npos) << message;
  EXPECT_NE(message.find(fmt::format("uid {}", ::getuid())), std::string::npos) << message;
  EXPECT_EQ(accepted_.size(), 2u);

  // An admin of the same uid is not held to it.
  admin_now_ = true;
  std::optional<ClientTransport> d;
  ASSERT_NE(connect_accepted(d), nullptr);
  EXPECT_EQ(server_->connection_count(), 3u);
  // The admin's connection does not count against the uid: with one of the uid's own
  // gone, its next newcomer gets in.
  admin_now_ = false;
  EXPECT_EQ(server_->connection_count(::getuid()), 2u);
  a.reset();
  ASSERT_TRUE(run_until([&] { return server_->connection_count() == 2; }));
  std::optional<ClientTransport> e;
  ASSERT_NE(connect_accepted(e), nullptr);
}

TEST_F(ServerLimits, TheLastConnectionsAreReservedForAdmins) {
  ConnectionLimits limits;
  limits.max_connections = 4;
  limits.admin_reserved_connections = 2;
  start(limits);
  std::optional<ClientTransport> a;
  std::optional<ClientTransport> b;
  ASSERT_NE(connect_accepted(a), nullptr);
  ASSERT_NE(connect_accepted(b), nullptr);
  auto c = connect();  // the third would take a reserved one
  ASSERT_TRUE(c.is_ok());
  ASSERT_TRUE(run_until([&] { return server_->refused_connections() == 1; }));
  EXPECT_EQ(server_->refused_connections(Refusal::kAdminReserved), 1u);
  const std::string message = refusal_message(*c);
  EXPECT_NE(message.find("admin-reserved-connections"), std::string::npos) << message;

  admin_now_ = true;  // both reserved ones go to admins; past max_connections nobody gets in
  std::optional<ClientTransport> d;
  std::optional<ClientTransport> e;
  ASSERT_NE(connect_accepted(d), nullptr);
  ASSERT_NE(connect_accepted(e), nullptr);
  auto f = connect();
  ASSERT_TRUE(f.is_ok());
  ASSERT_TRUE(run_until([&] { return server_->refused_connections() == 2; }));
  EXPECT_EQ(server_->refused_connections(Refusal::kMaxConnections), 1u);
  EXPECT_NE(refusal_message(*f).find("max-connections"), std::string::npos);
}

// More reserved than half of max_connections reserves half: others are never shut out.
TEST_F(ServerLimits, AtMostHalfTheConnectionsAreReserved) {
  ConnectionLimits limits;
  limits.max_connections = 3;
  limits.admin_reserved_connections = 8;
  start(limits);
  std::optional<ClientTransport> a;
  std::optional<ClientTransport> b;
  ASSERT_NE(connect_accepted(a), nullptr);
  ASSERT_NE(connect_accepted(b), nullptr);  // 3 / 2 = 1 reserved
  auto c = connect();
  ASSERT_TRUE(c.is_ok());
  ASSERT_TRUE(run_until([&] { return server_->refused_connections() == 1; }));
  EXPECT_EQ(server_->refused_connections(Refusal::kAdminReserved), 1u);
  const std::string message = refusal_message(*c);
  EXPECT_NE(message.find("last 1 of its 3"), std::string::npos) << message;
}

TEST_F(ServerLimits, AConnectionNotIntroducedInTimeIsClosedAndAnIntroducedOneStays) {
  ConnectionLimits limits;
  limits.introduction_timeout_ms = 1000;
  start(limits);
  std::optional<ClientTransport> silent;
  std::optional<ClientTransport> stranger;
  std::optional<ClientTransport> talking;
  auto talking_server = connect_accepted(talking);
  ASSERT_NE(talking_server, nullptr);
  ASSERT_TRUE(send_stats(*talking).is_ok());  // introduces it, well before its deadline
  auto silent_server = connect_accepted(silent);
  auto stranger_server = connect_accepted(stranger);
  ASSERT_NE(silent_server, nullptr);
  ASSERT_NE(stranger_server, nullptr);
  strangers_.insert(stranger_server->id());
  ASSERT_TRUE(send_stats(*stranger).is_ok());  // a frame, but not an introduction
  ASSERT_TRUE(run_until([&] { return frames_[talking_server->id()] == 1; }));
  ASSERT_TRUE(run_until([&] { return !silent_server->is_open() && !stranger_server->is_open(); }));
  EXPECT_EQ(server_->introduction_timeouts(), 2u);
  EXPECT_EQ(silent->receive().status().code(), StatusCode::kUnavailable);  // closed, no reply
  // Its deadline, set when it was accepted before the other two, has passed too.
  EXPECT_TRUE(talking_server->is_open());
  ASSERT_TRUE(send_stats(*talking).is_ok());
  ASSERT_TRUE(run_until([&] { return frames_[talking_server->id()] == 2; }));
  EXPECT_EQ(server_->introduction_timeouts(), 2u);
}

}  // namespace
}  // namespace kvtier::ipc
