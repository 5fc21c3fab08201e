// The C boundary of the data path: Save, Lookup, Load, BeginTurn, CloseSession, each
// blocking and as a kvtier_pending, and tier notices (a kvtier_pending only).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <utility>

#include "client/c_api_internal.h"
#include "client/kvtier.h"

#define KVTIER_EXPORT extern "C" __attribute__((visibility("default")))

namespace kvtier::c_api {

void write_save_result(const SaveResult& result, kvtier_save_result* out) {
  if (out == nullptr) return;
  out->stored = result.stored;
  out->deduplicated = result.deduplicated;
}

void write_lookup_result(const LookupResult& result, uint32_t count, uint32_t* hit_count,
                         kvtier_tier* tiers_out) {
  // Never more hits than hashes asked about, whatever the reply says: callers index
  // tiers_out by it.
  if (hit_count != nullptr) *hit_count = std::min(result.hit_count, count);
  if (tiers_out == nullptr) return;
  for (uint32_t i = 0; i < count; ++i) {
    tiers_out[i] = i < result.hit_count && i < result.tiers.size() ? c_tier(result.tiers[i])
                                                                   : KVTIER_TIER_NONE;
  }
}

void write_load_result(const LoadResult& result, kvtier_load_result* out) {
  if (out == nullptr) return;
  out->loaded_count = result.loaded_count;
  out->stop_code = static_cast<uint32_t>(result.stop_reason.code());
  copy_string(result.stop_reason.message(), out->stop_message, sizeof(out->stop_message));
}

void write_begin_turn_result(const BeginTurnResult& result, kvtier_begin_turn_result* out) {
  if (out == nullptr) return;
  out->known_blocks = result.known_blocks;
  out->promoted_blocks = result.promoted_blocks;
}

namespace {

Result<Retention> to_retention(const kvtier_retention& in, std::string_view field) {
  if (in.reserved != 0) return invalid_argument("{}.reserved is {}; must be 0", field, in.reserved);
  if (in.priority > 100) {
    return invalid_argument("{}.priority is {}; 1..100 allowed (0: not given)", field, in.priority);
  }
  if (in.priority == 0 && in.duration_ms != 0) {
    return invalid_argument("{}.duration_ms is {} without a priority", field, in.duration_ms);
  }
  return Retention{static_cast<uint8_t>(in.priority), in.duration_ms};
}

// The options of kvtier_save_with_retention, checked against the save's `count` refs.
Result<SaveOptions> to_save_options(const kvtier_retention* session_retention,
                                    const kvtier_range_retention* ranges, uint32_t range_count,
                                    uint32_t count) {
  SaveOptions options;
  if (session_retention != nullptr) {
    auto retention = to_retention(*session_retention, "session_retention");
    if (!retention.is_ok()) return retention.status();
    options.retention = *retention;  // priority 0: not given, as NULL
  }
  if (range_count > 0 && ranges == nullptr) {
    return invalid_argument("ranges is NULL with range_count {}", range_count);
  }
  uint64_t covered = 0;
  for (uint32_t i = 0; i < range_count; ++i) {
    const kvtier_range_retention& range = ranges[i];
    if (range.count == 0) return invalid_argument("ranges[{}].count is 0", i);
    if ((covered += range.count) > count) {
      return invalid_argument("ranges cover {} refs in total by ranges[{}]; at most the save's {}",
                              covered, i, count);
    }
    if (uint64_t{range.first} + range.count > count) {
      return invalid_argument("ranges[{}] covers refs {}..{}; the save has {}", i, range.first,
                              uint64_t{range.first} + range.count - 1, count);
    }
    auto retention = to_retention(range.retention, fmt::format("ranges[{}].retention", i));
    if (!retention.is_ok()) return retention.status();
    options.block_retention.push_back({range.first, range.count, *retention});
  }
  return options;
}

// Hands `reply` to the caller as a new kvtier_pending, or returns why it was not sent.
template <typename T>
Status make_pending(kvtier_client* client, Pending<T> reply, uint32_t count, kvtier_pending** out) {
  if (!reply.send_status().is_ok()) return reply.send_status();
  auto* pending = new (std::nothrow) kvtier_pending{client->client, std::move(reply), count, false};
  if (pending == nullptr) {
    reply.abandon();  // sent: its reply must not wait in the client forever
    return resource_exhausted("out of memory for a pending request");
  }
  *out = pending;
  return Status::ok();
}

// The one wait of `pending`, which must hold a Pending<T> (`kind` names it in errors).
template <typename T, typename Write>
Status wait_pending(kvtier_pending* pending, std::string_view kind, Write&& write) {
  KVTIER_RETURN_IF_ERROR(require(pending, "pending"));
  auto* reply = std::get_if<Pending<T>>(&pending->reply);
  if (reply == nullptr) {
    // In the order of kvtier_pending::reply's alternatives.
    static constexpr const char* kKinds[] = {"save",       "lookup",        "load",
                                             "begin_turn", "close_session", "tier_notices"};
    const char* actual = kKinds[pending->reply.index()];
    return invalid_argument("pending is a {0}, not a {1}: wait with kvtier_pending_wait_{0}",
                            actual, kind);
  }
  if (pending->waited) return invalid_argument("pending was already waited for");
  pending->waited = true;
  auto result = reply->wait();
  if (!result.is_ok()) return result.status();
  write(*result);
  return Status::ok();
}

}  // namespace
}  // namespace kvtier::c_api

