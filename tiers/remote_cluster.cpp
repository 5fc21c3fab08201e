#include "tiers/remote_cluster.h"

#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <algorithm>
#include <charconv>

namespace kvtier::remote {
namespace {

// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, no reflection — the
// checksum the cluster spec names for key slots. Bitwise: keys are short.
uint16_t crc16(std::string_view data) {
  uint16_t crc = 0;
  for (const char ch : data) {
    crc ^= static_cast<uint16_t>(static_cast<uint8_t>(ch)) << 8;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x8000) != 0 ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                                : static_cast<uint16_t>(crc << 1);
    }
  }
  return crc;
}

timeval to_timeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

std::optional<long long> parse_integer(std::string_view text) {
  long long value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using OwnedReply = std::unique_ptr<redisReply, ReplyDeleter>;

}  // namespace

std::string_view hash_tag(std::string_view key) {
  const size_t open = key.find('{');
  if (open == std::string_view::npos) return key;
  const size_t close = key.find('}', open + 1);
  if (close == std::string_view::npos || close == open + 1) return key;
  return key.substr(open + 1, close - open - 1);
}

uint16_t key_slot(std::string_view key) {
  return static_cast<uint16_t>(crc16(hash_tag(key)) % kClusterSlots);
}

std::string Endpoint::to_string() const {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                             : fmt::format("{}:{}", host, port);
}

Result<Endpoint> parse_endpoint(std::string_view text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return invalid_argument("'{}' is not host:port", text);
  }
  std::string_view host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const auto port = parse_integer(text.substr(colon + 1));
  if (!port || *port <= 0 || *port > 65535) {
    return invalid_argument("'{}' has no port in 1..65535", text);
  }
  return Endpoint{std::string(host), static_cast<int>(*port)};
}

std::optional<Redirect> parse_redirect(std::string_view error) {
  Redirect::Kind kind;
  if (error.starts_with("MOVED ")) {
    kind = Redirect::Kind::kMoved;
    error.remove_prefix(6);
  } else if (error.starts_with("ASK ")) {
    kind = Redirect::Kind::kAsk;
    error.remove_prefix(4);
  } else {
    return std::nullopt;
  }
  const size_t space = error.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const auto slot = parse_integer(error.substr(0, space));
  if (!slot || *slot < 0 || *slot >= kClusterSlots) return std::nullopt;
  std::string_view address = error.substr(space + 1);
  if (address.starts_with(':') && address.find(':', 1) == std::string_view::npos) {
    // cluster-preferred-endpoint-type unknown-endpoint: ":port", on the node that replied.
    const auto port = parse_integer(address.substr(1));
    if (!port || *port <= 0 || *port > 65535) return std::nullopt;
    return Redirect{kind, static_cast<uint16_t>(*slot), Endpoint{"", static_cast<int>(*port)}};
  }
  auto to = parse_endpoint(address);
  if (!to.is_ok()) return std::nullopt;
  return Redirect{kind, static_cast<uint16_t>(*slot), std::move(*to)};
}

Reply Reply::from(const redisReply& r) {
  Reply out;
  switch (r.type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR:
      out.kind = r.type == REDIS_REPLY_STRING   ? Kind::kString
                 : r.type == REDIS_REPLY_STATUS ? Kind::kStatus
                                                : Kind::kError;
      out.str.assign(r.str, r.len);
      break;
    case REDIS_REPLY_INTEGER:
      out.kind = Kind::kInteger;
      out.integer = r.integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.kind = Kind::kArray;
      out.elements.reserve(r.elements);
      for (size_t i = 0; i < r.elements; ++i) out.elements.push_back(from(*r.element[i]));
      break;
    default:
      out.kind = Kind::kNil;
      break;
  }
  return out;
}

Status SlotMap::assign_from_cluster_slots(const Reply& reply, std::string_view asked_host) {
  if (reply.kind != Reply::Kind::kArray) {
    return internal_error("CLUSTER SLOTS replied with something other than an array");
  }
  SlotMap next;
  for (const Reply& range : reply.elements) {
    // [first, last, [host, port, id, ...], replicas...]
    if (range.kind != Reply::Kind::kArray || range.elements.size() < 3 ||
        range.elements[0].kind != Reply::Kind::kInteger ||
        range.elements[1].kind != Reply::Kind::kInteger ||
        range.elements[2].kind != Reply::Kind::kArray || range.elements[2].elements.size() < 2) {
      return internal_error("CLUSTER SLOTS: a slot range is not [first, last, [host, port]]");
    }
    const long long first = range.elements[0].integer;
    const long long last = range.elements[1].integer;
    const Reply& master = range.elements[2];
    if (first < 0 || last >= kClusterSlots || first > last ||
        (master.elements[0].kind != Reply::Kind::kString &&
         master.elements[0].kind != Reply::Kind::kNil) ||
        master.elements[1].kind != Reply::Kind::kInteger || master.elements[1].integer <= 0 ||
        master.elements[1].integer > 65535) {
      return internal_error("CLUSTER SLOTS: bad range {}..{} or master address", first, last);
    }
    Endpoint at{master.elements[0].str, static_cast<int>(master.elements[1].integer)};
    if (at.host.empty()) at.host = std::string(asked_host);
    next.assign(static_cast<uint16_t>(first), static_cast<uint16_t>(last), at);
  }
  *this = std::move(next);
  return Status::ok();
}

