"""vLLM's own engine (LLM on the CPU platform) with kvtier.vllm, end to end.

A tiny Llama with seeded random weights, greedy decoding, vLLM's prefix cache on (its
default) over a cache of 32 blocks: what vLLM still holds is a local hit, what it
evicted must come back from kvtierd (or be recomputed), and every answer must equal
vLLM's without the connector."""

from __future__ import annotations

import json
import random
import subprocess
import time

import pytest
from conftest import ChatEngine, Kvtierd, reference_replies
from kvtierd_process import BUILD_DIR

BLOCK = 32  # engine_process.py's block size
BLOCK_BYTES = 64 << 10  # one block of the tiny Llama: 4 layers x 2 KV heads x 32 tokens x 32 x 2 x fp32
CACHE_BLOCKS = 32
# vLLM's prefix cache on, over 32 blocks (31 usable: vLLM keeps one aside): a chat's
# history fits, and a long request of another session evicts it.
SMALL_CACHE = ("--prefix-caching", "--max-model-len", str((CACHE_BLOCKS - 1) * BLOCK),
               "--kv-cache-bytes", str(CACHE_BLOCKS * BLOCK_BYTES))
MAX_TOKENS = 8


def conversation(seed: int, turns: int, system_tokens: int = 96, user_tokens: int = 40) -> list[list[int]]:
    rng = random.Random(seed)
    system = [rng.randrange(1, 500) for _ in range(system_tokens)]
    return [system] + [[rng.randrange(1, 500) for _ in range(user_tokens)] for _ in range(turns)]


def run_chat(engine: ChatEngine, pieces: list[list[int]], session: str | None, between=None) -> list[dict]:
    """Each reply, with "history": the prompt it answered."""
    history = list(pieces[0])
    replies = []
    for turn, user in enumerate(pieces[1:]):
        if between is not None and turn > 0:
            between(turn, len(history) + len(user))
        history += user
        reply = engine.turn(history, max_tokens=MAX_TOKENS, session=session)
        reply["history"] = list(history)
        replies.append(reply)
        history += reply["tokens"]
    return replies


def evict(engine: ChatEngine, seed: int, keep: int) -> None:
    """Another session's request taking every block vLLM holds but `keep` (at least 1:
    a prompt is shorter than the model's length): no request runs between, so those are
    the chat's first blocks (vLLM evicts the least recently freed first, and a request's
    last blocks before its first)."""
    rng = random.Random(seed)
    engine.turn([rng.randrange(1, 500) for _ in range((CACHE_BLOCKS - 1 - max(1, keep)) * BLOCK)], max_tokens=1)


def grown(replies: list[dict], turn: int) -> dict[str, int]:
    before = replies[turn - 1]["counters"]
    return {k: replies[turn]["counters"][k] - before[k] for k in before}


