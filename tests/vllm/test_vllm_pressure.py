"""kvtier.vllm under pressure, through vLLM's OpenAI server as it is deployed.

A grouped-query-attention Llama (8 query heads over 2 KV heads, seeded random weights,
fp32), vLLM's prefix cache on over a cache of LOCAL_BLOCKS blocks of 32 tokens (what it
still holds is a local hit, what it evicted comes back from kvtierd), kvtierd with an
HBM and a RAM of TIER_BLOCKS blocks each and a large NVMe, four conversations sent
concurrently (two with a retention priority), greedy decoding. Every reply must equal
that of a second server without the connector and without a prefix cache (each prompt
computed whole), whatever happens to kvtierd: killed and restarted, stopped, hung, full,
or sent bad kv_transfer_params.

Two servers for the module (one with the connector, one without), started side by side;
the daemon is restarted under the same socket between cases, and the connector
reconnects by itself.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from conftest import Kvtierd
from tiny_llama import kv_block_bytes, write_gqa_llama

REPO = Path(__file__).resolve().parents[2]
BLOCK = 32  # tokens per block, vLLM's and kvtierd's (vLLM's CPU attention takes multiples of 32)
LOCAL_BLOCKS = 16  # vLLM's own KV cache (15 usable): less than the four conversations' histories
TIER_BLOCKS = 4  # kvtierd's HBM and RAM, each
MAX_TOKENS = 8
SESSIONS = 4
TURNS = 4
SYSTEM_TOKENS, USER_TOKENS = 96, 48
PRIORITIES = (90, 10, None, None)  # half the sessions name one; the rest get kvtierd's 35


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """vLLM's OpenAI server (python -m vllm.entrypoints.openai.api_server) in a process of
    its own; started at construction, ready after wait_ready()."""

    def __init__(self, name: str, model: Path, log_dir: Path, *flags: str, env: dict[str, str] | None = None) -> None:
        self.name, self.model, self.port = name, str(model), free_port()
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                "--port", str(self.port), "--dtype", "float32", "--enforce-eager", "--seed", "0",
                "--block-size", str(BLOCK), "--max-model-len", str((LOCAL_BLOCKS - 1) * BLOCK),
                "--enable-prompt-tokens-details", *flags]
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                        env={**os.environ, **(env or {})})

    def wait_ready(self, timeout_s: float = 240) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2)
                return
            except OSError:
                assert self.process.poll() is None, self.log()
                assert time.monotonic() < deadline, f"{self.name} did not come up:\n{self.log()}"
                time.sleep(0.5)

    def log(self, tail: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:]

    def request(self, path: str, body: bytes | None = None, timeout_s: float = 120) -> tuple[int, bytes]:
        """(HTTP status, body) of a POST (body given) or GET."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def complete(self, prompt: list[int], max_tokens: int = MAX_TOKENS, raw: str | None = None,
                 **fields) -> dict:
        """A greedy /v1/completions of token ids: {"tokens", "cached_tokens", "status",
        "seconds"}. raw: JSON text spliced into the body (values json cannot write)."""
        body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                           "ignore_eos": True, "return_token_ids": True, **fields})
        if raw:
            body = body[:-1] + ", " + raw + "}"
        started = time.monotonic()
        status, data = self.request("/v1/completions", body.encode())
        seconds = time.monotonic() - started
        if status != 200:
            return {"status": status, "error": data[:2000], "seconds": seconds}
        reply = json.loads(data)
        details = (reply.get("usage") or {}).get("prompt_tokens_details") or {}
        return {"status": status, "tokens": reply["choices"][0]["token_ids"], "seconds": seconds,
                "cached_tokens": details.get("cached_tokens") or 0}

    def metrics(self) -> dict[str, float]:
        """vLLM's Prometheus series, summed over labels but "tier" (name or name[tier])."""
        status, data = self.request("/metrics")
        assert status == 200, data[:500]
        out: dict[str, float] = {}
        for line in data.decode().splitlines():
            if not line or line.startswith("#"):
                continue
            series, value = line.rsplit(" ", 1)
            name, _, labels = series.partition("{")
            tier = [label.split("=")[1].strip('"') for label in labels.rstrip("}").split(",")
                    if label.startswith("tier=")]
            key = f"{name}[{tier[0]}]" if tier else name
            out[key] = out.get(key, 0.0) + float(value)
        return out

    def reset_prefix_cache(self, timeout_s: float = 30) -> None:
        """Empties vLLM's own prefix cache (a development endpoint); it refuses while blocks
        are held (a Save in flight holds its request's), so: until it succeeds."""
        deadline = time.monotonic() + timeout_s
        while True:
            status, data = self.request("/reset_prefix_cache", b"")
            if status == 200 and json.loads(data).get("success"):
                return
            assert time.monotonic() < deadline, (status, data)
            time.sleep(0.1)

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


