"""The connector under vLLM's own Scheduler (tests/vllm/mini_engine.py), against a
real kvtierd: hits, the blocks loaded and saved, sessions, sharing across processes."""

from __future__ import annotations

import random
import time

import kvtier
import torch
import pytest
from kvtier import hashing
from kvtier.vllm.blocks import request_extra_keys

from conftest import Kvtierd
from mini_engine import BLOCK, MiniEngine
from test_vllm_end_to_end import _wait_until_serving as wait_until_serving


def tokens(seed: int, count: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 500) for _ in range(count)]


def check_loaded_bytes(engine: MiniEngine, prompt: list[int], job) -> None:
    first = [i for i, h in enumerate(hashing.block_hashes(prompt, BLOCK, extra_keys=_extra(engine)))
             if h == job.hashes[0]]
    assert first, "the Load names hashes of this prompt"
    for i, block_id in enumerate(job.block_ids):
        expected = engine.expected_block(prompt, first[0] + i)
        assert engine.block_bytes(block_id).equal(expected), f"block {first[0] + i} differs"


def _extra(engine: MiniEngine) -> str:
    class _Req:
        lora_request = None
        cache_salt = None
    return request_extra_keys(engine.connector._shape.model_id, _Req())


@pytest.fixture(params=["layerwise", "async"])
def engine(request, tiny_llama, kvtierd):
    e = MiniEngine(tiny_llama, kvtierd.socket_path, async_load=request.param == "async")
    yield e
    e.close()


