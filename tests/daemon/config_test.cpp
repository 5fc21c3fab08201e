// kvtierd's configuration: the TOML file, flags over it, errors that name the key, the
// printed effective config, and what SIGHUP may change.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "daemon/config.h"

namespace kvtier::daemon {
namespace {

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/kvtier-config-XXXXXX";
    ASSERT_NE(::mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& text, const std::string& name = "kvtierd.toml") {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  Result<CommandLine> parse(std::vector<std::string> args) {
    args.insert(args.begin(), "kvtierd");
    std::vector<const char*> argv;
    for (const auto& arg : args) argv.push_back(arg.c_str());
    return parse_command_line(static_cast<int>(argv.size()), argv.data());
  }

  std::string dir_;
};

::testing::AssertionResult FailsNaming(const Result<CommandLine>& result,
                                       std::vector<std::string> fragments) {
  if (result.is_ok()) return ::testing::AssertionFailure() << "parsed without an error";
  if (result.status().code() != StatusCode::kInvalidArgument)
    return ::testing::AssertionFailure() << result.status().to_string();
  for (const std::string& fragment : fragments) {
    if (result.status().message().find(fragment) == std::string::npos) {
      return ::testing::AssertionFailure()
             << "'" << result.status().message() << "' does not mention '" << fragment << "'";
    }
  }
  return ::testing::AssertionSuccess() << result.status().message();
}

TEST_F(ConfigTest, DefaultsAreValid) {
  auto parsed = parse({});
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->config.hbm_bytes, 1ull << 30);
  EXPECT_EQ(parsed->config.metrics_addr, kDefaultMetricsAddr);
  EXPECT_FALSE(parsed->check_config);
}

TEST_F(ConfigTest, GpusIsAllOrAListOfUuids) {
  auto parsed = parse({});
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->config.gpus, "all");
  EXPECT_TRUE(gpu_uuid_list(parsed->config).empty());
  parsed = parse({"--gpus", "GPU-5F4A1B2C-0000-1111-2222-333344445555,gpu-x"});
  EXPECT_TRUE(FailsNaming(parsed, {"gpus", "'gpu-x' is not a GPU UUID"}));
  parsed = parse({"--gpus", "GPU-5f4a1b2c-0000-1111-2222-33334444555"});  // one digit short
  EXPECT_TRUE(FailsNaming(parsed, {"gpus", "is not a GPU UUID"}));
  parsed =
      parse({"--gpus",
             "GPU-5f4a1b2c-0000-1111-2222-333344445555,GPU-5F4A1B2C-0000-1111-2222-333344445555"});
  EXPECT_TRUE(FailsNaming(parsed, {"gpus", "listed twice"}));
  const auto path = write(
      "gpus = "
      "\"GPU-5F4A1B2C-0000-1111-2222-333344445555,GPU-00000000-aaaa-bbbb-cccc-dddddddddddd\"\n");
  parsed = parse({"--config", path});
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  EXPECT_EQ(gpu_uuid_list(parsed->config),
            (std::vector<std::string>{"GPU-5f4a1b2c-0000-1111-2222-333344445555",
                                      "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"}));
  EXPECT_FALSE(find_setting("gpus")->reloadable);
}

