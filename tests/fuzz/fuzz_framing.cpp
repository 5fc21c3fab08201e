// Stream framing (ipc/framing.h) under any byte stream cut into any chunks: a frame the
// parser yields is exactly the bytes it came from and parses alone to the same frame
// (whatever the chunking); an error is
// InvalidArgument and final; a header over the limits is refused before its body
// arrives; nothing is yielded that the limits forbid.
#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstring>
#include <vector>

#include "ipc/framing.h"
#include "tests/fuzz/fuzz_check.h"

using kvtier::StatusCode;
using kvtier::fuzz::Input;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input input(data, size);
  kvtier::ipc::FrameLimits limits;
  limits.max_segments = 1 + input.byte() % 8;
  limits.max_frame_bytes = 8 * (1 + input.u32() % 8192);  // up to 64 KiB
  const uint8_t chunk_seed = input.byte();
  std::span<const uint8_t> stream = input.rest();

  kvtier::ipc::FrameParser parser(limits);
  size_t fed = 0;
  size_t consumed = 0;  // bytes of the frames yielded
  bool failed = false;
  size_t round = 0;
  while (fed < stream.size() && !failed) {
    // Chunk sizes follow the input, from 1 byte up.
    const size_t spread = (chunk_seed + round * 37) % 97;
    const size_t chunk = std::min<size_t>(stream.size() - fed, 1 + spread * (round % 3 + 1));
    ++round;
    auto space = parser.write_space(chunk);
    KVTIER_FUZZ_CHECK(space.size() >= chunk, "write_space gave %zu for %zu", space.size(), chunk);
    std::memcpy(space.data(), stream.data() + fed, chunk);
    parser.commit(chunk);
    fed += chunk;
    while (true) {
      auto frame = parser.next();
      if (!frame.is_ok()) {
        KVTIER_FUZZ_CHECK(frame.status().code() == StatusCode::kInvalidArgument, "%s",
                          frame.status().to_string().c_str());
        KVTIER_FUZZ_CHECK(!frame.status().message().empty(), "an error without a message");
        failed = true;
        break;
      }
      if (!frame->has_value()) {
        // A partial frame announced over the limits would have been refused.
        KVTIER_FUZZ_CHECK(parser.expected_frame_bytes() <= limits.max_frame_bytes,
                          "waiting for a %llu-byte frame over the %llu limit",
                          static_cast<unsigned long long>(parser.expected_frame_bytes()),
                          static_cast<unsigned long long>(limits.max_frame_bytes));
        break;
      }
      kvtier::ipc::Frame& got = **frame;
      KVTIER_FUZZ_CHECK(got.size_bytes() <= limits.max_frame_bytes, "frame of %zu bytes",
                        got.size_bytes());
      // The frame is exactly the bytes it came from: re-framing its segments gives them back.
      const uint8_t* original = stream.data() + consumed;
      KVTIER_FUZZ_CHECK(consumed + got.size_bytes() <= fed, "a frame past the bytes fed");
      consumed += got.size_bytes();
      std::vector<uint8_t> copy(original, original + got.size_bytes());
      kvtier::ipc::FrameParser again(limits);
      auto again_space = again.write_space(copy.size());
      std::memcpy(again_space.data(), copy.data(), copy.size());
      again.commit(copy.size());
      auto reparsed = again.next();
      KVTIER_FUZZ_CHECK(reparsed.is_ok() && reparsed->has_value(),
                        "a yielded frame does not parse alone");
      KVTIER_FUZZ_CHECK((*reparsed)->size_bytes() == got.size_bytes(), "sizes differ");
      KVTIER_FUZZ_CHECK(again.pending_bytes() == 0, "bytes left after a whole frame");
    }
  }
  if (failed) {
    // An error is final: nothing more comes out.
    auto after = parser.next();
    KVTIER_FUZZ_CHECK(!after.is_ok() || !after->has_value(), "a frame after an error");
  }
  return 0;
}
