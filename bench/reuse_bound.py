#!/usr/bin/python3
"""What an eviction order can know: hit rates of one block cache on a Mooncake trace.

The simulator's optimum (kvtier-bench sim) is clairvoyant: it knows when every block is
used next. An online policy knows only the past. This replays a trace through a single
cache as large as a budget's three tiers together, with the simulator's prefix rule (a
request hits its leading blocks up to the first miss, then saves all of them), and
evicts, when the cache passes its size, down to 95 % of it, in one of these orders:

  lru        least recently used first;
  frequency  fewest uses first (capped at 3: 1, 2, 3+), then least recently used — the
             best an order by the past's counts and recency did among those tried;
  whether    blocks never used again first, then least recently used: knows *whether*
             a block comes back, not when (an oracle);
  belady     used again farthest in the future first (an oracle; Belady's rule, here
             with eviction in batches after each request and hits only on a prefix,
             a reference point rather than a proven bound).

It also says how the trace's block reuse splits: a request that extends the whole
prefix of an earlier request (the longest such) continues that conversation, and its
reuse of that request's blocks is along a chain; every other reuse of a block is
across conversations.

Usage: reuse_bound.py [--trace FILE] [--tokens-per-block 512] [--block-mib 64]
                      [--budget-gib 1098 282 73]
Prints one row per budget: the hit rate of each order, and the share of the
LRU-to-Belady hit-rate gap each closes.
"""

import argparse
import heapq
import json
import os

ORDERS = ("lru", "frequency", "whether", "belady")
NEVER = float("inf")


def load(path, tokens_per_block):
    requests = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            full = r["input_length"] // tokens_per_block
            requests.append(r["hash_ids"][:full])
    return requests


def next_uses(requests):
    """For each block use in replay order, the position of that block's next use."""
    flat = [b for blocks in requests for b in blocks]
    after = [NEVER] * len(flat)
    seen = {}
    for i in range(len(flat) - 1, -1, -1):
        after[i] = seen.get(flat[i], NEVER)
        seen[flat[i]] = i
    return after


def reuse_split(requests):
    """(block reuses along a chain of turns, block reuses across conversations)."""
    seen_prefixes = {}
    used = set()
    chain = across = 0
    for index, blocks in enumerate(requests):
        parent_length = 0
        for length in range(len(blocks), 0, -1):
            if tuple(blocks[:length]) in seen_prefixes:
                parent_length = length
                break
        for position, block in enumerate(blocks):
            if block in used:
                if position < parent_length:
                    chain += 1
                else:
                    across += 1
            used.add(block)
        seen_prefixes[tuple(blocks)] = index
    return chain, across


def replay(requests, after, capacity, order):
    # block -> (uses, last position, next use)
    cache = {}
    uses = {}
    hits = total = position = 0
    keys = {
        "lru": lambda item: item[1][1],
        "frequency": lambda item: (min(item[1][0], 3), item[1][1]),
        "whether": lambda item: (item[1][2] != NEVER, item[1][1]),
        "belady": lambda item: -item[1][2],
    }
    key = keys[order]
    for blocks in requests:
        leading = True
        for block in blocks:
            total += 1
            if leading and block in cache:
                hits += 1
            else:
                leading = False
            uses[block] = uses.get(block, 0) + 1
            cache[block] = (uses[block], position, after[position])
            position += 1
        if len(cache) > capacity:
            excess = len(cache) - int(capacity * 0.95)
            for block, _ in heapq.nsmallest(excess, cache.items(), key=key):
                del cache[block]
    return hits / total if total else 0.0


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_trace = os.path.join(here, "..", "..", "shared", "traces",
                                 "mooncake_synthetic_trace.jsonl")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=os.environ.get("KVTIER_TRACE", default_trace))
    parser.add_argument("--tokens-per-block", type=int, default=512)
    parser.add_argument("--block-mib", type=float, default=64.0)
    parser.add_argument("--budget-gib", type=float, nargs="+", default=[1098, 282, 73],
                        help="each budget's HBM + RAM + NVMe, GiB (default: the "
                             "simulator's three budgets)")
    args = parser.parse_args()

    requests = load(args.trace, args.tokens_per_block)
    after = next_uses(requests)
    chain, across = reuse_split(requests)
    total = max(chain + across, 1)
    print(f"block reuses: {chain + across}; across conversations {100 * across / total:.1f} %, "
          f"along a chain of turns {100 * chain / total:.1f} %\n")
    print("| cache (GiB) | blocks | " + " | ".join(f"{o} hit %" for o in ORDERS) +
          " | frequency: share of the LRU→Belady gap | whether: share |")
    print("|---" * (len(ORDERS) + 4) + "|")
    for gib in args.budget_gib:
        capacity = int(gib * 1024 / args.block_mib)
        rates = {o: replay(requests, after, capacity, o) for o in ORDERS}
        span = rates["belady"] - rates["lru"]

        def share(o):
            return (rates[o] - rates["lru"]) / span if span > 0 else 0.0

        print(f"| {gib:g} | {capacity} | " +
              " | ".join(f"{100 * rates[o]:.1f}" for o in ORDERS) +
              f" | {share('frequency'):.2f} | {share('whether'):.2f} |")


if __name__ == "__main__":
    main()