using namespace kvtier;
using namespace kvtier::c_api;

// ---- Blocking -------------------------------------------------------------------

KVTIER_EXPORT kvtier_status kvtier_save_with_retention(
    kvtier_client* client, const char* session_id, const kvtier_block_ref* refs, uint32_t count,
    int end_of_turn, const kvtier_retention* session_retention,
    const kvtier_range_retention* ranges, uint32_t range_count, kvtier_save_result* out) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(client, "client"));
    KVTIER_RETURN_IF_ERROR(require(session_id, "session_id"));
    auto blocks = to_block_refs(refs, count);
    if (!blocks.is_ok()) return blocks.status();
    auto options = to_save_options(session_retention, ranges, range_count, count);
    if (!options.is_ok()) return options.status();
    auto saved = client->client->save(session_id, *blocks, end_of_turn != 0, *options);
    if (!saved.is_ok()) return saved.status();
    write_save_result(*saved, out);
    return Status::ok();
  });
}

KVTIER_EXPORT kvtier_status kvtier_save(kvtier_client* client, const char* session_id,
                                        const kvtier_block_ref* refs, uint32_t count,
                                        int end_of_turn, kvtier_save_result* out) {
  return kvtier_save_with_retention(client, session_id, refs, count, end_of_turn, nullptr, nullptr,
                                    0, out);
}

KVTIER_EXPORT kvtier_status kvtier_lookup(kvtier_client* client, const kvtier_hash* hashes,
                                          uint32_t count, uint32_t* hit_count,
                                          kvtier_tier* tiers_out) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(client, "client"));
    KVTIER_RETURN_IF_ERROR(require(hit_count, "hit_count"));
    auto list = to_hashes(hashes, count);
    if (!list.is_ok()) return list.status();
    auto found = client->client->lookup(*list);
    if (!found.is_ok()) return found.status();
    write_lookup_result(*found, count, hit_count, tiers_out);
    return Status::ok();
  });
}

KVTIER_EXPORT kvtier_status kvtier_load_planes(kvtier_client* client, const char* session_id,
                                               const kvtier_block_ref* refs, uint32_t count,
                                               uint32_t plane_begin, uint32_t plane_count,
                                               kvtier_load_result* out) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(client, "client"));
    KVTIER_RETURN_IF_ERROR(require(session_id, "session_id"));
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    auto blocks = to_block_refs(refs, count);
    if (!blocks.is_ok()) return blocks.status();
    auto loaded = client->client->load(session_id, *blocks, PlaneRange{plane_begin, plane_count});
    if (!loaded.is_ok()) return loaded.status();
    write_load_result(*loaded, out);
    return Status::ok();
  });
}

KVTIER_EXPORT kvtier_status kvtier_load(kvtier_client* client, const char* session_id,
                                        const kvtier_block_ref* refs, uint32_t count,
                                        kvtier_load_result* out) {
  return kvtier_load_planes(client, session_id, refs, count, 0, 0, out);
}

