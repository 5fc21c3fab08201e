"""kvtier's blocks on vLLM's KV-event stream (kvtier.vllm.events), under vLLM's own
Scheduler (tests/vllm/mini_engine.py) with prefix caching and KV events on, against a
real kvtierd: what a router reading the stream learns of the blocks kvtierd holds."""

from __future__ import annotations

import grp
import json
import os
import random
import subprocess
import threading
import time

import kvtier
import pytest
from vllm.distributed.kv_events import BlockRemoved, BlockStored

from conftest import Kvtierd
from kvtierd_process import BUILD_DIR
from mini_engine import BLOCK, MiniEngine


def tokens(seed: int, count: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 500) for _ in range(count)]


KVTIER_MEDIA = {"CPU", "STORAGE"}  # kvtier's; vLLM's own blocks are GPU


def stored(events: list) -> list[BlockStored]:
    """kvtier's announcements (vLLM's own are medium GPU)."""
    return [e for e in events if isinstance(e, BlockStored) and e.medium in KVTIER_MEDIA]


def hashes_of(events: list) -> list:
    return [h for e in events for h in e.block_hashes]


def session_blocks(daemon: Kvtierd, session: str) -> int:
    out = subprocess.run([str(BUILD_DIR / "kvtierctl"), "--socket", daemon.socket_path, "--json", "sessions"],
                         check=True, capture_output=True, text=True).stdout
    return {row["id"]: row["blocks"] for row in json.loads(out)["sessions"]}.get(session, 0)


def announced_count(engine: MiniEngine) -> int:
    events = engine.connector._scheduler_side._events
    assert events is not None
    return events.announced()


def test_saved_blocks_are_announced_with_vllms_own_hashes_once_kvtierd_has_them(tiny_llama, kvtierd):
    engine = MiniEngine(tiny_llama, kvtierd.socket_path, prefix_caching=True, kv_events=True)
    try:
        prompt = tokens(1, 5 * BLOCK + 3)
        output = engine.run(engine.add(prompt, session="ev-1"))
        gpu = [e for e in engine.events if isinstance(e, BlockStored) and e.medium == "GPU"]
        ours = stored(engine.events)
        saved = len(engine.saves[-1].hashes)
        assert saved == (len(prompt) + len(output) - 1) // BLOCK
        # Every block kvtierd holds for the session, announced once, in chain order.
        assert session_blocks(kvtierd, "ev-1") == saved
        assert len(hashes_of(ours)) == saved
        # vLLM's own hashes for the same blocks: a router joins the two.
        assert hashes_of(ours) == hashes_of(gpu)[:saved]
        assert ours[0].parent_block_hash is None
        assert {(e.medium, e.locality, e.block_size, e.lora_name) for e in ours} == {("CPU", "LOCAL", BLOCK, None)}
        assert [t for e in ours for t in e.token_ids] == (prompt + output)[:saved * BLOCK]
    finally:
        engine.close()


def test_each_block_is_announced_once_across_turns_and_sessions(tiny_llama, kvtierd):
    engine = MiniEngine(tiny_llama, kvtierd.socket_path, prefix_caching=True, kv_events=True)
    try:
        system = tokens(2, 4 * BLOCK)
        history = system + tokens(3, BLOCK + 5)
        for turn in range(3):
            history = history + engine.run(engine.add(history, session="ev-2")) + tokens(10 + turn, BLOCK)
        engine.run(engine.add(system + tokens(4, 2 * BLOCK), session="ev-3"))  # shares the system prompt
        announced = hashes_of(stored(engine.events))
        assert len(announced) == len(set(announced))
        # Each later announcement continues the chain: its parent is an announced block.
        for event in stored(engine.events)[1:]:
            assert event.parent_block_hash in announced, event
        assert announced_count(engine) == len(announced)
        assert not [e for e in engine.events if isinstance(e, BlockRemoved) and e.medium in KVTIER_MEDIA]
        # What stays in memory is each block once, compactly: no Save keeps its request's
        # token list or the blocks of the turns before it (they would add up turn by turn).
        events = engine.connector._scheduler_side._events
        assert events is not None
        segments = {id(s): s for s in events._announced.values()}.values()
        assert sum(len(s.keys) for s in segments) == len(announced)
        assert sum(len(s.tokens) for s in segments) == len(announced) * BLOCK
        assert all(s.source_tokens == () and s.source_keys == () for s in segments)
    finally:
        engine.close()


