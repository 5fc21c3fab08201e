"""kv_role, and the rules the CUDA branch follows that can be shown without a GPU.

- A producer (kv_producer) saves and never loads; a consumer (kv_consumer) loads what
  others saved and never saves.
- CUDA: a Save goes to kvtierd only once an event recorded after the step that wrote its
  KV has completed (polled; the step thread never synchronizes the stream), and vLLM
  holds the blocks until then.
- CUDA (kvtierd writes straight into vLLM's blocks): an asynchronous Load kvtierd has
  not answered is never given up, however late (the request keeps its blocks; other
  requests run), and is counted overdue once.
"""

from __future__ import annotations

from typing import cast

import kvtier.vllm
import kvtier.vllm.worker as worker_module
from kvtier.pending import Pending
from mini_engine import BLOCK, MiniEngine
from test_vllm_scheduler import tokens


def test_a_producer_only_saves_and_a_consumer_only_loads(tiny_llama, kvtierd):
    history = tokens(60, 4 * BLOCK + 3)
    producer = MiniEngine(tiny_llama, kvtierd.socket_path, kv_role="kv_producer")
    try:
        producer.run(producer.add(history, session="p"))
        assert sum(len(job.hashes) for job in producer.saves) == 4
        producer.run(producer.add(history + tokens(61, BLOCK), session="p"))
        assert producer.loads == []  # a producer never asks for hits
    finally:
        producer.close()
    consumer = MiniEngine(tiny_llama, kvtierd.socket_path, kv_role="kv_consumer")
    try:
        consumer.run(consumer.add(history + tokens(62, BLOCK), session="c"))
        assert sum(len(job.hashes) for job in consumer.loads) == 4  # what the producer saved
        assert consumer.saves == []
        assert not consumer.failed_blocks
    finally:
        consumer.close()


class StepEvent:
    """Stands in for torch.cuda.Event: the GPU finishes the step after `pending` polls."""

    def __init__(self, pending: int) -> None:
        self.pending = pending
        self.polls = 0

    def query(self) -> bool:
        self.polls += 1
        return self.polls > self.pending


def test_a_cuda_save_waits_for_its_step_on_the_gpu_without_blocking(tiny_llama, kvtierd, monkeypatch):
    events: list[StepEvent] = []

    def record():
        events.append(StepEvent(pending=3))
        return events[-1]

    monkeypatch.setattr(worker_module, "_record_step_event", record)
    engine = MiniEngine(tiny_llama, kvtierd.socket_path)
    side = engine.worker._worker
    side._host = False  # the CUDA branch's Save rule over the staged path's copies
    started: list[int] = []  # the event's polls when each Save went out
    original = side._start_save
    def start_save(job):
        started.append(events[-1].polls)
        original(job)

    monkeypatch.setattr(side, "_start_save", start_save)
    try:
        before = kvtier.vllm.counters()["saved_blocks"]
        engine.run(engine.add(tokens(63, 4 * BLOCK + 3), session="g"))
        assert len(events) == 1 and started == [4], (started, [e.polls for e in events])
        assert kvtier.vllm.counters()["saved_blocks"] - before == 4
    finally:
        engine.close()


class Unanswered:
    """A reply kvtierd has not sent."""

    def done(self) -> bool:
        return False


def test_a_late_load_into_vllms_blocks_is_never_given_up(tiny_llama, kvtierd, monkeypatch):
    engine = MiniEngine(tiny_llama, kvtierd.socket_path, async_load=True, load_timeout_ms=1)
    side = engine.worker._worker
    try:
        side._staged = False  # kvtierd writes vLLM's blocks itself (CUDA, zero copy)
        job = worker_module.LoadJob("late", "s", [bytes(32)], [5], asynchronous=True)
        pending = cast(Pending, Unanswered())  # a Pending kvtierd never answers
        load = worker_module._Load(job, [(bytes(32), 5)], [pending], [False], 1, started_s=0.0)
        side._async_loads.append(load)
        before = kvtier.vllm.counters()["load_timeouts"]
        for _ in range(3):
            assert side._poll_async_loads() == set()  # the request keeps waiting, its blocks with it
        assert side._async_loads == [load]
        assert kvtier.vllm.counters()["load_timeouts"] - before == 1  # counted overdue once
        side._async_loads.clear()
    finally:
        engine.close()
