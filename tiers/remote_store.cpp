#include "tiers/remote_store.h"

#include <fmt/format.h>

#include "tiers/remote_format.h"

namespace kvtier::remote {
namespace {

uint64_t wall_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// A reply to SET: +OK, or an error.
Status set_status(const Result<Reply>& reply, std::string_view key) {
  if (!reply.is_ok()) return reply.status();
  if (reply->kind == Reply::Kind::kStatus) return Status::ok();
  return unavailable("Redis refused SET {}: {}", key, reply->str);
}

}  // namespace

RemoteStore::RemoteStore(RemoteStoreOptions options, std::unique_ptr<RemoteCluster> cluster)
    : options_(std::move(options)), cluster_(std::move(cluster)) {}

Result<std::unique_ptr<RemoteStore>> RemoteStore::open(RemoteStoreOptions options) {
  if (options.budget_bytes == 0) return invalid_argument("remote-bytes must be positive");
  if (options.ttl.count() < 0) return invalid_argument("remote-ttl must not be negative");
  auto cluster = RemoteCluster::connect(options.cluster);
  if (!cluster.is_ok()) return cluster.status();
  return std::unique_ptr<RemoteStore>(new RemoteStore(std::move(options), std::move(*cluster)));
}

void RemoteStore::note(const Status& status) {
  if (status.code() == StatusCode::kUnavailable) {
    unreachable_ = true;
    ++stats_.errors;
  }
}

// One public call: afterwards the store is degraded exactly when some node it needed
// could not be reached.
class RemoteStore::CallScope {
 public:
  explicit CallScope(RemoteStore& store) : store_(store) { store_.unreachable_ = false; }
  ~CallScope() { store_.degraded_ = store_.unreachable_; }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  RemoteStore& store_;
};

void RemoteStore::forget(const std::string& key) {
  auto it = current_.find(key);
  if (it == current_.end()) return;
  stats_.stored_bytes -= it->second.bytes;
  current_.erase(it);
}

void RemoteStore::forget_expired() {
  if (options_.ttl.count() == 0) return;
  const auto now = std::chrono::steady_clock::now();
  while (!written_.empty() && written_.front().expires <= now) {
    auto it = current_.find(written_.front().key);
    if (it != current_.end() && it->second.seq == written_.front().seq) forget(it->first);
    written_.pop_front();
  }
}

bool RemoteStore::make_room(uint64_t bytes) {
  if (bytes > options_.budget_bytes) return false;
  forget_expired();
  std::vector<Written> victims;
  uint64_t freed = 0;
  while (stats_.stored_bytes - freed + bytes > options_.budget_bytes && !written_.empty()) {
    Written oldest = std::move(written_.front());
    written_.pop_front();
    auto it = current_.find(oldest.key);
    if (it == current_.end() || it->second.seq != oldest.seq) continue;  // written again
    freed += it->second.bytes;
    victims.push_back(std::move(oldest));
  }
  if (victims.empty()) return true;
  std::vector<RemoteCluster::Argv> dels;
  for (const Written& victim : victims) dels.push_back({"DEL", victim.key});
  const auto replies = cluster_->pipeline(dels);
  // A DEL that did not get through leaves its value counted and first in line for the
  // next write (the budget is passed until then, or until it expires).
  for (size_t i = victims.size(); i-- > 0;) {
    note(replies[i].status());
    if (replies[i].is_ok() && replies[i]->kind == Reply::Kind::kInteger) {
      forget(victims[i].key);
      ++stats_.budget_deletes;
    } else {
      written_.push_front(std::move(victims[i]));
    }
  }
  return true;
}

void RemoteStore::account(const std::string& key, uint64_t bytes) {
  forget(key);
  const uint64_t seq = ++seq_;
  current_[key] = Current{bytes, seq};
  stats_.stored_bytes += bytes;
  written_.push_back(Written{key, seq, std::chrono::steady_clock::now() + options_.ttl});
  // Keys written again leave stale entries behind; drop them before they outnumber the
  // live ones (a session record rewritten every turn would otherwise grow the queue).
  if (written_.size() > 2 * current_.size() + 1024) {
    std::erase_if(written_, [this](const Written& w) {
      auto it = current_.find(w.key);
      return it == current_.end() || it->second.seq != w.seq;
    });
  }
}

void RemoteStore::settle_write(const Result<Reply>& reply, const std::string& key, uint64_t bytes,
                               Status& status) {
  status = set_status(reply, key);
  note(status);
  if (status.is_ok()) {
    stats_.bytes_written += bytes;
  } else if (reply.is_ok()) {
    forget(key);  // Redis answered with an error: nothing was written
  }
  // A transport failure (timeout, dropped connection) may still have been applied: the
  // value stays counted, and leaves the count by the budget's DEL or its TTL.
}

std::vector<Status> RemoteStore::put_blocks(const std::vector<BlockWrite>& blocks) {
  CallScope call(*this);
  std::vector<Status> out(blocks.size());
  std::vector<std::string> keys(blocks.size());
  std::vector<std::string> values(blocks.size());
  const std::string ttl = std::to_string(options_.ttl.count());
  const uint64_t now = wall_ms();
  std::vector<size_t> sent;
  uint64_t batch_bytes = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const RemoteBlockId& id = blocks[i].id;
    keys[i] = block_key(id.namespace_name, id.layout_digest, id.hash);
    values[i] = encode_block_value(keys[i], blocks[i].payload, now);
    if (batch_bytes + values[i].size() > options_.budget_bytes) {
      out[i] = resource_exhausted("this write's blocks up to {} pass remote-bytes ({})", keys[i],
                                  options_.budget_bytes);
      continue;
    }
    batch_bytes += values[i].size();
    forget(keys[i]);  // its old value, if this node wrote one, is overwritten
    sent.push_back(i);
  }
  // Room once for the whole write, in one DEL pipeline. The write fits the budget, so
  // no block of it is deleted to make room for another.
  (void)make_room(batch_bytes);
  std::vector<RemoteCluster::Argv> sets;
  for (size_t i : sent) {
    account(keys[i], values[i].size());
    if (options_.ttl.count() > 0) {
      sets.push_back({"SET", keys[i], values[i], "PX", ttl});
    } else {
      sets.push_back({"SET", keys[i], values[i]});
    }
  }
  const auto replies = cluster_->pipeline(sets);
  for (size_t j = 0; j < sent.size(); ++j) {
    const size_t i = sent[j];
    settle_write(replies[j], keys[i], values[i].size(), out[i]);
  }
  return out;
}

