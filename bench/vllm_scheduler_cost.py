"""What kvtier.vllm's scheduler side costs vLLM's scheduler thread per request, by prompt
length: the time spent inside the connector's scheduler methods on the thread that calls
them (vLLM's own Scheduler drives them, in-process, against a real kvtierd; no model runs),
for the scheduler side at a git revision ("before") and the working tree's ("after"), in
one run.

    build/vllm-venv/bin/python bench/vllm_scheduler_cost.py [--before REV] [--reps 5]
        [--tokens 8192,32768,131072] [--json OUT]

Each engine step sleeps --step-ms (5) for the model. Each request is a fresh prompt (16 tokens a block) whose first half kvtierd holds (saved
beforehand under the connector's layout), 1 output token: its Lookup hits half, its Save
covers the rest. Reported per request (median over reps): the milliseconds inside the
connector's methods (on_new_request, get_num_new_matched_tokens,
update_state_after_alloc, build_connector_meta, request_finished,
update_connector_output), the longest single call, and the engine steps (and
milliseconds) the request waited before it was scheduled ("ask again" answers). Time vLLM itself spends on the
request (its own block hashing, serializing the step's metadata) is not counted.
Needs build/kvtierd and libkvtier (KVTIER_BUILD_DIR, KVTIER_LIBRARY as for the tests).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
sys.path.insert(0, str(REPO / "client" / "python"))
sys.path.insert(0, str(REPO / "examples" / "vllm"))

from kvtierd_process import Kvtierd, use_built_client  # noqa: E402

use_built_client()

import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, KVEventsConfig, KVTransferConfig, ModelConfig,  # noqa: E402
                         SchedulerConfig, VllmConfig)
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

import kvtier  # noqa: E402
from kvtier import hashing  # noqa: E402
from kvtier import torch as kvtier_torch  # noqa: E402
from kvtier.vllm.blocks import request_extra_keys  # noqa: E402
from kvtier.vllm.metadata import KvtierWorkerMetadata  # noqa: E402

BLOCK = 16
METHODS = ("on_new_request", "get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
           "request_finished", "update_connector_output", "take_events", "has_pending_push_work")
init_none_hash(sha256)


def scheduler_module_at(revision: str) -> types.ModuleType:
    """kvtier.vllm.scheduler as it was at a git revision (beside today's modules)."""
    source = subprocess.check_output(["git", "-C", str(REPO), "show", f"{revision}:client/python/kvtier/vllm/scheduler.py"])
    module = types.ModuleType("kvtier.vllm._scheduler_before")
    module.__package__ = "kvtier.vllm"
    sys.modules[module.__name__] = module
    exec(compile(source, f"scheduler.py@{revision}", "exec"), module.__dict__)
    return module


class Engine:
    """vLLM's Scheduler with the connector; the model and the worker are stand-ins."""

    def __init__(self, model_dir: Path, socket: str, max_tokens: int, side=None, step_s: float = 0.0,
                 kv_events: bool = False) -> None:
        self.step_s = step_s
        extra = {"socket": socket, "reconnect_ms": 100}
        self.config = VllmConfig(
            model_config=ModelConfig(model=str(model_dir), dtype="float32", seed=0, max_model_len=max_tokens + 64,
                                     skip_tokenizer_init=True),
            scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=8192,
                                             max_model_len=max_tokens + 64, is_encoder_decoder=False),
            cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=kv_events),
            kv_events_config=KVEventsConfig(enable_kv_cache_events=kv_events, publisher="null"),
            kv_transfer_config=KVTransferConfig(kv_connector="KvtierConnector", kv_connector_module_path="kvtier.vllm",
                                                kv_role="kv_both", kv_connector_extra_config=extra,
                                                kv_load_failure_policy="recompute"),
            device_config=DeviceConfig("cpu"))
        num_blocks = max_tokens // BLOCK + 64
        kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn.attn"], FullAttentionSpec(
                block_size=BLOCK, num_kv_heads=1, head_size=2, dtype=torch.float32))],
            kv_cache_layout="LBHNC")
        self.config.cache_config.num_gpu_blocks = num_blocks
        self.scheduler = Scheduler(vllm_config=self.config, kv_cache_config=kv_cache_config, log_stats=False,
                                   structured_output_manager=StructuredOutputManager(self.config), block_size=BLOCK)
        connector = self.scheduler.connector
        if side is not None:  # another revision's scheduler side in the same connector
            connector._scheduler.shutdown()
            connector._scheduler = side(connector._config, connector._shape)
            # What the connector asks of a side that revision may not have: vLLM's defaults.
            connector.take_events = lambda: ()
            connector.has_pending_push_work = lambda: False
        self.shape = connector._shape
        self.spent: list[float] = []  # seconds of each connector call since the last reset
        for name in METHODS:
            method = getattr(connector, name, None)
            if method is None:  # a revision without it
                continue

            def timed(*args, _method=method, _name=name, **kwargs):
                started = time.perf_counter()
                try:
                    return _method(*args, **kwargs)
                finally:
                    self.spent.append(time.perf_counter() - started)
                    self.by_method.append((_name, self.spent[-1]))

            setattr(connector, name, timed)
        self.sent_saves: list[tuple[str, int]] = []
        self.by_method: list[tuple[str, float]] = []

    def run(self, prompt: list[int]) -> tuple[float, float, int, float]:
        """Runs one request to its end; (seconds in the connector, longest call, steps
        before it was scheduled, seconds before it was scheduled)."""
        self.spent.clear()
        self.by_method.clear()
        request = Request(request_id=f"r{random.getrandbits(48)}", prompt_token_ids=prompt,
                          sampling_params=SamplingParams(max_tokens=1, ignore_eos=True), pooling_params=None,
                          mm_features=None, block_hasher=get_request_block_hasher(BLOCK, sha256))
        waited, arrived, scheduled_s = 0, time.perf_counter(), None
        self.scheduler.add_request(request)
        deadline = time.monotonic() + 60
        while self.scheduler.has_requests():
            assert time.monotonic() < deadline, "the request never finished"
            output = self.scheduler.schedule()
            if request.request_id not in output.num_scheduled_tokens and request.num_computed_tokens == 0:
                waited += 1
            elif scheduled_s is None:
                scheduled_s = time.perf_counter() - arrived
            if self.step_s:
                time.sleep(self.step_s)  # the model's forward pass
            # The Saves sent last step are answered now, every block kept.
            finished_sending = {request_id for request_id, _ in self.sent_saves}
            worker_meta = KvtierWorkerMetadata(saves_over={r: 1 for r, _ in self.sent_saves},
                                               saves_kept=dict(self.sent_saves))
            self.sent_saves = [(job.request_id, len(job.hashes)) for job in output.kv_connector_metadata.saves]
            ids = list(output.num_scheduled_tokens)
            sampled = [[7] if request.num_computed_tokens >= request.num_tokens else [] for _ in ids]
            self.scheduler.update_from_output(output, ModelRunnerOutput(
                req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled,
                kv_connector_output=KVConnectorOutput(finished_sending=finished_sending or None,
                                                      kv_connector_worker_meta=worker_meta)))
        return sum(self.spent), max(self.spent), waited, scheduled_s or 0.0

    def close(self) -> None:
        self.scheduler.connector.shutdown()


