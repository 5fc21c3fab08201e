// The block and session request handlers in the in-process daemon (handler_fixture.h):
// Save, Load, Lookup, BeginTurn and CloseSession, each asserted through what a client
// sees afterwards (Lookup, Load, GetSession, Stats), not only through the handler's own
// reply.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tests/daemon/handler_fixture.h"
#include "tests/integration/raw_connection.h"

namespace kvtier::daemon {
namespace {

using integration::RawConnection;

// --- Save / Load -----------------------------------------------------------------------

// The Save's copy is held on the device's gate: until it lands, the blocks are invisible
// (two-phase publish), the session does not exist and the engine has no reply.
TEST_F(HandlerTest, SaveRepliesAndPublishesItsBlocksOnlyOnceTheCopyLanded) {
  const auto hashes = PagedCache::chain_hashes("held-save", 4);
  const auto refs = Engine::refs(hashes, 0);
  engine_->fill(refs);
  auto observer = daemon_->connect();
  ASSERT_TRUE(observer.is_ok()) << observer.status().to_string();
  ASSERT_TRUE((*observer)->hello(engine_->cache.layout(), "observer").is_ok());

  daemon_->hold_copies();
  auto pending = engine_->client->save_async("held-save", refs, /*end_of_turn=*/true);
  ASSERT_TRUE(daemon_->wait_for_held_copies(1, kDeadline)) << "the Save's copy never started";
  auto unseen = (*observer)->lookup(hashes);
  ASSERT_TRUE(unseen.is_ok()) << unseen.status().to_string();
  EXPECT_EQ(unseen->hit_count, 0u) << "blocks still being written are visible";
  EXPECT_TRUE(
      IsError((*observer)->get_session("held-save").status(), StatusCode::kNotFound, "held-save"));
  auto during = (*observer)->stats();
  ASSERT_TRUE(during.is_ok()) << during.status().to_string();
  EXPECT_EQ(during->copies_in_flight, 1u);
  EXPECT_EQ(during->bytes_saved, 0u);
  EXPECT_FALSE(pending.ready()) << "Save was answered before its copy landed";

  daemon_->release_copies();
  auto saved = pending.wait();
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  EXPECT_EQ(saved->stored, 4u);
  auto seen = (*observer)->lookup(hashes);
  ASSERT_TRUE(seen.is_ok()) << seen.status().to_string();
  EXPECT_EQ(seen->hit_count, 4u);
  auto session = (*observer)->get_session("held-save");
  ASSERT_TRUE(session.is_ok()) << session.status().to_string();
  EXPECT_EQ(session->blocks, 4u);
  EXPECT_EQ(session->turns, 1u);
}

// docs/protocol.md (Save): the reply comes only when the copy is complete; after it
// the engine may reuse its blocks. A second Save of hashes that a first Save is still
// writing waits for those bytes; when the first copy fails, the second Save is told to
// send again (it was answered "deduplicated" at once before, for blocks never held).
TEST_F(HandlerTest, SaveOfHashesAnotherSaveIsStillWritingIsAnsweredOnlyOnceTheyLanded) {
  const auto hashes = PagedCache::chain_hashes("written-twice", 4);
  const auto refs = Engine::refs(hashes, 0);
  engine_->fill(refs);
  auto second = Engine::connect(daemon_->socket_path(), shape(), "second-writer");
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  second->fill(refs);

  daemon_->fail_nth_submit(1, unavailable("injected: copy engine stalled"));
  daemon_->hold_copies();
  auto first = engine_->client->save_async("first", refs, true);
  ASSERT_TRUE(daemon_->wait_for_held_copies(1, kDeadline));
  auto duplicate = second->client->save_async("second", refs, true);
  auto lookup = second->client->lookup(hashes);  // the duplicate Save was handled before it
  ASSERT_TRUE(lookup.is_ok()) << lookup.status().to_string();
  EXPECT_FALSE(duplicate.ready())
      << "a Save deduplicated against blocks still being written was answered before they "
         "landed";
  daemon_->release_copies();
  EXPECT_FALSE(first.wait().is_ok());
  auto answered = duplicate.wait();
  ASSERT_FALSE(answered.is_ok()) << "the blocks it relied on never landed";
  EXPECT_TRUE(IsError(answered.status(), StatusCode::kUnavailable,
                      "was being written by another Save whose copy failed"));
  EXPECT_TRUE(answered.status().retryable());
  // Sent again, it writes the blocks itself, and they load back.
  auto again = second->client->save("second", refs, true);
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(again->stored, 4u);
  auto loaded = load(*second, "second", hashes, 8);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->reply.loaded_count, 4u) << loaded->reply.stop_reason.to_string();
}

TEST_F(HandlerTest, SaveDeduplicatesHeldHashesAndLoadRestoresTheLeadingHeldBlocks) {
  auto first = save(*engine_, "dedup", 4);
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  auto again = save(*engine_, "dedup-again", 6);  // the same chain, two blocks longer
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(again->stored, 6u) << "another seed: every hash differs";
  auto longer = save(*engine_, "dedup", 6);
  ASSERT_TRUE(longer.is_ok()) << longer.status().to_string();
  EXPECT_EQ(longer->stored, 2u);
  EXPECT_EQ(longer->deduplicated, 4u);
  auto stats = wait_until_settled();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->bytes_saved, (4 + 6 + 2) * block_bytes());
  EXPECT_EQ(integration::total_blocks(*stats), 12u);