TEST_F(ConfigTest, FileSetsEveryKindAndFlagsOverrideIt) {
  const auto path = write(R"(
hbm-bytes = "256MiB"
ram-bytes = 1073741824
hbm-idle-ms = "5s"
ram-idle-ms = 120000
hbm-high-watermark = 0.8
hbm-low-watermark = 0.5
copy-threads = 3
device = "host"
shared-namespace = ["team=1001,1002", "ops=7"]
log-level = "debug"
metrics-addr = "off"
)");
  auto parsed = parse({"--config", path, "--hbm-bytes", "128MiB", "--hbm-idle-ms", "2s",
                       "--shared-namespace", "solo=5"});
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  const DaemonConfig& c = parsed->config;
  EXPECT_EQ(c.hbm_bytes, 128ull << 20);  // the flag wins
  EXPECT_EQ(c.ram_bytes, 1ull << 30);    // an integer is bytes
  EXPECT_EQ(c.hbm_idle_ms, 2000u);
  EXPECT_EQ(c.ram_idle_ms, 120'000u);  // an integer is milliseconds
  EXPECT_DOUBLE_EQ(c.hbm_high_watermark, 0.8);
  EXPECT_EQ(c.copy_threads, 3);
  EXPECT_EQ(c.device, "host");
  EXPECT_EQ(c.log_level, LogLevel::kDebug);
  EXPECT_EQ(c.metrics_addr, "off");
  // A list flag replaces the file's list rather than adding to it.
  EXPECT_EQ(c.shared_namespaces.size(), 1u);
  EXPECT_EQ(c.shared_namespaces.at(5), "solo");
  EXPECT_EQ(parsed->config_file, path);
}

TEST_F(ConfigTest, UnknownKeyIsAnErrorNamingItWithASuggestion) {
  const auto path = write("hbm-bytes = \"1GiB\"\nhbm-byte = \"2GiB\"\n");
  EXPECT_TRUE(FailsNaming(parse({"--config", path}),
                          {path + ":2", "unknown key 'hbm-byte'", "did you mean 'hbm-bytes'"}));
  const auto table = write("[tiers]\nhbm-bytes = \"1GiB\"\n", "table.toml");
  EXPECT_TRUE(FailsNaming(parse({"--config", table}), {"unknown key 'tiers'"}));
}

TEST_F(ConfigTest, BadValuesNameTheKeyAndLine) {
  EXPECT_TRUE(FailsNaming(parse({"--config", write("\n\nram-bytes = \"lots\"\n")}),
                          {":3", "ram-bytes", "lots"}));
  EXPECT_TRUE(FailsNaming(parse({"--config", write("hbm-bytes = \"4 parsecs\"\n")}),
                          {"hbm-bytes", "unknown unit"}));
  EXPECT_TRUE(FailsNaming(parse({"--config", write("hbm-bytes = true\n")}),
                          {"hbm-bytes", "expected a size", "found a boolean"}));
  EXPECT_TRUE(
      FailsNaming(parse({"--config", write("hbm-idle-ms = \"soon\"\n")}), {"hbm-idle-ms", "soon"}));
  EXPECT_TRUE(FailsNaming(parse({"--config", write("hbm-high-watermark = 1.5\n")}),
                          {"hbm-high-watermark", "outside"}));
  EXPECT_TRUE(FailsNaming(parse({"--config", write("copy-threads = \"two\"\n")}),
                          {"copy-threads", "expected an integer"}));
  EXPECT_TRUE(FailsNaming(parse({"--config", write("device = \"tpu\"\n")}), {"device", "tpu"}));
  EXPECT_TRUE(FailsNaming(parse({"--config", write("metrics-addr = \"localhost:9\"\n")}),
                          {"metrics-addr", "IP address"}));
  EXPECT_TRUE(FailsNaming(parse({"--config", write("shared-namespace = [\"team\"]\n")}),
                          {"shared-namespace", "NAME=UID"}));
  EXPECT_TRUE(FailsNaming(parse({"--config", write("log-level = \"loud\"\n")}), {"log-level"}));
}

TEST_F(ConfigTest, TenantQuotasParseAndResolvePerTenantThenStar) {
  const auto path = write(R"(
tenant-quota = ["uid:1000 hbm=1GiB ram=25%", "* hbm=10%"]
)");
  auto parsed = parse({"--config", path});
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  const std::vector<TenantQuota>& quotas = parsed->config.tenant_quotas;
  ASSERT_EQ(quotas.size(), 2u);
  constexpr uint64_t kCapacity = 8ull << 30;
  EXPECT_EQ(quota_bytes(quotas, "uid:1000", Tier::kHbm, kCapacity), 1ull << 30);
  EXPECT_EQ(quota_bytes(quotas, "uid:1000", Tier::kRam, kCapacity), 2ull << 30);
  // A tier the named entry leaves out has no quota for it ("*" is for tenants not named).
  EXPECT_EQ(quota_bytes(quotas, "uid:1000", Tier::kNvme, kCapacity), std::nullopt);
  EXPECT_EQ(quota_bytes(quotas, "uid:1001", Tier::kHbm, kCapacity),
            static_cast<uint64_t>(kCapacity * 0.1));
  EXPECT_EQ(quota_bytes(quotas, "uid:1001", Tier::kRam, kCapacity), std::nullopt);
  EXPECT_EQ(quota_bytes({}, "uid:1001", Tier::kHbm, kCapacity), std::nullopt);
  // The flag form, and what the daemon prints back reads the same.
  auto flag = parse({"--tenant-quota", "team nvme=100GiB"});
  ASSERT_TRUE(flag.is_ok()) << flag.status().to_string();
  EXPECT_EQ(quota_bytes(flag->config.tenant_quotas, "team", Tier::kNvme, kCapacity), 100ull << 30);
  for (const char* bad :
       {"uid:1", "uid:1 hbm", "uid:1 gpu=1GiB", "uid:1 hbm=lots", "uid:1 hbm=0%", "uid:1 hbm=101%",
        "uid:1 hbm=1GiB hbm=2GiB", "hbm=1GiB", "uid:1 remote=1GiB"}) {
    EXPECT_TRUE(FailsNaming(parse({"--tenant-quota", bad}), {"tenant-quota"})) << bad;
  }
  EXPECT_TRUE(FailsNaming(parse({"--tenant-quota", "a hbm=1GiB", "--tenant-quota", "a ram=1GiB"}),
                          {"tenant-quota", "already has a quota"}));
}

TEST_F(ConfigTest, BadPathsNameTheKey) {
  const auto file = write("not a directory", "plain-file");
  EXPECT_TRUE(FailsNaming(parse({"--config", write("data-dir = \"" + file + "\"\n")}),
                          {"data-dir", "not a directory"}));
  EXPECT_TRUE(
      FailsNaming(parse({"--config", write("socket = \"/" + std::string(200, 's') + "\"\n")}),
                  {"socket", "at most"}));
  EXPECT_TRUE(FailsNaming(parse({"--config", write("data-dir = \"\"\n")}), {"data-dir", "empty"}));
  EXPECT_TRUE(FailsNaming(parse({"--config", dir_ + "/missing.toml"}),
                          {"--config", "missing.toml", "cannot read"}));
}

TEST_F(ConfigTest, SyntaxErrorsNameTheLine) {
  EXPECT_TRUE(
      FailsNaming(parse({"--config", write("hbm-bytes = \"1GiB\"\nram-bytes = \n")}), {":2"}));
}

TEST_F(ConfigTest, FlagErrorsNameTheFlag) {
  EXPECT_TRUE(FailsNaming(parse({"--hbm-bytes", "many"}), {"--hbm-bytes", "many"}));
  EXPECT_TRUE(FailsNaming(parse({"--no-such-flag"}), {"no-such-flag"}));
  EXPECT_TRUE(FailsNaming(parse({"--hbm-low-watermark", "0.95"}),
                          {"hbm-low-watermark", "hbm-high-watermark"}));
}

TEST_F(ConfigTest, AdminGroupIsResolvedAfterFlagsOverride) {
  const auto path = write("admin-group = \"no-such-group-kvtier\"\n");
  EXPECT_TRUE(FailsNaming(parse({"--config", path}), {"admin-group", "no-such-group-kvtier"}));
  auto overridden = parse({"--config", path, "--admin-group", ""});
  ASSERT_TRUE(overridden.is_ok()) << overridden.status().to_string();
  EXPECT_FALSE(overridden->config.admin_gid.has_value());
  auto root = parse({"--admin-group", "root"});
  ASSERT_TRUE(root.is_ok()) << root.status().to_string();
  EXPECT_EQ(root->config.admin_gid, gid_t{0});
}

TEST_F(ConfigTest, PrintedConfigReadsBackToTheSameConfig) {
  auto parsed = parse({"--hbm-bytes", "1536MiB", "--ram-idle-ms", "90s", "--shared-namespace",
                       "team=1,2", "--hbm-high-watermark", "0.85", "--plan-interval-ms", "250"});
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  const std::string toml = to_toml(parsed->config);
  for (const Setting& setting : settings()) {
    EXPECT_NE(toml.find("\n" + std::string(setting.key) + " = "), std::string::npos)
        << setting.key << " missing from:\n"
        << toml;
  }
  DaemonConfig again = default_config();
  ASSERT_TRUE(apply_config_file(write(toml, "printed.toml"), again).is_ok());
  EXPECT_TRUE(changed_keys(parsed->config, again).empty()) << toml;
}

TEST_F(ConfigTest, ReloadTakesOnlyReloadableSettings) {
  auto running = parse({"--hbm-idle-ms", "30s", "--ram-bytes", "2GiB", "--log-level", "info"});
  auto fresh = parse({"--hbm-idle-ms", "5s", "--ram-bytes", "4GiB", "--log-level", "debug"});
  ASSERT_TRUE(running.is_ok() && fresh.is_ok());
  auto changed = changed_keys(running->config, fresh->config);
  EXPECT_EQ(changed, (std::vector<std::string>{"ram-bytes", "hbm-idle-ms", "log-level"}));
  DaemonConfig merged = with_reloadable_settings(running->config, fresh->config);
  EXPECT_EQ(merged.hbm_idle_ms, 5000u);
  EXPECT_EQ(merged.log_level, LogLevel::kDebug);
  EXPECT_EQ(merged.ram_bytes, 2ull << 30);  // needs a restart: unchanged
  EXPECT_TRUE(find_setting("hbm-high-watermark")->reloadable);
  EXPECT_FALSE(find_setting("socket")->reloadable);
}

// A test-only setting: off by default, a duration, needs a restart, and (TESTS ONLY)
// not one the shipped example must list.
TEST_F(ConfigTest, FaultCopyDelayIsATestOnlyDuration) {
  auto defaults = parse({});
  ASSERT_TRUE(defaults.is_ok()) << defaults.status().to_string();
  EXPECT_EQ(defaults->config.fault_copy_delay_ms, 0u);
  auto parsed = parse({"--fault-copy-delay-ms", "300ms"});
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->config.fault_copy_delay_ms, 300u);
  const Setting* setting = find_setting("fault-copy-delay-ms");
  ASSERT_NE(setting, nullptr);
  EXPECT_EQ(setting->kind, Setting::Kind::kDuration);
  EXPECT_FALSE(setting->reloadable);
  EXPECT_EQ(setting->help.rfind("TESTS ONLY", 0), 0u);
  EXPECT_TRUE(FailsNaming(parse({"--fault-copy-delay-ms", "soon"}), {"--fault-copy-delay-ms"}));
}

// The shipped example must load, and document every setting an operator may set.
TEST_F(ConfigTest, ExampleConfigIsValidAndListsEveryKey) {
  const std::string path = std::string(KVTIER_SOURCE_DIR) + "/systemd/kvtierd.toml";
  // The host running the tests may lack the package's group.
  auto parsed = parse({"--config", path, "--admin-group", ""});
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  for (const Setting& setting : settings()) {
    if (setting.help.rfind("TESTS ONLY", 0) == 0) continue;
    const std::string key(setting.key);
    EXPECT_TRUE(text.str().find("\n" + key + " = ") != std::string::npos ||
                text.str().find("\n# " + key + " = ") != std::string::npos)
        << "systemd/kvtierd.toml does not mention '" << key
        << "': add it (commented out, with its default and a line of help)";
  }
}

}  // namespace
}  // namespace kvtier::daemon
