// Cap'n Proto stream framing over a byte stream, with hard limits checked before any
// allocation.
//
// Frame layout (little endian): u32 segment_count-1, u32 size of each segment in
// words, u32 padding to an 8-byte boundary, then the segments. FrameParser
// accumulates bytes and yields whole frames; it refuses a header announcing more than
// `max_segments` segments or more than `max_frame_bytes` in total as soon as the
// header is visible, so a hostile peer cannot make it allocate.
//
// Thread-safety: none; one parser per connection.
#pragma once

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"

namespace kvtier::ipc {

struct FrameLimits {
  uint32_t max_segments = 64;
  uint64_t max_frame_bytes = 16ull << 20;
};

// One received message: owns its words and the reader over them.
class Frame {
 public:
  // REQUIRES: `words` holds exactly one valid stream frame (FrameParser checked it).
  Frame(kj::Array<capnp::word> words, const FrameLimits& limits);
  capnp::MessageReader& reader() { return *reader_; }
  size_t size_bytes() const { return words_.size() * sizeof(capnp::word); }

  // Something released with the frame (the receiving connection's account of the bytes
  // it holds); moves with it.
  void attach_lease(std::shared_ptr<void> lease) { lease_ = std::move(lease); }

 private:
  std::shared_ptr<void> lease_;  // first, so it is released after the words it counts
  kj::Array<capnp::word> words_;
  std::unique_ptr<capnp::FlatArrayMessageReader> reader_;
};

class FrameParser {
 public:
  explicit FrameParser(FrameLimits limits = {}) : limits_(limits) {}

  // Space to receive into; call commit(n) after writing n bytes there.
  std::span<std::byte> write_space(size_t at_least = 64 * 1024);
  void commit(size_t bytes) { end_ += bytes; }

  // The next complete frame, nullopt when more bytes are needed, or InvalidArgument
  // when the stream is corrupt (segment count or size over the limits); after an
  // error the parser is unusable and the connection should close.
  Result<std::optional<Frame>> next();

  // Bytes buffered that do not yet form a whole frame.
  size_t pending_bytes() const { return end_ - begin_; }
  // The size of the frame being assembled, once its header is visible (0 before).
  uint64_t expected_frame_bytes() const;

 private:
  FrameLimits limits_;
  std::vector<std::byte> buffer_;
  size_t begin_ = 0;
  size_t end_ = 0;
};

// Serializes a message in stream framing. Fails (InvalidArgument) when the message
// would exceed `limits`, so neither side ever sends what the other must refuse.
Result<kj::Array<capnp::word>> encode_frame(capnp::MessageBuilder& message,
                                            const FrameLimits& limits = {});

// capnp reports malformed data by throwing kj::Exception; this runs `fn` and turns
// such an exception into InvalidArgument naming `what`. No kj exception leaves ipc/.
Status catch_malformed(std::string_view what, const std::function<Status()>& fn);

}  // namespace kvtier::ipc