def test_a_partial_save_announces_only_the_prefix_kvtierd_kept(tiny_llama):
    # 6 KiB blocks, 128 KiB of memory in all and no NVMe: a 30-block Save keeps a prefix.
    daemon = Kvtierd(["--hbm-bytes", "64KiB", "--ram-bytes", "64KiB", "--nvme-bytes", "0", "--slab-bytes", "64KiB",
                      "--save-room-wait-ms", "100ms"])
    engine = MiniEngine(tiny_llama, daemon.socket_path, prefix_caching=True, kv_events=True)
    try:
        before = kvtier.vllm.counters()
        engine.run(engine.add(tokens(5, 30 * BLOCK + 1), session="ev-partial"))
        after = kvtier.vllm.counters()
        assert after["save_partial"] == before["save_partial"] + 1
        kept = after["saved_blocks"] - before["saved_blocks"]  # what the Save's answer kept
        assert 0 < kept < 30
        assert len(hashes_of(stored(engine.events))) == kept
    finally:
        engine.close()
        daemon.stop()


def test_past_its_bound_the_oldest_announced_block_is_withdrawn(tiny_llama, kvtierd):
    engine = MiniEngine(tiny_llama, kvtierd.socket_path, prefix_caching=True, kv_events=True, kv_events_max_blocks=4)
    try:
        engine.run(engine.add(tokens(6, 3 * BLOCK + 1), session="ev-a"))
        engine.run(engine.add(tokens(7, 3 * BLOCK + 1), session="ev-b"))
        first, second = (hashes_of(stored([e])) for e in stored(engine.events))
        removed = [e for e in engine.events if isinstance(e, BlockRemoved) and e.medium in KVTIER_MEDIA]
        assert hashes_of(removed) == first[:2]  # 6 announced, 4 kept: the two oldest go
        assert {(e.medium, e.locality) for e in removed} == {("CPU", "LOCAL")}
        assert announced_count(engine) == 4
        assert len(second) == 3
    finally:
        engine.close()


def test_with_kv_events_off_the_connector_keeps_nothing(tiny_llama, kvtierd):
    engine = MiniEngine(tiny_llama, kvtierd.socket_path, prefix_caching=True)
    try:
        engine.run(engine.add(tokens(8, 3 * BLOCK + 1), session="ev-off"))
        assert engine.connector._scheduler_side._events is None
        assert list(engine.connector.take_events()) == []
    finally:
        engine.close()


def replay(events: list, joined_late: bool = False) -> dict:
    """What a router believes kvtier holds after the stream: vLLM hash -> medium. A
    subscriber that joined late may hear removals of what it never heard announced."""
    held: dict = {}
    for event in events:
        if isinstance(event, BlockStored) and event.medium in KVTIER_MEDIA:
            for block_hash in event.block_hashes:
                held[block_hash] = event.medium
        elif isinstance(event, BlockRemoved) and event.medium in KVTIER_MEDIA:
            for block_hash in event.block_hashes:
                if joined_late and block_hash not in held:
                    continue
                assert held.get(block_hash) == event.medium, ("removed what was not announced", event)
                del held[block_hash]
    return held


def on_nvme(daemon: Kvtierd, session: str) -> bool:
    out = subprocess.run([str(BUILD_DIR / "kvtierctl"), "--socket", daemon.socket_path, "--json", "sessions"],
                         check=True, capture_output=True, text=True).stdout
    row = {r["id"]: r for r in json.loads(out)["sessions"]}.get(session)
    return row is not None and row["blocks"] > 0 and row["blocks_per_tier"]["nvme"] == row["blocks"]


