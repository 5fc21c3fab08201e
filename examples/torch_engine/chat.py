#!/usr/bin/python3
"""A multi-turn chat with the PyTorch Llama-architecture model, its history kept in kvtierd.

    build/kvtierd &                                   # or scripts/run
    /usr/bin/python3 examples/torch_engine/chat.py [--socket PATH] [--turns N]
    echo "first message\\nsecond" | /usr/bin/python3 examples/torch_engine/chat.py --stdin

Each turn runs twice: on the engine that restores the conversation's prefix from
kvtierd (dropping its own cache between turns), and on one that recomputes the whole
history; it prints the answer and both times to first token. The weights are random,
so the answers are gibberish; what matters is that both engines give the same one.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from checkout import use_checkout

use_checkout()

import kvtier  # noqa: E402
import torch  # noqa: E402

from engine import Conversation, Engine  # noqa: E402
from model import LlamaModel, config_named  # noqa: E402

SCRIPT = [
    "Hi! I pasted our runbook above. What is the first thing to check when the daemon "
    "will not start?",
    "And if the socket exists but engines get Unavailable?",
    "How do I move every idle session to NVMe before maintenance?",
    "What survives a kill -9, and what is lost?",
    "Thanks. Give me the three commands again, one per line.",
    "One more: how do I see which tier a session is in?",
]


def runbook(approximate_tokens: int) -> str:
    """A deterministic system prompt of about `approximate_tokens` byte tokens."""
    lines, size, number = [], 0, 1
    while size < approximate_tokens:
        line = (f"{number}. If step {number} fails, read the daemon's log, check the socket "
                f"permissions, and retry with --log-level debug.\n")
        lines.append(line)
        size += len(line)
        number += 1
    return "Operations runbook for kvtierd.\n" + "".join(lines)


def milliseconds(seconds: float) -> str:
    return f"{seconds * 1000:8.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--socket", help="kvtierd socket (default: $KVTIER_SOCKET or the "
                        "daemon's default)")
    parser.add_argument("--turns", type=int, default=4, help="scripted turns (at most %d)"
                        % len(SCRIPT))
    parser.add_argument("--stdin", action="store_true", help="read one message per line")
    parser.add_argument("--model", default="small", help="small (default) or large")
    parser.add_argument("--seed", type=int, default=0, help="weights seed")
    parser.add_argument("--system-tokens", type=int, default=2048,
                        help="length of the system prompt (a runbook) in tokens")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    parser.add_argument("--keep-session", action="store_true",
                        help="leave the session in kvtierd at exit (kvtierctl sessions)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    messages = (line.strip() for line in sys.stdin) if args.stdin else SCRIPT[:args.turns]
    config = config_named(args.model, args.seed)
    model = LlamaModel(config)
    block_size = 16
    num_blocks = (args.system_tokens + 512 * (len(SCRIPT) if not args.stdin else 64)) \
        // block_size + 64
    session_id = f"chat-{os.getpid()}-{int(time.time())}"
    print(f"model {config.model_id}: {config.kv_bytes_per_token} B of KV per token; "
          f"session {session_id}")
    try:
        restoring = Engine(config, "kvtier", socket_path=args.socket, num_blocks=num_blocks,
                           engine_name="torch-engine-chat", model=model)
    except kvtier.Unavailable as error:
        print(f"chat: {error}\nStart kvtierd first (scripts/run, or build/kvtierd), or "
              f"name its socket with --socket.", file=sys.stderr)
        return 1
    with restoring, Engine(config, "recompute", num_blocks=num_blocks,
                           model=model) as recomputing:
        tokenizer = restoring.tokenizer
        system = tokenizer.message(tokenizer.SYSTEM, runbook(args.system_tokens))
        with_kvtier = Conversation(session_id, list(system))
        without = Conversation(session_id, list(system))
        for turn, message in enumerate(messages, start=1):
            if not message:
                continue
            restored = restoring.turn(with_kvtier, message, args.max_new_tokens)
            recomputed = recomputing.turn(without, message, args.max_new_tokens)
            where = ", ".join(sorted(set(restored.lookup_tiers))) or "-"
            same = "same answer" if restored.tokens == recomputed.tokens else "ANSWERS DIFFER"
            print(f"\nturn {turn}: {message}")
            print(f"  prompt {restored.prompt_tokens} tokens, {restored.restored_tokens} restored "
                  f"from kvtier ({where}), {restored.saved_blocks} blocks saved")
            print(f"  TTFT with kvtier {milliseconds(restored.ttft_s)}   recompute "
                  f"{milliseconds(recomputed.ttft_s)}   "
                  f"({recomputed.ttft_s / restored.ttft_s:.1f}x)   {same}")
            print(f"  answer tokens {restored.tokens}")
            print(f"  answer text   {tokenizer.decode(restored.tokens)!r}")
        if not args.keep_session:
            restoring.end_session(session_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
