// What the c_api*.cpp files share behind client/kvtier.h: the opaque handles, the
// boundary wrapper that turns Status and exceptions into kvtier_status plus the
// thread's message, and the checks that turn C arguments into kvtier::Client ones.
// Not installed; nothing here is exported from libkvtier.so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <variant>
#include <vector>

#include "client/client.h"
#include "client/kvtier.h"
#include "common/status.h"

struct kvtier_client {
  // Shared with every kvtier_pending made from it, so that freeing a pending after
  // kvtier_close is safe: the connection closes with the last owner.
  std::shared_ptr<kvtier::Client> client;
  std::optional<kvtier::HelloInfo> hello;  // the last Hello's reply (kvtier_gpu_stager_create)
};

struct kvtier_pending {
  std::shared_ptr<kvtier::Client> client;  // keeps the connection the reply comes on
  std::variant<kvtier::Pending<kvtier::SaveResult>, kvtier::Pending<kvtier::LookupResult>,
               kvtier::Pending<kvtier::LoadResult>, kvtier::Pending<kvtier::BeginTurnResult>,
               kvtier::Pending<uint32_t>,  // CloseSession: released blocks
               kvtier::Pending<kvtier::TierNotices>>
      reply;
  uint32_t count = 0;   // hashes asked (Lookup): how many tiers_out entries to write
  bool waited = false;  // the one wait has happened
};

namespace kvtier::c_api {

// kvtier::Tier in the C ABI's numbering (KVTIER_TIER_NONE = 3, KVTIER_TIER_REMOTE = 4).
inline kvtier_tier c_tier(Tier tier) {
  switch (tier) {
    case Tier::kHbm:
      return KVTIER_TIER_HBM;
    case Tier::kRam:
      return KVTIER_TIER_RAM;
    case Tier::kNvme:
      return KVTIER_TIER_NVME;
    case Tier::kRemote:
      return KVTIER_TIER_REMOTE;
    case Tier::kNone:
      break;
  }
  return KVTIER_TIER_NONE;
}

// Records `status` as the calling thread's last error and returns its code.
kvtier_status finish(const Status& status) noexcept;
kvtier_status finish_exception(std::exception_ptr exception) noexcept;

// Runs `body` (returning Status) at the C boundary: no exception escapes.
template <typename Body>
kvtier_status guarded(Body&& body) noexcept {
  try {
    return finish(body());
  } catch (...) {
    return finish_exception(std::current_exception());
  }
}

// InvalidArgument "<name> is NULL" when `pointer` is NULL, else OK.
Status require(const void* pointer, std::string_view name);
// NULL with count > 0 is InvalidArgument; NULL with count 0 is an empty span.
Status require_array(const void* pointer, uint32_t count, std::string_view name);

// A kvtier_layout as the C++ client's (c_api.cpp), every field checked.
Result<LayoutSpec> to_layout(const kvtier_layout& layout);
Result<std::vector<BlockRef>> to_block_refs(const kvtier_block_ref* refs, uint32_t count);
Result<std::vector<BlockHash>> to_hashes(const kvtier_hash* hashes, uint32_t count);

// Copies `text` into a fixed char array, cut to fit, always NUL-terminated.
void copy_string(std::string_view text, char* out, size_t out_bytes);

// Writers of the C result structs (each may be given NULL: then nothing is written).
void write_save_result(const SaveResult& result, kvtier_save_result* out);
void write_lookup_result(const LookupResult& result, uint32_t count, uint32_t* hit_count,
                         kvtier_tier* tiers_out);
void write_load_result(const LoadResult& result, kvtier_load_result* out);
void write_begin_turn_result(const BeginTurnResult& result, kvtier_begin_turn_result* out);

}  // namespace kvtier::c_api
