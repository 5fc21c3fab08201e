"""Lookup overhead of the Python client: times Lookups of 32 hashes, one at a time.

    /usr/bin/python3 tests/python/lookup_bench.py                 # starts its own kvtierd
    /usr/bin/python3 tests/python/lookup_bench.py --socket PATH   # or uses a running one

Prints one JSON object (µs per Lookup: p50, p99, mean). The hashes are saved first, so
every Lookup is a full hit, as in kvtier-bench rpc.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from kvtierd_process import Kvtierd, use_built_client


def time_lookups(client, lookups: int = 2000, hashes_per_lookup: int = 32,
                 warmup: int = 200) -> dict:
    """Saves hashes_per_lookup blocks, then times `lookups` blocking Lookups of them.
    The client must have said hello with a layout of at least hashes_per_lookup blocks
    and registered its regions."""
    from kvtier.hashing import block_hashes

    hashes = block_hashes(range(hashes_per_lookup), 1, "lookup-bench")
    client.save("lookup-bench", list(zip(hashes, range(hashes_per_lookup))))
    for _ in range(warmup):
        client.lookup(hashes)
    samples_us = []
    for _ in range(lookups):
        start = time.perf_counter_ns()
        result = client.lookup(hashes)
        samples_us.append((time.perf_counter_ns() - start) / 1000)
        if result.hit_count != hashes_per_lookup:
            raise RuntimeError(f"lookup found {result.hit_count} of {hashes_per_lookup}")
    samples_us.sort()
    return {"lookups": lookups, "hashes_per_lookup": hashes_per_lookup,
            "p50_us": round(samples_us[len(samples_us) // 2], 2),
            "p99_us": round(samples_us[min(len(samples_us) - 1, len(samples_us) * 99 // 100)], 2),
            "mean_us": round(statistics.fmean(samples_us), 2)}


def run(socket_path: str, lookups: int, hashes_per_lookup: int) -> dict:
    import torch

    import kvtier
    from kvtier.torch import layout_from_tensors, memfd_tensor

    cache = memfd_tensor((2, hashes_per_lookup, 1, 1, 8), torch.float16)
    with kvtier.Client(socket_path) as client:
        client.hello(layout_from_tensors("lookup-bench", [cache], 0), engine_name="lookup-bench")
        client.register_tensor(0, cache)
        return time_lookups(client, lookups, hashes_per_lookup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", help="a running kvtierd (default: start one)")
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--hashes", type=int, default=32)
    args = parser.parse_args()
    use_built_client()
    daemon = None if args.socket else Kvtierd()
    try:
        socket_path = args.socket if daemon is None else daemon.socket_path
        print(json.dumps(run(socket_path, args.lookups, args.hashes)))
    finally:
        if daemon is not None:
            daemon.stop()


if __name__ == "__main__":
    main()
