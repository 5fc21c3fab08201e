"""TTFT of vLLM (CPU) with kvtier.vllm against recomputing, as ratios measured in one run.

    build/vllm-venv/bin/python bench/vllm_ttft.py [--history 8192] [--reps 7] [--json OUT]

One kvtierd and five vLLM engine processes (examples/vllm/engine_process.py), all idle
while another works; requests go to them in turn, so drift on the machine hits every
configuration alike. vLLM's prefix cache is off in all of them: each request either
loads its history from kvtierd or computes it.

- **recompute**: no connector; turn N's prompt (history + a new message) computed whole.
- **kvtier, layer-wise**: the connector; the history was saved by an earlier request,
  turn N loads it (one Load per layer) and computes only the new message.
- **kvtier, whole-request**: the same with one Load for all layers.
- **zero-copy** (``host_zero_copy``): both again with vLLM's cache in a memfd the
  daemon maps, instead of the staging buffer.
- **miss overhead**: fresh prompts nothing has seen, with the connector (Lookup, then
  the Save after the timed request) and without.

TTFT is the wall time of a request for one token (prefill + the first token). Medians
of --reps requests; every ratio is of medians taken in this run.

``--tp`` measures turn N at tensor parallelism 2 instead (vLLM's mp executor, one
thread a rank): two engines, recompute and the connector (whole-request Loads), each
rank loading its own shard from kvtierd; kvtier ÷ recompute of the medians.

``--pressure`` measures two other ratios instead, also in one run (two kvtierd, three
engines: recompute, and the connector against each daemon):

- **later turns under tight tiers, with priorities**: --sessions conversations of
  --history tokens, half of them saved with retention priority 90, half with 10, into a
  kvtierd whose HBM holds one history and RAM two (a large NVMe below). Each rep sends
  every session's next turn (its history + a new message) in turn: the kvtier engine
  loads the history from wherever kvtierd kept it, the recompute engine computes it.
  Reported: kvtier ÷ recompute, per priority too, and the tiers the Loads came from.
- **new requests while Saves wait for room**: fresh prompts of --miss-prompt tokens to
  a kvtier engine whose Saves go out in the next request's engine steps
  (engine_process.py --background-saves), against a kvtierd whose HBM and RAM together
  hold less than one Save (each waits save-room-wait-ms for room, then keeps the prefix
  that fits), and to the recompute engine. Reported: with ÷ without (target ≤ 1.05), and
  the same with Saves that find room at once (a roomy kvtierd, a fourth engine), which
  tells the wait from what a Save costs the next request anyway.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "vllm"))
sys.path.insert(0, str(REPO / "client" / "python"))  # kvtier, for --pressure's probe Save


def start_kvtierd(build: Path, flags: list[str] | None = None):
    sys.path.insert(0, str(REPO / "tests" / "python"))
    os.environ["KVTIER_BUILD_DIR"] = str(build)
    from kvtierd_process import Kvtierd

    return Kvtierd(flags or ["--hbm-bytes", "2GiB", "--ram-bytes", "2GiB", "--nvme-bytes", "0"], timeout_s=60)


def kvtierctl_status(build: Path, daemon) -> dict:
    import subprocess

    return json.loads(subprocess.run([str(build / "kvtierctl"), "--socket", daemon.socket_path, "--json", "status"],
                                     capture_output=True, text=True, check=True).stdout)


def timed_probe_save(daemon, block_bytes: int, blocks: int) -> dict:
    """One Save of `blocks` fresh blocks of block_bytes each, straight from kvtier's
    client: how long a Save waits in this daemon, and what it keeps."""
    import time

    import torch

    import kvtier
    from kvtier.hashing import block_hashes
    from kvtier.torch import layout_from_tensors, memfd_tensor

    heads = block_bytes // (2 * 32 * 64 * 4)  # [K/V, blocks, 32 tokens, heads, 64] fp32: the same block size
    cache = memfd_tensor((2, blocks, 32, heads, 64), torch.float32)
    with kvtier.Client(daemon.socket_path) as client:
        client.hello(layout_from_tensors("probe", [cache], 0), engine_name="bench-probe")
        client.register_tensor(0, cache)
        hashes = block_hashes(range(blocks * 32), 32, f"probe-{time.monotonic_ns()}")
        started = time.perf_counter()
        saved = client.save("probe", list(zip(hashes, range(blocks)))).saved
        return {"blocks": blocks, "saved": saved, "seconds": time.perf_counter() - started}


def pressure(args, model: Path, work: Path, Engine) -> dict:
    """The --pressure figures (module docstring); returns the JSON result."""
    from tiny_llama import kv_block_bytes

    build = Path(args.build)
    block = kv_block_bytes(model, 32)
    history_blocks = (args.history + args.message) // 32 + 1
    kib = block // 1024
    tight = start_kvtierd(build, ["--hbm-bytes", f"{history_blocks * kib}KiB",
                                  "--ram-bytes", f"{2 * history_blocks * kib}KiB", "--slab-bytes", f"{kib}KiB",
                                  "--nvme-bytes", f"{(args.sessions + 2) * 4 * history_blocks * kib}KiB"])
    waiting_blocks = max(1, (args.miss_prompt // 32) // 4)  # HBM and RAM: a quarter of one Save each
    full = start_kvtierd(build, ["--hbm-bytes", f"{waiting_blocks * kib}KiB",
                                 "--ram-bytes", f"{waiting_blocks * kib}KiB", "--slab-bytes", f"{kib}KiB",
                                 "--nvme-bytes", f"{(args.reps + 2) * (args.miss_prompt // 32) * kib}KiB"])
    roomy = start_kvtierd(build)
    env = {"KVTIER_LIBRARY": os.environ.get("KVTIER_LIBRARY", str(build / "libkvtier.so.0"))}
    max_len = args.history + max(args.message, args.miss_prompt) + 64
    common = ["--max-model-len", str(max_len), "--kv-cache-bytes", str(1 << 30), "--whole-request"]
    engines = {}
    try:
        engines["recompute"] = Engine(model, None, *common, log_path=work / "recompute.log", env=env)
        engines["tight"] = Engine(model, tight.socket_path, *common, log_path=work / "tight.log", env=env)
        engines["waiting"] = Engine(model, full.socket_path, *common, "--background-saves",
                                    log_path=work / "waiting.log", env=env)
        engines["roomy"] = Engine(model, roomy.socket_path, *common, "--background-saves",
                                  log_path=work / "roomy.log", env=env)
        rng = random.Random(2)
        histories = [[rng.randrange(1, 500) for _ in range(args.history)] for _ in range(args.sessions)]
        priorities = [90 if i % 2 == 0 else 10 for i in range(args.sessions)]
        for i, history in enumerate(histories):  # the earlier turns, saved once
            engines["tight"].turn(history + [1] * args.message, session=f"s{i}", priority=priorities[i],
                                  max_tokens=1)
        samples: dict[str, list[float]] = {"recompute": [], "kvtier": [], "kvtier_p90": [], "kvtier_p10": [],
                                           "miss_without": [], "miss_waiting": [], "miss_roomy": []}
        before = engines["tight"].turn([1], max_tokens=1)["counters"]
        for rep in range(args.reps):
            for i, history in enumerate(histories):
                prompt = history + [rng.randrange(1, 500) for _ in range(args.message)]
                reply = engines["tight"].turn(prompt, session=f"s{i}", priority=priorities[i], max_tokens=1)
                samples["kvtier"].append(reply["wall_s"])
                samples[f"kvtier_p{priorities[i]}"].append(reply["wall_s"])
                samples["recompute"].append(engines["recompute"].turn(prompt, max_tokens=1)["wall_s"])
                counters = reply["counters"]
            miss = [rng.randrange(1, 500) for _ in range(args.miss_prompt)]
            samples["miss_waiting"].append(engines["waiting"].turn(miss, max_tokens=1)["wall_s"])
            samples["miss_without"].append(engines["recompute"].turn(miss, max_tokens=1)["wall_s"])
            samples["miss_roomy"].append(engines["roomy"].turn(miss, max_tokens=1)["wall_s"])
        waiting_counters = engines["waiting"].turn([1], max_tokens=1)["counters"]
        grew = {k: counters[k] - before[k] for k in before}
        median = {name: statistics.median(values) for name, values in samples.items()}
        return {
            "mode": "pressure", "history_tokens": args.history, "message_tokens": args.message,
            "miss_prompt_tokens": args.miss_prompt, "reps": args.reps, "sessions": args.sessions,
            "model": {"layers": args.layers, "hidden": args.hidden, "block_bytes": block},
            "tight_tiers": {"hbm_blocks": history_blocks, "ram_blocks": 2 * history_blocks,
                            "priorities": priorities},
            "waiting_tiers": {"hbm_blocks": waiting_blocks, "ram_blocks": waiting_blocks},
            "median_ttft_s": median,
            "later_turn_kvtier_over_recompute": median["kvtier"] / median["recompute"],
            "later_turn_p90_over_recompute": median["kvtier_p90"] / median["recompute"],
            "later_turn_p10_over_recompute": median["kvtier_p10"] / median["recompute"],
            "new_request_while_saves_wait_over_no_connector": median["miss_waiting"] / median["miss_without"],
            "new_request_after_roomy_saves_over_no_connector": median["miss_roomy"] / median["miss_without"],
            "tight_loads": {k: grew[k] for k in ("loaded_blocks", "load_failed_blocks", "load_timeouts",
                                                 "loaded_blocks_hbm", "loaded_blocks_ram", "loaded_blocks_nvme",
                                                 "save_partial", "save_dropped_blocks")},
            "tight_daemon": {k: v for k, v in kvtierctl_status(build, tight).items()
                             if k in ("partial_saves", "blocks_not_saved", "blocks_evicted", "bytes")},
            "waiting_saves": {k: waiting_counters[k] for k in ("saves", "saved_blocks", "save_partial",
                                                               "save_dropped_blocks", "save_timeouts",
                                                               "staging_waits")},
            "waiting_daemon": {k: v for k, v in kvtierctl_status(build, full).items()
                               if k in ("partial_saves", "blocks_not_saved")},
            "probe_save_into_waiting_daemon": timed_probe_save(full, block, args.miss_prompt // 32),
            "samples_s": samples,
        }
    finally:
        for engine in engines.values():
            engine.close()
        tight.stop()
        full.stop()
        roomy.stop()


def tensor_parallel(args, model: Path, work: Path, Engine) -> dict:
    """--tp: turn N's TTFT at TP 2, kvtier (each rank loads its shard) ÷ recompute."""
    daemon = start_kvtierd(Path(args.build))
    env = {"KVTIER_LIBRARY": os.environ.get("KVTIER_LIBRARY", str(Path(args.build) / "libkvtier.so.0")),
           "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    max_len = args.history + args.message + 64
    common = ["--max-model-len", str(max_len), "--kv-cache-bytes", str(1 << 30), "--tensor-parallel-size", "2"]
    engines = {}
    try:
        engines["recompute"] = Engine(model, None, *common, log_path=work / "tp-recompute.log", env=env)
        engines["kvtier"] = Engine(model, daemon.socket_path, *common, "--whole-request",
                                   log_path=work / "tp-kvtier.log", env=env)
        rng = random.Random(2)
        history = [rng.randrange(1, 500) for _ in range(args.history)]
        engines["kvtier"].turn(history + [1] * args.message, session="tp-bench", max_tokens=1)  # saved
        samples: dict[str, list[float]] = {"recompute": [], "kvtier": []}
        for _ in range(args.reps):
            message = [rng.randrange(1, 500) for _ in range(args.message)]
            for name in ("recompute", "kvtier"):
                reply = engines[name].turn(history + message, max_tokens=1,
                                           session="tp-bench" if name == "kvtier" else None)
                samples[name].append(reply["wall_s"])
        status = kvtierctl_status(Path(args.build), daemon)
        median = {name: statistics.median(values) for name, values in samples.items()}
        return {"tensor_parallel_size": 2, "history_tokens": args.history, "message_tokens": args.message,
                "reps": args.reps, "model": {"layers": args.layers, "hidden": args.hidden},
                "median_ttft_s": median, "kvtier_over_recompute": median["kvtier"] / median["recompute"],
                "daemon_bytes_loaded": status.get("bytes", {}).get("loaded"), "samples_s": samples}
    finally:
        for engine in engines.values():
            engine.close()
        daemon.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=int, default=8192, help="tokens of history turn N reloads")
    parser.add_argument("--message", type=int, default=64, help="tokens of the new message")
    parser.add_argument("--miss-prompt", type=int, default=2048, help="tokens of the miss-overhead prompts")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--build", default=str(REPO / "build"))
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--pressure", action="store_true", help="the figures under pressure (see above)")
    parser.add_argument("--sessions", type=int, default=6, help="--pressure: conversations")
    parser.add_argument("--tp", action="store_true",
                        help="turn N at tensor parallelism 2: kvtier against recompute (both TP 2)")
    args = parser.parse_args()
    # This process's own client (the --pressure probe) uses the library just built too.
    os.environ.setdefault("KVTIER_LIBRARY", str(Path(args.build) / "libkvtier.so.0"))

    from engine_client import EngineProcess as Engine
    from tiny_llama import write_tiny_llama

    work = Path(tempfile.mkdtemp(prefix="kvtier-vllm-bench-"))
    max_len = args.history + max(args.message, args.miss_prompt) + 64
    model = write_tiny_llama(work / "model", 0, num_hidden_layers=args.layers, hidden_size=args.hidden,
                             intermediate_size=2 * args.hidden, num_attention_heads=args.hidden // 64,
                             num_key_value_heads=max(1, args.hidden // 128), max_position_embeddings=max_len)
    if args.pressure or args.tp:
        try:
            result = (pressure if args.pressure else tensor_parallel)(args, model, work, Engine)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(json.dumps({k: v for k, v in result.items() if k != "samples_s"}, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        return
    daemon = start_kvtierd(Path(args.build))
    sock = daemon.socket_path
    env = {"KVTIER_LIBRARY": os.environ.get("KVTIER_LIBRARY", str(Path(args.build) / "libkvtier.so.0"))}
    common = ["--max-model-len", str(max_len), "--kv-cache-bytes", str(1 << 30)]
    engines = {}
    try:
        engines["recompute"] = Engine(model, None, *common, log_path=work / "recompute.log", env=env)
        engines["layerwise"] = Engine(model, sock, *common, log_path=work / "layerwise.log", env=env)
        engines["whole"] = Engine(model, sock, *common, "--whole-request", log_path=work / "whole.log", env=env)
        engines["zc_layerwise"] = Engine(model, sock, *common, "--zero-copy", log_path=work / "zc_layerwise.log",
                                         env=env)
        engines["zc_whole"] = Engine(model, sock, *common, "--zero-copy", "--whole-request",
                                     log_path=work / "zc_whole.log", env=env)
        rng = random.Random(1)
        history = [rng.randrange(1, 500) for _ in range(args.history)]
        # The conversation's earlier turn, saved once (by the layer-wise engine).
        engines["layerwise"].turn(history + [1] * args.message, session="bench", max_tokens=1)
        loading = ("layerwise", "whole", "zc_layerwise", "zc_whole")
        samples: dict[str, list[float]] = {name: [] for name in ("recompute", *loading, "miss_with", "miss_without")}
        loaded: dict[str, list[int]] = {name: [] for name in loading}
        for rep in range(args.reps):
            message = [rng.randrange(1, 500) for _ in range(args.message)]
            for name in ("recompute", *loading):
                session = "bench" if name != "recompute" else None
                reply = engines[name].turn(history + message, max_tokens=1, session=session)
                samples[name].append(reply["wall_s"])
                if name in loaded:
                    loaded[name].append(reply["counters"].get("loaded_blocks", 0))
            miss = [rng.randrange(1, 500) for _ in range(args.miss_prompt)]
            samples["miss_with"].append(engines["layerwise"].turn(miss, max_tokens=1)["wall_s"])
            samples["miss_without"].append(engines["recompute"].turn(miss, max_tokens=1)["wall_s"])
        median = {name: statistics.median(values) for name, values in samples.items()}
        result = {
            "history_tokens": args.history, "message_tokens": args.message, "reps": args.reps,
            "model": {"layers": args.layers, "hidden": args.hidden},
            "median_ttft_s": median,
            "kvtier_over_recompute": median["layerwise"] / median["recompute"],
            "whole_request_over_recompute": median["whole"] / median["recompute"],
            "layerwise_over_whole_request": median["layerwise"] / median["whole"],
            "zero_copy_over_recompute": median["zc_layerwise"] / median["recompute"],
            "zero_copy_layerwise_over_whole_request": median["zc_layerwise"] / median["zc_whole"],
            "zero_copy_over_staged": median["zc_layerwise"] / median["layerwise"],
            "miss_overhead": median["miss_with"] / median["miss_without"] - 1.0,
            "loaded_blocks_total": {k: v[-1] for k, v in loaded.items()},
            "samples_s": samples,
        }
        print(json.dumps({k: v for k, v in result.items() if k != "samples_s"}, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        for engine in engines.values():
            engine.close()
        daemon.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
