#!/usr/bin/python3
"""Time to first token of a new turn: history restored from kvtierd's RAM tier, from its
NVMe tier, and recomputed, side by side in one run.

    /usr/bin/python3 examples/torch_engine/bench.py [--sizes 2048,8192,16384] [--json]

Starts its own kvtierd (build/kvtierd, host backend) in a temp dir with an NVMe tier.
For each history size N it builds a returning session whose next prompt is N tokens
(a long conversation, then one short turn), and times that prompt's first token:

  recompute  an engine without kvtier prefills all N tokens;
  RAM        the session idles in kvtierd's RAM tier (idle sessions leave its HBM arena
             at once); the turn runs begin_turn, lookup, load of the held prefix,
             prefill of the few tokens after it;
  NVMe       the same after the daemon's idle threshold for RAM drops to 0 (its config
             file is rewritten and reloaded with SIGHUP), so the session sits on NVMe.

Ratios are restore ÷ recompute. Restore times are the median of --repeats runs, each
from the same tier (the bench waits for the session to be demoted again in between).
The model is model.py's (fp32 weights and KV cache; "small": 2 KiB of KV per token).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from checkout import REPO, use_checkout

use_checkout()

import torch  # noqa: E402

from engine import Conversation, Engine, TurnResult  # noqa: E402
from model import LlamaModel, config_named  # noqa: E402

FIRST_MESSAGE = "Please keep all of that in mind for the rest of our conversation."
# Short enough that the measured turn's prompt adds no full block to the history (the
# answer and end marker of the first turn, then this message, fit in one block): every
# repeat restores exactly the same prefix and prefills the same few tokens.
BENCH_MESSAGE = "And now?"
BLOCK_SIZE = 16
WORDS = ("kv cache block tier session idle prefill decode attention layer head token "
         "prompt engine daemon restore recompute latency bandwidth memory nvme ram hbm "
         "slab index checksum promote demote evict budget turn user answer model").split()


def long_history(tokenizer, tokens_wanted: int) -> list[int]:
    """A deterministic conversation of at least `tokens_wanted` tokens."""
    rng = random.Random(0)
    tokens = tokenizer.message(tokenizer.SYSTEM, "You are a helpful operations assistant.")
    role = tokenizer.USER
    while len(tokens) < tokens_wanted:
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120)))
        tokens += tokenizer.message(role, text.capitalize() + ".")
        role = tokenizer.ASSISTANT if role == tokenizer.USER else tokenizer.USER
    return tokens


class BenchDaemon:
    """kvtierd with an NVMe tier, its idle-to-NVMe threshold switchable by SIGHUP."""

    def __init__(self, block_bytes: int, max_tokens: int, config_kv_bytes_per_token: int,
                 data_root: Path):
        self.dir = Path(tempfile.mkdtemp(prefix="kvtier-torch-bench-", dir=data_root))
        self.socket_path = str(self.dir / "kvtierd.sock")
        self.config_path = self.dir / "kvtierd.toml"
        session_bytes = max_tokens * config_kv_bytes_per_token
        mib = lambda n: f"{max(64, -(-n // 2**20))}MiB"  # noqa: E731
        self.write_config(ram_idle_ms="1h")
        argv = [str(REPO / "build" / "kvtierd"), "--config", str(self.config_path),
                "--socket", self.socket_path, "--data-dir", str(self.dir / "data"),
                "--device", "host", "--metrics-addr", "off",
                "--hbm-bytes", mib(2 * session_bytes), "--ram-bytes", mib(2 * session_bytes),
                "--nvme-bytes", mib(4 * session_bytes),
                "--slab-bytes", mib(max(block_bytes * 8, 2**20)),
                "--hbm-idle-ms", "0", "--plan-interval-ms", "10ms"]
        self.log = open(self.dir / "kvtierd.log", "wb")
        self.process = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not Path(self.socket_path).exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("kvtierd did not start: "
                                   + (self.dir / "kvtierd.log").read_text(errors="replace"))
            time.sleep(0.05)

    def write_config(self, ram_idle_ms: str) -> None:
        self.config_path.write_text(f'ram-idle-ms = "{ram_idle_ms}"\n')

    def idle_sessions_to_nvme(self) -> None:
        self.write_config(ram_idle_ms="0ms")
        self.process.send_signal(signal.SIGHUP)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        import shutil
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_for_tier(engine: Engine, tier: str, timeout_s: float = 60.0) -> None:
    """Until every block the daemon holds is in `tier` and no copy is in flight."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = engine.client.stats()
        elsewhere = sum(t.blocks for name, t in stats.tiers.items() if name != tier)
        if elsewhere == 0 and stats.tiers[tier].blocks > 0 and stats.copies_in_flight == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"blocks did not settle in {tier} within {timeout_s} s: {stats}")
        time.sleep(0.01)