void SlotMap::assign(uint16_t first, uint16_t last, const Endpoint& master) {
  auto it = std::find(masters_.begin(), masters_.end(), master);
  const auto index = static_cast<int16_t>(it - masters_.begin());
  if (it == masters_.end()) masters_.push_back(master);
  for (uint32_t slot = first; slot <= last && slot < kClusterSlots; ++slot) {
    slot_to_master_[slot] = index;
  }
}

const Endpoint* SlotMap::master_of(uint16_t slot) const {
  if (slot >= kClusterSlots) return nullptr;
  const int16_t index = slot_to_master_[slot];
  return index < 0 ? nullptr : &masters_[static_cast<size_t>(index)];
}

std::vector<Endpoint> SlotMap::masters() const {
  return masters_;
}

struct RemoteCluster::Node {
  redisContext* context = nullptr;
  ~Node() {
    if (context != nullptr) redisFree(context);
  }
};

Result<std::unique_ptr<RemoteCluster>> RemoteCluster::connect(ClusterOptions options) {
  if (options.seeds.empty()) return invalid_argument("no seed nodes for the Redis Cluster");
  if (options.max_redirects < 1) return invalid_argument("max_redirects must be at least 1");
  // A zero socket timeout would mean "block forever" to hiredis.
  if (options.connect_timeout.count() <= 0 || options.command_timeout.count() <= 0) {
    return invalid_argument("the Redis connect and command timeouts must be positive");
  }
  std::unique_ptr<RemoteCluster> cluster(new RemoteCluster(std::move(options)));
  KVTIER_RETURN_IF_ERROR(cluster->refresh_slots());
  return cluster;
}

RemoteCluster::RemoteCluster(ClusterOptions options) : options_(std::move(options)) {}
RemoteCluster::~RemoteCluster() = default;

Status RemoteCluster::refresh_slots() {
  // The masters we know first (the seeds may have left), then the seeds.
  std::vector<Endpoint> ask = slots_.masters();
  for (const Endpoint& seed : options_.seeds) {
    if (std::find(ask.begin(), ask.end(), seed) == ask.end()) ask.push_back(seed);
  }
  std::string failures;
  bool denied = false;
  for (const Endpoint& at : ask) {
    auto reply = run_on(at, {"CLUSTER", "SLOTS"}, false);
    if (!reply.is_ok()) {
      denied = denied || reply.status().code() == StatusCode::kPermissionDenied;
      failures += fmt::format("; {}: {}", at.to_string(), reply.status().message());
      continue;
    }
    if (reply->kind == Reply::Kind::kError) {
      failures += fmt::format("; {}: {}", at.to_string(), reply->str);
      continue;
    }
    SlotMap next;
    if (Status parsed = next.assign_from_cluster_slots(*reply, at.host); !parsed.is_ok()) {
      failures += fmt::format("; {}: {}", at.to_string(), parsed.message());
      continue;
    }
    if (next.empty()) {
      failures += fmt::format("; {}: no slot is served", at.to_string());
      continue;
    }
    slots_ = std::move(next);
    map_suspect_ = false;
    last_refresh_ = std::chrono::steady_clock::now();
    return Status::ok();
  }
  last_refresh_ = std::chrono::steady_clock::now();
  // Refused credentials are not a node being down: say so, so that it is not retried.
  if (denied) return permission_denied("no node of the Redis Cluster gave a slot map{}", failures);
  return unavailable("no node of the Redis Cluster gave a slot map{}", failures);
}

