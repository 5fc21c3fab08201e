// /metrics scraped over HTTP from the real daemon changes as an engine saves, looks up
// and loads, and never shows a session id or a namespace.
#include <gtest/gtest.h>

#include "tests/integration/ops_harness.h"

namespace kvtier::integration {
namespace {

class Metrics : public DaemonTest {
 protected:
  std::vector<std::string> daemon_flags() const override {
    auto flags = small_tier_flags();
    flags.insert(flags.end(), {"--metrics-addr", "127.0.0.1:0"});
    return flags;
  }
};

TEST_F(Metrics, ChangeAsAClientSavesAndLoads) {
  auto address = metrics_address(*daemon_);
  ASSERT_TRUE(address.is_ok()) << address.status().to_string();
  EXPECT_EQ(address->rfind("127.0.0.1:", 0), 0u);
  auto before = http_get(*address, "/metrics");
  ASSERT_TRUE(before.is_ok()) << before.status().to_string();
  EXPECT_EQ(metric(*before, "kvtier_moved_bytes_total{direction=\"save\"}"), 0.0) << *before;
  EXPECT_EQ(metric(*before, "kvtier_tier_blocks{tier=\"hbm\"}"), 0.0);

  constexpr size_t kBlocks = 4;
  const std::string session = "secret-session-name";
  auto engine = Engine::connect(daemon_->socket_path(), small_shape(2 * kBlocks), "metrics");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const auto hashes = PagedCache::chain_hashes(session, kBlocks);
  const auto saved = Engine::refs(hashes, 0);
  engine->fill(saved);
  ASSERT_TRUE(engine->client->save(session, saved, true).is_ok());
  auto found = engine->client->lookup(hashes);
  ASSERT_TRUE(found.is_ok() && found->hit_count == kBlocks);
  auto loaded = engine->client->load(session, Engine::refs(hashes, kBlocks));
  ASSERT_TRUE(loaded.is_ok() && loaded->loaded_count == kBlocks);
  EXPECT_EQ(engine->client->begin_turn("no-such-session").status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(daemon_->wait_until_settled().is_ok());

  auto after = http_get(*address, "/metrics");
  ASSERT_TRUE(after.is_ok()) << after.status().to_string();
  const double block_bytes = static_cast<double>(engine->hello.block_bytes);
  const std::string& text = *after;
  EXPECT_EQ(metric(text, "kvtier_moved_bytes_total{direction=\"save\"}"), kBlocks * block_bytes)
      << text;
  EXPECT_EQ(metric(text, "kvtier_moved_bytes_total{direction=\"load\"}"), kBlocks * block_bytes);
  EXPECT_EQ(metric(text, "kvtier_tier_blocks{tier=\"hbm\"}"), double{kBlocks});
  EXPECT_EQ(metric(text, "kvtier_tier_used_bytes{tier=\"hbm\"}"), kBlocks * block_bytes);
  EXPECT_EQ(metric(text, "kvtier_lookup_hits_total"), double{2 * kBlocks});
  // Lookup and Load each found the blocks in HBM.
  EXPECT_EQ(metric(text, "kvtier_lookup_hits_by_tier_total{tier=\"hbm\"}"), double{2 * kBlocks});
  // The Load made the session active (its next turn is being served).
  EXPECT_EQ(metric(text, "kvtier_sessions{state=\"active\"}"), 1.0);
  EXPECT_EQ(metric(text, "kvtier_request_duration_seconds_count{op=\"save\"}"), 1.0);
  EXPECT_EQ(metric(text, "kvtier_request_duration_seconds_count{op=\"load\"}"), 1.0);
  EXPECT_EQ(metric(text, "kvtier_request_errors_total{op=\"beginTurn\",code=\"not_found\"}"), 1.0);
  EXPECT_EQ(text.find(session), std::string::npos) << "a session id leaked into /metrics";
  EXPECT_EQ(text.find("uid:"), std::string::npos) << "a namespace leaked into /metrics";
}

TEST_F(Metrics, TurnLeadIsServedOnceATurnWasTimed) {
  auto address = metrics_address(*daemon_);
  ASSERT_TRUE(address.is_ok()) << address.status().to_string();
  auto engine = Engine::connect(daemon_->socket_path(), small_shape(4), "lead");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const auto hashes = PagedCache::chain_hashes("lead", 2);
  engine->fill(Engine::refs(hashes, 0));
  ASSERT_TRUE(engine->client->save("lead", Engine::refs(hashes, 0), true).is_ok());
  auto before = http_get(*address, "/metrics");
  ASSERT_TRUE(before.is_ok());
  EXPECT_FALSE(metric(*before, "kvtier_turn_lead_seconds").has_value()) << "no turn seen yet";

  // The value itself is tested on a manual clock (TurnLeadIsTimedFromBeginTurnToTheNextLoad
  // in tests/daemon); here, that the real daemon serves it once a turn was timed.
  ASSERT_TRUE(engine->client->begin_turn("lead").is_ok());
  ASSERT_TRUE(engine->client->load("lead", Engine::refs(hashes, 2)).is_ok());
  auto after = http_get(*address, "/metrics");
  ASSERT_TRUE(after.is_ok());
  const std::optional<double> lead = metric(*after, "kvtier_turn_lead_seconds");
  ASSERT_TRUE(lead.has_value()) << *after;
  EXPECT_GE(*lead, 0.0);
  // A Load without a BeginTurn before it is not a turn lead.
  ASSERT_TRUE(engine->client->load("lead", Engine::refs(hashes, 2)).is_ok());
  auto again = http_get(*address, "/metrics");
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(metric(*again, "kvtier_turn_lead_seconds"), lead);
}

TEST(MetricsAddress, AnExplicitAddressInUseStopsTheDaemon) {
  auto first = Daemon::start(
      {"--metrics-addr", "127.0.0.1:0", "--hbm-bytes", "16MiB", "--ram-bytes", "16MiB"});
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  auto address = metrics_address(**first);
  ASSERT_TRUE(address.is_ok()) << address.status().to_string();
  auto second =
      Daemon::start({"--metrics-addr", *address, "--hbm-bytes", "16MiB", "--ram-bytes", "16MiB"});
  ASSERT_FALSE(second.is_ok()) << "a second daemon served metrics on a taken address";
  EXPECT_NE(second.status().message().find("metrics-addr " + *address), std::string::npos)
      << second.status().to_string();
  EXPECT_TRUE((*first)->stop().ok());
}

}  // namespace
}  // namespace kvtier::integration
