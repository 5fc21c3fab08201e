// Broken framing: a truncated frame, a header announcing too much, and random bytes.
// Each gets an Error reply with id 0 (or just a closed connection for noise), only
// that connection closes, and the daemon keeps serving everyone else.
#include <gtest/gtest.h>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstring>
#include <random>

#include "tests/integration/daemon_harness.h"
#include "tests/integration/raw_connection.h"

namespace kvtier::integration {
namespace {

class BadFraming : public DaemonTest {
 protected:
  Result<RawConnection> connect_raw() const {
    return RawConnection::connect(daemon_->socket_path());
  }
};

std::vector<std::byte> stats_request_frame(uint64_t id) {
  capnp::MallocMessageBuilder message;
  auto request = message.initRoot<wire::Request>();
  request.setId(id);
  request.initStats();
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  std::vector<std::byte> out(bytes.size());
  std::memcpy(out.data(), bytes.begin(), bytes.size());
  return out;
}

std::vector<std::byte> frame_header(std::initializer_list<uint32_t> words) {
  std::vector<std::byte> out(words.size() * 4);
  size_t at = 0;
  for (uint32_t word : words) {
    std::memcpy(out.data() + at, &word, 4);  // little endian, as the framing is
    at += 4;
  }
  return out;
}

TEST_F(BadFraming, TruncatedFrameGetsAnErrorNamingIt) {
  auto raw = connect_raw();
  ASSERT_TRUE(raw.is_ok()) << raw.status().to_string();
  // Control: the whole frame gets a Stats reply on this kind of connection.
  {
    auto whole = connect_raw();
    ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
    ASSERT_TRUE(whole->send_bytes(stats_request_frame(7)).is_ok());
    auto reply = whole->receive_reply();
    ASSERT_TRUE(reply.is_ok()) << reply.status().to_string();
    EXPECT_EQ(reply->id, 7u);
    EXPECT_EQ(reply->which, wire::Response::STATS);
  }
  std::vector<std::byte> frame = stats_request_frame(1);
  ASSERT_GT(frame.size(), 16u);
  ASSERT_TRUE(raw->send_bytes(std::span(frame).first(frame.size() / 2)).is_ok());
  raw->shutdown_write();
  auto reply = raw->receive_reply();
  ASSERT_TRUE(reply.is_ok()) << reply.status().to_string();
  EXPECT_EQ(reply->id, 0u);
  EXPECT_TRUE(IsError(reply->error, StatusCode::kInvalidArgument, "truncated"));
  auto rest = raw->drain_until_closed();
  ASSERT_TRUE(rest.is_ok()) << "the daemon must close the connection: "
                            << rest.status().to_string();
  EXPECT_TRUE(rest->empty());
  EXPECT_TRUE(ServesSaveAndLoad(*daemon_, "after-truncated"));
}

TEST_F(BadFraming, StreamEndingInsideTheHeaderIsTruncatedToo) {
  auto raw = connect_raw();
  ASSERT_TRUE(raw.is_ok()) << raw.status().to_string();
  std::vector<std::byte> frame = stats_request_frame(1);
  ASSERT_TRUE(raw->send_bytes(std::span(frame).first(3)).is_ok());
  raw->shutdown_write();
  auto reply = raw->receive_reply();
  ASSERT_TRUE(reply.is_ok()) << reply.status().to_string();
  EXPECT_EQ(reply->id, 0u);
  EXPECT_TRUE(IsError(reply->error, StatusCode::kInvalidArgument, "truncated"));
  EXPECT_TRUE(raw->drain_until_closed().is_ok());
  EXPECT_TRUE(ServesSaveAndLoad(*daemon_, "after-short-header"));
}

TEST_F(BadFraming, OversizeFrameIsRefusedBeforeItArrives) {
  auto raw = connect_raw();
  ASSERT_TRUE(raw.is_ok()) << raw.status().to_string();
  // One segment of 16 MiB + 8 bytes: only the header is sent, and that must suffice.
  const uint32_t words = (16u << 20) / 8 + 1;
  ASSERT_TRUE(raw->send_bytes(frame_header({0, words})).is_ok());
  auto reply = raw->receive_reply();
  ASSERT_TRUE(reply.is_ok()) << reply.status().to_string();
  EXPECT_EQ(reply->id, 0u);
  EXPECT_TRUE(IsError(reply->error, StatusCode::kInvalidArgument, "exceeds"));
  auto rest = raw->drain_until_closed();
  ASSERT_TRUE(rest.is_ok()) << "the daemon must close the connection: "
                            << rest.status().to_string();
  EXPECT_TRUE(rest->empty());
  EXPECT_TRUE(ServesSaveAndLoad(*daemon_, "after-oversize"));
}

TEST_F(BadFraming, TooManySegmentsIsRefused) {
  auto raw = connect_raw();
  ASSERT_TRUE(raw.is_ok()) << raw.status().to_string();
  ASSERT_TRUE(raw->send_bytes(frame_header({1000, 1})).is_ok());
  auto reply = raw->receive_reply();
  ASSERT_TRUE(reply.is_ok()) << reply.status().to_string();
  EXPECT_EQ(reply->id, 0u);
  EXPECT_TRUE(IsError(reply->error, StatusCode::kInvalidArgument, "segments"));
  EXPECT_TRUE(raw->drain_until_closed().is_ok());
  EXPECT_TRUE(ServesSaveAndLoad(*daemon_, "after-segments"));
}

// Noise is answered with errors or a closed connection, never a crash or a hang.
// Two kinds per seed: raw random bytes, and a well-formed one-segment header around
// random content (which reaches the request decoder).
TEST_F(BadFraming, RandomBytesNeverKillTheDaemon) {
  // A bystander with state of its own, checked at the end.
  auto bystander = Engine::connect(daemon_->socket_path(), small_shape(8), "bystander");
  ASSERT_TRUE(bystander.is_ok()) << bystander.status().to_string();
  const auto hashes = PagedCache::chain_hashes("bystander", 4);
  const auto saved = Engine::refs(hashes, 0);
  bystander->fill(saved);
  ASSERT_TRUE(bystander->client->save("bystander", saved, true).is_ok());

  for (uint32_t seed = 1; seed <= 16; ++seed) {
    std::mt19937 rng(seed);
    for (bool framed : {false, true}) {
      SCOPED_TRACE(fmt::format("seed {} {}", seed, framed ? "framed" : "raw"));
      const size_t length = 8 * std::uniform_int_distribution<size_t>(1, 256)(rng);
      std::vector<std::byte> bytes =
          framed ? frame_header({0, static_cast<uint32_t>(length / 8)}) : std::vector<std::byte>{};
      for (size_t i = 0; i < length; ++i) bytes.push_back(static_cast<std::byte>(rng()));
      auto raw = connect_raw();
      ASSERT_TRUE(raw.is_ok()) << raw.status().to_string();
      // The daemon may close before it has read everything; a failed send is fine.
      (void)raw->send_bytes(bytes);
      raw->shutdown_write();
      auto replies = raw->drain_until_closed();
      ASSERT_TRUE(replies.is_ok()) << replies.status().to_string();
      for (const auto& reply : *replies) {
        if (reply.which == wire::Response::ERROR) {
          EXPECT_FALSE(reply.error.is_ok());
          EXPECT_FALSE(reply.error.message().empty());
          EXPECT_NE(reply.error.code(), StatusCode::kInternal) << reply.error.to_string();
        }
      }
      ASSERT_TRUE(daemon_->running()) << "kvtierd died on this input";
      auto client = daemon_->connect();
      ASSERT_TRUE(client.is_ok()) << client.status().to_string();
      ASSERT_TRUE((*client)->stats().is_ok());
    }
  }
  const auto restored = Engine::refs(hashes, 4);
  auto loaded = bystander->client->load("bystander", restored);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->loaded_count, 4u);
  EXPECT_EQ(bystander->count_verified(restored, loaded->loaded_count), 4u);
  EXPECT_TRUE(ServesSaveAndLoad(*daemon_, "after-garbage"));
}

}  // namespace
}  // namespace kvtier::integration
