"""vLLM (its offline LLM engine, on the CPU) in a process of its own, driven one request
at a time over stdin/stdout: what tests/vllm and bench/vllm_ttft.py run.

    python engine_process.py MODEL_DIR [--kvtier SOCKET] [--whole-request] [--prefix-caching]
        [--kv-transfer-config JSON] [--tensor-parallel-size N] [--hf-overrides JSON]
        [--served-model-name NAME] [--kv-events-config JSON]

Input lines: {"prompt": [token ids], "max_tokens": n, "session": "conv-1" | null,
"priority": 1..100 | null}. Output lines: {"tokens": [...], "wall_s": seconds the
generate call took, "cached_tokens": prompt tokens vLLM did not compute (its prefix
cache's hit plus what a connector loaded), "counters": kvtier.vllm's counters (empty
without --kvtier)}. ``--kv-transfer-config`` replaces the connector configuration
--kvtier makes (a MultiConnector, another connector class); --kvtier SOCKET then only
says kvtier.vllm is in it, for its counters and finish_saves.
With --kvtier the Saves of the finished request are completed after the timed call
(kvtier.vllm.finish_saves), as a server's engine loop would do on its own; with
--background-saves they are not: they go out in the engine steps of the next request
(as in a busy server), which they may then slow down.
The tokenizer is skipped (prompts are token ids); decoding is greedy.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--kvtier", metavar="SOCKET", help="use kvtier.vllm with kvtierd at SOCKET")
    parser.add_argument("--prefix-caching", action="store_true", help="keep vLLM's own prefix cache on")
    parser.add_argument("--whole-request", action="store_true", help="one Load per request, not per layer")
    parser.add_argument("--zero-copy", action="store_true", help="vLLM's cache in a memfd the daemon maps")
    parser.add_argument("--async-load", action="store_true", help="vLLM holds a request while its Load runs")
    parser.add_argument("--kv-cache-bytes", type=int, default=64 << 20)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--model-id", default=None)
    parser.add_argument("--tensor-parallel-size", type=int, default=1,
                        help="TP ranks (vLLM's mp executor: a worker process each)")
    parser.add_argument("--lookup-timeout-ms", type=float, default=None)
    parser.add_argument("--kv-transfer-config", default=None, metavar="JSON",
                        help="vLLM's kv_transfer_config, instead of the one --kvtier makes")
    parser.add_argument("--hf-overrides", default=None, metavar="JSON",
                        help="vLLM's hf_overrides: fields of the model's config replaced (rope, positions)")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--kv-events-config", default=None, metavar="JSON",
                        help="vLLM's kv_events_config: publish KV events (ZMQ) for routers")
    parser.add_argument("--background-saves", action="store_true",
                        help="leave a request's Saves to the next request's engine steps")
    args = parser.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    transfer = None
    if args.kvtier:
        extra = {"socket": args.kvtier, "layerwise": not args.whole_request, "reconnect_ms": 200,
                 "host_zero_copy": args.zero_copy, "async_load": args.async_load}
        if args.model_id:
            extra["model_id"] = args.model_id
        if args.lookup_timeout_ms is not None:
            extra["lookup_timeout_ms"] = args.lookup_timeout_ms
        # A block kvtierd cannot deliver after all is recomputed, never a failed request.
        transfer = KVTransferConfig(kv_connector="KvtierConnector", kv_connector_module_path="kvtier.vllm",
                                    kv_role="kv_both", kv_connector_extra_config=extra,
                                    kv_load_failure_policy="recompute")
    if args.kv_transfer_config:
        transfer = KVTransferConfig(**json.loads(args.kv_transfer_config))
    optional = {}
    if args.hf_overrides:
        optional["hf_overrides"] = json.loads(args.hf_overrides)
    if args.served_model_name:
        optional["served_model_name"] = args.served_model_name
    if args.kv_events_config:
        from vllm.config import KVEventsConfig

        optional["kv_events_config"] = KVEventsConfig(**json.loads(args.kv_events_config))
    llm = LLM(model=args.model, skip_tokenizer_init=True, dtype="float32", max_model_len=args.max_model_len,
              enforce_eager=True, block_size=args.block_size, kv_cache_memory_bytes=args.kv_cache_bytes,
              enable_prefix_caching=args.prefix_caching, kv_transfer_config=transfer, seed=0,
              max_num_batched_tokens=args.max_model_len, tensor_parallel_size=args.tensor_parallel_size,
              distributed_executor_backend="mp" if args.tensor_parallel_size > 1 else None, **optional)
    if args.kvtier:
        import kvtier.vllm
        counters, finish_saves = kvtier.vllm.counters, kvtier.vllm.finish_saves
        if args.background_saves:
            finish_saves = lambda llm: True  # noqa: E731
    else:
        counters, finish_saves = dict, lambda llm: True
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        transfer_params = {}
        if request.get("session"):
            transfer_params["kvtier_session"] = request["session"]
            if request.get("priority") is not None:
                transfer_params["kvtier_priority"] = request["priority"]
        params = SamplingParams(max_tokens=request.get("max_tokens", 8), temperature=0.0, detokenize=False,
                                ignore_eos=True,
                                extra_args={"kv_transfer_params": transfer_params} if transfer_params else None)
        started = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=request["prompt"])], params, use_tqdm=False)
        wall_s = time.perf_counter() - started
        finish_saves(llm)
        print(json.dumps({"tokens": list(out[0].outputs[0].token_ids), "wall_s": wall_s,
                          "cached_tokens": out[0].num_cached_tokens or 0, "counters": counters()}), flush=True)


if __name__ == "__main__":
    main()
