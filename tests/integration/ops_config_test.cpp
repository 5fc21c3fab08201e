// kvtierd's configuration as an operator meets it: --check-config, errors that name the
// key, and SIGHUP applying a new threshold that `kvtierctl config` then shows, while a
// change that needs a restart is only logged.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <thread>

#include "tests/integration/ops_harness.h"

namespace kvtier::integration {
namespace {

class ConfigFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/kvtier-ops-config-XXXXXX";
    ASSERT_NE(::mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string file(const std::string& text, const std::string& name = "kvtierd.toml") {
    const std::string path = dir_ + "/" + name;
    EXPECT_TRUE(write_file(path, text).is_ok());
    return path;
  }
  ProcessResult kvtierd(std::vector<std::string> args) {
    args.insert(args.begin(), binary_path("kvtierd"));
    return run_process(args);
  }

  std::string dir_;
};

TEST_F(ConfigFile, CheckConfigPrintsTheEffectiveConfiguration) {
  const auto path = file("hbm-bytes = \"96MiB\"\nram-idle-ms = \"2m\"\n");
  auto run = kvtierd({"--config", path, "--check-config", "--ram-bytes", "3GiB"});
  ASSERT_TRUE(run.status.ok()) << run.describe();
  EXPECT_NE(run.stdout_text.find("hbm-bytes = \"96MiB\""), std::string::npos) << run.describe();
  EXPECT_NE(run.stdout_text.find("ram-idle-ms = \"2m\""), std::string::npos);
  EXPECT_NE(run.stdout_text.find("ram-bytes = \"3GiB\""), std::string::npos) << "flag wins";
}

TEST_F(ConfigFile, ErrorsNameTheKey) {
  struct Case {
    std::string toml;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {"hbm-bytes = \"1GiB\"\nram-byte = \"1GiB\"\n", {":2", "unknown key 'ram-byte'"}},
      {"ram-bytes = \"a lot\"\n", {":1", "ram-bytes", "a lot"}},
      {"data-dir = \"/etc/hostname\"\n", {"data-dir", "not a directory"}},
      {"socket = \"/" + std::string(150, 'x') + "\"\n", {"socket", "at most"}},
  };
  for (const Case& c : cases) {
    auto run = kvtierd({"--config", file(c.toml), "--check-config"});
    EXPECT_TRUE(run.status.exited && run.status.code == 2) << run.describe();
    for (const std::string& fragment : c.fragments) {
      EXPECT_NE(run.stderr_text.find(fragment), std::string::npos)
          << "'" << fragment << "' not in: " << run.stderr_text;
    }
  }
  auto flag = kvtierd({"--hbm-bytes", "huge", "--check-config"});
  EXPECT_TRUE(flag.status.exited && flag.status.code == 2) << flag.describe();
  EXPECT_NE(flag.stderr_text.find("--hbm-bytes"), std::string::npos) << flag.stderr_text;
}

// The value `kvtierctl config --json` reports for `key`, or what went wrong.
std::string config_value(const Daemon& daemon, const std::string& key) {
  auto run = daemon.run_kvtierctl({"config", "--json"});
  if (!run.status.ok()) return "kvtierctl config failed: " + run.describe();
  auto json = parse_json(run.stdout_text);
  if (!json.is_ok()) return json.status().to_string();
  for (const auto& entry : json->at("config").as_array()) {
    if (entry.at("key").as_string() == key) return std::string(entry.at("value").as_string());
  }
  return "no key " + key;
}

TEST_F(ConfigFile, SighupAppliesThresholdsAndLogsWhatNeedsARestart) {
  const std::string path = dir_ + "/kvtierd.toml";
  ASSERT_TRUE(write_file(path,
                         "hbm-bytes = \"32MiB\"\nram-bytes = \"64MiB\"\nhbm-idle-ms = \"30s\"\n"
                         "hbm-high-watermark = 0.9\n")
                  .is_ok());
  auto daemon = Daemon::start({"--config", path, "--metrics-addr", "off"});
  ASSERT_TRUE(daemon.is_ok()) << daemon.status().to_string();
  const Daemon& d = **daemon;
  EXPECT_EQ(config_value(d, "hbm-idle-ms"), "\"30s\"");

  ASSERT_TRUE(write_file(path,
                         "hbm-bytes = \"32MiB\"\nram-bytes = \"128MiB\"\nhbm-idle-ms = \"5s\"\n"
                         "hbm-high-watermark = 0.8\n")
                  .is_ok());
  ::kill(d.pid(), SIGHUP);
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (config_value(d, "hbm-idle-ms") != "\"5s\"" &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(config_value(d, "hbm-idle-ms"), "\"5s\"");
  EXPECT_EQ(config_value(d, "hbm-high-watermark"), "0.8");
  EXPECT_EQ(config_value(d, "ram-bytes"), "\"64MiB\"") << "ram-bytes needs a restart";
  EXPECT_NE(d.log().find("ram-bytes = \"128MiB\" needs a restart"), std::string::npos) << d.log();

  // A broken file keeps the running configuration, and the daemon.
  ASSERT_TRUE(write_file(path, "hbm-idle-ms = \"whenever\"\n").is_ok());
  ::kill(d.pid(), SIGHUP);
  while (d.log().find("not reloaded") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_NE(d.log().find("hbm-idle-ms: duration 'whenever'"), std::string::npos) << d.log();
  EXPECT_EQ(config_value(d, "hbm-idle-ms"), "\"5s\"");
  EXPECT_TRUE((*daemon)->stop().ok());
}

}  // namespace
}  // namespace kvtier::integration
