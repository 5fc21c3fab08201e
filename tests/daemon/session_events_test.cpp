// Session events in the whole daemon (in-process, handler_fixture.h): every path that
// changes a session — a Save, CloseSession, an admin's Evict, a Save of another layout —
// reaches the session table's subscribers once, through the table, and the parts that
// subscribe act on it (an admin's pins follow a pinned session's growth). Idle time and a
// drain close nothing: kvtierd ends a session only by those paths.
//
// A recording subscriber sits beside the parts (InProcessDaemon::subscribe_to_sessions);
// it is read on the control thread.
#include <map>
#include <span>
#include <string>
#include <vector>

#include "policy/session_table.h"
#include "tests/daemon/handler_fixture.h"

namespace kvtier::daemon {
namespace {

// What the table told, per session id; control thread only.
class Recorder final : public policy::SessionObserver {
 public:
  void session_closed(uint32_t, const std::string& session_id) override { ++closes[session_id]; }
  void session_cut(const policy::Session& session) override { ++cuts[session.id]; }
  void session_grew(const policy::Session& session, std::span<const BlockHash> added) override {
    // `added` is the session's tail, as the notice promises.
    const size_t size = session.blocks.size();
    for (size_t i = 0; i < added.size(); ++i) {
      if (session.blocks[size - added.size() + i] != added[i]) ++misplaced[session.id];
    }
    grown[session.id] += added.size();
  }
  void turn_ended(const policy::Session& session) override { ++turns[session.id]; }

  std::map<std::string, int> closes, cuts, turns, misplaced;
  std::map<std::string, size_t> grown;
};

class SessionEventsTest : public HandlerTest {
 protected:
  DaemonConfig daemon_config() const override { return nvme_below_ram_config(); }
  PagedCacheShape shape() const override { return integration::small_shape(/*num_blocks=*/64); }

  void SetUp() override {
    HandlerTest::SetUp();
    if (daemon_ != nullptr) daemon_->subscribe_to_sessions(recorder_);
  }
  // A copy of what the recorder holds now.
  Recorder recorded() {
    Recorder copy;
    daemon_->run_on_control_thread([&] { copy = recorder_; });
    return copy;
  }

  Recorder recorder_;  // outlives the daemon: declared first, destroyed last
};

TEST_F(SessionEventsTest, EveryPathReachesEverySubscriberOnceThroughTheTable) {
  ASSERT_TRUE(save(*engine_, "closed", 4, 0).is_ok());
  ASSERT_TRUE(save(*engine_, "evicted", 4, 4).is_ok());
  ASSERT_TRUE(save(*engine_, "drained", 4, 8, /*end_of_turn=*/false).is_ok());
  {
    Recorder r = recorded();
    EXPECT_EQ(r.grown["closed"], 4u);
    EXPECT_EQ(r.grown["evicted"], 4u);
    EXPECT_EQ(r.grown["drained"], 4u);
    EXPECT_EQ(r.turns["closed"], 1);
    EXPECT_EQ(r.turns["drained"], 0);  // its Save did not end the turn
    EXPECT_TRUE(r.misplaced.empty());
  }

  // An admin pins "evicted"; its next Save adds two blocks, which the pin takes too:
  // AdminService hears of the growth from the table.
  auto pinned = engine_->client->pin("evicted", "", true);
  ASSERT_TRUE(pinned.is_ok()) << pinned.status().to_string();
  EXPECT_EQ(*pinned, 4u);
  ASSERT_TRUE(save(*engine_, "evicted", 6, 16).is_ok());  // the same chain, two blocks longer
  ASSERT_TRUE(wait_until_settled().is_ok());
  auto stats = engine_->client->stats();
  ASSERT_TRUE(stats.is_ok());
  EXPECT_EQ(stats->pinned_sessions, 1u);
  EXPECT_EQ(stats->admin_pinned_blocks, 6u);
  EXPECT_EQ(recorded().grown["evicted"], 6u);

  // A drain moves what is not pinned to NVMe and closes nothing; the pinned session
  // stays in RAM whole, its late blocks too.
  ASSERT_TRUE(engine_->client->drain().is_ok());
  ASSERT_TRUE(wait_until_in_tier("drained", Tier::kNvme, 4).is_ok());
  ASSERT_TRUE(wait_until_in_tier("closed", Tier::kNvme, 4).is_ok());
  auto evicted = engine_->client->get_session("evicted");
  ASSERT_TRUE(evicted.is_ok());
  EXPECT_EQ(evicted->blocks_per_tier[static_cast<size_t>(Tier::kRam)], 6u);
  EXPECT_TRUE(evicted->pinned);

  // A day of idle time closes nothing either.
  daemon_->advance_clock_ms(24ull * 3600 * 1000);
  EXPECT_TRUE(engine_->client->get_session("drained").is_ok());
  EXPECT_TRUE(recorded().closes.empty());

  // CloseSession and Evict: each close heard once, by every subscriber (the admin's
  // pins went with the evicted session).
  ASSERT_TRUE(engine_->client->close_session("closed").is_ok());
  ASSERT_TRUE(engine_->client->evict("evicted", "").is_ok());
  stats = engine_->client->stats();
  ASSERT_TRUE(stats.is_ok());
  EXPECT_EQ(stats->pinned_sessions, 0u);
  EXPECT_EQ(stats->admin_pinned_blocks, 0u);

  // A Save of another layout replaces an idle session: a close, then a new session
  // that grows by the Save's blocks.
  PagedCacheShape other = shape();
  other.model_id = "example/another-model";
  auto stranger = Engine::connect(daemon_->socket_path(), other, "another-model");
  ASSERT_TRUE(stranger.is_ok()) << stranger.status().to_string();
  ASSERT_TRUE(save(*engine_, "replaced", 2, 24).is_ok());
  ASSERT_TRUE(save(*stranger, "replaced", 3, 0).is_ok());

  Recorder r = recorded();
  EXPECT_EQ(r.closes, (std::map<std::string, int>{{"closed", 1}, {"evicted", 1}, {"replaced", 1}}));
  EXPECT_EQ(r.grown["replaced"], 5u);  // 2 under the first layout, 3 under the second
  EXPECT_TRUE(r.cuts.empty());
  EXPECT_TRUE(r.misplaced.empty());
  // Closing what is gone tells nobody again.
  EXPECT_FALSE(engine_->client->close_session("closed").is_ok());
  EXPECT_FALSE(engine_->client->evict("evicted", "").is_ok());
  EXPECT_EQ(recorded().closes, r.closes);
}

}  // namespace
}  // namespace kvtier::daemon