def prefill_daemon(socket: str, shape, prompt: list[int]) -> None:
    """Saves the first half of the prompt's blocks, as a worker would have."""
    class _Plain:
        lora_request = None
        cache_salt = None

    hashes = hashing.block_hashes(prompt, BLOCK, extra_keys=request_extra_keys(shape.model_id, _Plain()))
    hashes = hashes[:len(hashes) // 2]
    staging = kvtier_torch.memfd_tensor((len(hashes), shape.block_bytes), torch.uint8, name="bench-staging")
    with kvtier.Client(socket, reconnect=False) as client:
        client.hello(shape.staging_layout(len(hashes)), engine_name="bench")
        client.register_tensor(0, staging)
        client.save("bench-prefill", list(zip(hashes, range(len(hashes)))))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", default="b99a85d", help="git revision of the scheduler side to compare with")
    parser.add_argument("--tokens", default="8192,32768,131072")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", default=None)
    parser.add_argument("--step-ms", type=float, default=5.0, help="each engine step's model time (a sleep)")
    parser.add_argument("--verbose", action="store_true", help="each request's longest calls")
    args = parser.parse_args()
    sizes = [int(t) for t in args.tokens.split(",")]
    from tiny_llama import write_tiny_llama

    model = write_tiny_llama(Path(tempfile.mkdtemp(prefix="kvtier-bench-model-")), num_hidden_layers=1,
                             num_key_value_heads=1, num_attention_heads=1, hidden_size=2, intermediate_size=4,
                             max_position_embeddings=max(sizes) + 64)
    daemon = Kvtierd(["--max-blocks-per-request", str(max(sizes) // BLOCK + 1), "--ram-bytes", "256MiB",
                      "--nvme-bytes", "0"])
    before = scheduler_module_at(args.before)
    results = {}
    rng = random.Random(0)
    try:
        variants = {
            # The revision's own default poll (500 µs then).
            "before": lambda config, shape: before.SchedulerSide(dataclasses.replace(config, lookup_spin_us=500.0),
                                                                 shape, "host"),
            "after": None,
            # The working tree with vLLM's prefix caching and KV events on: kvtier's blocks
            # announced on the stream (kvtier.vllm.events).
            "after+events": None,
        }
        for name, side in variants.items():
            engine = Engine(model, daemon.socket_path, max(sizes), side, args.step_ms / 1000.0,
                            kv_events=name == "after+events")
            try:
                engine.run([rng.randrange(1, 500) for _ in range(4 * BLOCK + 1)])  # warm: connections, imports
                for size in sizes:
                    rows = []
                    for _ in range(args.reps):
                        prompt = [rng.randrange(1, 30000) for _ in range(size)]
                        prefill_daemon(daemon.socket_path, engine.shape, prompt)
                        rows.append(engine.run(prompt))
                        if args.verbose:
                            top = sorted(engine.by_method, key=lambda x: -x[1])[:4]
                            print(name, size, [(n, round(t * 1000, 3)) for n, t in top], file=sys.stderr)
                    results.setdefault(str(size), {})[name] = {
                        "connector_ms": round(1000 * statistics.median(r[0] for r in rows), 3),
                        "longest_call_ms": round(1000 * max(r[1] for r in rows), 3),
                        "steps_waited": statistics.median(r[2] for r in rows),
                        "scheduled_after_ms": round(1000 * statistics.median(r[3] for r in rows), 3)}
            finally:
                engine.close()
    finally:
        daemon.stop()
    print(f"{'tokens':>8} {'before ms':>10} {'after ms':>9} {'after/before':>12} {'longest call before/after ms':>30} "
          f"{'steps waited b/a':>17} {'scheduled after ms b/a':>23}")
    for size, row in results.items():
        b, a = row["before"], row["after"]
        row["ratio"] = round(a["connector_ms"] / b["connector_ms"], 3) if b["connector_ms"] else None
        print(f"{size:>8} {b['connector_ms']:>10.3f} {a['connector_ms']:>9.3f} {row['ratio']:>12} "
              f"{b['longest_call_ms']:>14.3f} / {a['longest_call_ms']:<13.3f} {b['steps_waited']:>8} / {a['steps_waited']:<8} "
              f"{b['scheduled_after_ms']:>10.3f} / {a['scheduled_after_ms']:.3f}")
    print(f"{'tokens':>8} {'events off ms':>14} {'events on ms':>13} {'on/off':>7} {'longest call off/on ms':>24}")
    for size, row in results.items():
        a, e = row["after"], row["after+events"]
        row["events_ratio"] = round(e["connector_ms"] / a["connector_ms"], 3) if a["connector_ms"] else None
        print(f"{size:>8} {a['connector_ms']:>14.3f} {e['connector_ms']:>13.3f} {row['events_ratio']:>7} "
              f"{a['longest_call_ms']:>11.3f} / {e['longest_call_ms']:<11.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"before": args.before, "block": BLOCK, "reps": args.reps,
                                               "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