Result<RemoteCluster::Node*> RemoteCluster::node(const Endpoint& at) {
  const std::string name = at.to_string();
  auto it = nodes_.find(name);
  if (it != nodes_.end()) return it->second.get();
  const auto now = std::chrono::steady_clock::now();
  if (auto down = down_until_.find(name); down != down_until_.end()) {
    if (now < down->second) {
      return unavailable("Redis node {} failed less than {} ms ago", name, kNodeBackoff.count());
    }
    down_until_.erase(down);
  }
  auto fresh = std::make_unique<Node>();
  fresh->context =
      redisConnectWithTimeout(at.host.c_str(), at.port, to_timeval(options_.connect_timeout));
  if (fresh->context == nullptr) return resource_exhausted("cannot allocate a hiredis context");
  if (fresh->context->err != 0) {
    down_until_[name] = std::chrono::steady_clock::now() + kNodeBackoff;
    return unavailable("Redis node {}: {}", name, fresh->context->errstr);
  }
  if (redisSetTimeout(fresh->context, to_timeval(options_.command_timeout)) != REDIS_OK) {
    return unavailable("Redis node {}: cannot set the command timeout", name);
  }
  if (!options_.user.empty()) {
    const char* argv[] = {"AUTH", options_.user.c_str(), options_.password.c_str()};
    const size_t lens[] = {4, options_.user.size(), options_.password.size()};
    OwnedReply reply(static_cast<redisReply*>(redisCommandArgv(fresh->context, 3, argv, lens)));
    if (!reply) {
      down_until_[name] = std::chrono::steady_clock::now() + kNodeBackoff;
      return unavailable("Redis node {}: AUTH: {}", name, fresh->context->errstr);
    }
    if (reply->type == REDIS_REPLY_ERROR) {
      return permission_denied("Redis node {} refused user '{}': {}", name, options_.user,
                               std::string_view(reply->str, reply->len));
    }
  }
  Node* raw = fresh.get();
  nodes_.emplace(name, std::move(fresh));
  return raw;
}

void RemoteCluster::drop(const Endpoint& at) {
  nodes_.erase(at.to_string());
  // Its connection broke or timed out: not again until the back-off has passed, so a
  // node that hangs costs one timeout per back-off, not one per command.
  down_until_[at.to_string()] = std::chrono::steady_clock::now() + kNodeBackoff;
  map_suspect_ = true;
}

void RemoteCluster::refresh_if_suspect() {
  if (!map_suspect_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_refresh_ < kSuspectRefreshInterval) return;
  (void)refresh_slots();  // on failure the old map stays, and stays suspect
}

Result<Reply> RemoteCluster::run_on(const Endpoint& at, const std::vector<std::string_view>& argv,
                                    bool asking) {
  auto connection = node(at);
  if (!connection.is_ok()) {
    map_suspect_ = true;
    return connection.status();
  }
  redisContext* context = (*connection)->context;
  if (asking) {
    OwnedReply ok(static_cast<redisReply*>(redisCommand(context, "ASKING")));
    if (!ok) {
      const std::string why = context->errstr;
      drop(at);
      return unavailable("Redis node {}: ASKING: {}", at.to_string(), why);
    }
  }
  std::vector<const char*> args;
  std::vector<size_t> lens;
  args.reserve(argv.size());
  lens.reserve(argv.size());
  for (std::string_view arg : argv) {
    args.push_back(arg.data());
    lens.push_back(arg.size());
  }
  OwnedReply reply(static_cast<redisReply*>(
      redisCommandArgv(context, static_cast<int>(args.size()), args.data(), lens.data())));
  if (!reply) {
    // A timeout or a dropped connection leaves the context unusable.
    const std::string why = context->errstr;
    drop(at);
    return unavailable("Redis node {}: {}", at.to_string(), why);
  }
  return Reply::from(*reply);
}

Result<Reply> RemoteCluster::command(const std::vector<std::string_view>& argv, size_t key_index) {
  if (key_index >= argv.size()) {
    return invalid_argument("command of {} arguments has no key at {}", argv.size(), key_index);
  }
  refresh_if_suspect();
  const uint16_t slot = key_slot(argv[key_index]);
  const Endpoint* owner = slots_.master_of(slot);
  if (owner == nullptr) {
    KVTIER_RETURN_IF_ERROR(refresh_slots());
    owner = slots_.master_of(slot);
    if (owner == nullptr) return unavailable("no master serves slot {}", slot);
  }
  Endpoint at = *owner;
  bool asking = false;
  for (int hop = 0; hop <= options_.max_redirects; ++hop) {
    auto reply = run_on(at, argv, asking);
    if (!reply.is_ok()) return reply.status();
    if (reply->kind != Reply::Kind::kError) return reply;
    auto redirect = parse_redirect(reply->str);
    if (!redirect) return reply;  // Redis's own error: the caller's to judge
    if (redirect->to.host.empty()) {
      redirect->to.host = at.host;
    }
    at = redirect->to;
    if (redirect->kind == Redirect::Kind::kMoved) {
      ++moved_;
      asking = false;
      // The slot has a new owner: the map is stale for it and probably for others.
      slots_.assign(redirect->slot, redirect->slot, redirect->to);
      (void)refresh_slots();
    } else {
      ++asks_;
      asking = true;
    }
  }
  return unavailable("slot {}: more than {} redirects", slot, options_.max_redirects);
}

