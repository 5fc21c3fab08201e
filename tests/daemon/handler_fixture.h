// HandlerTest: one in-process kvtierd (inprocess_harness.h) per test with one engine
// connected as the test process's own user, plus what the request-handler tests share:
// engines connected as other users (other namespaces, no admin rights), and saving and
// loading chained sessions. Every wait polls with a deadline; nothing sleeps to let
// something happen.
//
// Thread-safety: none; one test thread (the daemon's control thread is the harness's).
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/daemon/inprocess_harness.h"
#include "tests/integration/daemon_harness.h"

namespace kvtier::daemon {

using integration::Engine;
using integration::IsError;
using integration::kDeadline;
using integration::NoLeakedSlots;

// Ids no system account has: peers connected with them are nobody's admin, each in a
// namespace of its own ("uid:60001", "uid:60002").
inline constexpr uid_t kOtherUid = 60001;
inline constexpr uid_t kThirdUid = 60002;
// The admin group of configurations that name one (admin_group_config()).
inline constexpr gid_t kAdminGid = 60100;

// `head` then `tail`: sessions that share a prompt (same leading hashes) and differ after.
inline std::vector<BlockHash> concat_hashes(std::vector<BlockHash> head,
                                            const std::vector<BlockHash>& tail) {
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

// Save options with only the session's retention, or only ranges of blocks.
inline SaveOptions session_retention(uint8_t priority, uint64_t duration_ms) {
  SaveOptions options;
  options.retention = {priority, duration_ms};
  return options;
}
inline SaveOptions range_retention(std::vector<RangeRetention> ranges) {
  SaveOptions options;
  options.block_retention = std::move(ranges);
  return options;
}

// inprocess_config() with an admin group whose gid is kAdminGid.
DaemonConfig admin_group_config();
// inprocess_config() with no HBM, 2 MiB of RAM kept full (watermarks 1.0) and 1 MiB of
// NVMe below it; sessions idle 5 s (on the manual clock) leave RAM for NVMe.
DaemonConfig nvme_below_ram_config();

class HandlerTest : public ::testing::Test {
 protected:
  // What the daemon runs with; overridden by fixtures that need other tiers or policy.
  // (Not run as root, SetUp makes the test process's group the admin group when this
  // names none, so that engine_ may use admin requests either way.)
  virtual DaemonConfig daemon_config() const { return inprocess_config(); }
  // The shape of every engine's paged cache.
  virtual PagedCacheShape shape() const { return integration::small_shape(/*num_blocks=*/16); }

  void SetUp() override;

  // A client whose peer credentials are `uid` and `gid` (InProcessDaemon::connect_as).
  // PermissionDenied when this test process cannot take them: skip_unless_ok() skips.
  Result<std::unique_ptr<Client>> connect_as(uid_t uid, gid_t gid) const;
  // An engine (Hello with shape(), its region registered) connected as `uid`/`gid`.
  Result<Engine> connect_engine_as(uid_t uid, gid_t gid, const std::string& name) const;

  // Saves the first `count` blocks of PagedCache::chain_hashes(session, count) from
  // engine blocks first_block_id.. (their content written first).
  static Result<SaveResult> save(Engine& engine, const std::string& session, size_t count,
                                 uint64_t first_block_id = 0, bool end_of_turn = true);
  // Saves `hashes` as `session` from engine blocks first_block_id.., likewise.
  static Result<SaveResult> save_hashes(Engine& engine, const std::string& session,
                                        const std::vector<BlockHash>& hashes,
                                        uint64_t first_block_id = 0, bool end_of_turn = true);
  // Wipes the engine's cache and loads `hashes` into engine blocks first_block_id..;
  // `verified` is how many leading blocks hold exactly their content afterwards.
  struct Loaded {
    LoadResult reply;
    size_t verified;
  };
  static Result<Loaded> load(Engine& engine, const std::string& session,
                             const std::vector<BlockHash>& hashes, uint64_t first_block_id);

  // No copy in flight and no block pinned by one.
  Result<StatsInfo> wait_until_settled() const;
  // The session's blocks are all in `tier` (count of them: `blocks`).
  Result<SessionInfo> wait_until_in_tier(const std::string& session, Tier tier,
                                         uint32_t blocks) const;

  uint64_t block_bytes() const { return engine_->hello.block_bytes; }
  // A metric sample's value from the daemon's /metrics text (-1 when absent).
  double metric(const std::string& series) const;
  // Saves `count` chained blocks of `session` from engine blocks 0.., waits until the
  // daemon is settled, and wipes engine_'s cache.
  std::vector<BlockHash> save_and_wipe(const std::string& session, size_t count);

  // Declared after the daemon: engines' connections close before the daemon stops.
  std::unique_ptr<InProcessDaemon> daemon_;
  std::unique_ptr<Engine> engine_;
};

// Ends the test as skipped when `status` says the test process could not take another
// user's ids (not root): the in-process daemon can then make no non-admin peer.
#define KVTIER_SKIP_IF_NO_OTHER_USER(status)                                                 \
  do {                                                                                       \
    if ((status).code() == ::kvtier::StatusCode::kPermissionDenied) {                        \
      GTEST_SKIP() << "no peer with another uid can be made here: " << (status).to_string(); \
    }                                                                                        \
  } while (false)

}  // namespace kvtier::daemon