  // A Load past the held prefix restores what is held and says where it stopped.
  const auto eight = PagedCache::chain_hashes("dedup", 8);
  auto loaded = load(*engine_, "dedup", eight, 8);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->reply.loaded_count, 6u);
  EXPECT_TRUE(IsError(loaded->reply.stop_reason, StatusCode::kNotFound,
                      fmt::format("blocks[6] (hash {}) is not held", eight[6].to_hex())));
  EXPECT_EQ(loaded->verified, 6u);
}

TEST_F(HandlerTest, SaveAndLoadRefuseBadBlockListsNamingTheEntry) {
  const auto hashes = PagedCache::chain_hashes("bad-lists", 2);
  ASSERT_TRUE(save(*engine_, "bad-lists", 2).is_ok());
  const uint64_t blocks = shape().num_blocks;
  std::vector<BlockRef> same_target = {{hashes[0], 3}, {hashes[1], 3}};
  EXPECT_TRUE(IsError(engine_->client->load("bad-lists", same_target).status(),
                      StatusCode::kInvalidArgument,
                      "blocks[1].engineBlockId 3 is already the target of blocks[0]"));
  std::vector<BlockRef> beyond = {{hashes[0], 0}, {hashes[1], blocks}};
  const std::string beyond_message =
      fmt::format("blocks[1].engineBlockId {} is beyond the layout's {} blocks", blocks, blocks);
  EXPECT_TRUE(IsError(engine_->client->load("bad-lists", beyond).status(),
                      StatusCode::kInvalidArgument, beyond_message));
  EXPECT_TRUE(IsError(engine_->client->save("bad-lists", beyond, true).status(),
                      StatusCode::kInvalidArgument, beyond_message));
  EXPECT_TRUE(IsError(engine_->client->save("", Engine::refs(hashes, 0), true).status(),
                      StatusCode::kInvalidArgument, "sessionId is empty"));
  EXPECT_TRUE(
      IsError(engine_->client->save(std::string(257, 's'), Engine::refs(hashes, 0), true).status(),
              StatusCode::kInvalidArgument, "sessionId is longer than 256 bytes"));

  // A session holds one layout's blocks: while it is in a turn, another layout's Save
  // under its id is refused, and changes nothing; BeginTurn from another layout does
  // not find it.
  ASSERT_TRUE(engine_->client->begin_turn("bad-lists").is_ok());
  PagedCacheShape other_model = shape();
  other_model.model_id = "integration/another-model";
  auto other = Engine::connect(daemon_->socket_path(), other_model, "other-model");
  ASSERT_TRUE(other.is_ok()) << other.status().to_string();
  EXPECT_TRUE(IsError(save(*other, "bad-lists", 2).status(), StatusCode::kInvalidArgument,
                      "session 'bad-lists' belongs to another layout, which is in a turn"));
  EXPECT_TRUE(IsError(other->client->begin_turn("bad-lists").status(), StatusCode::kNotFound,
                      "unknown session 'bad-lists' for this layout"));
  auto session = engine_->client->get_session("bad-lists");
  ASSERT_TRUE(session.is_ok()) << session.status().to_string();
  EXPECT_EQ(session->blocks, 2u);
  EXPECT_TRUE(session->active) << "another layout's BeginTurn touched it";
  auto loaded = load(*engine_, "bad-lists", hashes, 8);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->verified, 2u);

  // Between turns, the conversation going on with another model (a Save of its layout)
  // replaces the session; the first layout's blocks stay cached, held by no session.
  ASSERT_TRUE(save(*engine_, "bad-lists", 2).is_ok());  // ends the turn
  auto replaced = save(*other, "bad-lists", 3);
  ASSERT_TRUE(replaced.is_ok()) << replaced.status().to_string();
  EXPECT_EQ(replaced->stored, 3u);
  session = other->client->get_session("bad-lists");
  ASSERT_TRUE(session.is_ok()) << session.status().to_string();
  EXPECT_EQ(session->blocks, 3u);
  EXPECT_EQ(session->layout_digest, other->hello.layout_digest);
  auto cached = engine_->client->lookup(hashes);
  ASSERT_TRUE(cached.is_ok()) << cached.status().to_string();
  EXPECT_EQ(cached->hit_count, 2u);
}

