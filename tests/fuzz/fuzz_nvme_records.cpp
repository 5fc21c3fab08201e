// The NVMe index's records as read back from RocksDB (tiers/nvme_format.h), from any
// bytes: what decodes re-encodes to the same bytes (block keys and records, layout
// records, u32/u64) or to a record that decodes equal (session records and deltas);
// a delta applies only to what it fits. Nothing malformed decodes.
#include <string>
#include <string_view>

#include "tests/fuzz/fuzz_check.h"
#include "tiers/nvme_format.h"

using namespace kvtier;
using kvtier::fuzz::Input;

namespace {

bool same_session(const NvmeSessionRecord& a, const NvmeSessionRecord& b) {
  return a.namespace_name == b.namespace_name && a.session_id == b.session_id &&
         a.layout_digest == b.layout_digest && a.created_wall_ms == b.created_wall_ms &&
         a.last_active_wall_ms == b.last_active_wall_ms && a.turns == b.turns &&
         a.state == b.state && a.priority == b.priority && a.returns == b.returns &&
         (a.sum_log_gap == b.sum_log_gap ||
          (a.sum_log_gap != a.sum_log_gap && b.sum_log_gap != b.sum_log_gap)) &&
         a.blocks == b.blocks;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input input(data, size);
  const uint8_t which = input.byte() % 6;
  const uint8_t split = input.byte();
  auto rest = input.rest();
  const std::string_view bytes(reinterpret_cast<const char*>(rest.data()), rest.size());
  const size_t cut = rest.empty() ? 0 : split % (rest.size() + 1);
  const std::string_view first = bytes.substr(0, cut);
  const std::string_view second = bytes.substr(cut);

  switch (which) {
    case 0:
      if (auto key = decode_block_key(bytes)) {
        KVTIER_FUZZ_CHECK(encode_block_key(*key) == bytes, "block key does not round-trip");
        KVTIER_FUZZ_CHECK(!key->hash.bytes().empty(), "a block key without a hash");
      }
      break;
    case 1:
      if (auto record = decode_block_record(bytes)) {
        KVTIER_FUZZ_CHECK(encode_block_record(*record) == bytes,
                          "block record does not round-trip");
      }
      break;
    case 2:
      if (auto layout = decode_layout(first, second)) {
        KVTIER_FUZZ_CHECK(encode_layout_key(layout->namespace_name, layout->layout_digest) == first,
                          "layout key does not round-trip");
        KVTIER_FUZZ_CHECK(encode_u64(layout->block_bytes) == second,
                          "layout value does not round-trip");
      }
      break;
    case 3:
      if (auto value = decode_u64(bytes)) {
        KVTIER_FUZZ_CHECK(encode_u64(*value) == bytes, "u64 does not round-trip");
      }
      if (auto value = decode_u32(bytes)) {
        KVTIER_FUZZ_CHECK(encode_u32(*value) == bytes, "u32 does not round-trip");
      }
      break;
    case 4:
      if (auto session = decode_session(first, second)) {
        KVTIER_FUZZ_CHECK(encode_session_key(session->namespace_name, session->session_id) == first,
                          "session key does not round-trip");
        auto again = decode_session(first, encode_session_value(*session));
        KVTIER_FUZZ_CHECK(again && same_session(*session, *again),
                          "session value does not round-trip");
        // A delta of its own tail rebuilds it from its head.
        const uint32_t base = session->blocks.empty() ? 0 : split % (session->blocks.size() + 1);
        NvmeSessionRecord head = *session;
        head.blocks.resize(base);
        KVTIER_FUZZ_CHECK(apply_session_delta(head, encode_session_delta(*session, base)),
                          "its own delta does not apply");
        KVTIER_FUZZ_CHECK(same_session(head, *session), "delta rebuilt another record");
      }
      break;
    case 5: {
      // Any delta on a well-formed record: applied or refused, never a broken record.
      NvmeSessionRecord record;
      record.namespace_name = "uid:1000";
      record.session_id = "conversation";
      record.layout_digest = 42;
      const uint8_t hash_bytes[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
      record.blocks.assign(3, BlockHash(std::span<const uint8_t>(hash_bytes)));
      const std::string key = encode_session_key(record.namespace_name, record.session_id);
      if (apply_session_delta(record, bytes)) {
        auto again = decode_session(key, encode_session_value(record));
        KVTIER_FUZZ_CHECK(again && same_session(record, *again),
                          "a record after a delta does not round-trip");
      }
      break;
    }
  }
  return 0;
}
