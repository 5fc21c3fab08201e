// GPU UUIDs as NVIDIA tools print them ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"), so
// an engine and the daemon name a GPU the same way. No CUDA dependency: callers pass
// the 16 bytes of a cudaUUID_t.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace kvtier {

std::string format_gpu_uuid(std::span<const uint8_t, 16> bytes);

}  // namespace kvtier
