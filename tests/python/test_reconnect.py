"""A Python engine rides through kvtierd restarts: the same kvtier.Client raises
Unavailable (retryable) while the daemon is away, then reconnects by itself (hello and
regions again) and loads, bit-exact, what the daemon kept on NVMe."""

from __future__ import annotations

import signal
import time

import pytest

import kvtier
from kvtier.hashing import block_hashes
from kvtierd_process import SMALL_SLABS, Kvtierd

pytest.importorskip("torch", reason="needs torch (Debian: python3-torch)")
import torch
from kvtier.torch import layout_from_tensors, memfd_tensor

SHAPE = (2, 16, 4, 2, 8)  # [2, blocks, block_size, heads, head_dim]
NVME = SMALL_SLABS + ["--nvme-bytes", "64MiB", "--hbm-idle-ms", "0", "--ram-idle-ms", "0",
                      "--plan-interval-ms", "10ms"]


def until_back(client, hashes, timeout_s=30.0):
    """Calls until one goes through; the backoff may refuse the first ones."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.lookup(hashes)
        except kvtier.Unavailable as away:
            assert away.retryable
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_python_engine_rides_through_a_daemon_restart(how):
    process = Kvtierd(NVME)
    try:
        cache = memfd_tensor(SHAPE, torch.float16)
        cache.copy_(torch.arange(cache.numel(), dtype=torch.float32).view(SHAPE) % 1000)
        with kvtier.Client(process.socket_path) as client:
            client.hello(layout_from_tensors("reconnect-model", [cache], 0))
            client.register_tensor(0, cache)
            hashes = block_hashes(range(32), 4, "py-conversation")  # 8 blocks
            assert client.save("py-conversation", list(zip(hashes, range(8)))).stored == 8
            expected = cache[:, :8].clone()
            deadline = time.monotonic() + 30
            while client.lookup(hashes).tiers != ["nvme"] * 8:  # durable before a SIGKILL
                assert time.monotonic() < deadline, client.lookup(hashes)
                time.sleep(0.01)

            if how == "SIGTERM":
                process.process.send_signal(signal.SIGTERM)
                process.process.wait(timeout=30)
            else:
                process.kill()
            with pytest.raises(kvtier.Unavailable) as away:
                client.lookup(hashes)
            assert away.value.retryable
            process.restart()

            assert until_back(client, hashes).hit_count == 8
            assert client.reconnects == 1
            cache[:, 8:16].zero_()
            loaded = client.load("py-conversation", list(zip(hashes, range(8, 16))))
            assert loaded.loaded_count == 8
            assert torch.equal(cache[:, 8:16], expected)
    finally:
        process.stop()


def test_reconnect_off_stays_away():
    process = Kvtierd(SMALL_SLABS)
    try:
        with kvtier.Client(process.socket_path, reconnect=False) as client:
            client.stats()
            process.kill()
            process.restart()
            for _ in range(3):
                with pytest.raises(kvtier.Unavailable):
                    client.stats()
                time.sleep(0.03)
            assert client.reconnects == 0
        with pytest.raises(kvtier.InvalidArgument, match="initial_backoff_ms"):
            kvtier.Client(process.socket_path, initial_backoff_ms=500, max_backoff_ms=100)
    finally:
        process.stop()


# ---- the torch engine: keeps serving through restarts on one Client -------------------

MESSAGES = [
    "Hello! Which tiers does kvtier keep KV blocks in?",
    "What does an engine do while kvtierd restarts?",
    "And once it is back?",
    "Thanks. Summarise that in one sentence.",
]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def model():
    from model import LlamaModel, config_named
    return LlamaModel(config_named("small"))


def _engine_modules():
    import sys
    from kvtierd_process import REPO
    path = str(REPO / "examples" / "torch_engine")
    if path not in sys.path:
        sys.path.insert(0, path)


_engine_modules()


def _start(engine, session: str):
    from engine import Conversation
    tokenizer = engine.tokenizer
    return Conversation(session, tokenizer.message(
        tokenizer.SYSTEM, f"[{session}] You are the assistant of a KV-cache offload daemon."))


def _same_answer(got, recomputed) -> None:
    assert got.tokens == recomputed.tokens
    for mine, theirs in zip(got.logits, recomputed.logits):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)


def _until_on_nvme(client, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = client.stats()
        above = stats.tiers["hbm"].blocks + stats.tiers["ram"].blocks
        if above == 0 and stats.tiers["nvme"].blocks > 0 and stats.copies_in_flight == 0:
            return
        assert time.monotonic() < deadline, f"still {above} blocks above NVMe: {stats}"
        time.sleep(0.02)


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_the_torch_engine_keeps_serving_and_hits_again_on_the_same_client(model, how):
    """While kvtierd is down the engine answers anyway (it recomputes and skips its
    save); once kvtierd is back, its next turns hit again through the same Client
    object, which reconnected by itself. Every answer equals a recomputing engine's."""
    from engine import Engine
    daemon = Kvtierd(NVME + ["--drain-timeout", "20s"])
    engine = Engine(model.config, "kvtier", socket_path=daemon.socket_path, model=model)
    recompute = Engine(model.config, "recompute", model=model)
    client = engine.client
    try:
        session = f"restart-{how}"
        conversation, expected = _start(engine, session), _start(recompute, session)
        first = engine.turn(conversation, MESSAGES[0], NEW_TOKENS)
        _same_answer(first, recompute.turn(expected, MESSAGES[0], NEW_TOKENS))
        assert first.saved_blocks > 0
        _until_on_nvme(client)

        if how == "SIGTERM":
            daemon.process.send_signal(signal.SIGTERM)
            assert daemon.process.wait(timeout=30) == 0, daemon.log()
        else:
            daemon.kill()
        during = engine.turn(conversation, MESSAGES[1], NEW_TOKENS)
        assert during.lookup_hits == 0 and during.restored_tokens == 0
        assert during.saved_blocks == 0
        _same_answer(during, recompute.turn(expected, MESSAGES[1], NEW_TOKENS))

        daemon.restart()
        deadline = time.monotonic() + 30  # past the backoff of the attempts while it was down
        while True:
            try:
                client.stats()
                break
            except kvtier.Unavailable:
                assert time.monotonic() < deadline
                time.sleep(0.02)
        back = engine.turn(conversation, MESSAGES[2], NEW_TOKENS)
        assert engine.client is client and client.reconnects == 1
        # The first turn's blocks survived on NVMe.
        assert back.lookup_hits == first.saved_blocks
        assert back.restored_tokens == first.saved_blocks * engine.cache.block_size
        assert back.saved_blocks > 0  # what the turn while away could not save
        _same_answer(back, recompute.turn(expected, MESSAGES[2], NEW_TOKENS))

        last = engine.turn(conversation, MESSAGES[3], NEW_TOKENS)
        assert last.lookup_hits == back.lookup_hits + back.saved_blocks
        _same_answer(last, recompute.turn(expected, MESSAGES[3], NEW_TOKENS))
        assert client.reconnects == 1
    finally:
        engine.close()
        recompute.close()
        daemon.stop()
