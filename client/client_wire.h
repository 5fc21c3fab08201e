// The wire form of what more than one part of the client library writes or reads:
// the Hello request and its reply, a layout, an unexpected reply. Internal to the
// library (tests that build raw requests use fill_layout too).
#pragma once

#include <string>
#include <string_view>

#include "client/client.h"
#include "schema/kvtier.capnp.h"

namespace kvtier {

// An error for a reply of another kind than the request's (`wanted`).
Status unexpected_reply(wire::Response::Reader response, std::string_view wanted);
// Writes `layout` into a wire Layout.
void fill_layout(wire::Layout::Builder out, const LayoutSpec& layout);
// Writes a Hello into `request` (its id is the caller's).
void fill_hello(wire::Request::Builder request, const LayoutSpec& layout,
                const std::string& engine_name, double prefill_tokens_per_second,
                DeviceKind device_kind, DataPath data_path);
// The daemon's answer to Hello (an Internal error for a reply of another kind).
Result<HelloInfo> decode_hello(wire::Response::Reader response);

}  // namespace kvtier
