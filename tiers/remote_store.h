// RemoteStore: block payloads and session records in a Redis Cluster, in the format of
// remote_format.h, for the remote tier below NVMe that every node of a fleet shares.
//
// Contracts:
//  * A read returns bytes only when they verify (remote_format.h). A value that does
//    not — corrupt, truncated, another key's — is DataLoss: the key is deleted (so no
//    node reads it again) and counted. A missing key is NotFound, and so is a value of
//    another format version (a node of another release wrote it: left alone).
//  * Every value is written with the store's TTL (remote-ttl; SET … PX), so a fleet's
//    forgotten sessions leave the cluster by themselves.
//  * Byte budget (remote-bytes): what this node wrote and has not seen expire or
//    deleted stays under the budget; a write that would pass it first deletes this
//    node's oldest values (FIFO, one DEL pipeline per write). A write's blocks past the
//    budget are refused (ResourceExhausted). A SET or DEL whose outcome is unknown (the
//    node timed out) keeps its value counted, so the budget may be passed while a node
//    is unreachable, never under-counted. The budget is this node's share: other nodes
//    keep their own, and a block two nodes both wrote (same key) is counted by both.
//  * Unavailable — a node down or slower than the command timeout, or a Redis error
//    reply (CLUSTERDOWN, OOM, …) — makes the store degraded() until a call needs no
//    node that fails; callers fall back to what is local.
//
// Thread-safety: none; one owner thread (the remote tier's worker).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/block_key.h"
#include "common/status.h"
#include "tiers/remote_cluster.h"

namespace kvtier::remote {

struct RemoteStoreOptions {
  ClusterOptions cluster;
  std::chrono::milliseconds ttl{std::chrono::hours(24)};  // 0: values do not expire
  uint64_t budget_bytes = 1ull << 30;
};

struct RemoteBlockId {
  std::string namespace_name;
  uint64_t layout_digest = 0;
  BlockHash hash;
};

class RemoteStore {
 public:
  static Result<std::unique_ptr<RemoteStore>> open(RemoteStoreOptions options);

  struct BlockWrite {
    RemoteBlockId id;
    std::span<const std::byte> payload;
  };
  // One status per block, pipelined.
  std::vector<Status> put_blocks(const std::vector<BlockWrite>& blocks);

  struct BlockRead {
    RemoteBlockId id;
    uint64_t bytes = 0;  // the layout's block size (0: any)
  };
  // Each block's verified payload, or NotFound / DataLoss / Unavailable. Pipelined.
  std::vector<Result<std::string>> get_blocks(const std::vector<BlockRead>& blocks);
  // Whether each block has a value in the cluster (EXISTS, pipelined): what a Lookup
  // may promise; the value itself is verified only when it is read.
  std::vector<Result<bool>> exists_blocks(const std::vector<RemoteBlockId>& blocks);

  Status put_session(std::string_view namespace_name, std::string_view session_id,
                     std::string_view record);
  Result<std::string> get_session(std::string_view namespace_name, std::string_view session_id);
  // The record goes (a closed session); its blocks stay until their TTL or the budget.
  Status delete_session(std::string_view namespace_name, std::string_view session_id);

  bool degraded() const { return degraded_; }
  struct Stats {
    uint64_t hits = 0, misses = 0, corrupt = 0, errors = 0;
    uint64_t bytes_written = 0, bytes_read = 0;
    uint64_t stored_bytes = 0;  // this node's values, as the budget counts them
    uint64_t budget_deletes = 0;
  };
  const Stats& stats() const { return stats_; }
  RemoteCluster& cluster() { return *cluster_; }

 private:
  RemoteStore(RemoteStoreOptions options, std::unique_ptr<RemoteCluster> cluster);
  // The budget's accounting: values this node wrote, oldest first.
  struct Written {
    std::string key;
    uint64_t seq;  // matches written_bytes_[key].seq unless the key was written again
    std::chrono::steady_clock::time_point expires;
  };
  struct Current {
    uint64_t bytes;
    uint64_t seq;
  };
  void forget_expired();
  void forget(const std::string& key);
  // Deletes this node's oldest values until `bytes` more fit. False when they never can.
  bool make_room(uint64_t bytes);
  void account(const std::string& key, uint64_t bytes);
  // A SET's outcome into `status`; the count follows what is known to be stored.
  void settle_write(const Result<Reply>& reply, const std::string& key, uint64_t bytes,
                    Status& status);
  // One GET's reply as a verified payload: NotFound when missing or of another format
  // version; DataLoss (counted, forgotten, the key queued on `deletes`) when corrupt.
  enum class ValueKind { kBlock, kSession };
  Result<std::string> read_value(Result<Reply>& reply, const std::string& key, ValueKind kind,
                                 uint64_t bytes, std::vector<RemoteCluster::Argv>& deletes);
  void note(const Status& status);

  RemoteStoreOptions options_;
  std::unique_ptr<RemoteCluster> cluster_;
  std::deque<Written> written_;
  std::unordered_map<std::string, Current> current_;  // the latest write of each key
  uint64_t seq_ = 0;
  class CallScope;
  bool unreachable_ = false;  // in the current call
  bool degraded_ = false;
  Stats stats_;
};

}  // namespace kvtier::remote
