"""Fixtures for the vLLM connector's tests: a tiny Llama written locally, real kvtierd
processes (tests/python/kvtierd_process.py), and vLLM engine processes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
from kvtierd_process import Kvtierd, use_built_client  # noqa: E402

sys.path.insert(0, str(HERE.parent.parent / "examples" / "vllm"))
from engine_client import EngineProcess  # noqa: E402
from tiny_llama import write_tiny_llama  # noqa: E402

use_built_client()


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), seed=0)


@pytest.fixture(scope="session")
def other_llama(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("other-llama"), seed=1)


@pytest.fixture
def kvtierd():
    daemon = Kvtierd(["--nvme-bytes", "256MiB"])
    yield daemon
    daemon.stop()


class ChatEngine(EngineProcess):
    """vLLM in its own process, one turn at a time; its stderr in build/ when there is one."""

    def __init__(self, model: Path, socket: str | None = None, *flags: str, env: dict[str, str] | None = None) -> None:
        build = HERE.parent.parent / "build"
        log = build / f"vllm-engine-{os.getpid()}-{id(self)}.log" if build.exists() else None
        super().__init__(model, socket, *flags, log_path=log, env=env)


@pytest.fixture(scope="session")
def reference(tiny_llama):
    """vLLM without a connector (prefix cache off): what every test's outputs must equal."""
    engine = ChatEngine(tiny_llama)
    yield engine
    engine.close()


def reference_replies(engine: ChatEngine, pieces: list[list[int]], max_tokens: int = 8) -> list[list[int]]:
    """The replies of a chat whose turn i sends pieces[0] + ... + pieces[i + 1] after the
    replies before it (greedy: the same on any engine that computes the same KV)."""
    history, replies = list(pieces[0]), []
    for user in pieces[1:]:
        history += user
        replies.append(engine.turn(history, max_tokens=max_tokens)["tokens"])
        history += replies[-1]
    return replies