namespace {

// One node's share of a pipeline: the commands sent to it and its connection.
struct SentToNode {
  const std::string* name;
  const Endpoint* at;
  const std::vector<size_t>* indexes;
  redisContext* context = nullptr;
  bool broken = false;
};

// Appends the node's commands to its connection and writes them out; `broken` when the
// connection failed.
void send_to_node(SentToNode& node_sent, const std::vector<RemoteCluster::Argv>& commands) {
  redisContext* context = node_sent.context;
  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (size_t i : *node_sent.indexes) {
    args.clear();
    lens.clear();
    for (std::string_view arg : commands[i]) {
      args.push_back(arg.data());
      lens.push_back(arg.size());
    }
    if (redisAppendCommandArgv(context, static_cast<int>(args.size()), args.data(), lens.data()) !=
        REDIS_OK) {
      node_sent.broken = true;
      break;
    }
  }
  // Written out now (bounded by the command timeout, as a read is).
  for (int done = 0; !node_sent.broken && !done;) {
    if (redisBufferWrite(context, &done) != REDIS_OK) node_sent.broken = true;
  }
}

// Reads the node's replies into `results`; a redirected command goes into `retry`, and
// every command after the connection broke is Unavailable.
void read_from_node(SentToNode& node_sent, std::vector<Result<Reply>>& results,
                    std::vector<size_t>& retry) {
  redisContext* context = node_sent.context;
  bool& broken = node_sent.broken;
  const std::string& name = *node_sent.name;
  bool reported = false;  // the first failure says why; the others that it happened
  for (size_t i : *node_sent.indexes) {
    void* raw = nullptr;
    if (broken || redisGetReply(context, &raw) != REDIS_OK || raw == nullptr) {
      broken = true;
      results[i] = reported ? unavailable("Redis node {}: connection lost in a pipeline", name)
                            : unavailable("Redis node {}: {}", name, context->errstr);
      reported = true;
      continue;
    }
    OwnedReply reply(static_cast<redisReply*>(raw));
    Reply decoded = Reply::from(*reply);
    if (decoded.kind == Reply::Kind::kError && parse_redirect(decoded.str)) {
      retry.push_back(i);
      continue;
    }
    results[i] = std::move(decoded);
  }
}

}  // namespace

std::vector<Result<Reply>> RemoteCluster::pipeline(const std::vector<Argv>& commands,
                                                   size_t key_index) {
  refresh_if_suspect();
  std::vector<Result<Reply>> results(commands.size(), Result<Reply>(Reply{}));
  // Commands by the master of their key's slot, in order.
  std::map<std::string, std::pair<Endpoint, std::vector<size_t>>> by_node;
  std::vector<size_t> unrouted;
  for (size_t i = 0; i < commands.size(); ++i) {
    if (key_index >= commands[i].size()) {
      results[i] = invalid_argument("command {} has no key at {}", i, key_index);
      continue;
    }
    const Endpoint* owner = slots_.master_of(key_slot(commands[i][key_index]));
    if (owner == nullptr) {
      unrouted.push_back(i);
      continue;
    }
    auto& entry = by_node[owner->to_string()];
    entry.first = *owner;
    entry.second.push_back(i);
  }
  std::vector<size_t> retry = unrouted;
  // Every node's commands are sent before any reply is read, so the masters work at
  // the same time: while one node's replies are read the others' are on their way.
  std::vector<SentToNode> sent;
  sent.reserve(by_node.size());
  for (auto& [name, entry] : by_node) {
    const auto& [at, indexes] = entry;
    auto connection = node(at);
    if (!connection.is_ok()) {
      map_suspect_ = true;
      for (size_t i : indexes) results[i] = connection.status();
      continue;
    }
    SentToNode& node_sent =
        sent.emplace_back(SentToNode{&name, &at, &indexes, (*connection)->context});
    send_to_node(node_sent, commands);
  }
  for (SentToNode& node_sent : sent) {
    read_from_node(node_sent, results, retry);
    if (node_sent.broken) drop(*node_sent.at);
  }
  for (size_t i : retry) results[i] = command(commands[i], key_index);
  return results;
}

}  // namespace kvtier::remote
