"""kvtier.vllm with tensor parallelism: each TP rank saves and loads its shard under a
session of its own (``{session}@tp{rank}of{size}``, the layout of its rank), and the
scheduler speaks for every rank (a Lookup per rank, the fewest hits; a BeginTurn per
rank's session).

The session names and the scheduler's rules in-process against a real kvtierd; then
vLLM's CPU engine at ``--tensor-parallel-size 2`` (its mp executor: a worker process a
rank), one engine start for the module: a chat whose history vLLM evicts between turns
answers as vLLM without the connector, and every rank loads it back."""

from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import kvtier.vllm
from kvtier import hashing
from kvtier import torch as kvtier_torch
from kvtier.vllm.blocks import MAX_SESSION_BYTES, BlockShape, rank_session_id, request_extra_keys, session_id_of
from kvtier.vllm.config import ConnectorConfig
from kvtier.vllm.scheduler import SchedulerSide

from conftest import ChatEngine, Kvtierd
from test_vllm_kv_events import ADMIN
from test_vllm_end_to_end import BLOCK, MAX_TOKENS, baseline, conversation, history_blocks  # noqa: F401 (a fixture)

REPO = Path(__file__).resolve().parents[2]
RANKS = 2
# The tiny Llama's 2 KV heads split over 2 ranks: a rank's block is 4 layers x 1 head x
# 32 tokens x 32 x 2 x fp32. vLLM's prefix cache on over 32 blocks a rank (31 usable).
RANK_BLOCK_BYTES = 32 << 10
CACHE_BLOCKS = 32
TP_SMALL_CACHE = ("--prefix-caching", "--max-model-len", str((CACHE_BLOCKS - 1) * BLOCK),
                  "--kv-cache-bytes", str(CACHE_BLOCKS * RANK_BLOCK_BYTES))


def test_each_rank_has_a_session_of_its_own_and_one_rank_keeps_the_session_itself():
    assert rank_session_id("conv-42", 0, 1) == "conv-42"  # TP 1: as before
    assert rank_session_id("", 1, 2) == ""  # no session: none on any rank
    ids = [rank_session_id("conv-42", r, 4) for r in range(4)]
    assert ids == ["conv-42@tp0of4", "conv-42@tp1of4", "conv-42@tp2of4", "conv-42@tp3of4"]
    # At kvtierd's limit already: the rank's id is a digest, still one per rank.
    longest = session_id_of("x" * MAX_SESSION_BYTES)
    assert longest == "x" * MAX_SESSION_BYTES
    digests = {rank_session_id(longest, r, 2) for r in range(2)}
    assert len(digests) == 2 and all(d.startswith("vllm-session-sha256:") and len(d) <= MAX_SESSION_BYTES
                                     for d in digests)


# ---- the scheduler's rules, in-process ------------------------------------------------

SHAPE = BlockShape(model_id="tp-model", layer_names=("l0", "l1"), tokens_per_block=4, num_kv_heads=1, head_dim=2,
                   dtype="fp32", layer_bytes=4 * 1 * 4 * 4, planes_per_layer=1, layout_name="LBHNC",
                   cross_layer=False, tp_rank=0, tp_size=RANKS, num_blocks=64)


def _request(request_id: str, tokens: list[int], session: str | None = None):
    return SimpleNamespace(request_id=request_id, num_tokens=len(tokens), all_token_ids=tokens,
                           prompt_token_ids=tokens, num_computed_tokens=0, mm_features=None, prompt_embeds=None,
                           lora_request=None, cache_salt=None,
                           kv_transfer_params={"kvtier_session": session} if session else None)


def _save_as_rank(socket: str, rank: int, session: str, hashes: list[bytes]) -> None:
    """What rank `rank`'s worker does: its layout, its session, a Save of the blocks."""
    shape = SHAPE.for_rank(rank)
    staging = kvtier_torch.memfd_tensor((len(hashes), shape.block_bytes), torch.uint8, name="tp-test")
    with kvtier.Client(socket, reconnect=False) as client:
        client.hello(shape.staging_layout(len(hashes)), engine_name="tp-test")
        client.register_tensor(0, staging)
        client.save(shape.session(session), list(zip(hashes, range(len(hashes)))))


def _matched(side: SchedulerSide, request) -> int | None:
    deadline = time.monotonic() + 10
    while True:
        tokens, _ = side.get_num_new_matched_tokens(request, 0)
        if tokens is not None:
            return tokens
        assert time.monotonic() < deadline, "the Lookups were never answered"
        time.sleep(0.005)


