// Replies: sending answers and timing requests (replies.h).
#include "daemon/replies.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/common.h>
#include <kj/exception.h>

#include <algorithm>

#include "common/log.h"
#include "daemon/admin_service.h"
#include "schema/wire_tier.h"

namespace kvtier::daemon {

namespace {

size_t kind_of(wire::Request::Which which) {
  const auto kind = static_cast<size_t>(which);
  return kind < RequestMetrics::kMaxKinds ? kind : RequestMetrics::kUnknownKind;
}

}  // namespace

void set_wire_error(wire::Error::Builder out, const Status& status) {
  static_assert(static_cast<uint16_t>(StatusCode::kNotSupported) ==
                static_cast<uint16_t>(wire::ErrorCode::NOT_SUPPORTED));
  out.setCode(static_cast<wire::ErrorCode>(static_cast<uint16_t>(status.code())));
  out.setMessage(status.message());
  out.setRetryable(status.retryable());
}

void Replies::reply(const ConnectionPtr& connection, uint64_t id, const Fill& fill) {
  if (building_) {  // a reply built while another is (never, today): a segment of its own
    capnp::MallocMessageBuilder message;
    send_reply(message, connection, id, fill);
    return;
  }
  // Most replies fit the reused first segment, which saves allocating and zeroing one per
  // reply (the builder zeroes what it used when it goes).
  building_ = true;
  KJ_DEFER(assert_control_thread(); building_ = false);  // a lambda, analysed on its own
  capnp::MallocMessageBuilder message(kj::arrayPtr(first_segment_.data(), first_segment_.size()));
  send_reply(message, connection, id, fill);
}

void Replies::send_reply(capnp::MessageBuilder& message, const ConnectionPtr& connection,
                         uint64_t id, const Fill& fill) {
  auto response = message.initRoot<wire::Response>();
  response.setId(id);
  fill(response);
  record_reply(connection, id, response.asReader());
  connection->send(capnp::messageToFlatArray(message));
  connection->request_done();
}

void Replies::send_built(capnp::MessageBuilder& message, const ConnectionPtr& connection,
                         uint64_t id) {
  auto response = message.getRoot<wire::Response>();
  response.setId(id);
  record_reply(connection, id, response.asReader());
  connection->send(capnp::messageToFlatArray(message));
  connection->request_done();
}

void Replies::reply_error(const ConnectionPtr& connection, uint64_t id, const Status& status) {
  if (status.code() == StatusCode::kInternal) {
    KVTIER_LOG_ERROR("request {} on connection {}: {}", id, connection->id(), status.to_string());
  } else {
    KVTIER_LOG_DEBUG("request {} on connection {}: {}", id, connection->id(), status.to_string());
  }
  reply(connection, id,
        [&](wire::Response::Builder response) { set_wire_error(response.initError(), status); });
}

void Replies::record_request(EngineContext& engine, uint64_t id, wire::Request::Reader request) {
  auto& pending = engine.pending_requests[id];
  pending.kind = kind_of(request.which());
  pending.started = std::chrono::steady_clock::now();
  pending.load_hit_tiers.clear();
  if (request.which() != wire::Request::LOAD || !engine.hello_done || ctx_.store == nullptr) return;
  try {
    // The Loads of a layer-wise load after the one starting at plane 0 name the same
    // blocks again: their hits were counted already.
    if (request.getLoad().getPlaneBegin() != 0) return;
    for (auto block : request.getLoad().getBlocks()) {
      auto hash = block.getHash();
      if (hash.size() == 0 || hash.size() > BlockHash::kMaxBytes) break;
      auto info = ctx_.store->lookup(
          {engine.layout_key, BlockHash(std::span<const uint8_t>(hash.begin(), hash.size()))});
      if (!info) break;
      pending.load_hit_tiers.push_back(info->location.tier);
    }
  } catch (const kj::Exception&) {
    // A malformed list: dispatch() reports it; there is nothing to count.
    pending.load_hit_tiers.clear();
  }
}

void Replies::record_reply(const ConnectionPtr& c, uint64_t id, wire::Response::Reader response) {
  const StatusCode code =
      response.isError()
          ? static_cast<StatusCode>(static_cast<uint16_t>(response.getError().getCode()))
          : StatusCode::kOk;
  auto engine = std::static_pointer_cast<EngineContext>(c->user_state);
  if (engine == nullptr) return;  // the connection closed; nobody waits for this reply
  auto pending = engine->pending_requests.find(id);
  if (pending == engine->pending_requests.end()) {
    metrics_.observe(RequestMetrics::kUnknownKind, std::chrono::nanoseconds(0), code);
    return;
  }
  metrics_.observe(pending->second.kind, std::chrono::steady_clock::now() - pending->second.started,
                   code);
  if (response.isLookup()) {
    for (auto tier : response.getLookup().getTiers()) metrics_.count_hit(from_wire(tier));
  } else if (response.isLoad()) {
    const auto& tiers = pending->second.load_hit_tiers;
    const size_t loaded = std::min<size_t>(response.getLoad().getLoadedCount(), tiers.size());
    for (size_t i = 0; i < loaded; ++i) metrics_.count_hit(tiers[i]);
  }
  engine->pending_requests.erase(pending);
}

void Part::reply(const ConnectionPtr& connection, uint64_t id, const Fill& fill) const {
  replies_.reply(connection, id, fill);
}

void Part::reply_error(const ConnectionPtr& connection, uint64_t id, const Status& status) const {
  replies_.reply_error(connection, id, status);
}

}  // namespace kvtier::daemon