@dataclasses.dataclass
class SizeResult:
    history_tokens: int
    prompt_tokens: int = 0
    restored_tokens: int = 0
    recompute_ms: float = 0.0
    ram_ms: float = 0.0
    nvme_ms: float = 0.0
    ram_tiers: str = ""
    nvme_tiers: str = ""
    same_first_token: bool = True

    @property
    def ram_ratio(self) -> float:
        return self.ram_ms / self.recompute_ms

    @property
    def nvme_ratio(self) -> float:
        return self.nvme_ms / self.recompute_ms


def tiers_seen(result: TurnResult) -> str:
    counts: dict[str, int] = {}
    for tier in result.lookup_tiers:
        counts[tier] = counts.get(tier, 0) + 1
    return ",".join(f"{tier}:{count}" for tier, count in sorted(counts.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="2048,8192,16384",
                        help="history sizes in tokens, comma-separated")
    parser.add_argument("--model", default="small", help="small (default) or large")
    parser.add_argument("--repeats", type=int, default=3, help="restore runs per size/tier")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    parser.add_argument("--data-root", default=None,
                        help="where the daemon's temp dir goes (default: the system temp dir; "
                             "the NVMe tier lives there)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = sorted({int(size) for size in args.sizes.split(",")}, reverse=True)
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else \
        (lambda *a: print(*a, flush=True))

    config = config_named(args.model)
    model = LlamaModel(config)
    num_blocks = -(-(max(sizes) + 64) // BLOCK_SIZE) + 8
    daemon = BenchDaemon(BLOCK_SIZE * config.kv_bytes_per_token, max(sizes) + 64,
                         config.kv_bytes_per_token, Path(args.data_root or tempfile.gettempdir()))
    try:
        with Engine(config, "kvtier", socket_path=daemon.socket_path, num_blocks=num_blocks,
                    block_size=BLOCK_SIZE, engine_name="torch-engine-bench", model=model) as engine, \
                Engine(config, "recompute", num_blocks=num_blocks, block_size=BLOCK_SIZE,
                       model=model) as recomputing:
            tokenizer = engine.tokenizer
            first_turn = len(tokenizer.user_turn(FIRST_MESSAGE))
            assert 2 + len(tokenizer.user_turn(BENCH_MESSAGE)) < BLOCK_SIZE
            history = long_history(tokenizer, max(sizes))
            conversations: dict[int, Conversation] = {}
            results = {size: SizeResult(size) for size in sizes}
            # Sessions: the largest first (a cold prefill that kvtierd keeps), then the
            # smaller ones, whose histories are prefixes of it (restored, deduplicated).
            # Each first turn's prompt ends on a block boundary, BLOCK_SIZE tokens short
            # of the size: all of it is saved, and the measured prompt adds a partial block.
            for size in sizes:
                held = size // BLOCK_SIZE * BLOCK_SIZE - BLOCK_SIZE
                conversation = Conversation(f"bench-{size}", history[:held - first_turn])
                warm = engine.turn(conversation, FIRST_MESSAGE, max_new_tokens=1)
                log(f"session of {size} tokens saved: {warm.saved_blocks} blocks stored, "
                    f"{warm.deduplicated_blocks} deduplicated, first turn "
                    f"{warm.ttft_s * 1000:.1f} ms ({warm.restored_tokens} tokens restored)")
                conversations[size] = conversation

            def measure(which: Engine, size: int) -> TurnResult:
                copy = Conversation(conversations[size].session_id,
                                    list(conversations[size].tokens))
                return which.turn(copy, BENCH_MESSAGE, max_new_tokens=1)

            first_tokens: dict[int, int] = {}
            for size in sizes:
                recomputed = measure(recomputing, size)
                results[size].recompute_ms = recomputed.ttft_s * 1000
                results[size].prompt_tokens = recomputed.prompt_tokens
                first_tokens[size] = recomputed.tokens[0]
                log(f"recompute {size}: {results[size].recompute_ms:.1f} ms")
            for tier in ("ram", "nvme"):
                if tier == "nvme":
                    daemon.idle_sessions_to_nvme()
                for size in sizes:
                    times, restore_times = [], []
                    for _ in range(args.repeats):
                        wait_for_tier(engine, tier)
                        restored = measure(engine, size)
                        times.append(restored.ttft_s * 1000)
                        restore_times.append(restored.restore_s * 1000)
                        results[size].same_first_token &= restored.tokens[0] == first_tokens[size]
                        results[size].restored_tokens = restored.restored_tokens
                        setattr(results[size], f"{tier}_tiers", tiers_seen(restored))
                    setattr(results[size], f"{tier}_ms", statistics.median(times))
                    log(f"{tier} {size}: {statistics.median(times):.1f} ms, of which "
                        f"{statistics.median(restore_times):.1f} ms begin_turn + hashes + "
                        f"lookup + load (lookup saw {getattr(results[size], f'{tier}_tiers')})")
    finally:
        daemon.stop()

    ordered = [results[size] for size in sorted(results)]
    if args.json:
        report = {
            "bench": "torch_engine",
            "config": {"model": config.model_id, "kv_bytes_per_token": config.kv_bytes_per_token,
                       "dtype": "fp32", "tokens_per_block": BLOCK_SIZE,
                       "torch_threads": torch.get_num_threads(), "repeats": args.repeats},
            "results": {},
            "targets": [],
        }
        largest = ordered[-1]
        for tier in ("ram", "nvme"):  # restoring must beat recomputing by a wide margin
            ratio = getattr(largest, f"{tier}_ratio")
            report["targets"].append({"metric": f"ratio_{tier}_{largest.history_tokens}",
                                      "value": round(ratio, 5), "op": "<=", "target": 0.1,
                                      "met": ratio <= 0.1})
        for r in ordered:
            n = r.history_tokens
            report["results"].update({
                f"prompt_tokens_{n}": r.prompt_tokens, f"restored_tokens_{n}": r.restored_tokens,
                f"ttft_recompute_ms_{n}": round(r.recompute_ms, 3),
                f"ttft_ram_ms_{n}": round(r.ram_ms, 3), f"ttft_nvme_ms_{n}": round(r.nvme_ms, 3),
                f"ratio_ram_{n}": round(r.ram_ratio, 5), f"ratio_nvme_{n}": round(r.nvme_ratio, 5),
                f"same_first_token_{n}": r.same_first_token})
        print(json.dumps(report))
    else:
        print(f"\nmodel {config.model_id} (fp32, {config.kv_bytes_per_token} B KV/token), "
              f"{torch.get_num_threads()} torch thread(s)")
        print(f"{'history':>8} {'restored':>9} {'recompute':>11} {'RAM':>10} {'ratio':>7} "
              f"{'NVMe':>10} {'ratio':>7}  same token")
        for r in ordered:
            print(f"{r.prompt_tokens:>8} {r.restored_tokens:>9} {r.recompute_ms:>8.1f} ms "
                  f"{r.ram_ms:>7.1f} ms {r.ram_ratio:>7.4f} {r.nvme_ms:>7.1f} ms "
                  f"{r.nvme_ratio:>7.4f}  {'yes' if r.same_first_token else 'NO'}")
    return 0 if all(r.same_first_token for r in ordered) else 1


if __name__ == "__main__":
    sys.exit(main())