// --- Lookup ----------------------------------------------------------------------------

TEST_F(HandlerTest, LookupCountsLeadingHeldBlocksStopsAtTheFirstMissAndNamesTheirTiers) {
  const std::string session = "lookup";
  const auto six = PagedCache::chain_hashes(session, 6);
  const std::vector<BlockHash> four(six.begin(), six.begin() + 4);
  const BlockHash foreign = PagedCache::chain_hashes("never-saved", 1)[0];
  auto saved = save(*engine_, session, 4);
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  auto before = engine_->client->stats();
  ASSERT_TRUE(before.is_ok()) << before.status().to_string();

  auto all = engine_->client->lookup(four);
  ASSERT_TRUE(all.is_ok()) << all.status().to_string();
  EXPECT_EQ(all->hit_count, 4u);
  EXPECT_EQ(all->tiers, std::vector<Tier>(4, Tier::kHbm));
  // A hole ends the prefix even though the blocks after it are held.
  auto holed = engine_->client->lookup(std::vector<BlockHash>{four[0], four[1], foreign, four[3]});
  ASSERT_TRUE(holed.is_ok()) << holed.status().to_string();
  EXPECT_EQ(holed->hit_count, 2u);
  EXPECT_EQ(holed->tiers.size(), 2u);
  auto first_missing = engine_->client->lookup(std::vector<BlockHash>{foreign, four[0], four[1]});
  ASSERT_TRUE(first_missing.is_ok()) << first_missing.status().to_string();
  EXPECT_EQ(first_missing->hit_count, 0u);
  EXPECT_TRUE(first_missing->tiers.empty());
  auto longer = engine_->client->lookup(six);
  ASSERT_TRUE(longer.is_ok()) << longer.status().to_string();
  EXPECT_EQ(longer->hit_count, 4u);
  auto after = engine_->client->stats();
  ASSERT_TRUE(after.is_ok()) << after.status().to_string();
  EXPECT_EQ(after->lookup_hits - before->lookup_hits, 4u + 2u + 0u + 4u);
  EXPECT_EQ(after->lookup_misses - before->lookup_misses, 0u + 2u + 3u + 2u);

  // The session idles past the HBM threshold (manual clock): its blocks go to RAM. The
  // next turn saves two more blocks, which land in HBM; the four stay in RAM.
  daemon_->advance_clock_ms(daemon_->config().hbm_idle_ms + 1);
  ASSERT_TRUE(wait_until_in_tier(session, Tier::kRam, 4).is_ok());
  auto extended = save(*engine_, session, 6);
  ASSERT_TRUE(extended.is_ok()) << extended.status().to_string();
  EXPECT_EQ(extended->stored, 2u);
  EXPECT_EQ(extended->deduplicated, 4u);
  auto mixed = engine_->client->lookup(six);
  ASSERT_TRUE(mixed.is_ok()) << mixed.status().to_string();
  EXPECT_EQ(mixed->hit_count, 6u);
  EXPECT_EQ(mixed->tiers, (std::vector<Tier>{Tier::kRam, Tier::kRam, Tier::kRam, Tier::kRam,
                                             Tier::kHbm, Tier::kHbm}));
}

