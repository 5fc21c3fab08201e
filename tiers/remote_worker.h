// RemoteWorker: the remote tier's RemoteStore on a thread of its own, so that the
// control thread never waits on Redis. Requests are queued (reads ahead of writes); each
// completion is handed to `post` (the daemon posts it to its control thread).
//
// Contracts:
//  * start() returns at once. The worker connects on its thread and, while it cannot
//    (no seed answers), retries every reconnect_interval (counted from the end of an
//    attempt); requests meanwhile fail with Unavailable — a request waits behind at
//    most one attempt per interval, the one between two requests — and the worker says
//    it is degraded.
//  * Bounded in-flight bytes: the payload bytes of queued and running writes stay under
//    max_in_flight_bytes, and so do those of reads (each on its own, so a write-behind
//    backlog never declines a read). A request that would pass the bound is declined
//    (put/get return false and nothing is queued): write-behind skips, a read falls
//    back to local data.
//  * A request's `done` (and whatever it holds) is released with its completion, where
//    `post` runs it, never on the worker's thread.
//  * Write-behind lag: how long the oldest queued or running write has waited, so an
//    operator sees how far behind another node's view of this node's sessions is.
//  * Reads (and existence checks) run before queued writes, in their own order: an
//    engine waits on a read, only other nodes on a write-behind.
//  * Destruction stops the thread after the request it is running; queued requests
//    complete with Unavailable (through `post`) before the destructor returns.
//
// Thread-safety: the public methods may be called from any thread; completions run
// wherever `post` runs them.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "tiers/remote_store.h"

namespace kvtier::remote {

struct RemoteWorkerOptions {
  RemoteStoreOptions store;
  uint64_t max_in_flight_bytes = 256ull << 20;
  std::chrono::milliseconds reconnect_interval{1000};
};

class RemoteWorker {
 public:
  using Post = std::function<void(std::function<void()>)>;
  static std::unique_ptr<RemoteWorker> start(RemoteWorkerOptions options, Post post);
  ~RemoteWorker();
  RemoteWorker(const RemoteWorker&) = delete;
  RemoteWorker& operator=(const RemoteWorker&) = delete;

  // A block to write, owning its bytes (the caller's copy may be gone by then).
  struct OwnedBlock {
    RemoteBlockId id;
    std::vector<std::byte> payload;
  };
  bool put_blocks(std::vector<OwnedBlock> blocks, std::function<void(std::vector<Status>)> done);
  // The same with bytes the caller keeps valid (and unchanged) until `done` runs, such
  // as pinned tier slots: no copy on the caller's thread.
  bool put_borrowed(std::vector<RemoteStore::BlockWrite> blocks,
                    std::function<void(std::vector<Status>)> done);
  bool get_blocks(std::vector<RemoteStore::BlockRead> reads,
                  std::function<void(std::vector<Result<std::string>>)> done);
  // Reads each block straight into `into` (which the caller keeps valid until `done`
  // runs, such as a reserved tier slot), on the worker's thread: OK once its verified
  // bytes are there; a value of another size is DataLoss.
  struct ReadInto {
    RemoteBlockId id;
    std::span<std::byte> into;
  };
  bool get_into(std::vector<ReadInto> reads, std::function<void(std::vector<Status>)> done);
  bool exists_blocks(std::vector<RemoteBlockId> ids,
                     std::function<void(std::vector<Result<bool>>)> done);
  void put_session(std::string namespace_name, std::string session_id, std::string record,
                   std::function<void(Status)> done);
  void get_session(std::string namespace_name, std::string session_id,
                   std::function<void(Result<std::string>)> done);
  // Queued as a write: after the writes (records included) queued before it.
  void delete_session(std::string namespace_name, std::string session_id,
                      std::function<void(Status)> done);

  struct Snapshot {
    bool connected = false;
    bool degraded = true;
    uint64_t in_flight_bytes = 0;
    uint64_t queued = 0;
    std::chrono::milliseconds write_lag{0};  // the oldest pending write's wait; 0: none
    size_t masters = 0;                      // masters in the slot map (not all need be reachable)
    RemoteStore::Stats store;
  };
  Snapshot snapshot() const KVTIER_EXCLUDES(mu_);
  // snapshot().connected without the copy (for checks on every request).
  bool connected() const { return connected_.load(std::memory_order_relaxed); }

 private:
  RemoteWorker(RemoteWorkerOptions options, Post post);
  struct Job {
    uint64_t bytes = 0;
    bool write = false;
    std::chrono::steady_clock::time_point queued_at;
    // Runs on the worker with the store (nullptr: not connected) and returns the
    // completion to post.
    std::function<std::function<void()>(RemoteStore*)> run;
  };
  bool enqueue(Job job, bool bounded) KVTIER_EXCLUDES(mu_);
  void loop(std::stop_token stop) KVTIER_EXCLUDES(mu_);
  // Connects when not connected and the retry interval has passed.
  void maybe_connect();
  void publish() KVTIER_EXCLUDES(mu_);  // copies the store's state into snapshot_

  const RemoteWorkerOptions options_;
  const Post post_;
  std::unique_ptr<RemoteStore> store_;  // the worker thread's
  std::chrono::steady_clock::time_point last_attempt_{};
  uint64_t failed_attempts_ = 0;  // connection attempts failed in a row

  mutable Mutex mu_;
  InterruptibleCondVar wake_;  // a job was queued, or the thread is asked to stop
  std::deque<Job> jobs_ KVTIER_GUARDED_BY(mu_);
  Snapshot snapshot_ KVTIER_GUARDED_BY(mu_);
  std::atomic<bool> connected_{false};                        // snapshot_.connected
  uint64_t in_flight_read_bytes_ KVTIER_GUARDED_BY(mu_) = 0;  // each bounded by max_in_flight_bytes
  uint64_t in_flight_write_bytes_ KVTIER_GUARDED_BY(mu_) = 0;
  // queued_at of each queued or running write, in order.
  std::deque<std::chrono::steady_clock::time_point> pending_writes_ KVTIER_GUARDED_BY(mu_);
  std::jthread thread_;  // last: started once everything above exists
};

}  // namespace kvtier::remote