KVTIER_EXPORT kvtier_status kvtier_begin_turn(kvtier_client* client, const char* session_id,
                                              kvtier_begin_turn_result* out) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(client, "client"));
    KVTIER_RETURN_IF_ERROR(require(session_id, "session_id"));
    auto begun = client->client->begin_turn(session_id);
    if (!begun.is_ok()) return begun.status();
    write_begin_turn_result(*begun, out);
    return Status::ok();
  });
}

KVTIER_EXPORT kvtier_status kvtier_close_session(kvtier_client* client, const char* session_id,
                                                 uint32_t* released_blocks) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(client, "client"));
    KVTIER_RETURN_IF_ERROR(require(session_id, "session_id"));
    auto closed = client->client->close_session(session_id);
    if (!closed.is_ok()) return closed.status();
    if (released_blocks != nullptr) *released_blocks = *closed;
    return Status::ok();
  });
}

// ---- Non-blocking ----------------------------------------------------------------

KVTIER_EXPORT kvtier_status kvtier_save_with_retention_async(
    kvtier_client* client, const char* session_id, const kvtier_block_ref* refs, uint32_t count,
    int end_of_turn, const kvtier_retention* session_retention,
    const kvtier_range_retention* ranges, uint32_t range_count, kvtier_pending** out) {
  if (out != nullptr) *out = nullptr;
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(client, "client"));
    KVTIER_RETURN_IF_ERROR(require(session_id, "session_id"));
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    auto blocks = to_block_refs(refs, count);
    if (!blocks.is_ok()) return blocks.status();
    auto options = to_save_options(session_retention, ranges, range_count, count);
    if (!options.is_ok()) return options.status();
    return make_pending(client,
                        client->client->save_async(session_id, *blocks, end_of_turn != 0, *options),
                        count, out);
  });
}

KVTIER_EXPORT kvtier_status kvtier_save_async(kvtier_client* client, const char* session_id,
                                              const kvtier_block_ref* refs, uint32_t count,
                                              int end_of_turn, kvtier_pending** out) {
  return kvtier_save_with_retention_async(client, session_id, refs, count, end_of_turn, nullptr,
                                          nullptr, 0, out);
}

KVTIER_EXPORT kvtier_status kvtier_lookup_async(kvtier_client* client, const kvtier_hash* hashes,
                                                uint32_t count, kvtier_pending** out) {
  if (out != nullptr) *out = nullptr;
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(client, "client"));
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    auto list = to_hashes(hashes, count);
    if (!list.is_ok()) return list.status();
    return make_pending(client, client->client->lookup_async(*list), count, out);
  });
}

KVTIER_EXPORT kvtier_status kvtier_load_planes_async(kvtier_client* client, const char* session_id,
                                                     const kvtier_block_ref* refs, uint32_t count,
                                                     uint32_t plane_begin, uint32_t plane_count,
                                                     kvtier_pending** out) {
  if (out != nullptr) *out = nullptr;
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(client, "client"));
    KVTIER_RETURN_IF_ERROR(require(session_id, "session_id"));
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    auto blocks = to_block_refs(refs, count);
    if (!blocks.is_ok()) return blocks.status();
    return make_pending(
        client,
        client->client->load_async(session_id, *blocks, PlaneRange{plane_begin, plane_count}),
        count, out);
  });
}

KVTIER_EXPORT kvtier_status kvtier_load_async(kvtier_client* client, const char* session_id,
                                              const kvtier_block_ref* refs, uint32_t count,
                                              kvtier_pending** out) {
  return kvtier_load_planes_async(client, session_id, refs, count, 0, 0, out);
}

KVTIER_EXPORT kvtier_status kvtier_begin_turn_async(kvtier_client* client, const char* session_id,
                                                    kvtier_pending** out) {
  if (out != nullptr) *out = nullptr;
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(client, "client"));
    KVTIER_RETURN_IF_ERROR(require(session_id, "session_id"));
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    return make_pending(client, client->client->begin_turn_async(session_id), 0, out);
  });
}

KVTIER_EXPORT kvtier_status kvtier_close_session_async(kvtier_client* client,
                                                       const char* session_id,
                                                       kvtier_pending** out) {
  if (out != nullptr) *out = nullptr;
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(client, "client"));
    KVTIER_RETURN_IF_ERROR(require(session_id, "session_id"));
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    return make_pending(client, client->client->close_session_async(session_id), 0, out);
  });
}

