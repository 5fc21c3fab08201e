# Installs the systemd units and the example configuration. Runs at install time
# (cmake --install, cpack) because the units name kvtierd and its config file by
# absolute path, and those depend on the prefix actually used: /usr (the .deb) puts the
# config in /etc, any other prefix in PREFIX/etc.
#
# file(INSTALL) adds $ENV{DESTDIR} itself (cpack stages with it).
# Set by the install(CODE) that includes this: KVTIER_SOURCE_DIR, KVTIER_BINARY_DIR,
# KVTIER_SBINDIR and KVTIER_DOCDIR (relative to the prefix).

if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(kvtier_sysconf "/etc")
else()
  set(kvtier_sysconf "${CMAKE_INSTALL_PREFIX}/etc")
endif()
set(KVTIER_SBIN_DIR "${CMAKE_INSTALL_PREFIX}/${KVTIER_SBINDIR}")
set(KVTIER_CONFIG_DIR "${kvtier_sysconf}/kvtier")
set(KVTIER_DOC_DIR "${CMAKE_INSTALL_PREFIX}/${KVTIER_DOCDIR}")

set(kvtier_staging "${KVTIER_BINARY_DIR}/systemd-install")
configure_file("${KVTIER_SOURCE_DIR}/systemd/kvtierd.service.in"
               "${kvtier_staging}/kvtierd.service" @ONLY)
configure_file("${KVTIER_SOURCE_DIR}/systemd/kvtierd.socket"
               "${kvtier_staging}/kvtierd.socket" @ONLY)
file(INSTALL "${kvtier_staging}/kvtierd.service" "${kvtier_staging}/kvtierd.socket"
     DESTINATION "${CMAKE_INSTALL_PREFIX}/lib/systemd/system")

# An operator's edited configuration is never overwritten by a later install (the .deb
# marks it a conffile, so dpkg asks instead).
if(EXISTS "$ENV{DESTDIR}${KVTIER_CONFIG_DIR}/kvtierd.toml")
  message(STATUS "Keeping: $ENV{DESTDIR}${KVTIER_CONFIG_DIR}/kvtierd.toml")
else()
  file(INSTALL "${KVTIER_SOURCE_DIR}/systemd/kvtierd.toml" DESTINATION "${KVTIER_CONFIG_DIR}")
endif()
