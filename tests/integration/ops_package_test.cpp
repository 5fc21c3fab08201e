// `cpack -G DEB` builds a package an operator can install: the binaries, units,
// sysusers/tmpfiles snippets, example config (a conffile), README, and the C interface
// (kvtier.h, libkvtier.so.0, kvtier.pc) in the standard places, with units that name the
// installed paths and binaries that run.
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/integration/ops_harness.h"

namespace kvtier::integration {
namespace {

ProcessResult shell(const std::string& command) {
  return run_process({"/bin/sh", "-c", command});
}

TEST(Package, DebBuildsWithTheExpectedFiles) {
  if (!shell("command -v dpkg-deb && command -v dpkg-shlibdeps").status.ok()) {
    GTEST_SKIP() << "dpkg-deb and dpkg-shlibdeps are needed (apt-get install dpkg-dev)";
  }
  char dir_template[] = "/tmp/kvtier-deb-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  // The build directory's CPackConfig.cmake, as an operator runs it after building.
  auto cpack = shell(
      fmt::format("cd '{}' && '{}' -G DEB -B '{}/out'", KVTIER_BIN_DIR, KVTIER_CPACK_COMMAND, dir));
  ASSERT_TRUE(cpack.status.ok()) << cpack.describe();
  std::string deb;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/out")) {
    if (entry.path().extension() == ".deb") deb = entry.path();
  }
  ASSERT_FALSE(deb.empty()) << cpack.describe();

  auto contents = shell("dpkg -c '" + deb + "'");
  ASSERT_TRUE(contents.status.ok()) << contents.describe();
  for (const char* path :
       {"./usr/sbin/kvtierd", "./usr/bin/kvtierctl", "./usr/bin/kvtier-example-engine",
        "./usr/lib/systemd/system/kvtierd.service", "./usr/lib/systemd/system/kvtierd.socket",
        "./usr/lib/sysusers.d/kvtier.conf", "./usr/lib/tmpfiles.d/kvtier.conf",
        "./etc/kvtier/kvtierd.toml", "./usr/share/doc/kvtier/README.md"}) {
    EXPECT_NE(contents.stdout_text.find(std::string(path) + "\n"), std::string::npos)
        << path << " is not in the package:\n"
        << contents.stdout_text;
  }
  EXPECT_EQ(contents.stdout_text.find("/usr/local"), std::string::npos) << contents.stdout_text;
  // The C interface: header, library with its soname and dev links, pkg-config file.
  const std::string libdir = "./usr/" KVTIER_INSTALL_LIBDIR "/";
  for (const std::string& path :
       {std::string("./usr/include/kvtier/kvtier.h\n"), libdir + "libkvtier.so.0.1.0\n",
        libdir + "libkvtier.so.0 -> libkvtier.so.0.1.0\n",
        libdir + "libkvtier.so -> libkvtier.so.0\n", libdir + "pkgconfig/kvtier.pc\n"}) {
    EXPECT_NE(contents.stdout_text.find(path), std::string::npos)
        << path << " is not in the package:\n"
        << contents.stdout_text;
  }

  auto name = shell("dpkg-deb -f '" + deb + "' Package");
  EXPECT_EQ(name.stdout_text, "kvtier\n") << name.describe();
  auto conffiles = shell("dpkg-deb -I '" + deb + "' conffiles");
  EXPECT_NE(conffiles.stdout_text.find("/etc/kvtier/kvtierd.toml"), std::string::npos)
      << "an operator's edited config must survive upgrades: " << conffiles.describe();
  auto scripts = shell("dpkg-deb -I '" + deb + "' postinst");
  EXPECT_NE(scripts.stdout_text.find("systemd-sysusers"), std::string::npos) << scripts.describe();

  // Unpacked: the unit names the installed binary and config; the binaries run.
  auto unpacked = shell("dpkg-deb -x '" + deb + "' '" + dir + "/root'");
  ASSERT_TRUE(unpacked.status.ok()) << unpacked.describe();
  auto unit = shell("cat '" + dir + "/root/usr/lib/systemd/system/kvtierd.service'");
  EXPECT_NE(
      unit.stdout_text.find("ExecStart=/usr/sbin/kvtierd --config /etc/kvtier/kvtierd.toml\n"),
      std::string::npos)
      << unit.stdout_text;
  auto version = run_process({dir + "/root/usr/sbin/kvtierd", "--version"});
  EXPECT_TRUE(version.status.ok()) << version.describe();
  EXPECT_EQ(version.stdout_text.rfind("kvtierd ", 0), 0u) << version.stdout_text;
  auto check =
      run_process({dir + "/root/usr/sbin/kvtierd", "--config",
                   dir + "/root/etc/kvtier/kvtierd.toml", "--admin-group", "", "--check-config"});
  EXPECT_TRUE(check.status.ok()) << check.describe();
  auto ctl = run_process({dir + "/root/usr/bin/kvtierctl", "--help"});
  EXPECT_TRUE(ctl.status.ok()) << ctl.describe();

  // libkvtier: the soname the links name, only kvtier_* exported, a shlibs entry, and a
  // .pc that points at /usr.
  const std::string library = dir + "/root/usr/" KVTIER_INSTALL_LIBDIR "/libkvtier.so.0.1.0";
  auto soname = shell("readelf -d '" + library + "'");
  EXPECT_NE(soname.stdout_text.find("Library soname: [libkvtier.so.0]"), std::string::npos)
      << soname.describe();
  auto exported = shell("nm -D --defined-only '" + library +
                        "' | grep -v ' kvtier_' | grep -Ev ' KVTIER_0(\\.[0-9]+)?$'");
  EXPECT_EQ(exported.stdout_text, "") << "symbols other than kvtier_*: " << exported.describe();
  auto shlibs = shell("dpkg-deb -I '" + deb + "' shlibs");
  EXPECT_NE(shlibs.stdout_text.find("libkvtier 0 kvtier"), std::string::npos) << shlibs.describe();
  auto triggers = shell("dpkg-deb -I '" + deb + "' triggers");
  EXPECT_NE(triggers.stdout_text.find("activate-noawait ldconfig"), std::string::npos)
      << triggers.describe();
  const std::string pkg_config =
      "PKG_CONFIG_PATH='" + dir + "/root/usr/" KVTIER_INSTALL_LIBDIR "/pkgconfig' pkg-config ";
  auto pc = shell(pkg_config + "--modversion kvtier && " + pkg_config +
                  "--variable=libdir kvtier && " + pkg_config + "--variable=includedir kvtier");
  EXPECT_EQ(pc.stdout_text,
            KVTIER_PROJECT_VERSION "\n/usr/" KVTIER_INSTALL_LIBDIR "\n/usr/include\n")
      << pc.describe();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvtier::integration
