"""A vLLM engine process for the tests: greedy chat turns read from stdin, one JSON a line.

    python chat_engine.py MODEL_DIR [--kvtier SOCKET] [--prefix-caching] [--whole-request]

Each input line is {"prompt": [token ids], "max_tokens": n, "session": "conv-1" or null};
each output line is {"tokens": [...], "ttft_s": ..., "counters": {...}} where counters
are kvtier.vllm's (empty without --kvtier). vLLM runs in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), on the CPU, with the tokenizer skipped.
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
    parser.add_argument("--kvtier", metavar="SOCKET")
    parser.add_argument("--prefix-caching", action="store_true")
    parser.add_argument("--whole-request", action="store_true", help="one Load per request")
    parser.add_argument("--kv-cache-bytes", type=int, default=64 << 20)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--model-id", default=None)
    args = parser.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    transfer = None
    if args.kvtier:
        extra = {"socket": args.kvtier, "layerwise": not args.whole_request, "reconnect_ms": 200}
        if args.model_id:
            extra["model_id"] = args.model_id
        transfer = KVTransferConfig(kv_connector="KvtierConnector", kv_connector_module_path="kvtier.vllm",
                                    kv_role="kv_both", kv_connector_extra_config=extra)
    llm = LLM(model=args.model, skip_tokenizer_init=True, dtype="float32", max_model_len=args.max_model_len,
              enforce_eager=True, block_size=32, kv_cache_memory_bytes=args.kv_cache_bytes,
              enable_prefix_caching=args.prefix_caching, kv_transfer_config=transfer, seed=0)
    counters = (lambda: __import__("kvtier.vllm", fromlist=["counters"]).counters()) if args.kvtier else dict
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        turn = json.loads(line)
        extra_args = {}
        if turn.get("session"):
            extra_args["kv_transfer_params"] = {"kvtier_session": turn["session"]}
            if turn.get("priority") is not None:
                extra_args["kv_transfer_params"]["kvtier_priority"] = turn["priority"]
        params = SamplingParams(max_tokens=turn.get("max_tokens", 8), temperature=0.0, detokenize=False,
                                ignore_eos=True, extra_args=extra_args or None)
        started = time.perf_counter()
        first = None
        tokens = []
        # Two passes: a 1-token request gives TTFT; the full turn reuses nothing from it
        # (prefix caching is off unless asked), so both see the same cache state only
        # when asked to measure. Plain turns run once.
        if turn.get("measure_ttft"):
            one = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, ignore_eos=True,
                                 extra_args=extra_args or None)
            llm.generate([TokensPrompt(prompt_token_ids=turn["prompt"])], one, use_tqdm=False)
            first = time.perf_counter() - started
        else:
            out = llm.generate([TokensPrompt(prompt_token_ids=turn["prompt"])], params, use_tqdm=False)
            tokens = list(out[0].outputs[0].token_ids)
        if args.kvtier:
            from kvtier.vllm import finish_saves
            finish_saves(llm)
        print(json.dumps({"tokens": tokens, "ttft_s": first, "wall_s": time.perf_counter() - started,
                          "counters": counters()}), flush=True)


if __name__ == "__main__":
    main()