def kvtier_counters(metrics: dict[str, float]) -> dict[str, float]:
    """kvtier.vllm's counters from vLLM's /metrics: name -> value (name_tier by tier)."""
    out = {}
    for key, value in metrics.items():
        if key.startswith("vllm:kvtier_") and "_total" in key:
            name = key[len("vllm:kvtier_"):].replace("_by_tier_total[", "_").replace("_total", "").rstrip("]")
            out[name] = value
    return out


def grown(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in set(before) | set(after)}


def ctl(daemon: Kvtierd, *command: str):
    out = subprocess.run([str(REPO / "build" / "kvtierctl"), "--socket", daemon.socket_path, "--json", *command],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, (command, out.stdout, out.stderr)
    return json.loads(out.stdout)


def sessions(daemon: Kvtierd) -> dict[str, dict]:
    return {row["id"]: row for row in ctl(daemon, "sessions")["sessions"]}


def wait_copied_to_nvme(daemon: Kvtierd, block_bytes: int, timeout_s: float = 30) -> None:
    """Until every block the sessions hold in HBM and RAM has its NVMe copy (written
    nvme-copy-after-ms, 1 s, after its Save). Copies are written for sessions' blocks
    only, at most one per block, and the chats share no block: as many copies as the
    sessions' blocks in memory means all of them. (Blocks saved without a session, as
    wait_reconnected's, get none: a restart need not keep them, and they may stay in
    memory.)"""
    deadline = time.monotonic() + timeout_s
    while True:
        status = ctl(daemon, "status")
        copies = {tier["tier"]: tier["copy_bytes"] // block_bytes for tier in status["tiers"]}
        rows = sessions(daemon)
        in_memory = sum(row["blocks_per_tier"]["hbm"] + row["blocks_per_tier"]["ram"] for row in rows.values())
        if copies["nvme"] >= in_memory:
            return
        assert time.monotonic() < deadline, (
            f"NVMe copies {copies['nvme']} of {in_memory} session blocks in memory; tiers "
            f"{ {t['tier']: (t['blocks'], t['copy_bytes'] // block_bytes) for t in status['tiers']} }; sessions "
            f"{ {k: v['blocks_per_tier'] for k, v in rows.items()} }")
        time.sleep(0.1)


def restart(daemon: Kvtierd, flags: dict[str, str] | None = None, fresh: bool = False) -> None:
    """kvtierd killed (SIGKILL; a stopped one is not) and started again on the same
    socket, with flags changed (flag -> value) and, when fresh, an empty data dir."""
    if daemon.running():
        daemon.kill()
    for flag, value in (flags or {}).items():
        if flag in daemon.argv:
            daemon.argv[daemon.argv.index(flag) + 1] = value
        else:
            daemon.argv += [flag, value]
    if fresh:
        shutil.rmtree(daemon.argv[daemon.argv.index("--data-dir") + 1], ignore_errors=True)
    daemon.restart()


class Chat:
    """One conversation: a system prompt, then TURNS user messages of seeded tokens."""

    def __init__(self, name: str, seed: int, priority: int | None) -> None:
        rng = random.Random(seed)
        self.name, self.priority = name, priority
        self.history = [rng.randrange(5, 500) for _ in range(SYSTEM_TOKENS)]
        self.users = [[rng.randrange(5, 500) for _ in range(USER_TOKENS)] for _ in range(TURNS)]
        self.prompts: list[list[int]] = []

    def params(self) -> dict:
        params: dict[str, object] = {"kvtier_session": self.name}
        if self.priority is not None:
            params["kvtier_priority"] = self.priority
        return params

    def next_prompt(self) -> list[int]:
        return self.history + self.users[len(self.prompts)]

    def answered(self, prompt: list[int], tokens: list[int]) -> None:
        self.prompts.append(prompt)
        self.history = prompt + tokens

    def reused_blocks(self) -> int:
        """Full blocks of the next prompt whose KV the turn before computed (and saved)."""
        if not self.prompts:
            return 0
        computed = len(self.prompts[-1]) + MAX_TOKENS - 1
        return min(computed // BLOCK, (len(self.next_prompt()) - 1) // BLOCK)

    def saved_blocks(self) -> int:
        """Full blocks whose KV the last turn computed: what its Save names."""
        return (len(self.prompts[-1]) + MAX_TOKENS - 1) // BLOCK


def concurrently(calls) -> list:
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(call) for call in calls]]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return write_gqa_llama(tmp_path_factory.mktemp("gqa-llama"), seed=3)


@pytest.fixture(scope="module")
def block_bytes(model) -> int:
    return kv_block_bytes(model, BLOCK)  # 4 layers x K,V x 2 KV heads x 32 tokens x 32 x fp32 = 64 KiB


def tight_flags(block_bytes: int) -> dict[str, str]:
    kib = block_bytes // 1024
    return {"--hbm-bytes": f"{TIER_BLOCKS * kib}KiB", "--ram-bytes": f"{TIER_BLOCKS * kib}KiB",
            "--slab-bytes": f"{kib}KiB", "--nvme-bytes": "256MiB"}


@pytest.fixture(scope="module")
def daemon(block_bytes):
    daemon = Kvtierd([x for pair in tight_flags(block_bytes).items() for x in pair])
    yield daemon
    if daemon.running():
        daemon.stop()
    shutil.rmtree(daemon.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def servers(model, block_bytes, daemon, tmp_path_factory):
    """(reference, served): vLLM without a connector or prefix cache, and vLLM with the
    connector and its prefix cache on over LOCAL_BLOCKS blocks."""
    logs = REPO / "build" if (REPO / "build").is_dir() else tmp_path_factory.mktemp("logs")
    config = {"kv_connector": "KvtierConnector", "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
              "kv_load_failure_policy": "recompute",
              "kv_connector_extra_config": {"socket": daemon.socket_path, "reconnect_ms": 200}}
    reference = Server(f"vllm-pressure-reference-{os.getpid()}", model, logs, "--no-enable-prefix-caching",
                       "--kv-cache-memory-bytes", str(64 << 20))
    served = Server(f"vllm-pressure-kvtier-{os.getpid()}", model, logs,
                    "--kv-cache-memory-bytes", str(LOCAL_BLOCKS * block_bytes),
                    "--kv-transfer-config", json.dumps(config),
                    env={"VLLM_SERVER_DEV_MODE": "1"})  # for /reset_prefix_cache
    try:
        reference.wait_ready()
        served.wait_ready()
        yield reference, served
    finally:
        served.close()
        reference.close()


def chats(tag: str, seed: int) -> list[Chat]:
    return [Chat(f"{tag}-{i}", seed * 10 + i, PRIORITIES[i]) for i in range(SESSIONS)]


def turn(servers, conversation: list[Chat]) -> list[dict]:
    """Every chat's next turn: sent to the reference (all at once), then to the served
    server (all at once, with the chat's kv_transfer_params); checks the replies are the
    same and records them."""
    reference, served = servers
    prompts = [chat.next_prompt() for chat in conversation]
    expected = concurrently([lambda p=p: reference.complete(p) for p in prompts])
    replies = concurrently([lambda p=p, c=c: served.complete(p, kv_transfer_params=c.params())
                            for p, c in zip(prompts, conversation)])
    for chat, prompt, want, got in zip(conversation, prompts, expected, replies):
        assert want["status"] == 200, want
        assert got["status"] == 200, (chat.name, got)
        assert got["tokens"] == want["tokens"], (chat.name, len(chat.prompts), got, want)
        got["reused_blocks"] = chat.reused_blocks()
        chat.answered(prompt, got["tokens"])
    return replies


def wait_saved(daemon: Kvtierd, conversation: list[Chat], timeout_s: float = 30) -> dict[str, dict]:
    """Waits until kvtierd holds every chat's last turn; its sessions."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = sessions(daemon)
        if all(rows.get(chat.name, {}).get("blocks") == chat.saved_blocks() for chat in conversation):
            return rows
        assert time.monotonic() < deadline, ({c.name: c.saved_blocks() for c in conversation},
                                             {k: (v["blocks"], v["blocks_per_tier"]) for k, v in rows.items()})
        time.sleep(0.1)


def settled(served: Server, until=None, timeout_s: float = 20) -> dict[str, float]:
    """vLLM's metrics once kvtier's counters stopped moving and until(counters) holds
    (the Saves of the last requests are counted in an engine step after their replies)."""
    deadline = time.monotonic() + timeout_s
    last = kvtier_counters(served.metrics())
    while True:
        time.sleep(0.4)
        metrics = served.metrics()
        counters = kvtier_counters(metrics)
        if counters == last and (until is None or until(counters)):
            return metrics
        assert time.monotonic() < deadline, (counters, last)
        last = counters


@dataclasses.dataclass
class Round:
    replies: list[dict]
    kvtier: dict[str, float]  # kvtier.vllm's counters: what the round added
    vllm: dict[str, float]  # vLLM's series: what the round added
    sessions: dict[str, dict]  # kvtierd's, after the round's Saves


def play(servers, daemon: Kvtierd | None, conversation: list[Chat], rounds: int) -> list[Round]:
    """rounds turns of every chat (the chats' turns of a round sent together); with a
    daemon, each round waits until kvtierd holds every chat's Save."""
    served = servers[1]
    out = []
    for _ in range(rounds):
        start = settled(served)
        replies = turn(servers, conversation)
        rows = wait_saved(daemon, conversation) if daemon else {}
        saves = kvtier_counters(start).get("saves", 0) + (len(conversation) if daemon else 0)
        end = settled(served, lambda counters, saves=saves: counters.get("saves", 0) >= saves)  # every Save counted
        out.append(Round(replies, grown(kvtier_counters(start), kvtier_counters(end)), grown(start, end), rows))
    return out


def describe(rounds: list[Round]) -> str:
    """Per round: (blocks cached, blocks the history had) and seconds per request, what
    kvtier counted, vLLM's local and external prefix-cache hits (tokens)."""
    return "\n".join(f"round {i}: cached/history "
                     f"{[(r['cached_tokens'] // BLOCK, r['reused_blocks']) for r in x.replies]}"
                     f" seconds {[round(r['seconds'], 2) for r in x.replies]}"
                     f" kvtier {({k: v for k, v in x.kvtier.items() if v})}"
                     f" local {x.vllm.get('vllm:prefix_cache_hits_total')}"
                     f" external {x.vllm.get('vllm:external_prefix_cache_hits_total')}"
                     for i, x in enumerate(rounds))


def wait_reconnected(served: Server, daemon: Kvtierd, timeout_s: float = 30) -> None:
    """After a restart of kvtierd: requests without a session (a Lookup, a Save of one
    block) until both of the connector's connections are back (the client library
    reconnects on a call after its backoff)."""
    rng = random.Random(time.monotonic_ns())
    deadline = time.monotonic() + timeout_s
    while ctl(daemon, "status")["connections"] < 3:  # the scheduler's, the worker's, kvtierctl's
        assert time.monotonic() < deadline, ctl(daemon, "status")
        assert served.complete([rng.randrange(5, 500) for _ in range(BLOCK + 8)], max_tokens=1)["status"] == 200
        time.sleep(0.2)


# ---- four sessions, four turns, tight tiers ---------------------------------------


@pytest.fixture(scope="module")
def main_flow(servers, daemon):
    conversation = chats("main", 1)
    rounds = play(servers, daemon, conversation, TURNS)
    return conversation, rounds, ctl(daemon, "status")


def test_every_turn_answers_as_vllm_alone_and_reuses_its_history_locally_or_from_kvtier(main_flow):
    conversation, rounds, _ = main_flow  # the replies were compared as they came
    print(describe(rounds))
    assert [len(chat.prompts) for chat in conversation] == [TURNS] * SESSIONS
    for number, done in enumerate(rounds):
        external = done.vllm["vllm:external_prefix_cache_hits_total"]
        local = done.vllm["vllm:prefix_cache_hits_total"]
        for reply in done.replies:  # every full block of the history: vLLM's own hit or kvtierd's
            assert reply["cached_tokens"] == reply["reused_blocks"] * BLOCK, (number, describe(rounds))
        assert local + external == sum(reply["cached_tokens"] for reply in done.replies), describe(rounds)
        # What kvtier promised vLLM, it loaded (or reported failed, then vLLM recomputed).
        assert external == BLOCK * (done.kvtier["loaded_blocks"] + done.kvtier["load_failed_blocks"]), \
            describe(rounds)
        assert done.kvtier["lookup_hit_blocks"] >= done.kvtier["loaded_blocks"] + done.kvtier["load_failed_blocks"]
        assert done.kvtier["internal_errors"] == 0 and done.kvtier["lookup_errors"] == 0, describe(rounds)
        if number == 0:
            assert external == local == 0 and done.kvtier["loaded_blocks"] == 0, describe(rounds)
        else:  # vLLM's cache holds less than the four histories: kvtierd supplies the rest
            assert done.kvtier["lookup_hit_blocks"] > 0 and external > 0, describe(rounds)
    assert sum(done.vllm["vllm:prefix_cache_hits_total"] for done in rounds) > 0, describe(rounds)
    assert sum(done.kvtier["loaded_blocks"] for done in rounds) > 0, describe(rounds)


def test_saves_keep_every_block_while_nvme_has_room(main_flow, block_bytes):
    conversation, rounds, status = main_flow
    for done in rounds:
        assert done.kvtier["saves"] == SESSIONS, describe(rounds)
        for name in ("save_errors", "save_partial", "save_dropped_blocks", "save_timeouts"):
            assert done.kvtier[name] == 0, (name, describe(rounds))
    assert status["partial_saves"] == 0 and status["blocks_not_saved"] == 0, status
    assert status["blocks_evicted"] == 0 and status["data_loss_blocks"] == 0, status
    rows = rounds[-1].sessions
    for chat in conversation:  # every session, of every priority, with every block of its last turn
        row = rows[chat.name]
        assert row["blocks"] == chat.saved_blocks(), (chat.name, row)
        assert row["priority"] == (chat.priority or 35), (chat.name, row)
        assert row["blocks_per_tier"]["none"] == 0, (chat.name, row)
    tiers = {tier["tier"]: tier for tier in status["tiers"]}
    assert tiers["hbm"]["capacity_bytes"] == tiers["ram"]["capacity_bytes"] == TIER_BLOCKS * block_bytes
    assert tiers["nvme"]["blocks"] > 2 * TIER_BLOCKS  # most of it went past the memory tiers


def test_later_turns_load_what_vllm_lost_without_a_failed_block(main_flow):
    conversation, rounds, _ = main_flow
    for done in rounds[1:]:
        assert done.kvtier["loaded_blocks"] > 0, describe(rounds)
        assert done.kvtier["load_failed_blocks"] == 0 and done.kvtier["load_timeouts"] == 0, describe(rounds)


def test_a_load_larger_than_ram_reads_every_block_from_nvme():
    """What the vLLM turns above meet, with kvtier's client alone: one session's blocks,
    more of them on NVMe than RAM (TIER_BLOCKS blocks) holds, loaded at once."""
    import kvtier
    import torch
    from kvtier.hashing import block_hashes
    from kvtier.torch import layout_from_tensors, memfd_tensor

    blocks = 2 * TIER_BLOCKS
    shape = (2, 4 * blocks, BLOCK, 2, 32)  # [K/V, blocks, tokens, KV heads, head size], one layer
    cache = memfd_tensor(shape, torch.float32)
    kib = cache[:, 0].numel() * 4 // 1024
    daemon = Kvtierd(["--hbm-bytes", f"{TIER_BLOCKS * kib}KiB", "--ram-bytes", f"{TIER_BLOCKS * kib}KiB",
                      "--slab-bytes", f"{kib}KiB", "--nvme-bytes", "64MiB", "--nvme-load-wait-ms", "2s"])
    try:
        with kvtier.Client(daemon.socket_path) as client:
            client.hello(layout_from_tensors("pressure-load", [cache], 0), engine_name="pressure")
            client.register_tensor(0, cache)
            cache.copy_(torch.randn(shape))
            hashes = {}
            for session in range(3):  # no Save larger than RAM; the first session goes down to NVMe
                hashes[session] = block_hashes(range(blocks * BLOCK), BLOCK, f"pressure-{session}")
                for end in range(TIER_BLOCKS, blocks + 1, TIER_BLOCKS):
                    ids = range(session * blocks, session * blocks + end)
                    assert client.save(f"s{session}", list(zip(hashes[session][:end], ids))).saved == end
            deadline = time.monotonic() + 10
            while client.lookup(hashes[0]).tiers.count("nvme") <= TIER_BLOCKS:  # more than RAM holds
                assert time.monotonic() < deadline, client.lookup(hashes[0])
                time.sleep(0.05)
            # Every block, not the prefix RAM held once nvme-load-wait-ms passed.
            loaded = client.load("s0", list(zip(hashes[0], range(3 * blocks, 4 * blocks))))
            assert torch.equal(cache[:, 3 * blocks:3 * blocks + loaded.loaded_count],
                               cache[:, :loaded.loaded_count])
            assert loaded.loaded_count == blocks and loaded.stop_reason is None, loaded
    finally:
        daemon.stop()


# ---- kvtierd killed (-9) and restarted between turns -------------------------------


def test_after_kill_9_every_session_of_every_priority_reloads_from_nvme(servers, daemon, block_bytes):
    served = servers[1]
    restart(daemon, tight_flags(block_bytes), fresh=True)
    wait_reconnected(served, daemon)
    conversation = chats("crash", 2)
    before = play(servers, daemon, conversation, 1)
    wait_copied_to_nvme(daemon, block_bytes)
    daemon.kill()
    daemon.restart()  # the same data dir and socket
    rows = sessions(daemon)
    for chat in conversation:  # back from NVMe's session table: every block, the priority given
        assert rows[chat.name]["blocks"] == chat.saved_blocks(), (chat.name, rows)
        assert rows[chat.name]["blocks_per_tier"]["nvme"] == chat.saved_blocks(), (chat.name, rows)
        assert rows[chat.name]["priority"] == (chat.priority or 35), (chat.name, rows)
    wait_reconnected(served, daemon)
    served.reset_prefix_cache()  # vLLM lost every block of every history: kvtierd has them all
    after = play(servers, daemon, conversation, 1)
    rounds = before + after
    done = after[0]
    for reply in done.replies:  # each session, loaded whole
        assert reply["reused_blocks"] > 0 and reply["cached_tokens"] == reply["reused_blocks"] * BLOCK, \
            describe(rounds)
    promised = sum(reply["reused_blocks"] for reply in done.replies)
    assert done.vllm["vllm:prefix_cache_hits_total"] == 0, describe(rounds)
    assert done.vllm["vllm:external_prefix_cache_hits_total"] == promised * BLOCK, describe(rounds)
    assert done.kvtier["lookup_hit_blocks"] == promised, describe(rounds)
    assert done.kvtier["loaded_blocks"] == promised and done.kvtier["load_failed_blocks"] == 0, describe(rounds)
    assert done.kvtier["loaded_blocks_nvme"] > 0, describe(rounds)  # what BeginTurn had not moved up yet
    assert done.kvtier["save_errors"] == done.kvtier["save_partial"] == 0, describe(rounds)
    status = ctl(daemon, "status")
    assert status["partial_saves"] == 0 and status["data_loss_blocks"] == 0, status


# ---- bad kv_transfer_params ----------------------------------------------------------

# (name, request fields, raw JSON spliced into the body: values Python's json cannot write)
BAD_PARAMS: list[tuple[str, dict[str, Any] | None, str | None]] = [
    ("huge-session", {"kv_transfer_params": {"kvtier_session": "s" * 300_000, "kvtier_priority": 60}}, None),
    ("priority-abc", {"kv_transfer_params": {"kvtier_session": "bad-abc", "kvtier_priority": "abc"}}, None),
    ("priority-1e309", None, '"kv_transfer_params": {"kvtier_session": "bad-inf", "kvtier_priority": 1e309}'),
    ("priority-nan", None, '"kv_transfer_params": {"kvtier_session": "bad-nan", "kvtier_priority": NaN}'),
    ("priority-huge", {"kv_transfer_params": {"kvtier_session": "bad-big", "kvtier_priority": 1e6}}, None),
    ("nested-junk", {"kv_transfer_params": {"kvtier_session": {"a": [1, {"b": None}]}, "kvtier_priority": [1, 2],
                                            "x": {"y": [None, {"z": []}]}}}, None),
    ("nul", None, '"kv_transfer_params": {"kvtier_session": "a\\u0000b", "kvtier_priority": -7}'),
    # vLLM itself refuses these before any connector sees them, with or without one: its
    # request model an integer past 64 bits and what is not a dict (400); a lone
    # surrogate, and what is not a dict passed through vllm_xargs (500: its output
    # processor calls .get on it).
    ("priority-2e40", {"kv_transfer_params": {"kvtier_session": "bad-2e40", "kvtier_priority": 2 * 10 ** 40}},
     None),
    ("surrogate", None, '"kv_transfer_params": {"kvtier_session": "a\\ud800b"}'),
    ("body-string", {"kv_transfer_params": "conv-1"}, None),
    ("body-list", {"kv_transfer_params": [1, 2]}, None),
    ("xargs-string", {"vllm_xargs": {"kv_transfer_params": "conv-1"}}, None),
    ("xargs-list", {"vllm_xargs": {"kv_transfer_params": [1, "x", 2.5]}}, None),
]


def test_bad_kv_transfer_params_are_answered_as_vllm_alone_answers_them(servers, daemon):
    served = servers[1]
    conversation = [Chat(f"bad-{name}", 300 + i, None) for i, (name, _, _) in enumerate(BAD_PARAMS)]
    cases = {chat.name: (fields or {}, raw) for chat, (_, fields, raw) in zip(conversation, BAD_PARAMS)}
    before = served.metrics()
    statuses: dict[str, list[tuple[int, int]]] = {chat.name: [] for chat in conversation}
    for _ in range(2):  # a second turn: its Lookup and Load under the same parameters
        prompts = [chat.next_prompt() for chat in conversation]
        expected, got = [concurrently([lambda s=server, p=p, c=c: s.complete(p, raw=cases[c.name][1],
                                                                              **cases[c.name][0])
                                       for p, c in zip(prompts, conversation)])
                         for server in servers]
        for chat, prompt, want, reply in zip(conversation, prompts, expected, got):
            statuses[chat.name].append((want["status"], reply["status"]))
            if want["status"] == reply["status"] == 200:
                assert reply["tokens"] == want["tokens"], (chat.name, reply, want)
            chat.answered(prompt, want.get("tokens", [0] * MAX_TOKENS))
    print(statuses)
    refused = {"bad-priority-2e40": 400, "bad-body-string": 400, "bad-body-list": 400, "bad-surrogate": 500,
               "bad-xargs-string": 500, "bad-xargs-list": 500}
    assert statuses == {name: [(refused.get(name, 200),) * 2] * 2 for name in statuses}, statuses
    grew = grown(kvtier_counters(before), kvtier_counters(settled(served)))
    assert grew["internal_errors"] == 0 and grew["save_errors"] == 0, grew
    assert daemon.running(), daemon.log()[-3000:]
    rows = sessions(daemon)
    digest = [row for name, row in rows.items() if name.startswith("vllm-session-sha256:")]
    assert len(digest) == 2 and {row["priority"] for row in digest} == {60, 1}, rows.keys()  # too long; NUL (-7: 1)
    for name in ("bad-abc", "bad-inf", "bad-nan"):  # a priority that is no number: ignored
        assert rows[name]["priority"] == 35, rows[name]
    assert rows["bad-big"]["priority"] == 100, rows["bad-big"]  # clamped to kvtierd's range
    assert rows[str({"a": [1, {"b": None}]})]["priority"] == 35  # the session, as text


# ---- kvtierd hung (SIGSTOP) while requests arrive -----------------------------------

def test_a_hung_daemon_costs_hits_not_answers(servers, daemon, block_bytes):
    """kvtierd stopped (SIGSTOP) before a round of requests arrives, and continued
    (SIGCONT) only once every one was answered: they must not need it. Measured here:
    the last answer 5.3-6.4 s after the stop: two requests ran at once (0.3-0.9 s, their
    Lookups timed out after 200 ms), the other two waited for room in vLLM's 15 blocks,
    which the first two's Saves held until save_timeout_ms (5 s) gave them back."""
    served = servers[1]
    restart(daemon, tight_flags(block_bytes), fresh=True)
    wait_reconnected(served, daemon)
    conversation = chats("hung", 4)
    rounds = play(servers, daemon, conversation, 1)
    start = settled(served)
    daemon.process.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:  # not waited for without end: past this the answers waited for kvtierd
        replies = pool.submit(turn, servers, conversation).result(timeout=120)
        answered_s = time.monotonic() - stopped
    finally:
        daemon.process.send_signal(signal.SIGCONT)
        pool.shutdown()
    hung = grown(kvtier_counters(start), kvtier_counters(settled(served)))
    print(f"hung daemon: every answer within {answered_s:.2f} s of the stop "
          f"({[round(r['seconds'], 2) for r in replies]}); {({k: v for k, v in hung.items() if v})}")
    assert hung["lookup_timeouts"] > 0 and hung["loaded_blocks"] == 0, hung
    assert hung["internal_errors"] == 0, hung
    rounds += play(servers, daemon, conversation, 1)  # kvtierd answers again: identical, and reused
    assert rounds[-1].kvtier["lookup_timeouts"] == 0 and rounds[-1].kvtier["internal_errors"] == 0, \
        describe(rounds)


# ---- kvtierd full: tiers too small, NVMe tiny ---------------------------------------


def test_a_full_daemon_keeps_what_fits_and_vllm_serves(servers, daemon, block_bytes):
    served = servers[1]
    kib = block_bytes // 1024
    restart(daemon, {"--hbm-bytes": f"{kib}KiB", "--ram-bytes": f"{kib}KiB", "--nvme-bytes": f"{2 * kib}KiB"},
            fresh=True)
    try:
        wait_reconnected(served, daemon)
        conversation = chats("full", 5)
        rounds = play(servers, None, conversation, 3)
        print(describe(rounds))
        grew = {k: sum(r.kvtier.get(k, 0) for r in rounds) for k in rounds[0].kvtier}
        status = ctl(daemon, "status")
        assert daemon.running(), daemon.log()[-3000:]
        assert grew["save_partial"] > 0 and grew["save_dropped_blocks"] > 0, grew
        assert status["partial_saves"] > 0 and status["blocks_not_saved"] > 0, status
        assert grew["internal_errors"] == 0 and grew["save_errors"] == 0, grew
    finally:
        restart(daemon, tight_flags(block_bytes), fresh=True)
        wait_reconnected(served, daemon)


# ---- kvtierd stopped -----------------------------------------------------------------


def test_vllm_answers_every_request_with_the_daemon_stopped(servers, daemon):
    daemon.process.terminate()  # SIGTERM: kvtierd drains and exits
    daemon.process.wait(timeout=60)
    rounds = play(servers, None, chats("stopped", 6), 2)
    grew = {k: sum(r.kvtier.get(k, 0) for r in rounds) for k in rounds[0].kvtier}
    assert grew["loaded_blocks"] == grew["saved_blocks"] == grew["lookup_hit_blocks"] == 0, grew
    assert grew["internal_errors"] == 0 and grew["load_failed_blocks"] == 0, grew