def test_after_a_kill_and_restart_the_stream_claims_exactly_what_kvtierd_kept(tiny_llama):
    # Idle sessions reach NVMe within a tenth of a second; a request without a session
    # gets no NVMe copy and stays in memory: a kill -9 loses it.
    daemon = Kvtierd(["--nvme-bytes", "64MiB", "--hbm-idle-ms", "50ms", "--ram-idle-ms", "100ms"])
    engine = MiniEngine(tiny_llama, daemon.socket_path, prefix_caching=True, kv_events=True)
    try:
        kept_prompt, lost_prompt = tokens(30, 4 * BLOCK + 2), tokens(31, 3 * BLOCK + 2)
        engine.run(engine.add(kept_prompt, session="ev-kept"))
        engine.run(engine.add(lost_prompt))
        kept = hashes_of(stored(engine.events))[:4]
        lost = hashes_of(stored(engine.events))[4:]
        assert len(lost) == 3 and set(replay(engine.events).values()) == {"CPU"}
        deadline = time.monotonic() + 20
        while not on_nvme(daemon, "ev-kept"):
            assert time.monotonic() < deadline, "the session never reached NVMe"
            time.sleep(0.05)
        daemon.kill()  # SIGKILL: what was only in memory is gone
        daemon.restart()
        events = engine.connector._scheduler_side._events
        assert events is not None
        deadline = time.monotonic() + 30
        while replay(engine.events) != {h: "STORAGE" for h in kept}:
            assert time.monotonic() < deadline, (replay(engine.events), kept, lost)
            engine.step()  # vLLM's steps carry the connector's events
            time.sleep(0.02)
        assert not events.resynchronising()
        assert engine.connector._scheduler_side._watching, "tier notices were given up after the restart"
        assert events.announced() == len(kept)
        # What the stream claims is what kvtierd holds: the session's blocks on NVMe, the
        # request's without a session nowhere.
        clients = engine.connector._scheduler_side._link.get()
        assert clients is not None
        held = clients[0].lookup(engine.saves[0].hashes)
        assert (held.hit_count, held.tiers) == (4, ["nvme"] * 4)
        assert clients[0].lookup(engine.saves[1].hashes).hit_count == 0
    finally:
        engine.close()
        daemon.stop()


# kvtierctl's drain and evict are admin requests: the test process's group is the admin group.
ADMIN = ["--admin-group", grp.getgrgid(os.getegid()).gr_name]


def kvtierctl(daemon: Kvtierd, *args: str) -> None:
    subprocess.run([str(BUILD_DIR / "kvtierctl"), "--socket", daemon.socket_path, *args], check=True,
                   capture_output=True, text=True)


def test_kvtierds_own_moves_reach_the_stream_demoted_then_evicted(tiny_llama):
    """Tier notices: kvtierd drains the session to NVMe, then evicts it; the stream follows
    each move (BlockRemoved CPU + BlockStored STORAGE, then BlockRemoved STORAGE) without
    a resynchronisation."""
    daemon = Kvtierd(["--nvme-bytes", "64MiB", *ADMIN])
    engine = MiniEngine(tiny_llama, daemon.socket_path, prefix_caching=True, kv_events=True)
    try:
        engine.run(engine.add(tokens(40, 4 * BLOCK + 2), session="ev-moved"))
        engine.run(engine.add(tokens(41, 3 * BLOCK + 2), session="ev-stays"))
        session = hashes_of(stored(engine.events))[:4]
        other = hashes_of(stored(engine.events))[4:]
        assert len(other) == 3 and replay(engine.events) == {h: "CPU" for h in session + other}
        kvtierctl(daemon, "drain")
        deadline = time.monotonic() + 20
        while replay(engine.events) != {h: "STORAGE" for h in session + other}:
            assert time.monotonic() < deadline, replay(engine.events)
            engine.step()
            time.sleep(0.02)
        kvtierctl(daemon, "evict", "ev-moved")
        while replay(engine.events) != {h: "STORAGE" for h in other}:
            assert time.monotonic() < deadline, replay(engine.events)
            engine.step()
            time.sleep(0.02)
        events = engine.connector._scheduler_side._events
        assert events is not None and not events.resynchronising()
        assert events.announced() == len(other)
        clients = engine.connector._scheduler_side._link.get()
        assert clients is not None
        assert clients[0].lookup(engine.saves[0].hashes).hit_count == 0
        held = clients[0].lookup(engine.saves[1].hashes)
        assert (held.hit_count, held.tiers) == (3, ["nvme"] * 3)
    finally:
        engine.close()
        daemon.stop()


