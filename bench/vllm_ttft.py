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


def start_kvtierd(build: Path):
    sys.path.insert(0, str(REPO / "tests" / "python"))
    os.environ["KVTIER_BUILD_DIR"] = str(build)
    from kvtierd_process import Kvtierd

    return Kvtierd(["--hbm-bytes", "2GiB", "--ram-bytes", "2GiB", "--nvme-bytes", "0"], timeout_s=60)


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
    args = parser.parse_args()

    from engine_client import EngineProcess as Engine
    from tiny_llama import write_tiny_llama

    work = Path(tempfile.mkdtemp(prefix="kvtier-vllm-bench-"))
    max_len = args.history + max(args.message, args.miss_prompt) + 64
    model = write_tiny_llama(work / "model", 0, num_hidden_layers=args.layers, hidden_size=args.hidden,
                             intermediate_size=2 * args.hidden, num_attention_heads=args.hidden // 64,
                             num_key_value_heads=max(1, args.hidden // 128), max_position_embeddings=max_len)
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