def history_blocks(replies: list[dict], turn: int) -> int:
    """Full blocks of turn's prompt whose KV the turn before computed (and saved)."""
    computed = len(replies[turn - 1]["history"]) + MAX_TOKENS - 1
    return min(computed // BLOCK, (len(replies[turn]["history"]) - 1) // BLOCK)


@pytest.fixture(scope="module")
def baseline(reference):
    return reference_replies(reference, conversation(7, 4), max_tokens=MAX_TOKENS)


PATHS = {"staged": [], "zero-copy": ["--zero-copy"], "async-load": ["--async-load"]}


@pytest.mark.parametrize("path", list(PATHS))
def test_turns_reuse_their_history_locally_or_from_kvtier_and_answer_as_without_it(tiny_llama, kvtierd, baseline,
                                                                                    path):
    engine = ChatEngine(tiny_llama, kvtierd.socket_path, *SMALL_CACHE, *PATHS[path])

    kept = {2: 1}  # turn -> blocks of the history vLLM keeps (turn 1: all of them)

    def between(turn, prompt_tokens):
        # Turn 1: vLLM still holds the history. Turn 2: another session's request
        # evicts all of it but its first block. Turn 3: all but its first half.
        if turn > 1:
            kept.setdefault(turn, prompt_tokens // BLOCK // 2)
            evict(engine, 100 + turn, keep=kept[turn])

    try:
        replies = run_chat(engine, conversation(7, 4), "conv-42", between)
    finally:
        engine.close()
    assert [r["tokens"] for r in replies] == baseline
    assert replies[-1]["counters"]["zero_copy_caches"] == (1 if path == "zero-copy" else 0)
    assert replies[0]["counters"]["loaded_blocks"] == 0
    for turn in (1, 2, 3):
        grew, expected = grown(replies, turn), history_blocks(replies, turn)
        # Every full block of the history was reused, from vLLM's cache or kvtierd's.
        assert replies[turn]["cached_tokens"] == expected * BLOCK, (turn, replies[turn]["cached_tokens"], expected)
        assert grew["load_failed_blocks"] == 0, (turn, grew)
        assert grew["saved_blocks"] > 0, (turn, grew)
        assert grew["layer_loads"] == (0 if path == "async-load" else 4 * grew["loads"]), (turn, grew)
        if turn == 1:
            assert grew["loaded_blocks"] == 0, grew  # all of it local: nothing loaded
            assert grew["lookup_waits_for_save"] == 0, grew
        else:  # what vLLM kept is a local hit; exactly what it lost is loaded
            assert 0 < kept[turn] < expected and grew["loaded_blocks"] == expected - kept[turn], \
                (turn, expected, kept, grew)


def _wait_until_on_nvme(daemon, session: str, blocks: int, timeout_s: float = 20.0) -> None:
    """Until the session holds `blocks` blocks, all of them on NVMe. The last turn's Save
    lands after its reply and idle demotion moves it down a tenth of a second later: a
    kill -9 before that loses the blocks still in memory, as it should. (Waiting for any
    block on NVMe would pass at once from the second turn on, on the earlier turns'.)"""
    deadline = time.monotonic() + timeout_s
    while True:
        out = subprocess.run([str(BUILD_DIR / "kvtierctl"), "--socket", daemon.socket_path, "--json", "sessions"],
                             check=False, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, (out.stdout, out.stderr)
        row = {r["id"]: r for r in json.loads(out.stdout)["sessions"]}.get(session, {})
        if row.get("blocks", 0) >= blocks and row["blocks_per_tier"]["nvme"] == row["blocks"]:
            return
        assert time.monotonic() < deadline, (f"{session} not on NVMe", blocks, row)
        time.sleep(0.05)


def _wait_until_serving(daemon) -> None:
    """Returns once kvtierd answers data requests (it holds them while it fills its pools)."""
    import kvtier

    probe = kvtier.Layout(model_id="probe", num_layers=1, num_kv_heads=1, head_dim=1, dtype="fp32",
                          tokens_per_block=1, num_blocks=1, planes=[kvtier.Plane(0, 0, 4, 4)])
    with kvtier.Client(daemon.socket_path, reconnect=False) as client:
        client.hello(probe, engine_name="probe")
        client.lookup([bytes(32)])


@pytest.fixture(scope="module")
def nvme_daemon():
    # Idle sessions leave memory for NVMe within a tenth of a second.
    daemon = Kvtierd(["--nvme-bytes", "256MiB", "--hbm-idle-ms", "50ms", "--ram-idle-ms", "100ms"])
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def nvme_engine(tiny_llama, nvme_daemon):
    # The first call after a restart reconnects (with the client library's backoff), which
    # can take longer than the default Lookup timeout: these tests are about what NVMe kept.
    engine = ChatEngine(tiny_llama, nvme_daemon.socket_path, *SMALL_CACHE, "--lookup-timeout-ms", "5000")
    yield engine
    engine.close()


def test_a_killed_and_restarted_daemon_still_serves_the_next_turn_from_nvme(nvme_daemon, nvme_engine, baseline):
    pieces = conversation(7, 4)

    def crash_and_restart(turn, prompt_tokens):
        evict(nvme_engine, 200 + turn, keep=1)  # vLLM keeps the first block: NVMe has the rest
        computed = prompt_tokens - len(pieces[turn + 1]) - 1  # the last turn's KV: all but its last token
        _wait_until_on_nvme(nvme_daemon, "conv-7", computed // BLOCK)
        nvme_daemon.kill()  # SIGKILL: nothing flushed on the way out
        nvme_daemon.restart()
        _wait_until_serving(nvme_daemon)  # a Lookup made while it fills its memory times out: a miss

    replies = run_chat(nvme_engine, pieces, "conv-7", between=crash_and_restart)
    assert [r["tokens"] for r in replies] == baseline
    for turn in (1, 2, 3):
        grew, expected = grown(replies, turn), history_blocks(replies, turn)
        assert replies[turn]["cached_tokens"] == expected * BLOCK, (turn, replies[turn]["cached_tokens"], expected)
        assert grew["loaded_blocks"] == expected - 1, (turn, expected, grew)
        assert grew["load_failed_blocks"] == 0, (turn, grew)


def test_vllm_answers_every_request_with_the_daemon_stopped(nvme_daemon, nvme_engine, baseline):
    nvme_daemon.stop()
    before = nvme_engine.turn([1], max_tokens=1)["counters"]
    replies = run_chat(nvme_engine, conversation(7, 4), "conv-9", between=lambda turn, _: evict(nvme_engine, turn, 1))
    assert [r["tokens"] for r in replies] == baseline
    assert replies[-1]["counters"]["loaded_blocks"] == before["loaded_blocks"]
