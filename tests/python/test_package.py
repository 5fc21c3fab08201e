"""The package as users get it: import without torch, the library search, and an
offline pip install into a venv that finds its shipped copy of libkvtier.so.0."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvtierd_process import REPO


def run_python(code: str, env: dict, python: str = sys.executable) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, cwd="/")


def test_import_kvtier_does_not_import_torch():
    env = dict(os.environ, PYTHONPATH=str(REPO / "client" / "python"))
    out = run_python("import sys, kvtier, kvtier.hashing; print('torch' in sys.modules)", env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_a_missing_library_is_unavailable_naming_the_path():
    env = dict(os.environ, PYTHONPATH=str(REPO / "client" / "python"),
               KVTIER_LIBRARY="/nonexistent/libkvtier.so.0")
    out = run_python("import kvtier\n"
                     "try:\n    kvtier.Client('/nonexistent.sock')\n"
                     "except kvtier.Unavailable as e:\n    print(e)\n", env)
    assert out.returncode == 0, out.stderr
    assert "/nonexistent/libkvtier.so.0" in out.stdout and "KVTIER_LIBRARY" in out.stdout


def test_pip_install_offline_ships_the_library(tmp_path, daemon):
    pytest.importorskip("torch", reason="the installed package is tried with kvtier.torch "
                                        "(Debian: python3-torch)")
    library = os.environ.get("KVTIER_LIBRARY")
    if not library or not Path(library).exists():
        pytest.skip("no built libkvtier.so.0 to ship")
    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                          capture_output=True, text=True, timeout=120)
    if made.returncode != 0:
        pytest.skip(f"cannot make a venv (python3-venv missing?): {made.stderr.strip()}")
    source = tmp_path / "src"
    shutil.copytree(REPO / "client" / "python", source,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    shutil.copy(library, source / "kvtier" / "libkvtier.so.0")  # the copy to ship
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-index",
         "--no-build-isolation", str(source)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    env = {k: v for k, v in os.environ.items() if k not in ("KVTIER_LIBRARY", "PYTHONPATH")}
    out = run_python(
        "import kvtier, kvtier._lib as lib, kvtier.torch as kt, torch\n"
        f"c = kvtier.Client({daemon.socket_path!r})\n"
        "kv = kt.memfd_tensor((2, 4, 4, 1, 8), torch.float16)\n"
        "c.hello(kt.layout_from_tensors('pip-installed', [kv], 0))\n"
        "c.register_tensor(0, kv)\n"
        "print(kvtier.__file__, lib.library()._name, c.lookup([b'h' * 32]).hit_count)\n"
        "c.close()\n", env, python=str(venv / "bin" / "python"))
    assert out.returncode == 0, out.stderr
    module, loaded, hits = out.stdout.split()
    assert module.startswith(str(venv)) and loaded.startswith(str(venv)) and hits == "0"
