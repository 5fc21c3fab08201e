"""A real attention model (examples/torch_engine) gives the same answer with its
history's KV restored from kvtierd as with the KV it computed itself:

1. a 4-turn conversation whose engine drops its cache between turns and restores the
   prefix from kvtierd matches, token for token and bit for bit in its logits, the
   engine that kept its cache in memory; and gives the greedy tokens of a full
   recompute (logits within fp tolerance: prefill shapes differ);
2. the same when the session was demoted to NVMe and kvtierd was killed with SIGKILL
   and restarted on the same data dir in the middle of the conversation;
3. a second engine process loads the first one's system-prompt blocks (deduplicated
   on save) and answers as a recompute would; an engine with other weights (another
   model id) finds nothing;
4. a conversation begun on one node (kvtierd A) goes on on another (kvtierd B, its
   own data dir and socket) through the remote tier on a local Redis Cluster: B's
   engine restores the whole history from the cluster and answers bit for bit as the
   engine that kept its cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvtierd_process import BUILD_DIR, REPO, Kvtierd

pytest.importorskip("torch", reason="needs torch (Debian: python3-torch)")
import torch

ENGINE_DIR = REPO / "examples" / "torch_engine"
sys.path.insert(0, str(ENGINE_DIR))

from engine import Conversation, Engine  # noqa: E402 - from ENGINE_DIR, and imports torch
from model import LlamaModel, config_named  # noqa: E402 - likewise

MESSAGES = [
    "Hello! Which tiers does kvtier keep KV blocks in?",
    "And what happens when a session goes idle for ten minutes?",
    "Why would reloading beat recomputing the prefill?",
    "Thanks. Summarise that in one sentence.",
]
NEW_TOKENS = 20
# Demote every idle session at once, all the way to NVMe.
NVME_FLAGS = ["--nvme-bytes", "64MiB", "--slab-bytes", "1MiB", "--hbm-idle-ms", "0",
              "--ram-idle-ms", "0", "--plan-interval-ms", "10ms", "--drain-timeout", "5s"]


@pytest.fixture(scope="module")
def model():
    return LlamaModel(config_named("small"))


def system_prompt(test_name: str) -> str:
    # Unique per test, so tests sharing a daemon never see each other's blocks.
    return (f"[{test_name}] You are the assistant of a KV-cache offload daemon. Answer "
            f"briefly, precisely, and cite the tier a block came from.")


def start_conversation(engine: Engine, session_id: str, test_name: str) -> Conversation:
    tokenizer = engine.tokenizer
    return Conversation(session_id, tokenizer.message(tokenizer.SYSTEM, system_prompt(test_name)))


def assert_cache_wiped(engine: Engine) -> None:
    """Nothing of the previous turn is left in the engine's own cache."""
    assert engine.cache.free_blocks == engine.cache.num_blocks
    assert torch.all(torch.nan_to_num(engine.cache.tensor, nan=0.0) == 0)


def assert_same_as_reference(restored, reference) -> None:
    assert restored.tokens == reference.tokens
    assert restored.restored_tokens == reference.restored_tokens
    for row, (got, want) in enumerate(zip(restored.logits, reference.logits)):
        assert torch.equal(got, want), f"answer token {row}: logits differ"


def assert_same_as_recompute(restored, recomputed) -> None:
    assert restored.tokens == recomputed.tokens
    for got, want in zip(restored.logits, recomputed.logits):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_restored_prefix_gives_the_same_answer(daemon, model):
    config = model.config
    engines = {mode: Engine(config, mode, socket_path=daemon.socket_path, model=model)
               for mode in ("kvtier", "memory", "recompute")}
    try:
        conversations = {mode: start_conversation(engine, "same-answer", "same-answer")
                         for mode, engine in engines.items()}
        saved_blocks = 0
        for turn, message in enumerate(MESSAGES):
            results = {mode: engine.turn(conversations[mode], message, NEW_TOKENS)
                       for mode, engine in engines.items()}
            restored = results["kvtier"]
            assert_cache_wiped(engines["kvtier"])
            if turn > 0:
                # Every full block of the history so far came back from kvtierd.
                assert restored.lookup_hits == saved_blocks
                assert restored.restored_tokens == saved_blocks * 16
                assert restored.deduplicated_blocks == saved_blocks
            saved_blocks += restored.saved_blocks
            assert_same_as_reference(restored, results["memory"])
            assert_same_as_recompute(restored, results["recompute"])
        assert conversations["kvtier"].tokens == conversations["recompute"].tokens
    finally:
        for engine in engines.values():
            engine.close()


