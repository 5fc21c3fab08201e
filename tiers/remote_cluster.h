// RemoteCluster: the Redis Cluster client the remote tier is built on — the one part of
// talking to a cluster that kvtier writes itself. hiredis speaks the protocol to one
// node; this routes each command to the master that owns its key's slot:
//  * key_slot(): CRC16 (XMODEM) of the key, or of its hash tag (the part between the
//    first '{' and the next '}', when not empty), mod 16384 — the cluster spec's rule,
//    so keys sharing a tag ("kvtier:{ns}:...") share a slot and a node;
//  * SlotMap: slot ranges → master endpoint, from CLUSTER SLOTS;
//  * redirects: "MOVED slot host:port" (the slot has a new owner: refresh the map and
//    retry there) and "ASK slot host:port" (the slot is being migrated and this key is
//    already at the target: send ASKING and the command there once, map unchanged);
//    at most max_redirects per command, then Unavailable.
// Every node connection has a connect and a command timeout; a node that times out,
// drops or refuses is disconnected and answers Unavailable at once for kNodeBackoff
// (a node that hangs costs one timeout per back-off, not one per command), and the
// slot map is read again
// before the next command (at most every kSuspectRefreshInterval): a master that died
// is found replaced by its promoted replica once the cluster has failed over. Authentication: an
// ACL user and password (AUTH user password) on every connection.
//
// Errors: Unavailable (retryable) for a node down, slow, or a cluster without a master
// for the slot; InvalidArgument for bad options; Internal for replies that break the
// protocol. An error reply from Redis itself comes back as a Reply of kind kError.
//
// Thread-safety: none; one owner thread (the remote tier's worker).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

struct redisContext;
struct redisReply;

namespace kvtier::remote {

inline constexpr uint16_t kClusterSlots = 16384;

// The part of `key` that is hashed: its hash tag when it has a non-empty one.
std::string_view hash_tag(std::string_view key);
// CRC16-XMODEM of hash_tag(key), mod 16384.
uint16_t key_slot(std::string_view key);

struct Endpoint {
  std::string host;
  int port = 0;
  std::string to_string() const;
  friend bool operator==(const Endpoint&, const Endpoint&) = default;
};
// "host:port" (the last ':' splits, so "::1:7000" is IPv6). InvalidArgument otherwise.
Result<Endpoint> parse_endpoint(std::string_view text);

struct Redirect {
  enum class Kind { kMoved, kAsk };
  Kind kind;
  uint16_t slot;
  Endpoint to;
};
// A "MOVED slot host:port" or "ASK slot host:port" error text; nullopt for any other.
// "MOVED slot :port" (a cluster announcing unknown endpoints) has an empty host: the
// node that replied.
std::optional<Redirect> parse_redirect(std::string_view error);

// One reply, owned.
struct Reply {
  enum class Kind { kString, kStatus, kError, kInteger, kNil, kArray };
  Kind kind = Kind::kNil;
  std::string str;  // kString, kStatus, kError
  long long integer = 0;
  std::vector<Reply> elements;  // kArray
  static Reply from(const redisReply& r);
};

// Which master serves each slot.
class SlotMap {
 public:
  // Replaces the map with what a CLUSTER SLOTS reply says (a node announced with an
  // empty or nil host — unknown-endpoint mode — is on `asked_host`, the node that
  // replied). Internal when the reply is
  // not shaped as the command documents (the map is then unchanged).
  Status assign_from_cluster_slots(const Reply& reply, std::string_view asked_host);
  void assign(uint16_t first, uint16_t last, const Endpoint& master);
  // The master of `slot`; nullptr when no master serves it.
  const Endpoint* master_of(uint16_t slot) const;
  // Every master named, once.
  std::vector<Endpoint> masters() const;
  bool empty() const { return masters_.empty(); }

 private:
  std::vector<Endpoint> masters_;  // distinct
  std::vector<int16_t> slot_to_master_ = std::vector<int16_t>(kClusterSlots, -1);
};

struct ClusterOptions {
  std::vector<Endpoint> seeds;  // any nodes of the cluster; the slot map comes from one
  std::chrono::milliseconds connect_timeout{1000};
  std::chrono::milliseconds command_timeout{1000};
  std::string user;      // ACL user ("" : no AUTH)
  std::string password;  // its password
  int max_redirects = 5;
};

class RemoteCluster {
 public:
  // Connects to a seed and reads the slot map. Unavailable when no seed answers with
  // a map that covers some slot.
  static Result<std::unique_ptr<RemoteCluster>> connect(ClusterOptions options);
  ~RemoteCluster();
  RemoteCluster(const RemoteCluster&) = delete;
  RemoteCluster& operator=(const RemoteCluster&) = delete;

  // Runs `argv` (argv[key_index] is the key that routes it) on the master of its slot,
  // following redirects. A Redis error reply is a Reply of kind kError, not a Status.
  Result<Reply> command(const std::vector<std::string_view>& argv, size_t key_index = 1);
  // Many commands, pipelined per node: every command for one node is sent before its
  // replies are read, so a batch costs a round trip per node, not per command. Each
  // result is what command() would give; a redirected one is retried through it.
  using Argv = std::vector<std::string_view>;
  std::vector<Result<Reply>> pipeline(const std::vector<Argv>& commands, size_t key_index = 1);
  // Reads the slot map again from any master (or seed) that answers.
  Status refresh_slots();
  const SlotMap& slots() const { return slots_; }
  // How many MOVED and ASK redirects were followed (metrics, tests).
  uint64_t moved_count() const { return moved_; }
  uint64_t ask_count() const { return asks_; }

 private:
  explicit RemoteCluster(ClusterOptions options);
  struct Node;
  // The connection to `at`, made (and authenticated) when there is none.
  Result<Node*> node(const Endpoint& at);
  void drop(const Endpoint& at);
  // One command on one node; a dropped or timed-out connection is Unavailable.
  Result<Reply> run_on(const Endpoint& at, const std::vector<std::string_view>& argv, bool asking);

  // A node failed since the map was read: read it again before the next command.
  void refresh_if_suspect();
  static constexpr std::chrono::milliseconds kSuspectRefreshInterval{200};
  static constexpr std::chrono::milliseconds kNodeBackoff{1000};
  std::map<std::string, std::chrono::steady_clock::time_point> down_until_;

  ClusterOptions options_;
  SlotMap slots_;
  bool map_suspect_ = false;
  std::chrono::steady_clock::time_point last_refresh_{};
  std::map<std::string, std::unique_ptr<Node>> nodes_;  // by Endpoint::to_string()
  uint64_t moved_ = 0;
  uint64_t asks_ = 0;
};

}  // namespace kvtier::remote
