"""Fixtures for the vLLM connector's tests: a tiny Llama written locally, real kvtierd
processes (tests/python/kvtierd_process.py), and vLLM engine processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
from kvtierd_process import Kvtierd, use_built_client  # noqa: E402

sys.path.insert(0, str(HERE.parent.parent / "examples" / "vllm"))
from tiny_llama import write_tiny_llama  # noqa: E402

use_built_client()


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), seed=0)


@pytest.fixture(scope="session")
def other_llama(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("other-llama"), seed=1)


@pytest.fixture
def kvtierd(tmp_path):
    daemon = Kvtierd(["--nvme-bytes", "256MiB"])
    yield daemon
    daemon.stop()


class ChatEngine:
    """vLLM in its own process (examples/vllm/engine_process.py), one turn at a time."""

    def __init__(self, model: Path, socket: str | None = None, *extra: str) -> None:
        argv = [sys.executable, str(HERE.parent.parent / "examples" / "vllm" / "engine_process.py"), str(model)]
        if socket:
            argv += ["--kvtier", socket]
        argv += list(extra)
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "WARNING"}
        self.log = open(HERE.parent.parent / "build" / f"vllm-engine-{os.getpid()}-{id(self)}.log", "w") \
            if (HERE.parent.parent / "build").exists() else subprocess.DEVNULL
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.log, text=True, env=env)
        ready = self._read()
        assert ready.get("ready"), ready

    def _read(self) -> dict:
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"the vLLM engine exited ({self.process.wait()}); see {getattr(self.log, 'name', '')}")
            line = line.strip()
            if line.startswith("{"):
                return json.loads(line)

    def turn(self, prompt: list[int], max_tokens: int = 8, session: str | None = None, **fields) -> dict:
        self.process.stdin.write(json.dumps({"prompt": prompt, "max_tokens": max_tokens, "session": session,
                                             **fields}) + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.log is not subprocess.DEVNULL:
            self.log.close()