std::vector<Result<std::string>> RemoteStore::get_blocks(const std::vector<BlockRead>& blocks) {
  CallScope call(*this);
  std::vector<Result<std::string>> out;
  out.reserve(blocks.size());
  std::vector<std::string> keys;
  std::vector<RemoteCluster::Argv> gets;
  keys.reserve(blocks.size());
  for (const BlockRead& block : blocks) {
    keys.push_back(block_key(block.id.namespace_name, block.id.layout_digest, block.id.hash));
  }
  for (const std::string& key : keys) gets.push_back({"GET", key});
  auto replies = cluster_->pipeline(gets);
  std::vector<RemoteCluster::Argv> deletes;
  for (size_t i = 0; i < blocks.size(); ++i) {
    out.push_back(read_value(replies[i], keys[i], ValueKind::kBlock, blocks[i].bytes, deletes));
    note(out.back().status());
  }
  // Deleted only by key, after the reads: a value a node wrote meanwhile under the same
  // key would go too, and that node's next read misses (never a wrong byte).
  if (!deletes.empty()) (void)cluster_->pipeline(deletes);
  return out;
}

std::vector<Result<bool>> RemoteStore::exists_blocks(const std::vector<RemoteBlockId>& blocks) {
  CallScope call(*this);
  std::vector<std::string> keys;  // the commands below point into these
  keys.reserve(blocks.size());
  for (const RemoteBlockId& id : blocks) {
    keys.push_back(block_key(id.namespace_name, id.layout_digest, id.hash));
  }
  std::vector<RemoteCluster::Argv> commands;
  commands.reserve(blocks.size());
  for (const std::string& key : keys) commands.push_back({"EXISTS", key});
  auto replies = cluster_->pipeline(commands);
  std::vector<Result<bool>> out;
  out.reserve(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    Status status = Status::ok();
    bool exists = false;
    if (!replies[i].is_ok()) {
      status = replies[i].status();
    } else if (replies[i]->kind != Reply::Kind::kInteger) {
      status = unavailable("Redis answered EXISTS {} with {}", keys[i], replies[i]->str);
    } else {
      exists = replies[i]->integer > 0;
    }
    note(status);
    if (status.is_ok()) {
      out.emplace_back(exists);
    } else {
      out.emplace_back(std::move(status));
    }
  }
  return out;
}

