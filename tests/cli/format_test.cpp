// kvtierctl's output formats: every --json form is valid JSON with raw numbers, tables
// use human units, and sessions sort as the flags say.
#include <gtest/gtest.h>

// Boost.JSON, header-only, only to check that what kvtierctl writes is JSON.
#include <boost/json/src.hpp>

#include "cli/format.h"

namespace kvtier::cli {
namespace {

namespace json = boost::json;

SessionInfo session(std::string id, bool active, uint64_t idle_ms, uint64_t bytes) {
  SessionInfo s{std::move(id), "uid:1000", active, idle_ms, 3, 4, {2, 1, 0, 1}, 0xabcdef};
  s.bytes = bytes;
  return s;
}

StatsInfo stats() {
  StatsInfo s{};
  s.tiers = {{Tier::kHbm, 1ull << 30, 256ull << 20, 128},
             {Tier::kNvme, 2ull << 30, 1ull << 20, 0, 1ull << 20, 3ull << 20}};
  s.sessions_active = 1;
  s.sessions_idle = 2;
  s.lookup_hits = 30;
  s.lookup_misses = 10;
  s.bytes_saved = 3ull << 30;
  s.device_name = "host \"quoted\"";
  s.uptime_ms = 125'000;
  s.pinned_sessions = 1;
  s.admin_pinned_blocks = 4;
  return s;
}

json::value parse(const std::string& text) {
  boost::system::error_code ec;
  json::value value = json::parse(text, ec);
  EXPECT_FALSE(ec) << ec.message() << " in: " << text;
  return value;
}

TEST(Format, StatusJsonIsJsonWithRawNumbers) {
  auto value = parse(status_json(stats()));
  EXPECT_EQ(value.at("device").as_string(), "host \"quoted\"");
  EXPECT_EQ(value.at("tiers").as_array()[0].at("used_bytes").as_int64(), 256 << 20);
  EXPECT_EQ(value.at("tiers").as_array()[1].at("copy_bytes").as_int64(), 1 << 20);
  EXPECT_EQ(value.at("tiers").as_array()[1].at("written_bytes").as_int64(), 3 << 20);
  EXPECT_EQ(value.at("sessions").at("pinned").as_int64(), 1);
  EXPECT_EQ(value.at("admin_pinned_blocks").as_int64(), 4);
}

TEST(Format, StatusTextUsesHumanUnits) {
  const std::string text = status_text(stats());
  EXPECT_NE(text.find("256.0 MiB"), std::string::npos) << text;
  EXPECT_NE(text.find("up 2m05s"), std::string::npos) << text;
  EXPECT_NE(text.find("25.0%"), std::string::npos) << text;
}

TEST(Format, SessionsSortByIdleOrBytes) {
  std::vector<SessionInfo> list = {session("b", false, 5'000, 10), session("a", true, 0, 99),
                                   session("c", false, 60'000, 50)};
  sort_sessions(list, SessionSort::kIdle);
  EXPECT_EQ(list[0].session_id, "c");
  EXPECT_EQ(list[1].session_id, "b");
  EXPECT_EQ(list[2].session_id, "a");  // active sessions last
  sort_sessions(list, SessionSort::kBytes);
  EXPECT_EQ(list[0].session_id, "a");
  EXPECT_EQ(list[2].session_id, "b");
  auto value = parse(sessions_json(list));
  ASSERT_EQ(value.at("sessions").as_array().size(), 3u);
  EXPECT_EQ(value.at("sessions").as_array()[0].at("blocks_per_tier").at("hbm").as_int64(), 2);
  const std::string text = sessions_text(list);
  EXPECT_NE(text.find("1m00s"), std::string::npos) << text;
  EXPECT_EQ(sessions_text({}), "(no sessions)\n");
}

TEST(Format, SessionAndConfigForms) {
  SessionInfo s = session("conv\t42", false, 90'000, 8ull << 20);
  s.pinned = true;
  auto value = parse(session_json(s));
  EXPECT_EQ(value.at("id").as_string(), "conv\t42");
  EXPECT_TRUE(value.at("pinned").as_bool());
  EXPECT_NE(session_text(s).find("idle for 1m30s"), std::string::npos);
  EXPECT_NE(session_text(s).find("8.0 MiB held"), std::string::npos);
  std::vector<ConfigEntryInfo> entries = {{"hbm-bytes", "\"1GiB\"", false},
                                          {"hbm-idle-ms", "\"30s\"", true}};
  auto config = parse(config_json(entries));
  EXPECT_EQ(config.at("config").as_array()[1].at("value").as_string(), "\"30s\"");
  EXPECT_NE(config_text(entries).find("hbm-idle-ms = \"30s\""), std::string::npos);
}

TEST(Format, TopShowsBarsRatesAndTheLargestSessions) {
  EXPECT_EQ(occupancy_bar(1, 4, 8), "[##------]");
  EXPECT_EQ(occupancy_bar(9, 4, 4), "[####]");
  EXPECT_EQ(occupancy_bar(0, 0, 3), "[---]");
  StatsInfo before = stats();
  StatsInfo now = stats();
  now.bytes_saved += 2ull << 20;
  std::vector<SessionInfo> list = {session("small", false, 1, 1), session("big", false, 1, 1000)};
  const std::string frame = top_frame(now, &before, 2.0, list, 1);
  EXPECT_NE(frame.find("save 1.0 MiB/s"), std::string::npos) << frame;
  EXPECT_NE(frame.find("big"), std::string::npos) << frame;
  EXPECT_EQ(frame.find("small"), std::string::npos) << "only the largest `rows` sessions";
  EXPECT_NE(top_frame(now, nullptr, 0, list, 5).find("save -"), std::string::npos);
  auto value = parse(top_json(now, &before, 2.0, list, 5));
  EXPECT_EQ(value.at("bytes_per_second").at("saved").as_int64(), 1 << 20);
  EXPECT_EQ(value.at("top_sessions").as_array().size(), 2u);
}

}  // namespace
}  // namespace kvtier::cli
