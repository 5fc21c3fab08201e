"""Starts and stops a real kvtierd for the Python tests and the lookup benchmark.

The build directory comes from $KVTIER_BUILD_DIR (default ./build); the client
library from $KVTIER_LIBRARY, else the build directory's libkvtier.so.0.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_DIR = Path(os.environ.get("KVTIER_BUILD_DIR", REPO / "build")).resolve()

# Small tiers and no metrics listener, so several daemons can run side by side. Each
# (flag, value) pair applies unless extra_flags names the flag.
DEFAULT_FLAGS = ["--device", "host", "--hbm-bytes", "32MiB", "--ram-bytes", "64MiB",
                 "--copy-threads", "2", "--metrics-addr", "off"]
# Every block size takes a slab of its own: tests with many layouts want small slabs.
SMALL_SLABS = ["--slab-bytes", "1MiB"]


def use_built_client() -> None:
    """Points the kvtier package at this checkout and its built library."""
    if "KVTIER_LIBRARY" not in os.environ:
        for candidate in (BUILD_DIR / "libkvtier.so.0", BUILD_DIR / "client" / "libkvtier.so.0"):
            if candidate.exists():
                os.environ["KVTIER_LIBRARY"] = str(candidate)
                break
    package_dir = str(REPO / "client" / "python")
    if package_dir not in sys.path:
        sys.path.insert(0, package_dir)


class Kvtierd:
    """One kvtierd in its own temp dir (socket, data dir, log). Killed on stop()."""

    def __init__(self, extra_flags: list[str] | None = None, timeout_s: float = 20.0,
                 env: dict[str, str] | None = None) -> None:
        binary = BUILD_DIR / "kvtierd"
        if not binary.exists():
            raise RuntimeError(f"{binary} does not exist: build kvtierd (and the kvtier library) "
                               f"first, or set KVTIER_BUILD_DIR")
        self.dir = Path(tempfile.mkdtemp(prefix="kvtier-py-"))
        self.socket_path = str(self.dir / "kvtierd.sock")
        self.log_path = self.dir / "kvtierd.log"
        extra_flags = list(extra_flags or [])
        self.argv = [str(binary), "--socket", self.socket_path, "--data-dir",
                     str(self.dir / "data")]
        for flag, value in zip(DEFAULT_FLAGS[::2], DEFAULT_FLAGS[1::2]):
            if flag not in extra_flags:  # kvtierd refuses a flag given twice
                self.argv += [flag, value]
        self.argv += extra_flags
        self.timeout_s = timeout_s
        self.env = None if env is None else {**os.environ, **env}  # added to ours
        self._start()

    def _start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=self.env)
        deadline = time.monotonic() + self.timeout_s
        while not self._accepting():
            if self.process.poll() is not None:
                raise RuntimeError(f"kvtierd exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"kvtierd did not accept connections within {self.timeout_s} "
                                   f"s:\n{self.log()}")
            time.sleep(0.02)

    def restart(self) -> None:
        """Starts kvtierd again with the same flags, socket and data dir (after kill()
        or a crash); its log continues in the same file."""
        if self.running():
            raise RuntimeError("kvtierd is still running: kill() or stop it first")
        self._start()

    def _accepting(self) -> bool:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(self.socket_path)
            return True
        except OSError:
            return False
        finally:
            probe.close()

    def running(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.running():
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, SIGKILL after timeout_s; removes the temp dir."""
        if self.running():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