def test_with_two_ranks_a_block_is_where_its_slowest_shard_is():
    """Tier notices of two TP ranks combine: a block is announced where its slowest
    rank's shard is, and withdrawn once any rank's shard is gone; a Save one of whose
    blocks was told of before it was announced is looked up again and corrected."""
    import types

    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

    from kvtier.vllm.events import BlockEvents

    keys = [bytes([i]) * 32 for i in range(4)]
    request = types.SimpleNamespace(block_hashes=[bytes([100 + i]) * 32 for i in range(4)],
                                    all_token_ids=tokens(50, 4 * BLOCK + 1), lora_request=None,
                                    cache_salt=None, prompt_embeds=None, mm_features=[])
    hashes = [maybe_convert_block_hash(h) for h in request.block_hashes]  # as events carry them
    events = BlockEvents(BLOCK, ranks=2, max_blocks=100)
    events.capture("r", request, keys)
    events.tiers_changed(0, [(keys[3], "nvme")])  # before the announcement: looked up after it
    events.save_over("r", 2, 4)
    taken = events.take()
    assert replay(taken) == {h: "CPU" for h in hashes}
    assert events.verifying()
    asked: list = []

    class Answered:
        def done(self) -> bool:
            return True

        def result(self) -> kvtier.LookupResult:
            return kvtier.LookupResult(hit_count=4, tiers=["ram", "ram", "ram", "nvme"])

    def send(hashes: list[bytes]) -> Answered:
        asked.append(hashes)
        return Answered()

    events.step_verify(send)  # the Lookup goes out
    events.step_verify(send)  # and is answered
    assert asked == [keys] and not events.verifying()
    taken += events.take()
    assert replay(taken) == {h: "CPU" for h in hashes[:3]} | {hashes[3]: "STORAGE"}
    events.tiers_changed(0, [(keys[0], "nvme"), (keys[1], "nvme")])  # rank 1's shards still in RAM
    events.tiers_changed(1, [(keys[1], "nvme"), (keys[2], "none")])
    taken += events.take()
    assert replay(taken) == {hashes[0]: "STORAGE", hashes[1]: "STORAGE",
                             hashes[3]: "STORAGE"}
    events.tiers_changed(0, [(keys[0], "ram")])  # rank 0 back in RAM, rank 1 never left: CPU again
    taken += events.take()
    assert replay(taken)[hashes[0]] == "CPU"
    events.tiers_changed(1, [(keys[1], "remote")])  # only the remote tier: no node is warmer
    taken += events.take()
    assert hashes[1] not in replay(taken)
    assert events.announced() == 2


# ---- through vLLM's OpenAI server, as a router subscribes to it ----------------------
# ---- through vLLM's OpenAI server, as a router subscribes to it ----------------------


