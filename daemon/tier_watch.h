// TierWatch: tier notices (schema: WatchTiers). An engine that announces kvtierd's
// blocks to routers (the vLLM connector's KV events) must hear when a block it saved
// moves between this node's tiers or leaves them; this part tells it, over its own
// connection, as answers to a long poll.
//
// It listens to the store's block events (policy/block_events.h; the Service subscribes
// it once the store exists). For each subscribed connection it keeps the hashes of its
// layout's blocks that entered or left a tier since its last answer, each once (a block demoted,
// then promoted, is one notice), and looks each one's tier up only when it answers: what it says is
// where the block is then, never a history. Noted: a block whose fastest tier changed (a move
// landed, a demotion onto its copy, a block recovered or read back from the remote tier) or that
// left the store. Not noted: a Save's own blocks while they are written (the Save's
// answer says they were kept; one being written when the answer is built is left out),
// and copies written or dropped below a block (its place did not change).
//
// Bounded per connection: at most max-tier-notices-per-connection blocks wait for an
// engine that does not ask; past that the part forgets them and the next answer says
// `resync`, so a slow engine costs neither memory nor time on the control thread beyond
// that bound. A block event of a layout nobody watches costs one hash-map probe.
//
// Thread-safety: control thread only (daemon_context.h).
#pragma once

#include <boost/asio/steady_timer.hpp>

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "daemon/daemon_context.h"
#include "policy/block_events.h"

namespace kvtier::daemon {

class TierWatch final : public Part, public policy::BlockListener {
 public:
  using Departure = policy::Departure;
  static constexpr uint32_t kMaxWaitMs = 60000;  // WatchTiers.maxWaitMs, at most
  static constexpr uint32_t kCoalesceMs = 5;     // a waiting WatchTiers gathers this long

  TierWatch(DaemonContext& ctx, Replies& replies) : Part(ctx, replies) {}
  ~TierWatch();

  // WatchTiers: subscribes the connection (its first one), then answers at once with
  // what is noted, or waits for the first change or max_wait_ms.
  Status handle_watch(const ConnectionPtr& c, const EngineContext& engine, uint64_t id,
                      uint32_t max_wait_ms, uint32_t max_changes) KVTIER_REQUIRES(control_thread);
  // The connection closed: its subscription and any waiting WatchTiers go.
  void forget(const EngineContext* engine) KVTIER_REQUIRES(control_thread);
  // The daemon stops: waiting WatchTiers are answered (empty) so no timer outlives it.
  void stop() KVTIER_REQUIRES(control_thread);

  // Connections subscribed, and notices sent and resyncs told since start (metrics).
  size_t watchers() const KVTIER_REQUIRES(control_thread) { return watchers_.size(); }
  uint64_t notices_sent() const KVTIER_REQUIRES(control_thread) { return notices_sent_; }
  uint64_t resyncs() const KVTIER_REQUIRES(control_thread) { return resyncs_; }

  // A block the executor wrote in (read back from the remote tier) is readable now: the
  // store tells of its reservation, not of its commit.
  void block_written(const BlockKey& key) KVTIER_REQUIRES(control_thread);

  // policy::BlockListener (the store's notices, on the control thread).
  void block_entered(const BlockKey& key, Tier tier, uint64_t bytes) override;
  void block_left(const BlockKey& key, Tier tier, Departure why) override;

 private:
  struct Watcher {
    explicit Watcher(asio::io_context& io) : timer(io) {}
    std::weak_ptr<ipc::Connection> connection;
    LayoutKey layout;
    std::unordered_set<BlockHash, BlockHashHasher> noted;
    bool resync = false;  // notes were dropped since the last answer
    // A WatchTiers waiting for changes (id 0: none), and how many it takes.
    uint64_t waiting_id = 0;
    uint32_t max_changes = 0;
    bool answer_soon = false;  // the timer was moved to kCoalesceMs from a change
    asio::steady_timer timer;
  };

  void note(const BlockKey& key) KVTIER_REQUIRES(control_thread);
  // Answers the watcher's waiting WatchTiers with up to its max_changes noted blocks.
  void answer(Watcher& watcher) KVTIER_REQUIRES(control_thread);
  // The watcher's timer runs `ms` from now, then answers.
  void arm(const std::shared_ptr<Watcher>& watcher, uint32_t ms) KVTIER_REQUIRES(control_thread);
  Tier tier_now(const BlockKey& key) const KVTIER_REQUIRES(control_thread);

  // Subscribed connections by their context, and by layout for the store's notices.
  std::unordered_map<const EngineContext*, std::shared_ptr<Watcher>> watchers_
      KVTIER_GUARDED_BY(control_thread);
  std::unordered_map<LayoutKey, std::vector<std::shared_ptr<Watcher>>, LayoutKeyHasher> by_layout_
      KVTIER_GUARDED_BY(control_thread);
  uint64_t notices_sent_ KVTIER_GUARDED_BY(control_thread) = 0;
  uint64_t resyncs_ KVTIER_GUARDED_BY(control_thread) = 0;
};

}  // namespace kvtier::daemon