// A Lookup over a raw connection (the client cannot build a bad hash): Hello, then the
// hashes `fill` writes; the reply's error.
Status raw_lookup(const std::string& socket_path, const LayoutSpec& layout,
                  const std::function<void(capnp::List<capnp::Data>::Builder)>& fill,
                  unsigned count) {
  auto raw = RawConnection::connect(socket_path);
  if (!raw.is_ok()) return raw.status();
  KVTIER_RETURN_IF_ERROR(raw->send(1, [&](wire::Request::Builder request) {
    auto hello = request.initHello();
    hello.setProtocolVersion(wire::PROTOCOL_VERSION);
    integration::fill_layout(hello.initLayout(), layout);
  }));
  auto hello = raw->receive_reply();
  if (!hello.is_ok()) return hello.status();
  KVTIER_RETURN_IF_ERROR(hello->error);
  KVTIER_RETURN_IF_ERROR(raw->send(
      2, [&](wire::Request::Builder request) { fill(request.initLookup().initHashes(count)); }));
  auto reply = raw->receive_reply();
  if (!reply.is_ok()) return reply.status();
  if (reply->error.is_ok() && reply->which != wire::Response::LOOKUP) {
    return internal_error("a Lookup was answered with reply kind {}",
                          static_cast<int>(reply->which));
  }
  return reply->error;
}

void set_hash(capnp::List<capnp::Data>::Builder list, unsigned i, const BlockHash& hash) {
  list.set(i, capnp::Data::Reader(hash.bytes().data(), hash.size()));
}

TEST_F(HandlerTest, LookupRefusesMalformedHashesNamingTheEntry) {
  const auto hashes = PagedCache::chain_hashes("malformed", 2);
  ASSERT_TRUE(save(*engine_, "malformed", 2).is_ok());
  const LayoutSpec layout = engine_->cache.layout();
  Status too_long = raw_lookup(
      daemon_->socket_path(), layout,
      [&](capnp::List<capnp::Data>::Builder list) {
        set_hash(list, 0, hashes[0]);
        set_hash(list, 1, hashes[1]);
        list.init(2, BlockHash::kMaxBytes + 1);
      },
      3);
  EXPECT_TRUE(IsError(too_long, StatusCode::kInvalidArgument,
                      fmt::format("hashes[2] has {} bytes; 1..{} allowed", BlockHash::kMaxBytes + 1,
                                  BlockHash::kMaxBytes)));
  Status empty = raw_lookup(
      daemon_->socket_path(), layout,
      [&](capnp::List<capnp::Data>::Builder list) {
        set_hash(list, 0, hashes[0]);
        list.init(1, 0);
      },
      2);
  EXPECT_TRUE(IsError(empty, StatusCode::kInvalidArgument, "hashes[1] has 0 bytes"));
}

// Every bad request gets an error naming the bad field (docs/protocol.md, errors), whatever the
// daemon holds: a malformed hash after the first miss too (Lookup's scan stops there, its
// validation does not).
TEST_F(HandlerTest, LookupRefusesAMalformedHashAfterTheFirstMiss) {
  const BlockHash unheld = PagedCache::chain_hashes("never-saved", 1)[0];
  Status after_miss = raw_lookup(
      daemon_->socket_path(), engine_->cache.layout(),
      [&](capnp::List<capnp::Data>::Builder list) {
        set_hash(list, 0, unheld);
        list.init(1, BlockHash::kMaxBytes + 1);
      },
      2);
  EXPECT_TRUE(IsError(after_miss, StatusCode::kInvalidArgument,
                      fmt::format("hashes[1] has {} bytes", BlockHash::kMaxBytes + 1)));
}

// --- BeginTurn -------------------------------------------------------------------------

