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
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "vllm"))


class Engine:
    def __init__(self, name: str, model: Path, args: list[str], log_dir: Path, library: Path) -> None:
        self.name = name
        env = {**os.environ, "KVTIER_LIBRARY": os.environ.get("KVTIER_LIBRARY", str(library)), "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "WARNING",
               "PYTHONPATH": f"{REPO / 'client' / 'python'}:{os.environ.get('PYTHONPATH', '')}"}
        self.log = open(log_dir / f"{name}.log", "w")
        self.process = subprocess.Popen(
            [sys.executable, str(REPO / "examples" / "vllm" / "engine_process.py"), str(model), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        assert self._read().get("ready"), name

    def _read(self) -> dict:
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"engine {self.name} exited; see {self.log.name}")
            if line.startswith("{"):
                return json.loads(line)

    def ttft(self, prompt: list[int], session: str | None = None) -> dict:
        self.process.stdin.write(json.dumps({"prompt": prompt, "max_tokens": 1, "session": session}) + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=120)
        self.log.close()


def start_kvtierd(build: Path, work: Path) -> tuple[subprocess.Popen, str]:
    sock = str(work / "kvtierd.sock")
    process = subprocess.Popen([str(build / "kvtierd"), "--socket", sock, "--data-dir", str(work / "data"),
                                "--device", "host", "--hbm-bytes", "2GiB", "--ram-bytes", "2GiB",
                                "--nvme-bytes", "0", "--metrics-addr", "off"],
                               stdout=open(work / "kvtierd.log", "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(sock)
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"kvtierd did not start; see {work / 'kvtierd.log'}")
            time.sleep(0.05)
        finally:
            probe.close()
    return process, sock


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

    from tiny_llama import write_tiny_llama

    work = Path(tempfile.mkdtemp(prefix="kvtier-vllm-bench-"))
    max_len = args.history + max(args.message, args.miss_prompt) + 64
    model = write_tiny_llama(work / "model", 0, num_hidden_layers=args.layers, hidden_size=args.hidden,
                             intermediate_size=2 * args.hidden, num_attention_heads=args.hidden // 64,
                             num_key_value_heads=max(1, args.hidden // 128), max_position_embeddings=max_len)
    daemon, sock = start_kvtierd(Path(args.build), work)
    library = Path(args.build) / "libkvtier.so.0"
    common = ["--max-model-len", str(max_len), "--kv-cache-bytes", str(1 << 30)]
    engines = {}
    try:
        engines["recompute"] = Engine("recompute", model, common, work, library)
        engines["layerwise"] = Engine("layerwise", model, [*common, "--kvtier", sock], work, library)
        engines["whole"] = Engine("whole", model, [*common, "--kvtier", sock, "--whole-request"], work, library)
        engines["zc_layerwise"] = Engine("zc_layerwise", model, [*common, "--kvtier", sock, "--zero-copy"],
                                         work, library)
        engines["zc_whole"] = Engine("zc_whole", model, [*common, "--kvtier", sock, "--zero-copy",
                                                         "--whole-request"], work, library)
        rng = random.Random(1)
        history = [rng.randrange(1, 500) for _ in range(args.history)]
        # The conversation's earlier turn, saved once (by the layer-wise engine).
        engines["layerwise"].ttft(history + [1] * args.message, session="bench")
        loading = ("layerwise", "whole", "zc_layerwise", "zc_whole")
        samples: dict[str, list[float]] = {name: [] for name in ("recompute", *loading, "miss_with", "miss_without")}
        loaded: dict[str, list[int]] = {name: [] for name in loading}
        for rep in range(args.reps):
            message = [rng.randrange(1, 500) for _ in range(args.message)]
            for name in ("recompute", *loading):
                reply = engines[name].ttft(history + message, session="bench" if name != "recompute" else None)
                samples[name].append(reply["wall_s"])
                if name in loaded:
                    loaded[name].append(reply["counters"].get("loaded_blocks", 0))
            miss = [rng.randrange(1, 500) for _ in range(args.miss_prompt)]
            samples["miss_with"].append(engines["layerwise"].ttft(miss)["wall_s"])
            samples["miss_without"].append(engines["recompute"].ttft(miss)["wall_s"])
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
        daemon.terminate()
        daemon.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