def test_the_scheduler_counts_only_blocks_every_rank_holds_and_begins_every_ranks_turn(kvtierd):
    tokens = list(range(1, 4 * 10 + 2))  # 10 full blocks and a token
    request = _request("a", tokens)
    hashes = hashing.block_hashes(tokens, 4, extra_keys=request_extra_keys(SHAPE.model_id, request))
    _save_as_rank(kvtierd.socket_path, 0, "chat", hashes[:8])
    _save_as_rank(kvtierd.socket_path, 1, "chat", hashes[:5])
    config = ConnectorConfig(socket=kvtierd.socket_path, reconnect_ms=100)
    side = SchedulerSide(config, SHAPE, "host")
    try:
        before = kvtier.vllm.counters()
        first = _request("b", tokens, session="chat")
        side.on_new_request(first)
        assert _matched(side, first) == 5 * 4  # rank 1 holds 5 of rank 0's 8
        assert kvtier.vllm.counters()["begin_turns"] - before["begin_turns"] == RANKS
        _save_as_rank(kvtierd.socket_path, 1, "chat", hashes[:10])
        second = _request("c", tokens, session="chat")
        side.on_new_request(second)
        assert _matched(side, second) == 8 * 4  # now rank 0 holds the fewest
        listing = _sessions(kvtierd)
        assert "chat" not in listing and {"chat@tp0of2", "chat@tp1of2"} <= set(listing), listing
        # Each rank's session has the layout of its rank, and its turn was begun.
        rows = [listing[f"chat@tp{r}of2"] for r in range(RANKS)]
        assert rows[0]["layout_digest"] != rows[1]["layout_digest"], rows
        assert all(row["state"] == "active" for row in rows), rows
        # Blocks one rank holds and the other does not: a miss.
        alone = _request("d", [7] * 41)
        _save_as_rank(kvtierd.socket_path, 0, "alone", hashing.block_hashes(
            alone.all_token_ids, 4, extra_keys=request_extra_keys(SHAPE.model_id, alone)))
        side.on_new_request(alone)
        assert _matched(side, alone) == 0
    finally:
        side.shutdown()


def _sessions(daemon) -> dict[str, dict]:
    out = subprocess.run([str(REPO / "build" / "kvtierctl"), "--socket", daemon.socket_path, "sessions", "--json"],
                         capture_output=True, text=True, check=True).stdout
    return {row["id"]: row for row in json.loads(out)["sessions"]}


# ---- vLLM at --tensor-parallel-size 2 ---------------------------------------------------

@pytest.fixture(scope="module")
def tp_daemon():
    daemon = Kvtierd(["--nvme-bytes", "256MiB", *ADMIN])
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def tp_events_port() -> int:
    from test_vllm_pressure import free_port

    return free_port()


@pytest.fixture(scope="module")
def tp_engine(tiny_llama, tp_daemon, tp_events_port):
    # One thread a rank, each on its own core (vLLM's CPU backend binds them). KV events
    # on, as a routed deployment runs it.
    env = {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{tp_events_port}",
              "topic": "kv"}
    engine = ChatEngine(tiny_llama, tp_daemon.socket_path, *TP_SMALL_CACHE, "--tensor-parallel-size", str(RANKS),
                        "--kv-events-config", json.dumps(events), env=env)
    yield engine
    engine.close()


def _evict(engine: ChatEngine, seed: int) -> None:
    """Another request taking every block of vLLM's cache but one."""
    rng = random.Random(seed)
    engine.turn([rng.randrange(1, 500) for _ in range((CACHE_BLOCKS - 2) * BLOCK)], max_tokens=1)


