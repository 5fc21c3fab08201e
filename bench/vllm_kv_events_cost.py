"""What announcing kvtier's blocks on vLLM's KV-event stream (kvtier.vllm.events) costs
vLLM's scheduler thread, and the scheduler's memory per announced block.

    build/vllm-venv/bin/python bench/vllm_kv_events_cost.py [--tokens 8192,32768,131072]
        [--block 16] [--reps 5] [--json OUT]

For each prompt length: a real vLLM Request (vLLM's own block hasher), its Save recorded
(BlockEvents.capture, in request_finished) and answered, then the events taken step by
step (BlockEvents.take, in each engine step) until every block is announced. Reported
(median of reps): the milliseconds recording the Save, announcing in all, the slowest
step, and the steps it took. Memory: tracemalloc's growth over 8 Saves of 16,384 tokens,
each request's own lists let go, per announced block. No kvtierd is needed.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "client" / "python"))

from vllm import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from kvtier.vllm.events import BlockEvents  # noqa: E402

init_none_hash(sha256)


def request(tokens: list[int], block: int, name: str) -> Request:
    return Request(request_id=name, prompt_token_ids=tokens, sampling_params=SamplingParams(max_tokens=1),
                   pooling_params=None, mm_features=None, block_hasher=get_request_block_hasher(block, sha256))


def keys_for(name: str, count: int) -> list[bytes]:
    return [hashlib.sha256(f"{name}-{i}".encode()).digest() for i in range(count)]


def time_one(size: int, block: int, rng: random.Random) -> tuple[float, float, float, int]:
    name = f"r{rng.getrandbits(32)}"
    req = request([rng.randrange(1, 150000) for _ in range(size)], block, name)
    keys = keys_for(name, size // block)
    events = BlockEvents(block, 1, 1 << 22, "full_attention")
    started = time.perf_counter()
    events.capture(name, req, keys)
    recorded = time.perf_counter() - started
    events.save_over(name, 1, len(keys))
    steps = []
    while True:
        started = time.perf_counter()
        events.take()
        steps.append(time.perf_counter() - started)
        if events.announced() >= len(keys):
            break
    return recorded * 1e3, sum(steps) * 1e3, max(steps) * 1e3, len(steps)


def bytes_per_block(block: int, rng: random.Random) -> float:
    events = BlockEvents(block, 1, 1 << 22, "full_attention")
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(8):
        name = f"m{i}"
        req = request([rng.randrange(1000, 150000) for _ in range(16384)], block, name)
        keys = keys_for(name, 16384 // block)
        events.capture(name, req, keys)
        events.save_over(name, 1, len(keys))
        while events.announced() < (i + 1) * len(keys):
            events.take()
        del req, keys
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return used / events.announced()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="8192,32768,131072")
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rng = random.Random(0)
    results = {}
    print(f"{'tokens':>8} {'record ms':>10} {'announce ms':>12} {'slowest step ms':>16} {'steps':>6}")
    for size in (int(t) for t in args.tokens.split(",")):
        rows = [time_one(size, args.block, rng) for _ in range(args.reps)]
        row = {"record_ms": round(statistics.median(r[0] for r in rows), 3),
               "announce_ms": round(statistics.median(r[1] for r in rows), 3),
               "slowest_step_ms": round(statistics.median(r[2] for r in rows), 3),
               "steps": statistics.median(r[3] for r in rows)}
        results[str(size)] = row
        print(f"{size:>8} {row['record_ms']:>10.3f} {row['announce_ms']:>12.3f} {row['slowest_step_ms']:>16.3f} "
              f"{row['steps']:>6}")
    memory = {str(block): round(bytes_per_block(block, rng)) for block in (16, 32)}
    print("bytes per announced block: " + ", ".join(f"{b}-token blocks {v} B" for b, v in memory.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"block": args.block, "reps": args.reps, "results": results,
                                               "bytes_per_block": memory}, indent=1) + "\n")


if __name__ == "__main__":
    main()
