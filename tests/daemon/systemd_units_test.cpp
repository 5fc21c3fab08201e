// The shipped systemd files: systemd's own tools accept them, and the unit carries the
// settings the operations contract promises (notify, watchdog, hardening, ...).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/units.h"
#include "daemon/config.h"

namespace kvtier::daemon {
namespace {

struct Output {
  int exit_code = -1;
  std::string text;  // stdout and stderr
};

Output run_shell(const std::string& command) {
  Output out;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.text.append(buffer, n);
  const int status = ::pclose(pipe);
  out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

bool have_tool(const std::string& name) {
  return run_shell("command -v " + name).exit_code == 0;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The value of `key=` in a unit file ("" when absent).
std::string unit_value(const std::string& unit, const std::string& key) {
  std::istringstream lines(unit);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(key + "=", 0) == 0) return line.substr(key.size() + 1);
  }
  return "";
}

const std::string kUnitDir = KVTIER_UNIT_DIR;  // units configured to name the kvtierd under test
const std::string kSourceDir = KVTIER_SOURCE_DIR;

TEST(SystemdUnits, SystemdAnalyzeVerifyAcceptsThem) {
  if (!have_tool("systemd-analyze")) {
    GTEST_SKIP() << "systemd-analyze is not installed (apt-get install systemd)";
  }
  const Output verify = run_shell("systemd-analyze verify " + kUnitDir + "/kvtierd.service " +
                                  kUnitDir + "/kvtierd.socket");
  if (verify.exit_code != 0 && (verify.text.find("Failed to initialize") != std::string::npos ||
                                verify.text.find("Failed to setup") != std::string::npos ||
                                verify.text.find("Permission denied") != std::string::npos)) {
    GTEST_SKIP() << "systemd-analyze verify cannot run here (no usable systemd in this "
                    "container?); its output:\n"
                 << verify.text;
  }
  EXPECT_EQ(verify.exit_code, 0) << verify.text;
  EXPECT_EQ(verify.text, "") << "systemd-analyze verify warned about the units";
}

TEST(SystemdUnits, SysusersAndTmpfilesApplyToAFreshRoot) {
  if (::geteuid() != 0 || !have_tool("systemd-sysusers") || !have_tool("systemd-tmpfiles")) {
    GTEST_SKIP() << "needs root and systemd-sysusers/systemd-tmpfiles to apply the snippets to a "
                    "scratch root";
  }
  char dir_template[] = "/tmp/kvtier-root-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string root = dir_template;
  std::filesystem::create_directories(root + "/etc");
  const Output users =
      run_shell("systemd-sysusers --root=" + root + " " + kSourceDir + "/systemd/kvtier.sysusers");
  EXPECT_EQ(users.exit_code, 0) << users.text;
  const std::string passwd = read_file(root + "/etc/passwd");
  const std::string groups = read_file(root + "/etc/group");
  EXPECT_NE(passwd.find("kvtier:"), std::string::npos) << passwd;
  EXPECT_NE(groups.find("kvtier-admin:"), std::string::npos) << groups;
  const Output dirs = run_shell("systemd-tmpfiles --root=" + root + " --create " + kSourceDir +
                                "/systemd/kvtier.tmpfiles");
  EXPECT_EQ(dirs.exit_code, 0) << dirs.text;
  EXPECT_TRUE(std::filesystem::is_directory(root + "/run/kvtier"));
  EXPECT_TRUE(std::filesystem::is_directory(root + "/var/lib/kvtier"));
  std::filesystem::remove_all(root);
}

TEST(SystemdUnits, ServiceCarriesTheOperationsContract) {
  const std::string unit = read_file(kUnitDir + "/kvtierd.service");
  ASSERT_FALSE(unit.empty());
  EXPECT_EQ(unit_value(unit, "Type"), "notify");
  EXPECT_NE(unit_value(unit, "WatchdogSec"), "");
  EXPECT_EQ(unit_value(unit, "Restart"), "on-failure");
  EXPECT_EQ(unit_value(unit, "LimitMEMLOCK"), "infinity");
  EXPECT_EQ(unit_value(unit, "User"), "kvtier");
  EXPECT_EQ(unit_value(unit, "RuntimeDirectory"), "kvtier");
  EXPECT_EQ(unit_value(unit, "StateDirectory"), "kvtier");
  EXPECT_EQ(unit_value(unit, "ConfigurationDirectory"), "kvtier");
  EXPECT_EQ(unit_value(unit, "NoNewPrivileges"), "yes");
  EXPECT_EQ(unit_value(unit, "ProtectSystem"), "strict");
  EXPECT_EQ(unit_value(unit, "ProtectHome"), "yes");
  EXPECT_EQ(unit_value(unit, "PrivateTmp"), "yes");
  EXPECT_NE(unit_value(unit, "ReadWritePaths"), "");
  EXPECT_NE(unit.find("DeviceAllow=char-nvidia"), std::string::npos);
  EXPECT_NE(unit_value(unit, "ExecStart").find("--config"), std::string::npos);
  // The stop timeout leaves room for the default drain to NVMe.
  auto stop_ms = parse_duration_ms(unit_value(unit, "TimeoutStopSec"));
  ASSERT_TRUE(stop_ms.is_ok()) << stop_ms.status().to_string();
  if (const Setting* drain = find_setting("drain-timeout")) {
    std::string value = drain->get(default_config());
    auto drain_ms = parse_duration_ms(value.substr(1, value.size() - 2));  // unquote
    ASSERT_TRUE(drain_ms.is_ok()) << value;
    EXPECT_GT(*stop_ms, *drain_ms);
  }
  const std::string socket = read_file(kUnitDir + "/kvtierd.socket");
  EXPECT_EQ(unit_value(socket, "ListenStream"), "/run/kvtier/kvtierd.sock");
  EXPECT_EQ(unit_value(socket, "SocketMode"), "0660");
}

}  // namespace
}  // namespace kvtier::daemon
