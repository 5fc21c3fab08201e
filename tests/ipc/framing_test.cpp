// FrameParser: whole frames out of arbitrary chunks, limits enforced from the header.
#include "ipc/framing.h"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "schema/kvtier.capnp.h"

namespace kvtier::ipc {
namespace {

kj::Array<capnp::word> lookup_frame(uint64_t id, unsigned hashes) {
  capnp::MallocMessageBuilder message;
  auto request = message.initRoot<wire::Request>();
  request.setId(id);
  auto list = request.initLookup().initHashes(hashes);
  for (unsigned i = 0; i < hashes; ++i) {
    uint8_t bytes[16];
    std::memset(bytes, static_cast<int>(i), sizeof(bytes));
    list.set(i, capnp::Data::Reader(bytes, sizeof(bytes)));
  }
  return encode_frame(message).value();
}

void feed(FrameParser& parser, const std::byte* data, size_t size) {
  auto space = parser.write_space(size);
  std::memcpy(space.data(), data, size);
  parser.commit(size);
}

TEST(FrameParser, ReassemblesFramesSplitAtEveryByteBoundary) {
  auto first = lookup_frame(7, 32);
  auto second = lookup_frame(8, 3);
  std::vector<std::byte> stream;
  for (auto* frame : {&first, &second}) {
    auto bytes = frame->asBytes();
    stream.insert(stream.end(), reinterpret_cast<const std::byte*>(bytes.begin()),
                  reinterpret_cast<const std::byte*>(bytes.end()));
  }
  std::mt19937 rng(1);
  for (int trial = 0; trial < 50; ++trial) {
    FrameParser parser;
    std::vector<uint64_t> ids;
    size_t offset = 0;
    while (offset < stream.size()) {
      size_t chunk = std::min<size_t>(1 + rng() % 40, stream.size() - offset);
      feed(parser, stream.data() + offset, chunk);
      offset += chunk;
      while (true) {
        auto frame = parser.next();
        ASSERT_TRUE(frame.is_ok()) << frame.status().to_string();
        if (!frame->has_value()) break;
        auto request = (*frame)->reader().getRoot<wire::Request>();
        ids.push_back(request.getId());
        EXPECT_EQ(request.getLookup().getHashes().size(), ids.size() == 1 ? 32u : 3u);
      }
    }
    EXPECT_EQ(ids, (std::vector<uint64_t>{7, 8}));
    EXPECT_EQ(parser.pending_bytes(), 0u);
  }
}

TEST(FrameParser, RefusesTooManySegmentsFromTheFirstFourBytes) {
  FrameParser parser(FrameLimits{64, 16 << 20});
  uint32_t count_minus_one = 1000;
  feed(parser, reinterpret_cast<const std::byte*>(&count_minus_one), 4);
  auto frame = parser.next();
  ASSERT_FALSE(frame.is_ok());
  EXPECT_EQ(frame.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(frame.status().message().find("1001 segments"), std::string::npos);
}

TEST(FrameParser, RefusesOversizeFrameBeforeItsBodyArrives) {
  FrameParser parser(FrameLimits{64, 1 << 20});
  uint32_t header[2] = {0, (2u << 20) / 8};  // one segment of 2 MiB
  feed(parser, reinterpret_cast<const std::byte*>(header), sizeof(header));
  auto frame = parser.next();
  ASSERT_FALSE(frame.is_ok());
  EXPECT_NE(frame.status().message().find("exceeds"), std::string::npos);
}

TEST(FrameParser, ReportsExpectedSizeOfAPartialFrame) {
  auto frame = lookup_frame(1, 4);
  auto bytes = frame.asBytes();
  FrameParser parser;
  feed(parser, reinterpret_cast<const std::byte*>(bytes.begin()), bytes.size() - 8);
  auto next = parser.next();
  ASSERT_TRUE(next.is_ok());
  EXPECT_FALSE(next->has_value());
  EXPECT_EQ(parser.expected_frame_bytes(), bytes.size());
  EXPECT_EQ(parser.pending_bytes(), bytes.size() - 8);
}

TEST(FrameParser, GarbageInsideAValidHeaderIsCaughtWhenRead) {
  // A frame whose header is fine but whose root pointer is nonsense.
  uint64_t words[3];
  uint32_t header[2] = {0, 2};
  std::memcpy(words, header, 8);
  words[1] = 0xffffffffffffff00ull;  // a struct pointer far outside the segment
  words[2] = 0;
  FrameParser parser;
  feed(parser, reinterpret_cast<const std::byte*>(words), sizeof(words));
  auto frame = parser.next();
  ASSERT_TRUE(frame.is_ok());
  ASSERT_TRUE(frame->has_value());
  Status status = catch_malformed("request", [&] {
    (void)(*frame)->reader().getRoot<wire::Request>().getId();
    return Status::ok();
  });
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("malformed request"), std::string::npos);
}

TEST(EncodeFrame, RefusesMessagesOverTheLimit) {
  capnp::MallocMessageBuilder message;
  auto request = message.initRoot<wire::Request>();
  std::vector<uint8_t> big(2 << 20, 1);
  request.initLookup().initHashes(1).set(0, capnp::Data::Reader(big.data(), big.size()));
  auto encoded = encode_frame(message, FrameLimits{64, 1 << 20});
  ASSERT_FALSE(encoded.is_ok());
  EXPECT_NE(encoded.status().message().find("exceeds"), std::string::npos);
}

}  // namespace
}  // namespace kvtier::ipc
