# Installs kvtier.pc. Runs at install time (cmake --install, cpack) so that the file
# names the prefix actually installed to (/usr for the .deb), not the configured one.
# file(INSTALL) adds $ENV{DESTDIR} itself (cpack stages with it).
# Set by the install(CODE) that includes this: KVTIER_SOURCE_DIR, KVTIER_BINARY_DIR,
# KVTIER_PC_LIBDIR and KVTIER_PC_INCLUDEDIR (relative to the prefix), KVTIER_PC_VERSION.

set(KVTIER_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
configure_file("${KVTIER_SOURCE_DIR}/client/kvtier.pc.in"
               "${KVTIER_BINARY_DIR}/pkgconfig-install/kvtier.pc" @ONLY)
file(INSTALL "${KVTIER_BINARY_DIR}/pkgconfig-install/kvtier.pc"
     DESTINATION "${CMAKE_INSTALL_PREFIX}/${KVTIER_PC_LIBDIR}/pkgconfig")
