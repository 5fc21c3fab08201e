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

use_built_client()

TINY_LLAMA = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)


def write_tiny_llama(directory: Path, seed: int, **overrides) -> Path:
    """A Llama-architecture model with seeded random weights (no hub)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(**{**TINY_LLAMA, **overrides}, torch_dtype="float32")
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    return directory


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
    """vLLM in its own process (tests/vllm/chat_engine.py), one turn at a time."""

    def __init__(self, model: Path, socket: str | None = None, *extra: str) -> None:
        argv = [sys.executable, str(HERE / "chat_engine.py"), str(model)]
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