def test_every_rank_saves_and_loads_its_shard_and_vllm_answers_as_without_the_connector(
        tp_daemon, tp_engine, baseline):  # noqa: F811 - the fixture imported above
    pieces = conversation(7, 4)
    history, replies = list(pieces[0]), []
    loaded = []  # bytes kvtierd loaded during each turn
    with kvtier.Client(tp_daemon.socket_path, reconnect=False) as probe:
        probe.hello(kvtier.Layout(model_id="probe", num_layers=1, num_kv_heads=1, head_dim=1, dtype="fp32",
                                  tokens_per_block=1, num_blocks=1, planes=[kvtier.Plane(0, 0, 4, 4)]))
        for turn, user in enumerate(pieces[1:]):
            if turn > 0:
                _evict(tp_engine, 400 + turn)  # vLLM keeps the chat's first block: kvtierd has the rest
            history += user
            before = probe.stats().bytes_loaded
            reply = tp_engine.turn(history, max_tokens=MAX_TOKENS, session="tp-chat", priority=70)
            loaded.append(probe.stats().bytes_loaded - before)
            reply["history"] = list(history)
            replies.append(reply)
            history += reply["tokens"]
    # Greedy fp32: the same answers as one rank without the connector.
    assert [r["tokens"] for r in replies] == baseline
    assert loaded[0] == 0
    for turn in (1, 2, 3):
        expected = history_blocks(replies, turn)
        # vLLM counted every block of the history as computed: its first from its own
        # cache, the rest from kvtierd ...
        assert replies[turn]["cached_tokens"] == expected * BLOCK, (turn, replies[turn]["cached_tokens"], expected)
        # ... and both ranks loaded those blocks' shards (each rank's half of every block).
        assert loaded[turn] == RANKS * (expected - 1) * RANK_BLOCK_BYTES, (turn, loaded, expected)
        grew = {k: replies[turn]["counters"][k] - replies[turn - 1]["counters"][k] for k in replies[0]["counters"]}
        assert grew["begin_turns"] == RANKS and grew["lookup_errors"] == 0 and grew["internal_errors"] == 0, grew
    # One session a rank, each holding every block the last turn computed (no Save of
    # any rank was refused), with the request's priority.
    listing = _sessions(tp_daemon)
    assert "tp-chat" not in listing, listing
    computed = (len(replies[-1]["history"]) + MAX_TOKENS - 1) // BLOCK
    for rank in range(RANKS):
        row = listing[f"tp-chat@tp{rank}of{RANKS}"]
        assert row["blocks"] == computed and row.get("priority") == 70, (rank, row)


def test_at_tp_2_the_stream_follows_every_ranks_shards(tp_daemon, tp_engine, tp_events_port):
    """KV events at TP 2: a chat's blocks are announced once both ranks' Saves are
    answered; kvtierd drains both ranks' shards to NVMe and the blocks move to STORAGE;
    one rank's shards evicted (its session alone) withdraws them, though the other
    rank still holds its own: vLLM can load a block only whole."""
    from test_vllm_kv_events import Subscriber, replay, stored, tokens

    subscriber = Subscriber(f"tcp://127.0.0.1:{tp_events_port}", "kv")
    seed = 900

    def step_until(what, timeout_s: float = 60.0):
        """Short requests (the offline engine steps, and publishes, only while it serves
        one) until what(events) is not None."""
        nonlocal seed
        deadline = time.monotonic() + timeout_s
        while True:
            with subscriber._lock:
                value = what(list(subscriber.events))
            if value is not None:
                return value
            assert time.monotonic() < deadline, f"not seen; last events: {subscriber.events[-6:]}"
            seed += 1
            tp_engine.turn(tokens(seed, BLOCK + 8), max_tokens=2)  # a full block: vLLM announces it

    try:
        step_until(lambda events: True if events else None)  # the subscriber has joined
        prompt = tokens(91, 4 * BLOCK + 5)
        tp_engine.turn(prompt, max_tokens=4, session="tp-events")

        def believed(events: list) -> dict:
            ours = {h for e in stored(events) if e.token_ids[:BLOCK] == prompt[:BLOCK] for h in e.block_hashes}
            return {h: medium for h, medium in replay(events, joined_late=True).items() if h in ours}

        announced = step_until(lambda events: believed(events) if len(believed(events)) >= 4 else None)
        assert set(announced.values()) == {"CPU"}
        kvtierctl = [str(REPO / "build" / "kvtierctl"), "--socket", tp_daemon.socket_path]
        subprocess.run([*kvtierctl, "drain"], check=True, capture_output=True)
        moved = step_until(lambda events: believed(events) if set(believed(events).values()) == {"STORAGE"}
                           and believed(events).keys() == announced.keys() else None)
        assert len(moved) == len(announced)
        subprocess.run([*kvtierctl, "evict", f"tp-events@tp0of{RANKS}"], check=True, capture_output=True)
        step_until(lambda events: True if not believed(events) else None)
        # Rank 1 still holds its shards: the block is gone for vLLM, not for kvtierd.
        listing = _sessions(tp_daemon)
        assert listing[f"tp-events@tp1of{RANKS}"]["blocks"] >= len(announced), listing
    finally:
        subscriber.close()
