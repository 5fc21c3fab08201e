"""The scheduler side keeps vLLM's scheduler thread short: a long prompt is hashed on the
connector's hashing thread, chunk by chunk, which sends its Lookup; the request is asked
again until then, and its hits, Load and Save are what hashing it inline gave
(bench/vllm_scheduler_cost.py measures the time)."""

from __future__ import annotations

import random
import time
from types import SimpleNamespace

import pytest
import torch

import kvtier
from kvtier import hashing
from kvtier import torch as kvtier_torch
from kvtier.vllm import scheduler as scheduler_module
from kvtier.vllm.blocks import BlockShape, request_extra_keys
from kvtier.vllm.config import ConnectorConfig
from kvtier.vllm.scheduler import HASH_CHUNK_TOKENS, INLINE_HASH_TOKENS, MAX_SPIN_US, SchedulerSide

from conftest import Kvtierd
from mini_engine import BLOCK, MiniEngine
from test_vllm_scheduler import check_loaded_bytes, tokens

SHAPE = BlockShape(model_id="long-model", layer_names=("l0",), tokens_per_block=16, num_kv_heads=1, head_dim=2,
                   dtype="fp32", layer_bytes=16 * 4 * 4, planes_per_layer=1, layout_name="LBHNC", cross_layer=False,
                   tp_rank=0, tp_size=1, num_blocks=64)


def _plain_request(request_id: str, token_ids: list[int]):
    return SimpleNamespace(request_id=request_id, num_tokens=len(token_ids), all_token_ids=token_ids,
                           num_computed_tokens=0, mm_features=None, prompt_embeds=None, lora_request=None,
                           cache_salt=None, kv_transfer_params={"kvtier_session": "long"})


def test_a_128k_token_prompt_is_hashed_off_the_scheduler_thread_and_its_lookup_hits():
    count = 128 * 1024
    prompt = [random.Random(1).randrange(1, 30000) for _ in range(count + 1)]
    request = _plain_request("long", prompt)
    expected = hashing.block_hashes(prompt, 16, extra_keys=request_extra_keys(SHAPE.model_id, request))
    assert len(expected) == count // 16 > INLINE_HASH_TOKENS // 16
    held = count // 16 - 100  # kvtierd holds all but the last 100 blocks
    daemon = Kvtierd(["--max-blocks-per-request", str(count // 16 + 1), "--nvme-bytes", "0"])
    try:
        staging = kvtier_torch.memfd_tensor((held, SHAPE.block_bytes), torch.uint8, name="long-test")
        with kvtier.Client(daemon.socket_path, reconnect=False) as client:
            client.hello(SHAPE.staging_layout(held), engine_name="long-test")
            client.register_tensor(0, staging)
            client.save("long", list(zip(expected[:held], range(held))))
        side = SchedulerSide(ConnectorConfig(socket=daemon.socket_path, reconnect_ms=100, lookup_spin_us=500),
                             SHAPE, "host")
        try:
            assert side._spin_s == MAX_SPIN_US / 1e6  # never a longer poll than 100 µs
            lookups = kvtier.vllm.counters()["lookups"]
            side.on_new_request(request)
            state = side._requests["long"]
            assert state.hashing is not None and state.hashes == []  # on the hashing thread
            answers = []
            deadline = time.monotonic() + 30
            while True:
                matched, _ = side.get_num_new_matched_tokens(request, 0)
                answers.append(matched)
                if matched is not None:
                    break
                assert time.monotonic() < deadline
                time.sleep(0.001)
            assert answers[0] is None and matched == held * 16
            assert state.hashes == expected and kvtier.vllm.counters()["lookups"] == lookups + 1
            # The Save extends the Lookup's hashes: the same objects, not hashed again.
            request.num_computed_tokens = len(prompt)
            assert side.request_finished(request, list(range(count // 16))) == (True, None)
            save = side._saves[-1]
            assert save.hashes == expected and all(a is b for a, b in zip(save.hashes, state.hashes))
        finally:
            side.shutdown()
    finally:
        daemon.stop()


@pytest.fixture
def small_chunks(monkeypatch):
    """Prompts of more than 3 blocks go to the hashing thread, 2 blocks a chunk."""
    monkeypatch.setattr(scheduler_module, "INLINE_HASH_TOKENS", 3 * BLOCK)
    monkeypatch.setattr(scheduler_module, "HASH_CHUNK_TOKENS", 2 * BLOCK)
    assert (INLINE_HASH_TOKENS, HASH_CHUNK_TOKENS) == (8192, 8192)


@pytest.mark.parametrize("mode", ["layerwise", "async"])
def test_a_conversation_hashed_on_the_hashing_thread_hits_and_loads_what_inline_hashing_did(
        tiny_llama, kvtierd, small_chunks, mode):
    engine = MiniEngine(tiny_llama, kvtierd.socket_path, async_load=mode == "async")
    try:
        history = tokens(50, 7 * BLOCK + 3)
        hits = []
        for turn in range(3):
            request = engine.add(history, session="hashed")
            loads_before = len(engine.loads)
            output = engine.run(request)  # MiniEngine.step checks every block the model reads
            assert engine.connector._scheduler_side._hasher is not None
            new_loads = engine.loads[loads_before:]
            hits.append(sum(len(j.hashes) for j in new_loads))
            for job in new_loads:
                check_loaded_bytes(engine, history, job)
            computed = len(history) + len(output) - 1
            extra = request_extra_keys(engine.connector._shape.model_id, request)
            assert engine.saves[-1].hashes == hashing.block_hashes(history + output, BLOCK, extra_keys=extra)[
                :computed // BLOCK]
            history = history + output + tokens(60 + turn, 3 * BLOCK)
        assert hits[0] == 0 and hits[1] >= 7 and hits[2] > hits[1], hits
    finally:
        engine.close()