Result<std::string> RemoteStore::read_value(Result<Reply>& reply, const std::string& key,
                                            ValueKind kind, uint64_t bytes,
                                            std::vector<RemoteCluster::Argv>& deletes) {
  if (!reply.is_ok()) return reply.status();
  if (reply->kind == Reply::Kind::kNil) {
    ++stats_.misses;
    return not_found("{} is not in the remote tier", key);
  }
  if (reply->kind != Reply::Kind::kString) {
    return unavailable("Redis answered GET {} with {}", key, reply->str);
  }
  auto payload = kind == ValueKind::kBlock ? verify_block_value(key, reply->str, bytes)
                                           : verify_session_value(key, reply->str);
  if (!payload.is_ok()) {
    if (payload.status().code() == StatusCode::kNotSupported) {
      // Another format version (a node of another release): not this node's to judge
      // or delete; a miss here.
      ++stats_.misses;
      return not_found("{}", payload.status().message());
    }
    ++stats_.corrupt;
    deletes.push_back({"DEL", key});
    forget(key);
    return payload.status();
  }
  ++stats_.hits;
  stats_.bytes_read += reply->str.size();
  reply->str.erase(0, kRemoteHeaderBytes);
  return std::move(reply->str);
}

Status RemoteStore::put_session(std::string_view namespace_name, std::string_view session_id,
                                std::string_view record) {
  CallScope call(*this);
  const std::string key = session_key(namespace_name, session_id);
  const std::string value = encode_session_value(key, record);
  forget(key);
  if (!make_room(value.size())) {
    return resource_exhausted("a {}-byte session record is larger than remote-bytes ({})",
                              value.size(), options_.budget_bytes);
  }
  account(key, value.size());
  const std::string ttl = std::to_string(options_.ttl.count());
  auto reply = options_.ttl.count() > 0 ? cluster_->command({"SET", key, value, "PX", ttl})
                                        : cluster_->command({"SET", key, value});
  Status status;
  settle_write(reply, key, value.size(), status);
  return status;
}

Status RemoteStore::delete_session(std::string_view namespace_name, std::string_view session_id) {
  CallScope call(*this);
  const std::string key = session_key(namespace_name, session_id);
  auto reply = cluster_->command({"DEL", key});
  if (!reply.is_ok()) {
    note(reply.status());
    return reply.status();
  }
  forget(key);
  return Status::ok();
}

Result<std::string> RemoteStore::get_session(std::string_view namespace_name,
                                             std::string_view session_id) {
  CallScope call(*this);
  const std::string key = session_key(namespace_name, session_id);
  auto reply = cluster_->command({"GET", key});
  std::vector<RemoteCluster::Argv> deletes;
  Result<std::string> record = read_value(reply, key, ValueKind::kSession, 0, deletes);
  if (!deletes.empty()) (void)cluster_->command(deletes.front());
  note(record.status());
  return record;
}

}  // namespace kvtier::remote