TEST_F(HandlerTest, BeginTurnPromotesAnIdleSessionToHbmAndMakesItActive) {
  const std::string session = "begin-turn";
  auto saved = save(*engine_, session, 4);
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  daemon_->advance_clock_ms(daemon_->config().hbm_idle_ms + 1);
  ASSERT_TRUE(wait_until_in_tier(session, Tier::kRam, 4).is_ok());
  ASSERT_TRUE(wait_until_settled().is_ok());
  auto idle = engine_->client->stats();
  ASSERT_TRUE(idle.is_ok()) << idle.status().to_string();
  EXPECT_EQ(idle->sessions_active, 0u);
  EXPECT_EQ(idle->sessions_idle, 1u);

  auto turn = engine_->client->begin_turn(session);
  ASSERT_TRUE(turn.is_ok()) << turn.status().to_string();
  EXPECT_EQ(turn->known_blocks, 4u);
  EXPECT_EQ(turn->promoted_blocks, 4u);
  auto back = wait_until_in_tier(session, Tier::kHbm, 4);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_TRUE(back->active);
  EXPECT_EQ(back->idle_ms, 0u);
  auto active = engine_->client->stats();
  ASSERT_TRUE(active.is_ok()) << active.status().to_string();
  EXPECT_EQ(active->sessions_active, 1u);
  EXPECT_EQ(active->sessions_idle, 0u);

  // Already in HBM: a second BeginTurn has nothing to promote.
  auto again = engine_->client->begin_turn(session);
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(again->known_blocks, 4u);
  EXPECT_EQ(again->promoted_blocks, 0u);
  ASSERT_TRUE(wait_until_settled().is_ok());
  auto loaded = load(*engine_, session, PagedCache::chain_hashes(session, 4), 8);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->verified, 4u);
}