def test_a_three_turn_conversation_hits_on_turns_two_and_three(engine):
    before = kvtier.vllm.counters()
    history = tokens(1, 5 * BLOCK + 3)
    hits = []
    for turn in range(3):
        request = engine.add(history, session="conv-42")
        loads_before = len(engine.loads)
        output = engine.run(request)
        new_loads = engine.loads[loads_before:]
        hits.append(sum(len(j.hashes) for j in new_loads))
        for job in new_loads:
            assert job.session_id == "conv-42"
            assert job.asynchronous == engine.connector._config.async_load_for("host")
            check_loaded_bytes(engine, history, job)
        # The Save named every full block whose KV was computed, under the session.
        save = engine.saves[-1]
        assert save.session_id == "conv-42" and not save.anonymous
        computed = len(history) + len(output) - 1
        assert save.hashes == hashing.block_hashes(history + output, BLOCK, extra_keys=_extra(engine))[
            :computed // BLOCK]
        history = history + output + tokens(10 + turn, 2 * BLOCK)
    assert hits[0] == 0
    # Turn 2 finds turn 1's full blocks; turn 3 finds turn 2's.
    assert hits[1] >= 5 and hits[2] > hits[1], hits
    after = kvtier.vllm.counters()
    assert after["begin_turns"] - before["begin_turns"] == 3
    assert after["load_failed_blocks"] == before["load_failed_blocks"]


def test_a_request_without_a_session_is_saved_as_an_anonymous_prefix(engine, kvtierd):
    prompt = tokens(2, 4 * BLOCK + 1)
    engine.run(engine.add(prompt))
    save = engine.saves[-1]
    assert save.anonymous and save.session_id.startswith("vllm-request:")
    # Its blocks stay findable after its per-request session was closed.
    again = engine.add(prompt + tokens(3, BLOCK))
    loads_before = len(engine.loads)
    engine.run(again)
    assert sum(len(j.hashes) for j in engine.loads[loads_before:]) == 4
    check_loaded_bytes(engine, prompt, engine.loads[-1])


def test_a_second_vllm_with_the_same_model_hits_the_first_ones_system_prompt(tiny_llama, other_llama, kvtierd):
    system = tokens(4, 6 * BLOCK)
    first = MiniEngine(tiny_llama, kvtierd.socket_path)
    try:
        first.run(first.add(system + tokens(5, 20), session="a"))
    finally:
        first.close()
    second = MiniEngine(tiny_llama, kvtierd.socket_path)
    try:
        second.run(second.add(system + tokens(6, 20), session="b"))
        assert sum(len(j.hashes) for j in second.loads) == 6
        check_loaded_bytes(second, system + tokens(6, 20), second.loads[0])
    finally:
        second.close()
    other = MiniEngine(other_llama, kvtierd.socket_path)
    try:
        other.run(other.add(system + tokens(6, 20), session="c"))
        assert other.loads == []
    finally:
        other.close()


def test_lookups_never_block_the_scheduler_and_time_out_to_zero(tiny_llama, kvtierd):
    engine = MiniEngine(tiny_llama, kvtierd.socket_path, lookup_timeout_ms=50)
    try:
        prompt = tokens(7, 4 * BLOCK + 2)
        engine.run(engine.add(prompt, session="s"))
        before = kvtier.vllm.counters()
        kvtierd.process.send_signal(__import__("signal").SIGSTOP)  # a daemon that hangs
        try:
            request = engine.add(prompt + tokens(8, 8), session="s")
            output = engine.run(request)
        finally:
            kvtierd.process.send_signal(__import__("signal").SIGCONT)
        assert len(output) == 4
        assert kvtier.vllm.counters()["lookup_timeouts"] > before["lookup_timeouts"]
    finally:
        engine.close()


@pytest.mark.parametrize("mode", ["layerwise", "async"])
def test_blocks_a_load_cannot_fill_are_reported_and_recomputed(tiny_llama, mode):
    daemon = Kvtierd(["--nvme-bytes", "0"])  # memory only: a crash loses every block
    engine = MiniEngine(tiny_llama, daemon.socket_path, async_load=mode == "async")
    try:
        prompt = tokens(9, 5 * BLOCK + 4)
        engine.run(engine.add(prompt, session="lost"))
        request = engine.add(prompt + tokens(10, 8), session="lost")
        lookup = engine.connector._scheduler_side._requests[request.request_id].lookup
        assert lookup is not None
        lookup.result()  # the Lookup saw the blocks (the scheduler reads the same reply)...
        daemon.kill()  # ... which die with the daemon
        daemon.restart()
        wait_until_serving(daemon)
        loads_before = len(engine.loads)
        output = engine.run(request)  # MiniEngine.step checks every block read after the failure
        assert len(output) == 4
        promised = [j for j in engine.loads[loads_before:] if j.request_id == request.request_id]
        assert sum(len(j.hashes) for j in promised) == 5  # what the Lookup promised
        assert engine.failed_blocks >= set(promised[0].block_ids)  # every one reported
    finally:
        engine.close()
        daemon.stop()


def test_layer_zero_is_in_place_while_later_layers_still_load(tiny_llama):
    # Every Save/Load copy completes 500 ms late, one after another: the three per-layer
    # Loads of a request are answered at least 500 ms apart.
    daemon = Kvtierd(["--copy-threads", "1", "--fault-copy-delay-ms", "500ms"])
    engine = MiniEngine(tiny_llama, daemon.socket_path)
    try:
        prompt = tokens(11, 4 * BLOCK + 5)
        engine.run(engine.add(prompt, session="layers"))
        seen = []

        def on_layer_loaded(layer, meta):
            for job in meta.loads:
                cache = engine.cache[:, job.block_ids]
                expected = torch.stack([engine.expected_block(prompt, i) for i in range(len(job.block_ids))], 1)
                seen.append({"layer": layer, "at": time.monotonic(),
                             "this_layer_exact": cache[layer].equal(expected[layer]),
                             "last_layer_poisoned": bool((cache[-1] == -1.0).all())})

        engine.on_layer_loaded = on_layer_loaded
        started = time.monotonic()
        engine.run(engine.add(prompt + tokens(12, 8), session="layers"))
    finally:
        engine.close()
        daemon.stop()
    assert [s["layer"] for s in seen] == [0, 1, 2]
    first, last = seen[0], seen[-1]
    assert first["this_layer_exact"] and first["last_layer_poisoned"], first
    assert last["this_layer_exact"], last
    # The daemon answers the last layer's Load two delays after layer 0's, so
    # wait_for_layer_load(layer 0) returned while the last layer was still loading (with
    # one Load for the whole request, both waits end at the same reply).
    assert last["at"] - first["at"] >= 0.5, (first["at"] - started, last["at"] - started)


def test_a_request_aborted_while_its_asynchronous_load_runs_is_cleaned_up_and_not_saved(tiny_llama):
    from vllm.v1.request import RequestStatus

    daemon = Kvtierd(["--copy-threads", "1", "--fault-copy-delay-ms", "200ms"])
    engine = MiniEngine(tiny_llama, daemon.socket_path, async_load=True)
    try:
        prompt = tokens(13, 4 * BLOCK + 3)
        engine.run(engine.add(prompt, session="abort"))
        request = engine.add(prompt + tokens(14, 8), session="abort")
        while not any(j.request_id == request.request_id for j in engine.loads):
            engine.step()
        assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        engine.scheduler.finish_requests(request.request_id, RequestStatus.FINISHED_ABORTED)
        deadline = time.monotonic() + 30
        while engine.scheduler.has_requests():  # the Load's report frees the blocks
            assert time.monotonic() < deadline
            engine.step()
        assert not any(j.request_id == request.request_id for j in engine.saves)
        assert request.request_id not in engine.scheduler.requests
        # The engine goes on serving.
        assert len(engine.run(engine.add(prompt + tokens(15, 8), session="abort"))) == 4
    finally:
        engine.close()
        daemon.stop()


def test_saves_and_lookups_respect_the_daemons_request_size_limit(tiny_llama):
    daemon = Kvtierd(["--max-blocks-per-request", "4"])
    engine = MiniEngine(tiny_llama, daemon.socket_path)
    try:
        prompt = tokens(16, 10 * BLOCK + 1)
        before = kvtier.vllm.counters()
        engine.run(engine.add(prompt, session="big"))
        after = kvtier.vllm.counters()
        assert after["saved_blocks"] - before["saved_blocks"] == 10  # in chunks of 4
        assert after["save_errors"] == before["save_errors"]
        loads_before = len(engine.loads)
        engine.run(engine.add(prompt + tokens(17, 8), session="big"))
        assert sum(len(j.hashes) for j in engine.loads[loads_before:]) == 4  # at most one request's worth
        assert kvtier.vllm.counters()["lookup_errors"] == before["lookup_errors"]
    finally:
        engine.close()
        daemon.stop()


def test_session_ids_and_priorities_from_requests_are_made_safe():
    from kvtier.vllm.scheduler import _session_of, session_id_of

    class Request:
        def __init__(self, params):
            self.kv_transfer_params = params

    assert session_id_of("conv-42") == "conv-42"
    long_id = session_id_of("x" * 300)
    assert long_id.startswith("vllm-session-sha256:") and long_id == session_id_of("x" * 300)
    assert session_id_of("a\0b") != session_id_of("a")
    assert session_id_of("\ud800").startswith("vllm-session-sha256:")
    assert _session_of(Request({"kvtier_session": 42, "kvtier_priority": float("inf")})) == ("42", None)
    assert _session_of(Request({"kvtier_priority": "250"})) == ("", 100)
    assert _session_of(Request("not a dict")) == ("", None)


@pytest.mark.parametrize("layout", ["LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC"])
def test_every_kv_cache_layout_round_trips_and_stays_apart_from_the_others(tiny_llama, kvtierd, layout):
    prompt = tokens(18, 4 * BLOCK + 7)
    first = MiniEngine(tiny_llama, kvtierd.socket_path, kv_cache_layout=layout)
    try:
        first.run(first.add(prompt, session=f"l-{layout}"))
    finally:
        first.close()
    # A second process with the same layout loads the blocks (MiniEngine.step checks
    # every block the model reads holds its prefix's KV).
    second = MiniEngine(tiny_llama, kvtierd.socket_path, kv_cache_layout=layout)
    try:
        second.run(second.add(prompt + tokens(19, 8), session=f"l-{layout}"))
        assert sum(len(j.hashes) for j in second.loads) == 4
        check_loaded_bytes(second, prompt, second.loads[0])
    finally:
        second.close()
    # One with another byte order gets nothing from it.
    other_layout = "LBNHC" if layout == "LBHNC" else "LBHNC"
    other = MiniEngine(tiny_llama, kvtierd.socket_path, kv_cache_layout=other_layout)
    try:
        other.run(other.add(prompt + tokens(20, 8), session=f"o-{layout}"))
        assert other.loads == []
    finally:
        other.close()


def test_a_full_daemon_drops_saves_and_vllm_goes_on(tiny_llama):
    # 6 KiB blocks, 128 KiB of memory in all and no NVMe: a 30-block Save cannot fit;
    # kvtierd keeps the prefix that does (a partial Save, counted under a known name:
    # an unknown one once raised out of get_finished and took vLLM's engine down).
    daemon = Kvtierd(["--hbm-bytes", "64KiB", "--ram-bytes", "64KiB", "--nvme-bytes", "0", "--slab-bytes", "64KiB",
                      "--save-room-wait-ms", "100ms"])
    engine = MiniEngine(tiny_llama, daemon.socket_path)
    try:
        before = kvtier.vllm.counters()
        for i in range(3):
            assert len(engine.run(engine.add(tokens(30 + i, 30 * BLOCK + 1), session=f"full-{i}"))) == 4
        after = kvtier.vllm.counters()
        assert after["save_dropped_blocks"] > before["save_dropped_blocks"], (before, after)
        assert after["save_partial"] > before["save_partial"], (before, after)
        assert after["internal_errors"] == before["internal_errors"]
    finally:
        engine.close()
        daemon.stop()


def test_a_daemon_that_accepts_but_never_answers_never_stalls_vllm(tiny_llama, tmp_path):
    import socket as sockets

    silent = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
    path = str(tmp_path / "silent.sock")
    silent.bind(path)
    silent.listen(16)  # connections are accepted by the kernel; nothing is ever read or answered
    try:
        engine = MiniEngine(tiny_llama, path)
        try:
            output = engine.run(engine.add(tokens(40, 3 * BLOCK + 2), session="silent"), timeout_s=30)
            assert len(output) == 4
            assert engine.loads == [] and engine.saves == []
        finally:
            engine.close()
    finally:
        silent.close()


def test_a_turn_whose_history_vllm_still_holds_never_waits_for_its_save(tiny_llama):
    # Every Save/Load copy completes 500 ms late: the turn before is still being saved
    # when the next one arrives, and vLLM's prefix cache (on) holds all of it.
    daemon = Kvtierd(["--copy-threads", "1", "--fault-copy-delay-ms", "500ms"])
    engine = MiniEngine(tiny_llama, daemon.socket_path, prefix_caching=True, save_wait_ms=5000)
    try:
        prompt = tokens(21, 4 * BLOCK + 3)
        first = engine.add(prompt, session="held")
        while not first.is_finished():
            engine.step()
        before = kvtier.vllm.counters()
        # Two new full blocks past the history: kvtier is asked about them.
        second = engine.add(prompt + list(first.output_token_ids) + tokens(22, 2 * BLOCK + 8), session="held")
        # Scheduled once its Lookup is answered (a step or two: the scheduler polls it for
        # at most 100 us), from vLLM's own blocks, while the Save is still in flight: it
        # never waited for the Save.
        for _ in range(200):
            engine.step()
            if second.num_computed_tokens > 0:
                break
        assert second.num_computed_tokens > 4 * BLOCK, second.num_computed_tokens
        assert engine.connector._scheduler_side._saving_by_request, "the Save was over: the case did not arise"
        assert kvtier.vllm.counters()["lookup_waits_for_save"] == before["lookup_waits_for_save"]
        assert len(engine.run(second)) == 4
        assert not [j for j in engine.loads if j.request_id == second.request_id]
    finally:
        engine.close()
        daemon.stop()


def test_a_turn_whose_history_vllm_lost_waits_for_its_save_and_loads_it(tiny_llama):
    daemon = Kvtierd(["--copy-threads", "1", "--fault-copy-delay-ms", "300ms"])
    engine = MiniEngine(tiny_llama, daemon.socket_path, save_wait_ms=5000)  # no prefix cache: nothing held
    try:
        prompt = tokens(23, 4 * BLOCK + 3)
        first = engine.add(prompt, session="lost")
        while not first.is_finished():
            engine.step()
        before = kvtier.vllm.counters()
        second = engine.add(prompt + list(first.output_token_ids) + tokens(24, 8), session="lost")
        engine.run(second)
        assert kvtier.vllm.counters()["lookup_waits_for_save"] == before["lookup_waits_for_save"] + 1
        assert sum(len(j.hashes) for j in engine.loads if j.request_id == second.request_id) == 4
    finally:
        engine.close()
        daemon.stop()


def test_a_staged_save_gives_vllm_its_blocks_back_before_kvtierd_answers(tiny_llama):
    # Every copy in kvtierd completes 2 s late: vLLM must not hold a finished request's
    # blocks for that long (they are in the staging buffer), yet the next turn still
    # waits for the Save to be over on kvtierd's side and loads it bit-exact, although
    # another request has reused and overwritten the released blocks meanwhile.
    daemon = Kvtierd(["--copy-threads", "1", "--fault-copy-delay-ms", "2s"])
    engine = MiniEngine(tiny_llama, daemon.socket_path, num_blocks=16, save_wait_ms=10000)
    try:
        pool = engine.scheduler.kv_cache_manager.block_pool
        free = pool.get_num_free_blocks()
        prompt = tokens(25, 4 * BLOCK + 3)
        first = engine.add(prompt, session="released")
        for _ in range(100):  # vLLM holds the blocks until the Save is reported finished
            engine.step()
            if first.is_finished() and not engine.scheduler.has_requests():
                break
        assert pool.get_num_free_blocks() == free, "vLLM still holds the staged Save's blocks"
        assert engine.connector._scheduler_side.saves_in_flight() == 1, \
            "kvtierd answered already: the case did not arise"
        # Another request takes (and writes) the blocks just released.
        other = engine.add(tokens(26, 12 * BLOCK), max_tokens=2)
        engine.run(other, timeout_s=120)
        before = kvtier.vllm.counters()
        second = engine.add(prompt + list(first.output_token_ids) + tokens(27, 8), session="released")
        engine.run(second, timeout_s=120)
        loaded = [j for j in engine.loads if j.request_id == second.request_id]
        assert sum(len(j.hashes) for j in loaded) == 4, loaded
        after = kvtier.vllm.counters()
        assert after["saved_blocks"] >= before["saved_blocks"], (before, after)
        assert not engine.failed_blocks
    finally:
        engine.close()
        daemon.stop()