KVTIER_EXPORT kvtier_status kvtier_watch_tiers_async(kvtier_client* client, uint32_t max_wait_ms,
                                                     uint32_t max_changes, kvtier_pending** out) {
  if (out != nullptr) *out = nullptr;
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(client, "client"));
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    return make_pending(client, client->client->watch_tiers_async(max_wait_ms, max_changes),
                        max_changes, out);
  });
}

KVTIER_EXPORT kvtier_status kvtier_pending_poll(kvtier_pending* pending, int* ready) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(pending, "pending"));
    KVTIER_RETURN_IF_ERROR(require(ready, "ready"));
    if (pending->waited) return invalid_argument("pending was already waited for");
    *ready = std::visit([](auto& reply) { return reply.ready(); }, pending->reply) ? 1 : 0;
    return Status::ok();
  });
}

KVTIER_EXPORT kvtier_status kvtier_pending_wait_save(kvtier_pending* pending,
                                                     kvtier_save_result* out) {
  return guarded([&]() -> Status {
    return wait_pending<SaveResult>(pending, "save",
                                    [&](const SaveResult& r) { write_save_result(r, out); });
  });
}

KVTIER_EXPORT kvtier_status kvtier_pending_wait_lookup(kvtier_pending* pending, uint32_t* hit_count,
                                                       kvtier_tier* tiers_out) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(hit_count, "hit_count"));
    return wait_pending<LookupResult>(pending, "lookup", [&](const LookupResult& r) {
      write_lookup_result(r, pending->count, hit_count, tiers_out);
    });
  });
}

KVTIER_EXPORT kvtier_status kvtier_pending_wait_tier_notices(kvtier_pending* pending,
                                                             kvtier_tier_change* changes_out,
                                                             uint32_t capacity, uint32_t* count,
                                                             int* resync) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(count, "count"));
    KVTIER_RETURN_IF_ERROR(require(resync, "resync"));
    KVTIER_RETURN_IF_ERROR(require_array(changes_out, capacity, "changes_out"));
    return wait_pending<TierNotices>(pending, "tier_notices", [&](const TierNotices& notices) {
      // Changes past `capacity` cannot be told: the caller must look its blocks up again.
      const size_t written = std::min<size_t>(notices.changes.size(), capacity);
      for (size_t i = 0; i < written; ++i) {
        const TierChange& change = notices.changes[i];
        kvtier_tier_change& out = changes_out[i];
        std::memset(out.hash, 0, sizeof(out.hash));
        std::memcpy(out.hash, change.hash.bytes().data(), change.hash.size());
        out.hash_len = static_cast<uint32_t>(change.hash.size());
        out.tier = c_tier(change.tier);
      }
      *count = static_cast<uint32_t>(written);
      *resync = notices.resync || written < notices.changes.size() ? 1 : 0;
    });
  });
}

KVTIER_EXPORT kvtier_status kvtier_pending_wait_load(kvtier_pending* pending,
                                                     kvtier_load_result* out) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(out, "out"));
    return wait_pending<LoadResult>(pending, "load",
                                    [&](const LoadResult& r) { write_load_result(r, out); });
  });
}

KVTIER_EXPORT kvtier_status kvtier_pending_wait_begin_turn(kvtier_pending* pending,
                                                           kvtier_begin_turn_result* out) {
  return guarded([&]() -> Status {
    return wait_pending<BeginTurnResult>(
        pending, "begin_turn", [&](const BeginTurnResult& r) { write_begin_turn_result(r, out); });
  });
}

KVTIER_EXPORT kvtier_status kvtier_pending_wait_close_session(kvtier_pending* pending,
                                                              uint32_t* released_blocks) {
  return guarded([&]() -> Status {
    return wait_pending<uint32_t>(pending, "close_session", [&](uint32_t released) {
      if (released_blocks != nullptr) *released_blocks = released;
    });
  });
}

KVTIER_EXPORT void kvtier_pending_free(kvtier_pending* pending) {
  if (pending == nullptr) return;
  try {
    if (!pending->waited) {
      std::visit([](auto& reply) { reply.abandon(); }, pending->reply);
    }
  } catch (...) {
    // Abandoning only drops bookkeeping; failing to (out of memory) leaks one reply.
  }
  delete pending;
}
