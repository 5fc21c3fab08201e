#include "tests/daemon/handler_fixture.h"

#include <unistd.h>

namespace kvtier::daemon {

DaemonConfig admin_group_config() {
  DaemonConfig config = inprocess_config();
  // The loader resolves the name through the group database; set both, as it would.
  config.admin_group = "kvtier-test-admins";
  config.admin_gid = kAdminGid;
  return config;
}

DaemonConfig nvme_below_ram_config() {
  DaemonConfig config = inprocess_config();
  config.hbm_bytes = 0;
  config.ram_bytes = 2ull << 20;
  config.ram_high_watermark = 1.0;
  config.ram_low_watermark = 1.0;
  config.nvme_bytes = 1ull << 20;
  config.ram_idle_ms = 5'000;  // on the manual clock
  return config;
}

double HandlerTest::metric(const std::string& series) const {
  const std::string text = daemon_->metrics_text();
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

std::vector<BlockHash> HandlerTest::save_and_wipe(const std::string& session, size_t count) {
  auto hashes = PagedCache::chain_hashes(session, count);
  auto saved = save_hashes(*engine_, session, hashes, 0);
  EXPECT_TRUE(saved.is_ok()) << saved.status().to_string();
  EXPECT_TRUE(wait_until_settled().is_ok());
  engine_->cache.wipe();
  return hashes;
}

void HandlerTest::SetUp() {
  DaemonConfig config = daemon_config();
  // The tests' own connections act as the operator. Run as root they are; otherwise the
  // test process's group becomes the admin group (unless the fixture names one), and the
  // tests that need a non-admin peer skip (connect_as).
  if (::geteuid() != 0 && !config.admin_gid) {
    config.admin_group = "test-process-group";
    config.admin_gid = ::getegid();
  }
  auto daemon = InProcessDaemon::start(std::move(config));
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  daemon_ = std::move(*daemon);
  auto engine = Engine::connect(daemon_->socket_path(), shape(), "handler-test-engine");
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  engine_ = std::make_unique<Engine>(std::move(*engine));
}

Result<std::unique_ptr<Client>> HandlerTest::connect_as(uid_t uid, gid_t gid) const {
  return daemon_->connect_as(uid, gid);
}

Result<Engine> HandlerTest::connect_engine_as(uid_t uid, gid_t gid, const std::string& name) const {
  auto client = connect_as(uid, gid);
  if (!client.is_ok()) return client.status();
  return Engine::start(std::move(*client), shape(), name);
}

Result<SaveResult> HandlerTest::save(Engine& engine, const std::string& session, size_t count,
                                     uint64_t first_block_id, bool end_of_turn) {
  return save_hashes(engine, session, PagedCache::chain_hashes(session, count), first_block_id,
                     end_of_turn);
}

Result<SaveResult> HandlerTest::save_hashes(Engine& engine, const std::string& session,
                                            const std::vector<BlockHash>& hashes,
                                            uint64_t first_block_id, bool end_of_turn) {
  const auto refs = Engine::refs(hashes, first_block_id);
  engine.fill(refs);
  return engine.client->save(session, refs, end_of_turn);
}

Result<HandlerTest::Loaded> HandlerTest::load(Engine& engine, const std::string& session,
                                              const std::vector<BlockHash>& hashes,
                                              uint64_t first_block_id) {
  const auto refs = Engine::refs(hashes, first_block_id);
  engine.cache.wipe();
  auto loaded = engine.client->load(session, refs);
  if (!loaded.is_ok()) return loaded.status();
  return Loaded{*loaded, engine.count_verified(refs, refs.size())};
}

Result<StatsInfo> HandlerTest::wait_until_settled() const {
  return daemon_->wait_for_stats(
      [](const StatsInfo& s) { return s.copies_in_flight == 0 && s.pinned_blocks == 0; },
      kDeadline);
}

Result<SessionInfo> HandlerTest::wait_until_in_tier(const std::string& session, Tier tier,
                                                    uint32_t blocks) const {
  return daemon_->wait_for_session(
      session,
      [tier, blocks](const SessionInfo& s) {
        return s.blocks == blocks && s.blocks_per_tier.size() > static_cast<size_t>(tier) &&
               s.blocks_per_tier[static_cast<size_t>(tier)] == blocks;
      },
      kDeadline);
}

}  // namespace kvtier::daemon
