"""vLLM's own engine (LLM on the CPU platform) with kvtier.vllm, end to end.

A tiny Llama with seeded random weights, greedy decoding, vLLM's prefix cache off so
every turn's history must come from kvtierd or be recomputed."""

from __future__ import annotations

import random
import time

import pytest

from conftest import ChatEngine, Kvtierd


def conversation(seed: int, turns: int, system_tokens: int = 96, user_tokens: int = 40) -> list[list[int]]:
    rng = random.Random(seed)
    system = [rng.randrange(1, 500) for _ in range(system_tokens)]
    return [system] + [[rng.randrange(1, 500) for _ in range(user_tokens)] for _ in range(turns)]


def run_chat(engine: ChatEngine, pieces: list[list[int]], session: str | None, between=None) -> list[dict]:
    history = list(pieces[0])
    replies = []
    for turn, user in enumerate(pieces[1:]):
        if between is not None and turn > 0:
            between(turn)
        history += user
        reply = engine.turn(history, max_tokens=8, session=session)
        replies.append(reply)
        history += reply["tokens"]
    return replies


@pytest.fixture(scope="module")
def baseline(tiny_llama):
    engine = ChatEngine(tiny_llama)
    try:
        return [r["tokens"] for r in run_chat(engine, conversation(7, 3), None)]
    finally:
        engine.close()


PATHS = {"staged": [], "zero-copy": ["--zero-copy"], "async-load": ["--async-load"]}


@pytest.mark.parametrize("path", list(PATHS))
def test_turns_load_their_history_and_answer_as_without_kvtier(tiny_llama, kvtierd, baseline, path):
    engine = ChatEngine(tiny_llama, kvtierd.socket_path, *PATHS[path])
    try:
        replies = run_chat(engine, conversation(7, 3), "conv-42")
    finally:
        engine.close()
    assert [r["tokens"] for r in replies] == baseline
    assert replies[-1]["counters"]["zero_copy_caches"] == (1 if path == "zero-copy" else 0)
    before = replies[0]["counters"]
    assert before["loaded_blocks"] == 0
    for i in (1, 2):
        grew = {k: replies[i]["counters"][k] - replies[i - 1]["counters"][k] for k in before}
        # The whole history up to the last full block before the new message came back.
        assert grew["loaded_blocks"] >= 4, f"turn {i}: {grew}"
        assert grew["load_failed_blocks"] == 0, (i, grew)
        assert grew["saved_blocks"] > 0, (i, grew)
        # One Load per layer, but for an asynchronous Load (one per request).
        assert grew["layer_loads"] == (0 if path == "async-load" else 4 * grew["loads"]), (i, grew)


def _wait_until_on_nvme(daemon, timeout_s: float = 20.0) -> None:
    import kvtier

    deadline = time.monotonic() + timeout_s
    with kvtier.Client(daemon.socket_path, reconnect=False) as client:
        while client.stats().tiers["nvme"].blocks == 0:
            assert time.monotonic() < deadline, "no block reached NVMe"
            time.sleep(0.05)


def _wait_until_serving(daemon) -> None:
    """Returns once kvtierd answers data requests (it holds them while it fills its pools)."""
    import kvtier

    probe = kvtier.Layout(model_id="probe", num_layers=1, num_kv_heads=1, head_dim=1, dtype="fp32",
                          tokens_per_block=1, num_blocks=1, planes=[kvtier.Plane(0, 0, 4, 4)])
    with kvtier.Client(daemon.socket_path, reconnect=False) as client:
        client.hello(probe, engine_name="probe")
        client.lookup([bytes(32)])


def test_a_killed_and_restarted_daemon_still_serves_the_next_turn_from_nvme(tiny_llama, baseline):
    # Idle sessions leave memory for NVMe within a tenth of a second.
    daemon = Kvtierd(["--nvme-bytes", "256MiB", "--hbm-idle-ms", "50ms", "--ram-idle-ms", "100ms"])
    # The first call after a restart reconnects (with the client library's backoff), which
    # can take longer than the default Lookup timeout: this test is about what NVMe kept.
    engine = ChatEngine(tiny_llama, daemon.socket_path, "--lookup-timeout-ms", "5000")

    def crash_and_restart(turn):
        _wait_until_on_nvme(daemon)
        daemon.kill()  # SIGKILL: nothing flushed on the way out
        daemon.restart()
        _wait_until_serving(daemon)  # a Lookup made while it fills its memory times out: a miss

    try:
        replies = run_chat(engine, conversation(7, 3), "conv-7", between=crash_and_restart)
    finally:
        engine.close()
        daemon.stop()
    assert [r["tokens"] for r in replies] == baseline
    for i in (1, 2):
        grew = {k: replies[i]["counters"][k] - replies[i - 1]["counters"][k] for k in replies[i]["counters"]}
        assert grew["loaded_blocks"] >= 4, f"turn {i}: {grew}"
        assert grew["load_failed_blocks"] == 0, (i, grew)


def test_vllm_answers_every_request_with_the_daemon_stopped(tiny_llama, kvtierd, baseline):
    engine = ChatEngine(tiny_llama, kvtierd.socket_path)
    try:
        kvtierd.stop()
        replies = run_chat(engine, conversation(7, 3), "conv-9")
    finally:
        engine.close()
    assert [r["tokens"] for r in replies] == baseline
    assert replies[-1]["counters"]["loaded_blocks"] == 0
