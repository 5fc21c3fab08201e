#include "common/gpu_uuid.h"

#include <fmt/format.h>

namespace kvtier {

std::string format_gpu_uuid(std::span<const uint8_t, 16> b) {
  return fmt::format(
      "GPU-{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}"
      "{:02x}{:02x}",
      b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
      b[15]);
}

}  // namespace kvtier
