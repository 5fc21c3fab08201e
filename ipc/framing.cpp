#include "ipc/framing.h"

#include <kj/exception.h>

#include <cstring>

namespace kvtier::ipc {
namespace {

uint32_t read_u32(const std::byte* p) {
  uint32_t value;
  std::memcpy(&value, p, sizeof(value));
  return value;  // x86-64 and aarch64 are little endian, as the framing is
}

capnp::ReaderOptions reader_options(const FrameLimits& limits) {
  capnp::ReaderOptions options;
  // Every word may be traversed at most ~4 times: a frame cannot amplify into more
  // work than a few passes over its own bytes.
  options.traversalLimitInWords = limits.max_frame_bytes / sizeof(capnp::word) * 4;
  options.nestingLimit = 16;
  return options;
}

}  // namespace

Frame::Frame(kj::Array<capnp::word> words, const FrameLimits& limits) : words_(kj::mv(words)) {
  reader_ = std::make_unique<capnp::FlatArrayMessageReader>(words_.asPtr(), reader_options(limits));
}

std::span<std::byte> FrameParser::write_space(size_t at_least) {
  if (begin_ == end_) begin_ = end_ = 0;
  if (buffer_.size() - end_ < at_least) {
    // Compact first; frames always start 8-byte aligned relative to the buffer start
    // because every frame's length is a multiple of 8.
    if (begin_ > 0) {
      std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    if (buffer_.size() - end_ < at_least) buffer_.resize(end_ + at_least);
  }
  return {buffer_.data() + end_, buffer_.size() - end_};
}

uint64_t FrameParser::expected_frame_bytes() const {
  size_t available = end_ - begin_;
  const std::byte* p = buffer_.data() + begin_;
  if (available < 4) return 0;
  uint64_t segments = uint64_t{read_u32(p)} + 1;
  uint64_t header_bytes = (4 + 4 * segments + 7) & ~uint64_t{7};
  if (segments > limits_.max_segments || available < 4 + 4 * segments) return 0;
  uint64_t total = header_bytes;
  for (uint64_t i = 0; i < segments; ++i) total += uint64_t{read_u32(p + 4 + 4 * i)} * 8;
  return total;
}

Result<std::optional<Frame>> FrameParser::next() {
  size_t available = end_ - begin_;
  const std::byte* p = buffer_.data() + begin_;
  if (available < 4) return std::optional<Frame>();
  uint64_t segments = uint64_t{read_u32(p)} + 1;
  if (segments > limits_.max_segments) {
    return invalid_argument("frame header announces {} segments; the limit is {}", segments,
                            limits_.max_segments);
  }
  uint64_t header_bytes = (4 + 4 * segments + 7) & ~uint64_t{7};
  if (available < 4 + 4 * segments) return std::optional<Frame>();
  uint64_t total = header_bytes;
  for (uint64_t i = 0; i < segments; ++i) {
    total += uint64_t{read_u32(p + 4 + 4 * i)} * 8;
    if (total > limits_.max_frame_bytes) {
      return invalid_argument("frame of at least {} bytes exceeds the limit of {} bytes", total,
                              limits_.max_frame_bytes);
    }
  }
  if (available < total) return std::optional<Frame>();
  auto words = kj::heapArray<capnp::word>(total / sizeof(capnp::word));
  std::memcpy(words.begin(), p, total);
  begin_ += total;
  try {
    return std::optional<Frame>(Frame(kj::mv(words), limits_));
  } catch (const kj::Exception& e) {
    return invalid_argument("malformed frame: {}", e.getDescription().cStr());
  }
}

Result<kj::Array<capnp::word>> encode_frame(capnp::MessageBuilder& message,
                                            const FrameLimits& limits) {
  auto segments = message.getSegmentsForOutput();
  if (segments.size() > limits.max_segments) {
    return invalid_argument("message has {} segments; the limit is {}", segments.size(),
                            limits.max_segments);
  }
  auto words = capnp::messageToFlatArray(segments);
  if (words.size() * sizeof(capnp::word) > limits.max_frame_bytes) {
    return invalid_argument("message of {} bytes exceeds the frame limit of {} bytes",
                            words.size() * sizeof(capnp::word), limits.max_frame_bytes);
  }
  return words;
}

Status catch_malformed(std::string_view what, const std::function<Status()>& fn) {
  try {
    return fn();
  } catch (const kj::Exception& e) {
    return invalid_argument("malformed {}: {}", what, e.getDescription().cStr());
  }
}

}  // namespace kvtier::ipc