// The turn lead is the manual clock's time from BeginTurn to the session's next Load,
// averaged 1/8 toward each new turn; a turn that ends without a Load gives none.
TEST_F(HandlerTest, TurnLeadIsTimedFromBeginTurnToTheNextLoad) {
  const std::string session = "lead";
  const auto hashes = PagedCache::chain_hashes(session, 2);
  ASSERT_TRUE(save(*engine_, session, 2).is_ok());
  auto lead_seconds = [&]() -> std::optional<double> {
    const std::string text = daemon_->metrics_text();
    const std::string series = "\nkvtier_turn_lead_seconds ";
    const size_t at = text.find(series);
    if (at == std::string::npos) return std::nullopt;
    return std::stod(text.substr(at + series.size()));
  };
  EXPECT_FALSE(lead_seconds().has_value()) << "no turn seen yet";

  ASSERT_TRUE(engine_->client->begin_turn(session).is_ok());
  daemon_->advance_clock_ms(400);
  ASSERT_TRUE(load(*engine_, session, hashes, 4).is_ok());
  ASSERT_TRUE(lead_seconds().has_value());
  EXPECT_DOUBLE_EQ(*lead_seconds(), 0.4);

  // A Load with no BeginTurn before it is no lead.
  daemon_->advance_clock_ms(5'000);
  ASSERT_TRUE(load(*engine_, session, hashes, 4).is_ok());
  EXPECT_DOUBLE_EQ(*lead_seconds(), 0.4);

  // A BeginTurn whose turn ended (Save, end of turn) without a Load: the next turn's
  // Load, a minute later, is not timed from it.
  ASSERT_TRUE(engine_->client->begin_turn(session).is_ok());
  ASSERT_TRUE(save(*engine_, session, 2).is_ok());
  daemon_->advance_clock_ms(60'000);
  ASSERT_TRUE(load(*engine_, session, hashes, 4).is_ok());
  EXPECT_DOUBLE_EQ(*lead_seconds(), 0.4);

  // The next measured turn moves the mean 1/8 of the way: 0.4 + (0.0 - 0.4) / 8.
  ASSERT_TRUE(engine_->client->begin_turn(session).is_ok());
  ASSERT_TRUE(load(*engine_, session, hashes, 4).is_ok());
  EXPECT_DOUBLE_EQ(*lead_seconds(), 0.35);
}

// Retention fields are checked before anything is stored, and each error names its
// field; a Save refused for one creates no session.
TEST_F(HandlerTest, SaveRetentionIsValidatedAtTheBoundary) {
  const auto refs = Engine::refs(PagedCache::chain_hashes("r", 4), 0);
  engine_->fill(refs);
  auto refused = [&](const SaveOptions& options, const std::string& message) {
    auto saved = engine_->client->save("r", refs, true, options);
    EXPECT_TRUE(IsError(saved.status(), StatusCode::kInvalidArgument, message))
        << saved.status().to_string();
  };
  refused(session_retention(101, 0), "retention.priority is 101");
  refused(session_retention(0, 5'000), "retention.durationMs is 5000 without a priority");
  refused(range_retention({{0, 0, {50, 0}}}), "blockRetention[0].count is 0");
  refused(range_retention({{0, 1, {50, 0}}, {2, 3, {50, 0}}}),
          "blockRetention[1] covers blocks 2..4; the Save has 4");
  refused(range_retention({{0, 1, {200, 0}}}), "blockRetention[0].retention.priority is 200");
  refused(range_retention(std::vector<RangeRetention>(5, {0, 1, {50, 0}})),
          "blockRetention has 5 ranges for 4 blocks");
  refused(range_retention({{0, 4, {50, 0}}, {0, 1, {60, 0}}}),
          "blockRetention covers 5 blocks in total by range 1; at most the Save's 4");
  EXPECT_TRUE(IsError(engine_->client->get_session("r").status(), StatusCode::kNotFound, "r"));
}

// A priority given for a time shows how long it has left and returns to the default
// when the time is up (on the daemon's clock, at the next plan).
TEST_F(HandlerTest, ATimedPriorityEndsAndTheSessionIsBackToTheDefault) {
  const auto refs = Engine::refs(PagedCache::chain_hashes("t", 2), 0);
  engine_->fill(refs);
  ASSERT_TRUE(engine_->client->save("t", refs, true, session_retention(80, 60'000)).is_ok());
  auto info = engine_->client->get_session("t");
  ASSERT_TRUE(info.is_ok()) << info.status().to_string();
  EXPECT_EQ(info->priority, 80);
  EXPECT_EQ(info->priority_remaining_ms, 60'000u);
  daemon_->advance_clock_ms(20'000);
  info = engine_->client->get_session("t");
  ASSERT_TRUE(info.is_ok());
  EXPECT_EQ(info->priority_remaining_ms, 40'000u);
  // A Save without retention leaves the priority as it is.
  ASSERT_TRUE(engine_->client->save("t", refs, false).is_ok());
  info = engine_->client->get_session("t");
  ASSERT_TRUE(info.is_ok());
  EXPECT_EQ(info->priority, 80);

  daemon_->advance_clock_ms(40'000);
  ASSERT_TRUE(engine_->client->save("t", refs, true).is_ok());  // runs a plan after it
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  do {
    info = engine_->client->get_session("t");
    ASSERT_TRUE(info.is_ok());
  } while (info->priority != 35 && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(info->priority, 35);
  EXPECT_EQ(info->priority_remaining_ms, 0u);
}

TEST_F(HandlerTest, BeginTurnOfAnUnknownSessionIsNotFoundAndCreatesNothing) {
  EXPECT_TRUE(IsError(engine_->client->begin_turn("never-saved").status(), StatusCode::kNotFound,
                      "unknown session 'never-saved'"));
  EXPECT_TRUE(IsError(engine_->client->get_session("never-saved").status(), StatusCode::kNotFound,
                      "never-saved"));
  auto stats = engine_->client->stats();
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->sessions_active + stats->sessions_idle, 0u);
  auto listed = engine_->client->list_sessions();
  ASSERT_TRUE(listed.is_ok()) << listed.status().to_string();
  EXPECT_TRUE(listed->empty());
}

// --- CloseSession ----------------------------------------------------------------------

// Three conversations share a two-block system prompt. Closing one drops its references:
// the prompt stays referenced by the others (an admin Evict keeps it while one remains),
// and once the last holder goes it is referenced by nobody (Evict frees it).
TEST_F(HandlerTest, CloseSessionDropsItsReferencesAndSharedBlocksStayWithTheOthers) {
  const auto prompt = PagedCache::chain_hashes("system-prompt", 2);
  const auto a = concat_hashes(prompt, PagedCache::chain_hashes("conversation-a", 2));
  const auto b = concat_hashes(prompt, PagedCache::chain_hashes("conversation-b", 2));
  const auto c = concat_hashes(prompt, PagedCache::chain_hashes("conversation-c", 2));
  ASSERT_TRUE(save_hashes(*engine_, "a", a, 0).is_ok());
  auto saved_b = save_hashes(*engine_, "b", b, 4);
  ASSERT_TRUE(saved_b.is_ok()) << saved_b.status().to_string();
  EXPECT_EQ(saved_b->deduplicated, 2u);
  ASSERT_TRUE(save_hashes(*engine_, "c", c, 8).is_ok());

  auto closed = engine_->client->close_session("a");
  ASSERT_TRUE(closed.is_ok()) << closed.status().to_string();
  EXPECT_EQ(*closed, 4u);
  EXPECT_TRUE(IsError(engine_->client->close_session("a").status(), StatusCode::kNotFound,
                      "unknown session 'a'"));
  EXPECT_TRUE(IsError(engine_->client->get_session("a").status(), StatusCode::kNotFound, "'a'"));
  // The blocks themselves stay as prefix cache until room is needed.
  auto cached = engine_->client->lookup(a);
  ASSERT_TRUE(cached.is_ok()) << cached.status().to_string();
  EXPECT_EQ(cached->hit_count, 4u);
  auto other = engine_->client->get_session("b");
  ASSERT_TRUE(other.is_ok()) << other.status().to_string();
  EXPECT_EQ(other->blocks, 4u);
  EXPECT_EQ(other->blocks_per_tier[static_cast<size_t>(Tier::kHbm)], 4u);
  auto loaded = load(*engine_, "b", b, 12);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->verified, 4u);
  ASSERT_TRUE(wait_until_settled().is_ok());

  // c's own blocks go; the prompt is still b's.
  auto evicted_c = engine_->client->evict("c", "");
  ASSERT_TRUE(evicted_c.is_ok()) << evicted_c.status().to_string();
  EXPECT_EQ(evicted_c->blocks_evicted, 2u);
  EXPECT_EQ(evicted_c->blocks_kept, 2u) << "the shared prompt lost b's reference";
  // b was the prompt's last holder (a's close dropped a's references): all of it goes.
  auto evicted_b = engine_->client->evict("b", "");
  ASSERT_TRUE(evicted_b.is_ok()) << evicted_b.status().to_string();
  EXPECT_EQ(evicted_b->blocks_evicted, 4u) << "the closed session still references the prompt";
  EXPECT_EQ(evicted_b->blocks_kept, 0u);
  auto gone = engine_->client->lookup(b);
  ASSERT_TRUE(gone.is_ok()) << gone.status().to_string();
  EXPECT_EQ(gone->hit_count, 0u);
}

TEST_F(HandlerTest, CloseSessionOfAnUnknownOrAnotherNamespacesSessionIsNotFound) {
  EXPECT_TRUE(IsError(engine_->client->close_session("never-saved").status(), StatusCode::kNotFound,
                      "unknown session 'never-saved'"));
  ASSERT_TRUE(save(*engine_, "mine", 4).is_ok());
  auto stranger = connect_engine_as(kOtherUid, kOtherUid, "stranger");
  KVTIER_SKIP_IF_NO_OTHER_USER(stranger.status());
  ASSERT_TRUE(stranger.is_ok()) << stranger.status().to_string();
  EXPECT_TRUE(IsError(stranger->client->close_session("mine").status(), StatusCode::kNotFound,
                      "unknown session 'mine'"));
  EXPECT_TRUE(IsError(stranger->client->begin_turn("mine").status(), StatusCode::kNotFound,
                      "unknown session 'mine'"));
  auto still = engine_->client->get_session("mine");
  ASSERT_TRUE(still.is_ok()) << still.status().to_string();
  EXPECT_EQ(still->blocks, 4u);
}

}  // namespace
}  // namespace kvtier::daemon
