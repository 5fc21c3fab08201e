// What the fuzz targets share: a check that stops the run with a message when an
// invariant breaks (libFuzzer then saves the input), and a way to read input bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string_view>

#include "common/status.h"

#define KVTIER_FUZZ_CHECK(cond, ...)                                                    \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: invariant broken: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                \
      std::fprintf(stderr, "\n");                                                       \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

namespace kvtier::fuzz {

// Consumes bytes from the front of the input; zeros once it is used up.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = (v << 8) | byte();
    return v;
  }
  std::span<const uint8_t> rest() {
    auto out = std::span<const uint8_t>(data_ + at_, size_ - at_);
    at_ = size_;
    return out;
  }
  size_t left() const { return size_ - at_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

// Whether `message` names one of `fields`.
inline bool names_one_of(std::string_view message, std::initializer_list<std::string_view> fields) {
  for (std::string_view field : fields) {
    if (message.find(field) != std::string_view::npos) return true;
  }
  return false;
}

// A refusal is InvalidArgument and its message names one of `fields`.
inline void refused_naming(const Status& refused, std::initializer_list<std::string_view> fields) {
  KVTIER_FUZZ_CHECK(refused.code() == StatusCode::kInvalidArgument, "%s",
                    refused.to_string().c_str());
  KVTIER_FUZZ_CHECK(names_one_of(refused.message(), fields), "%s", refused.message().c_str());
}

}  // namespace kvtier::fuzz