class Subscriber:
    """A router's end of vLLM's KV-event stream: a ZMQ SUB socket decoding each batch
    with vLLM's own KVEventBatch decoder, on a thread of its own."""

    def __init__(self, endpoint: str, topic: str) -> None:
        import msgspec
        import zmq
        from vllm.distributed.kv_events import KVEventBatch

        self._decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._socket.setsockopt(zmq.RCVTIMEO, 100)
        self._socket.connect(endpoint)
        self.endpoint = endpoint
        self.events: list = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import zmq

        while not self._stop.is_set():
            try:
                _topic, _seq, payload = self._socket.recv_multipart()
            except zmq.Again:
                continue
            batch = self._decoder.decode(payload)
            with self._lock:
                self.events.extend(batch.events)

    def wait_for(self, what, timeout_s: float = 20.0):
        """Until what(events) is truthy; its value."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                value = what(list(self.events))
            if value:
                return value
            assert time.monotonic() < deadline, f"not seen in {timeout_s} s; events: {self.events[-10:]}"
            time.sleep(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._socket.close(linger=0)
        self._context.term()


@pytest.fixture(scope="module")
def kv_events_server(tiny_llama, tmp_path_factory):
    """(kvtierd, vLLM's OpenAI server with the connector and KV events on, a subscriber)."""
    from test_vllm_pressure import Server, free_port

    # Each copy answered 300 ms late: vLLM has its blocks back (they are staged) and is
    # idle long before kvtierd answers the Save.
    daemon = Kvtierd(["--fault-copy-delay-ms", "300ms", "--nvme-bytes", "64MiB", *ADMIN])
    logs = tmp_path_factory.mktemp("kv-events-logs")
    port = free_port()
    connector = {"kv_connector": "KvtierConnector", "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
                 "kv_load_failure_policy": "recompute",
                 "kv_connector_extra_config": {"socket": daemon.socket_path, "reconnect_ms": 200}}
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": "kv"}
    server = Server("vllm-kv-events", tiny_llama, logs, "--kv-cache-memory-bytes", str(16 * SERVER_BLOCK_BYTES),
                    "--kv-transfer-config", json.dumps(connector), "--kv-events-config", json.dumps(events))
    subscriber = None
    try:
        server.wait_ready()
        subscriber = Subscriber(f"tcp://127.0.0.1:{port}", "kv")
        # A SUB socket hears only what is published after it joined: requests until one's
        # events arrive (the tests then see every event of their own requests).
        deadline, seed = time.monotonic() + 60, 1000
        while not subscriber.events:  # fresh tokens each time: vLLM announces new blocks only
            seed += 1
            assert server.complete(tokens(seed, SERVER_BLOCK + 1), max_tokens=1)["status"] == 200
            assert time.monotonic() < deadline, "the subscriber never heard vLLM's KV events"
            time.sleep(0.2)
        yield daemon, server, subscriber
    finally:
        if subscriber is not None:
            subscriber.close()
        server.close()
        daemon.stop()


SERVER_BLOCK = 32  # test_vllm_pressure.Server's block size
SERVER_BLOCK_BYTES = 64 << 10  # one block of the tiny Llama (test_vllm_end_to_end.BLOCK_BYTES)


def test_through_the_openai_server_a_router_sees_kvtiers_blocks_under_vllms_hashes(kv_events_server):
    daemon, server, subscriber = kv_events_server
    prompt = tokens(20, 5 * SERVER_BLOCK + 7)
    reply = server.complete(prompt, max_tokens=8, kv_transfer_params={"kvtier_session": "routed-1"})
    assert reply["status"] == 200, reply
    saved = (len(prompt) + len(reply["tokens"]) - 1) // SERVER_BLOCK
    history = prompt + reply["tokens"]

    def this_session(events: list) -> list[BlockStored]:
        """kvtier's announcements that start with this chat's first block (other requests'
        Saves are announced too)."""
        return [e for e in stored(events) if e.token_ids[:SERVER_BLOCK] == history[:SERVER_BLOCK]]

    # The engine is idle once it answered: the announcement still comes (it steps until
    # the Save is answered), with every block kvtierd holds, under vLLM's own hashes.
    ours = subscriber.wait_for(lambda events: this_session(events)
                               if len(hashes_of(this_session(events))) >= saved else None)
    assert session_blocks(daemon, "routed-1") == saved == len(hashes_of(ours))
    gpu = {h: e for e in subscriber.events if isinstance(e, BlockStored) and e.medium == "GPU"
           for h in e.block_hashes}
    for index, block_hash in enumerate(hashes_of(ours)):
        assert block_hash in gpu, f"block {index}: no GPU event of vLLM carries its hash"
    assert [t for e in ours for t in e.token_ids] == history[:saved * SERVER_BLOCK]
    assert {(e.medium, e.locality, e.ownership, e.kv_cache_spec_kind) for e in ours} == \
        {("CPU", "LOCAL", None, "full_attention")}


def test_through_the_openai_server_kvtiers_moves_reach_the_router(kv_events_server):
    """kvtierd drains a session to NVMe, then evicts it: while vLLM serves another
    request (it publishes only when it steps), the router hears the session's blocks
    move to STORAGE, then leave."""
    daemon, server, subscriber = kv_events_server
    prompt = tokens(60, 3 * SERVER_BLOCK + 5)
    reply = server.complete(prompt, max_tokens=4, kv_transfer_params={"kvtier_session": "routed-moves"})
    assert reply["status"] == 200, reply
    first_block = prompt[:SERVER_BLOCK]

    def believed(events: list) -> dict:
        """What the router believes of this chat's blocks: their hash -> medium."""
        ours = {h for e in stored(events) if e.token_ids[:SERVER_BLOCK] == first_block
                for h in e.block_hashes}
        return {h: medium for h, medium in replay(events).items() if h in ours}

    announced = subscriber.wait_for(lambda events: believed(events) if len(believed(events)) >= 3 else None)
    assert set(announced.values()) == {"CPU"}
    kvtierctl(daemon, "drain")
    seed = 2000

    def busy_until(what) -> dict:
        nonlocal seed
        deadline = time.monotonic() + 30
        while True:
            seed += 1  # vLLM steps, and publishes, while it serves this
            assert server.complete(tokens(seed, SERVER_BLOCK // 2), max_tokens=4)["status"] == 200
            with subscriber._lock:
                value = what(list(subscriber.events))
            if value is not None:
                return value
            assert time.monotonic() < deadline, f"not seen; events: {subscriber.events[-10:]}"

    moved = busy_until(lambda events: believed(events) if set(believed(events).values()) == {"STORAGE"} else None)
    assert moved.keys() == announced.keys()
    kvtierctl(daemon, "evict", "routed-moves")
    busy_until(lambda events: True if not believed(events) else None)


def _http_json(method: str, url: str, body: dict | None = None) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            text = reply.read().decode()
            return reply.status, json.loads(text) if text.strip().startswith("{") else {}
    except (urllib.error.URLError, ConnectionError, OSError):
        return 0, {}


def test_dynamos_kv_indexer_ranks_the_node_where_kvtier_holds_the_session_above_a_cold_one(kv_events_server):
    """NVIDIA Dynamo's standalone KV indexer (ai-dynamo-runtime, from PyPI, no GPU) reads
    the OpenAI server's stream as worker 1 and a silent endpoint as worker 2 (a cold
    node). Once vLLM evicted a chat's blocks from its GPU cache, only kvtier's claims
    are left, and the indexer still matches the whole prefix on worker 1, none on 2."""
    import sys

    from test_vllm_pressure import free_port

    daemon, server, subscriber = kv_events_server
    http_port, cold_port = free_port(), free_port()
    warm = subscriber.endpoint
    indexer = subprocess.Popen([sys.executable, "-m", "dynamo.indexer", "--port", str(http_port), "--block-size",
                                str(SERVER_BLOCK), "--threads", "1", "--workers",
                                f"1={warm},2=tcp://127.0.0.1:{cold_port}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{http_port}"
    try:
        deadline = time.monotonic() + 60
        while _http_json("GET", base + "/health")[0] != 200:
            assert indexer.poll() is None, "the indexer exited"
            assert time.monotonic() < deadline, "the indexer never answered /health"
            time.sleep(0.2)

        def ranked(token_ids: list[int]) -> dict:
            status, body = _http_json("POST", base + "/query", {"token_ids": token_ids, "model_name": "default"})
            return body.get("instances", {}) if status == 200 else {}

        # Its subscriber hears only what is published after it joined: requests until the
        # indexer knows one of them (vLLM's own GPU events suffice for that).
        probe_seed = 7000
        while True:
            probe_seed += 1
            probe = tokens(probe_seed, SERVER_BLOCK + 3)
            assert server.complete(probe, max_tokens=1)["status"] == 200
            time.sleep(0.5)
            if "1" in ranked(probe[:SERVER_BLOCK]):
                break
            assert time.monotonic() < deadline, "the indexer never heard the server's stream"
        prompt = tokens(70, 4 * SERVER_BLOCK + 5)
        reply = server.complete(prompt, max_tokens=4, kv_transfer_params={"kvtier_session": "routed-dynamo"})
        assert reply["status"] == 200, reply
        chat = (prompt + reply["tokens"])[:4 * SERVER_BLOCK]

        seed = 3000
        deadline = time.monotonic() + 90
        while True:  # vLLM evicts the chat from its GPU cache (16 blocks) for other requests
            instances = ranked(chat)
            warm_node = instances.get("1", {})
            if warm_node.get("longest_matched", 0) >= len(chat) and warm_node.get("gpu", len(chat)) == 0:
                break
            assert time.monotonic() < deadline, instances
            seed += 1
            assert server.complete(tokens(seed, 5 * SERVER_BLOCK), max_tokens=1)["status"] == 200
        assert instances.get("2", {}).get("longest_matched", 0) == 0, instances
        assert warm_node.get("cpu", 0) + warm_node.get("disk", 0) >= len(chat), warm_node
    finally:
        indexer.kill()
        indexer.wait()


def test_through_the_openai_server_after_a_kill_the_router_believes_what_kvtierd_kept(kv_events_server):
    """kvtierd is killed (-9) and restarted under the server: what reached NVMe survives
    (the first chat, drained there by an earlier test), what was only in memory does not
    (a request without a session: no NVMe copy is made for it). Once vLLM steps again,
    the router's view is exactly that: the chat on STORAGE, block for block, the
    request's blocks withdrawn."""
    daemon, server, subscriber = kv_events_server

    def view(events: list, first_block: list[int]) -> dict:
        ours = {h for e in stored(events) if e.token_ids[:SERVER_BLOCK] == first_block for h in e.block_hashes}
        return {h: medium for h, medium in replay(events, joined_late=True).items() if h in ours}

    def current(first_block: list[int]) -> dict:
        with subscriber._lock:
            return view(list(subscriber.events), first_block)

    kept_first = tokens(20, 5 * SERVER_BLOCK + 7)[:SERVER_BLOCK]  # routed-1's chat
    assert set(current(kept_first).values()) == {"STORAGE"}, current(kept_first)
    on_nvme = session_blocks(daemon, "routed-1")
    assert len(current(kept_first)) == on_nvme
    lost_prompt = tokens(80, 3 * SERVER_BLOCK + 5)
    assert server.complete(lost_prompt, max_tokens=2)["status"] == 200
    subscriber.wait_for(lambda events: len(view(events, lost_prompt[:SERVER_BLOCK])) >= 3)
    daemon.kill()
    daemon.restart()
    seed, deadline = 5000, time.monotonic() + 60
    while True:
        kept, lost = current(kept_first), current(lost_prompt[:SERVER_BLOCK])
        if not lost and len(kept) == on_nvme and set(kept.values()) == {"STORAGE"}:
            break
        assert time.monotonic() < deadline, (kept, lost, on_nvme)
        seed += 1  # vLLM steps, and publishes the corrections, while it serves this
        assert server.complete(tokens(seed, SERVER_BLOCK // 2), max_tokens=2)["status"] == 200
