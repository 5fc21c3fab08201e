// The NVMe tier's record encodings round-trip, and malformed bytes decode to nothing
// rather than to a wrong record.
#include "tiers/nvme_format.h"

#include <gtest/gtest.h>

#include "tests/tiers/test_memory.h"

namespace kvtier {
namespace {

TEST(NvmeFormat, BlockKeyAndRecordRoundTrip) {
  NvmeBlockKey key{"uid:1000", 0xfedcba9876543210ull, tiers_test::hash_of(77)};
  auto decoded = decode_block_key(encode_block_key(key));
  ASSERT_TRUE(decoded.has_value());
  EXPECT_TRUE(*decoded == key);
  NvmeBlockRecord record{64ull << 20, 2 << 20, 0x0123456789abcdefull, 1700000000000ull};
  const std::string value = encode_block_record(record);
  EXPECT_EQ(value.size(), 32u);
  auto back = decode_block_record(value);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->offset, record.offset);
  EXPECT_EQ(back->bytes, record.bytes);
  EXPECT_EQ(back->checksum, record.checksum);
  EXPECT_EQ(back->last_access_wall_ms, record.last_access_wall_ms);
}

TEST(NvmeFormat, MalformedBlockBytesDecodeToNothing) {
  EXPECT_FALSE(decode_block_key("").has_value());
  EXPECT_FALSE(decode_block_key(std::string("\x05uid:1", 6)).has_value());  // no digest
  std::string no_hash = encode_block_key({"ns", 1, tiers_test::hash_of(1)});
  no_hash.resize(no_hash.size() - 4);
  EXPECT_FALSE(decode_block_key(no_hash).has_value());
  std::string long_hash = no_hash + std::string(33, 'x');
  EXPECT_FALSE(decode_block_key(long_hash).has_value());
  std::string record = encode_block_record({1, 2, 3, 4});
  EXPECT_FALSE(decode_block_record(record.substr(0, 31)).has_value());
  EXPECT_FALSE(decode_block_record(record + "x").has_value());
  EXPECT_FALSE(decode_block_record(encode_block_record({1, 0, 3, 4})).has_value());
}

TEST(NvmeFormat, SessionRoundTripAndCorruptCounts) {
  NvmeSessionRecord session;
  session.namespace_name = "shared";
  session.session_id = "conversation-42";
  session.layout_digest = 99;
  session.created_wall_ms = 5;
  session.last_active_wall_ms = 6;
  session.turns = 7;
  session.state = 1;
  session.priority = 2;
  session.returns = 4;
  session.sum_log_gap = 12.5;
  for (uint32_t i = 0; i < 50; ++i) session.blocks.push_back(tiers_test::hash_of(i));
  const std::string key = encode_session_key(session.namespace_name, session.session_id);
  const std::string value = encode_session_value(session);
  auto back = decode_session(key, value);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->namespace_name, "shared");
  EXPECT_EQ(back->session_id, "conversation-42");
  EXPECT_EQ(back->turns, 7u);
  EXPECT_EQ(back->state, 1);
  EXPECT_EQ(back->priority, 2);
  EXPECT_EQ(back->returns, 4u);
  EXPECT_EQ(back->sum_log_gap, 12.5);
  EXPECT_EQ(back->blocks, session.blocks);
  // A block count far beyond the value's size is corrupt, not an allocation.
  std::string huge = value;
  huge[42] = '\xff';
  huge[43] = '\xff';
  huge[44] = '\xff';
  huge[45] = '\x7f';
  EXPECT_FALSE(decode_session(key, huge).has_value());
  EXPECT_FALSE(decode_session(key, value.substr(0, value.size() - 1)).has_value());
  EXPECT_FALSE(decode_session(encode_session_key("ns", ""), value).has_value());
}

TEST(NvmeFormat, SessionDeltaAppliesInOrderAndKeepsAPrefix) {
  NvmeSessionRecord session;
  session.layout_digest = 7;
  for (uint32_t i = 0; i < 3; ++i) session.blocks.push_back(tiers_test::hash_of(i));
  NvmeSessionRecord stored = session;  // what the value holds
  session.turns = 2;
  session.state = 1;
  session.sum_log_gap = 3.5;
  for (uint32_t i = 3; i < 6; ++i) session.blocks.push_back(tiers_test::hash_of(i));
  const std::string delta = encode_session_delta(session, 3);
  // A delta is the header and the new blocks: its size does not grow with the session.
  EXPECT_LT(delta.size(), encode_session_value(session).size());
  ASSERT_TRUE(apply_session_delta(stored, delta));
  EXPECT_EQ(stored.blocks, session.blocks);
  EXPECT_EQ(stored.turns, 2u);
  EXPECT_EQ(stored.state, 1);
  EXPECT_EQ(stored.sum_log_gap, 3.5);
  // A stored record longer than the base (a cut was written whole, then an old delta
  // is replayed on it) is cut to the base, then appended to.
  NvmeSessionRecord longer = stored;
  longer.blocks.push_back(tiers_test::hash_of(99));
  ASSERT_TRUE(apply_session_delta(longer, encode_session_delta(session, 6)));
  EXPECT_EQ(longer.blocks, session.blocks);
  // Shorter than the base: a write that never landed; the session ends where it does.
  NvmeSessionRecord shorter;
  shorter.blocks = {tiers_test::hash_of(0)};
  ASSERT_TRUE(apply_session_delta(shorter, delta));
  EXPECT_EQ(shorter.blocks.size(), 1u);
  EXPECT_EQ(shorter.turns, 2u);
  // Malformed deltas are refused, not applied in part.
  EXPECT_FALSE(apply_session_delta(stored, delta.substr(0, delta.size() - 1)));
  EXPECT_FALSE(apply_session_delta(stored, delta + "x"));
  EXPECT_FALSE(apply_session_delta(stored, ""));
}

TEST(NvmeFormat, LayoutRecordRoundTrip) {
  auto layout = decode_layout(encode_layout_key("uid:5", 42), encode_u64(4096));
  ASSERT_TRUE(layout.has_value());
  EXPECT_EQ(layout->namespace_name, "uid:5");
  EXPECT_EQ(layout->layout_digest, 42u);
  EXPECT_EQ(layout->block_bytes, 4096u);
  EXPECT_FALSE(decode_layout("format_version", encode_u32(1)).has_value());
}

}  // namespace
}  // namespace kvtier