def wait_until_on_nvme(engine: Engine, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = engine.client.stats()
        above = stats.tiers["hbm"].blocks + stats.tiers["ram"].blocks
        if above == 0 and stats.tiers["nvme"].blocks > 0 and stats.copies_in_flight == 0:
            return
        assert time.monotonic() < deadline, f"still {above} blocks above NVMe: {stats}"
        time.sleep(0.02)


def test_same_answer_after_kill_nine_with_the_session_on_nvme(model):
    daemon = Kvtierd(NVME_FLAGS)
    config = model.config
    engine = Engine(config, "kvtier", socket_path=daemon.socket_path, model=model)
    reference = Engine(config, "memory", model=model)
    try:
        conversation = start_conversation(engine, "kill-nine", "kill-nine")
        expected = start_conversation(reference, "kill-nine", "kill-nine")
        saved_blocks = 0
        for turn, message in enumerate(MESSAGES):
            if turn == 2:
                wait_until_on_nvme(engine)
                daemon.kill()
                daemon.restart()  # the engine notices on its next call and reconnects
            restored = engine.turn(conversation, message, NEW_TOKENS)
            assert_same_as_reference(restored, reference.turn(expected, message, NEW_TOKENS))
            if turn > 0:
                assert restored.lookup_hits == saved_blocks
            if turn == 2:
                # The restarted daemon began with empty RAM and HBM: the hits were read
                # back from NVMe (BeginTurn may have promoted them before the Lookup, so
                # the tiers the Lookup saw do not tell).
                assert engine.client.stats().bytes_promoted > 0
            saved_blocks += restored.saved_blocks
        assert daemon.running(), daemon.log()
    finally:
        engine.close()
        daemon.stop()


def run_engine_process(socket_path: str, session: str, message: str, tmp_path: Path,
                       seed: int = 0) -> tuple[dict, list[torch.Tensor]]:
    logits_path = tmp_path / f"{session}-{seed}.pt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO / "client" / "python"), str(ENGINE_DIR), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, str(ENGINE_DIR / "engine.py"), "--socket", socket_path, "--session",
         session, "--seed", str(seed), "--system", system_prompt("two-engines"), "--message",
         message, "--max-new-tokens", str(NEW_TOKENS), "--logits-out", str(logits_path)],
        env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), torch.load(logits_path)[0]


def test_second_engine_loads_the_first_ones_system_prompt(daemon, model, tmp_path):
    first, _ = run_engine_process(daemon.socket_path, "engine-a", MESSAGES[0], tmp_path)
    assert first["lookup_hits"] == 0 and first["saved_blocks"] > 0

    second, second_logits = run_engine_process(daemon.socket_path, "engine-b", MESSAGES[1],
                                               tmp_path)
    recompute = Engine(model.config, "recompute", model=model)
    conversation = start_conversation(recompute, "engine-b", "two-engines")
    system_blocks = len(conversation.tokens) // 16
    assert second["lookup_hits"] >= system_blocks
    assert second["restored_tokens"] >= system_blocks * 16
    assert second["deduplicated_blocks"] >= system_blocks
    recomputed = recompute.turn(conversation, MESSAGES[1], NEW_TOKENS)
    assert second["tokens"] == recomputed.tokens
    torch.testing.assert_close(second_logits, torch.stack(recomputed.logits), rtol=1e-4,
                               atol=1e-4)

    other_model, _ = run_engine_process(daemon.socket_path, "engine-c", MESSAGES[1], tmp_path,
                                        seed=1)
    assert other_model["lookup_hits"] == 0
    assert other_model["deduplicated_blocks"] == 0


def remote_status(socket_path: str) -> dict:
    done = subprocess.run([str(BUILD_DIR / "kvtierctl"), "--socket", socket_path, "status",
                           "--json"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["remote"]


def test_conversation_moves_to_another_node_through_the_remote_tier(model, tmp_path):
    cluster_dir = tmp_path / "redis"
    started = subprocess.run([str(REPO / "scripts" / "redis-cluster"), "start", str(cluster_dir)],
                             capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    seeds = started.stdout.strip().splitlines()[-1]
    nodes = []
    engines = []
    try:
        nodes = [Kvtierd(["--remote-nodes", seeds]) for _ in range(2)]
        config = model.config
        engine_a, engine_b = (Engine(config, "kvtier", socket_path=node.socket_path, model=model)
                              for node in nodes)
        reference = Engine(config, "memory", model=model)
        engines = [engine_a, engine_b, reference]
        conversation = start_conversation(engine_a, "moves", "moves")
        expected = start_conversation(reference, "moves", "moves")
        saved_blocks = 0
        for turn, message in enumerate(MESSAGES):
            engine = engine_a if turn < 2 else engine_b
            if turn == 2:
                # Node A has written the first two turns behind (blocks, then records).
                deadline = time.monotonic() + 20
                while True:
                    status = remote_status(nodes[0].socket_path)
                    if status["written_blocks"] >= saved_blocks and \
                            status["in_flight_bytes"] == 0 and status["write_lag_ms"] == 0:
                        break
                    assert time.monotonic() < deadline, status
                    time.sleep(0.05)
            restored = engine.turn(conversation, message, NEW_TOKENS)
            assert_same_as_reference(restored, reference.turn(expected, message, NEW_TOKENS))
            if turn > 0:
                assert restored.lookup_hits == saved_blocks
            if turn == 2:
                # B had never seen this conversation: every block came from the cluster.
                assert remote_status(nodes[1].socket_path)["fetched_blocks"] == saved_blocks
            saved_blocks += restored.saved_blocks
        assert all(node.running() for node in nodes)
    finally:
        for engine in engines:
            engine.close()
        for node in nodes:
            node.stop()
        subprocess.run([str(REPO / "scripts" / "redis-cluster"), "stop", str(cluster_dir)],
                       capture_output=True, timeout=60)
