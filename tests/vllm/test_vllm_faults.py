"""An unexpected error inside kvtier never takes vLLM down: at every entry point vLLM
calls, an injected fault (tests/vllm/faulty_connector.py) costs hits, never requests,
never wrong KV, never vLLM's blocks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import faulty_connector
import kvtier.vllm
from conftest import ChatEngine, reference_replies
from faulty_connector import SCHEDULER_METHODS, WORKER_METHODS
from mini_engine import BLOCK, MiniEngine
from test_vllm_scheduler import tokens

HERE = Path(__file__).resolve().parent
ENTRY_POINTS = sorted(set(SCHEDULER_METHODS + WORKER_METHODS) - {"shutdown", "register_kv_caches"})


def faulty_engine(tiny_llama, socket: str, **extra) -> MiniEngine:
    return MiniEngine(tiny_llama, socket, connector="FaultyKvtierConnector", module="faulty_connector", **extra)


def all_blocks_free(engine: MiniEngine) -> bool:
    pool = engine.scheduler.kv_cache_manager.block_pool
    return pool.get_num_free_blocks() == pool.num_gpu_blocks - 1  # all but vLLM's null block


@pytest.mark.parametrize("mode", ["layerwise", "async"])
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_fault_at_an_entry_point_costs_hits_never_requests(tiny_llama, kvtierd, monkeypatch, entry, mode):
    engine = faulty_engine(tiny_llama, kvtierd.socket_path, async_load=mode == "async")
    try:
        history = tokens(50, 4 * BLOCK + 3)
        assert len(engine.run(engine.add(history, session="f"))) == 4  # saved: the next turns can hit
        history += tokens(51, BLOCK)
        before = kvtier.vllm.counters()
        monkeypatch.setattr(faulty_connector, "FAULT", entry)
        # MiniEngine.step checks every block the model reads holds its prefix's KV:
        # a block vLLM was told is loaded and is not must have been reported failed.
        assert len(engine.run(engine.add(history, session="f"))) == 4
        during = kvtier.vllm.counters()
        assert during["internal_errors"] > before["internal_errors"], entry
        monkeypatch.setattr(faulty_connector, "FAULT", "")
        loads_before = len(engine.loads)
        assert len(engine.run(engine.add(history + tokens(52, BLOCK), session="f"))) == 4
        # kvtier serves again once the fault is gone (turn 1's blocks at least).
        assert sum(len(j.hashes) for j in engine.loads[loads_before:]) >= 4, entry
        assert all_blocks_free(engine), f"{entry}: vLLM's blocks leaked"
    finally:
        engine.close()


def test_a_worker_that_cannot_be_set_up_serves_without_kvtier(tiny_llama, kvtierd, monkeypatch):
    monkeypatch.setattr(faulty_connector, "FAULT", "register_kv_caches")
    before = kvtier.vllm.counters()
    engine = faulty_engine(tiny_llama, kvtierd.socket_path)
    monkeypatch.setattr(faulty_connector, "FAULT", "")
    try:
        history = tokens(53, 4 * BLOCK + 3)
        for turn in range(2):
            assert len(engine.run(engine.add(history, session="nf"))) == 4
            history += tokens(54 + turn, BLOCK)
        after = kvtier.vllm.counters()
        assert after["internal_errors"] > before["internal_errors"]
        assert after["saved_blocks"] == before["saved_blocks"]  # nothing reached kvtierd...
        assert after["load_failed_blocks"] >= before["load_failed_blocks"]  # ... hits were recomputed
        assert all_blocks_free(engine)
    finally:
        monkeypatch.setattr(faulty_connector, "FAULT", "shutdown")
        engine.close()  # a fault in shutdown is logged, not raised


def test_the_engine_serves_through_a_fault_at_each_entry_point_in_turn(tiny_llama, kvtierd, reference, tmp_path):
    fault = tmp_path / "fault"
    fault.write_text("")
    config = {"kv_connector": "FaultyKvtierConnector", "kv_connector_module_path": "faulty_connector",
              "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
              "kv_connector_extra_config": {"socket": kvtierd.socket_path, "reconnect_ms": 200}}
    env = {"PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1] / "client" / "python"),
                                          os.environ.get("PYTHONPATH", "")]),
           faulty_connector.FAULT_FILE: str(fault)}
    engine = ChatEngine(tiny_llama, kvtierd.socket_path, "--kv-transfer-config", json.dumps(config),
                        *SMALL_CACHE, env=env)
    pieces = [tokens(60, 96)] + [tokens(61 + i, 24) for i in range(len(ENTRY_POINTS) + 1)]
    expected = reference_replies(reference, pieces, max_tokens=4)
    try:
        history = list(pieces[0])
        errors = []
        for turn, user in enumerate(pieces[1:]):
            entry = ENTRY_POINTS[turn] if turn < len(ENTRY_POINTS) else ""
            engine.turn(tokens(200 + turn, 640), max_tokens=1)  # evicts most of the chat from vLLM's cache
            fault.write_text(entry)
            history += user
            reply = engine.turn(history, max_tokens=4, session="faults")
            fault.write_text("")
            assert reply["tokens"] == expected[turn], (turn, entry)
            errors.append(reply["counters"]["internal_errors"])
            history += reply["tokens"]
        # Every entry point's turn met its fault; the last turn, without one, none.
        assert all(b > a for a, b in zip([0] + errors[:-2], errors[:-1])), list(zip(ENTRY_POINTS, errors))
        assert errors[-1] == errors[-2]
        assert reply["counters"]["loaded_blocks"] > 0
        fault.write_text("shutdown")
    finally:
        engine.close()
    assert engine.process.returncode == 0


# vLLM's prefix cache on (its default) and 24 blocks of 32 tokens (23 usable): a
# 640-token request evicts most of a chat's history from it (what is left is a local hit).
SMALL_CACHE = ("--prefix-caching", "--max-model-len", "736", "--kv-cache-bytes", str(24 * 64 << 10))
