"""A chat engine over model.py that keeps its conversations' KV in kvtierd between turns.

One turn, as a production engine runs it (mode "kvtier"):

  1. a message arrives for a session → ``begin_turn`` (kvtierd starts promoting the
     session's blocks; NotFound just means a new session);
  2. tokenise the whole conversation and hash its full blocks (``kvtier.hashing``,
     with the model id as extra key);
  3. ``lookup`` + ``load`` the longest held prefix into freshly allocated cache blocks;
  4. prefill only the tokens after it, decode greedily;
  5. ``save`` the full blocks (end_of_turn), then free the blocks, wiped: the next
     turn's prefix has to come back from kvtierd.

Two other modes share every line but steps 1, 3 and 5, for comparison:
  "memory"    keeps the session's full blocks in its own cache across turns and reuses
              the longest equal prefix (an engine with a local prefix cache and room
              to spare): the reference a restored prefix must match bit for bit;
  "recompute" prefills the whole conversation every turn.

The last prompt token is always prefilled (it yields the first logits), so a prompt
whose every block is held still recomputes its last block from the last token on.

Errors: no daemon when the engine starts → kvtier.Unavailable from the constructor (the
caller says so). Unavailable later (kvtierd stopped, crashed or restarting) → the turn
recomputes its prefix, and its save is skipped: the engine keeps serving. The client
reconnects by itself on a later call, repeating hello and the cache region, so the
turns after kvtierd is back hit again (whatever reached NVMe survived the restart, and
the next save stores the rest). A Load that stops early (DataLoss, NotFound) → compute
from there on. Cache blocks go back to the cache on every path, errors included.
Thread-safety: none; one engine per thread.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import time
from typing import Sequence

import torch

from model import ModelConfig, LlamaModel, PagedKVCache, config_named

REGION_ID = 0
MODES = ("kvtier", "memory", "recompute")


class Tokenizer:
    """Bytes of UTF-8 text are tokens 0..255; a few role markers follow."""

    SYSTEM, USER, ASSISTANT, END = 256, 257, 258, 259

    def __init__(self, vocab_size: int):
        if vocab_size <= self.END:
            raise ValueError(f"vocab_size {vocab_size} leaves no room for the role markers")

    def message(self, role: int, text: str) -> list[int]:
        return [role, *text.encode("utf-8"), self.END]

    def user_turn(self, text: str) -> list[int]:
        """A user message and the marker that asks the model to answer."""
        return [*self.message(self.USER, text), self.ASSISTANT]

    def decode(self, tokens: Sequence[int]) -> str:
        names = {self.SYSTEM: "<system>", self.USER: "<user>", self.ASSISTANT: "<assistant>",
                 self.END: "<end>"}
        out, pending = [], bytearray()
        for token in tokens:
            if token < 256:
                pending.append(token)
                continue
            out.append(pending.decode("utf-8", errors="replace"))
            pending.clear()
            out.append(names.get(token, f"<{token}>"))
        out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)


@dataclasses.dataclass
class Conversation:
    """A session: its id and every token so far (system prompt, messages, answers)."""

    session_id: str
    tokens: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class TurnResult:
    tokens: list[int]  # the answer, greedy
    logits: list[torch.Tensor]  # the logits each answer token was chosen from
    ttft_s: float  # message arrival → first token's logits
    prompt_tokens: int  # the conversation including this message
    restored_tokens: int  # of those, taken from a held prefix (kvtier or own memory)
    restore_s: float = 0.0  # of ttft_s: begin_turn, hashing, lookup and load
    lookup_hits: int = 0  # kvtier: leading blocks the daemon held
    lookup_tiers: list[str] = dataclasses.field(default_factory=list)
    saved_blocks: int = 0  # kvtier: blocks this turn's save copied
    deduplicated_blocks: int = 0  # kvtier: blocks the daemon already held
    unsaved_blocks: int = 0  # kvtier: blocks past a partial Save (no room): recomputed

    def logits_digest(self) -> str:
        """SHA-256 of the logits' bytes: equal digests ⇔ bit-identical logits."""
        digest = hashlib.sha256()
        for row in self.logits:
            digest.update(row.cpu().numpy().tobytes())
        return digest.hexdigest()

    def to_json(self) -> dict:
        fields = dataclasses.asdict(self)
        fields.pop("logits")
        fields["logits_sha256"] = self.logits_digest()
        return fields


class Engine:
    def __init__(self, config: ModelConfig, mode: str = "kvtier", *,
                 socket_path: str | None = None, num_blocks: int = 256, block_size: int = 16,
                 engine_name: str = "torch-engine", model: LlamaModel | None = None,
                 device: str = "cpu"):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.config = config
        self.mode = mode
        self.device = torch.device(device)
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {device!r}")
        self.model = model if model is not None else LlamaModel(config, self.device)
        if self.model.device != self.device:
            raise ValueError(f"the model is on {self.model.device}, the engine on {self.device}")
        self.tokenizer = Tokenizer(config.vocab_size)
        self.socket_path = socket_path
        self.engine_name = engine_name
        self.hash_extra_keys = config.model_id.encode()
        self._kept: dict[str, list[int]] = {}  # memory mode: session → its full blocks
        self._kept_tokens: dict[str, list[int]] = {}  # ... and the tokens they hold
        self.client = None
        allocate = None
        if mode == "kvtier" and self.device.type == "cpu":
            # kvtierd maps a CPU cache through its memfd; a CUDA cache is registered by
            # pointer (legacy IPC or VMM, whichever the allocation is).
            import kvtier.torch
            allocate = lambda shape, dtype: kvtier.torch.memfd_tensor(shape, dtype,
                                                                     name="torch-engine-kv")
        self.cache = PagedKVCache(config, num_blocks, block_size, allocate_tensor=allocate,
                                  device=self.device)
        if mode == "kvtier":
            # No daemon at start is the caller's to report (Unavailable); a daemon that
            # goes away later only makes turns recompute.
            self.connect()

    # ---- kvtier connection -----------------------------------------------------------

    def connect(self) -> None:
        """Connects: a new Client, hello with this cache's layout, the cache region. Once
        is enough: the client rides through daemon restarts by itself."""
        import kvtier
        import kvtier.torch
        self.disconnect()
        layout = kvtier.Layout(
            model_id=self.config.model_id, num_layers=self.config.num_layers,
            num_kv_heads=self.config.num_kv_heads, head_dim=self.config.head_dim, dtype="fp32",
            tokens_per_block=self.cache.block_size, num_blocks=self.cache.num_blocks,
            planes=kvtier.torch.vllm_planes(self.cache.layers(), REGION_ID))
        client = kvtier.Client(self.socket_path)
        try:
            self.hello = client.hello(layout, engine_name=self.engine_name,
                                      device="cuda" if self.device.type == "cuda" else "host")
            client.register_tensor(REGION_ID, self.cache.tensor)
        except BaseException:
            client.close()
            raise
        self.client = client

    def disconnect(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            try:
                client.close()
            except Exception:  # a dead daemon: the connection is gone either way
                pass

    def close(self) -> None:
        self.disconnect()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _block_hashes(self, tokens: list[int]) -> list[bytes]:
        """Chained hashes of the full blocks; the model id as extra key keeps another
        model's blocks apart even under an equal layout."""
        import kvtier.hashing
        return kvtier.hashing.block_hashes(tokens, self.cache.block_size,
                                           extra_keys=self.hash_extra_keys)

    def _chunks(self, items: list) -> list[list]:
        step = self.hello.max_blocks_per_request or len(items) or 1
        return [items[i:i + step] for i in range(0, len(items), step)]

    # ---- one turn ----------------------------------------------------------------------

    def turn(self, conversation: Conversation, message: str,
             max_new_tokens: int = 16) -> TurnResult:
        """Answers `message` in `conversation` and appends both to it."""
        started = time.perf_counter()
        prompt = conversation.tokens + self.tokenizer.user_turn(message)
        if self.mode == "kvtier":
            self._begin_turn(conversation.session_id)
        hashes = self._block_hashes(prompt) if self.mode == "kvtier" else []
        result = TurnResult(tokens=[], logits=[], ttft_s=0.0, prompt_tokens=len(prompt),
                            restored_tokens=0)
        table, held_blocks = self._prefix(conversation.session_id, prompt, hashes,
                                          self.cache.blocks_for(len(prompt) + max_new_tokens),
                                          result)
        result.restore_s = time.perf_counter() - started
        try:
            start = min(held_blocks * self.cache.block_size, len(prompt) - 1)
            result.restored_tokens = start
            logits = self.model.forward(torch.tensor(prompt[start:]), start, table, self.cache)
            result.ttft_s = time.perf_counter() - started
            position = len(prompt)
            while True:
                token = int(torch.argmax(logits))
                result.tokens.append(token)
                result.logits.append(logits)
                if len(result.tokens) == max_new_tokens or token == self.tokenizer.END:
                    break
                logits = self.model.forward(torch.tensor([token]), position, table, self.cache)
                position += 1
        except BaseException:
            self.cache.free(table, wipe=True)
            raise
        conversation.tokens = prompt + result.tokens
        computed_tokens = len(prompt) + len(result.tokens) - 1  # the last answer token has no KV yet
        self._keep(conversation, table, computed_tokens // self.cache.block_size, result)
        if result.tokens[-1] != self.tokenizer.END:
            conversation.tokens.append(self.tokenizer.END)
        return result

    def end_session(self, session_id: str) -> None:
        """The conversation is over: kvtierd drops the session's references (blocks
        shared with other sessions stay); memory mode frees the blocks it kept."""
        if self.mode == "memory":
            self.cache.free(self._kept.pop(session_id, []))
            self._kept_tokens.pop(session_id, None)
        elif self.mode == "kvtier":
            import kvtier
            try:
                self.client.close_session(session_id)
            except (kvtier.NotFound, kvtier.Unavailable):
                pass  # never saved, or nothing to tell a daemon that is gone

    def _begin_turn(self, session_id: str) -> None:
        import kvtier
        try:
            self.client.begin_turn(session_id)
        except kvtier.NotFound:
            pass  # a new session: nothing held yet
        except kvtier.Unavailable:
            pass  # no daemon: this turn recomputes

    def _synchronize(self) -> None:
        """A CUDA cache: kvtierd's copies run on its own streams, so the engine's writes
        to the blocks a Save or Load names must be finished first (the client's
        contract); a Load's blocks are in place when it returns."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _prefix(self, session_id: str, prompt: list[int], hashes: list[bytes],
                blocks_needed: int, result: TurnResult) -> tuple[list[int], int]:
        """A block table for the turn whose leading blocks hold the longest prefix
        available; returns it and how many blocks that prefix is."""
        if self.mode == "memory":
            kept = self._kept.pop(session_id, [])
            kept_tokens = self._kept_tokens.pop(session_id, [])
            size = self.cache.block_size
            reuse = 0
            while reuse < len(kept) and (reuse + 1) * size <= len(prompt) and \
                    kept_tokens[reuse * size:(reuse + 1) * size] == \
                    prompt[reuse * size:(reuse + 1) * size]:
                reuse += 1
            self.cache.free(kept[reuse:])
            return kept[:reuse] + self.cache.allocate(blocks_needed - reuse), reuse
        table = self.cache.allocate(blocks_needed)
        if self.mode == "recompute":
            return table, 0
        self._synchronize()  # the wipe of a freed block must not land after kvtierd's copy
        import kvtier
        try:
            hits, tiers = 0, []
            for chunk in self._chunks(hashes):
                found = self.client.lookup(chunk)
                hits += found.hit_count
                tiers += found.tiers
                if found.hit_count < len(chunk):
                    break
            result.lookup_hits, result.lookup_tiers = hits, tiers
            loaded = 0
            for chunk in self._chunks(list(zip(hashes[:hits], table[:hits]))):
                done = self.client.load(session_id, chunk)
                loaded += done.loaded_count
                if done.loaded_count < len(chunk):
                    break  # DataLoss or evicted meanwhile: compute from here
            return table, loaded
        except kvtier.Unavailable:
            return table, 0  # kvtierd is away: recompute the whole prompt
        except BaseException:
            self.cache.free(table)  # the caller never sees the table: give it back
            raise

    def _keep(self, conversation: Conversation, table: list[int], full_blocks: int,
              result: TurnResult) -> None:
        """End of turn: hands the full blocks to kvtier or keeps them, frees the rest."""
        if self.mode == "memory":
            self._kept[conversation.session_id] = table[:full_blocks]
            self._kept_tokens[conversation.session_id] = \
                conversation.tokens[:full_blocks * self.cache.block_size]
            self.cache.free(table[full_blocks:])
            return
        if self.mode == "kvtier":
            import kvtier
            hashes = self._block_hashes(
                conversation.tokens[:full_blocks * self.cache.block_size])
            chunks = self._chunks(list(zip(hashes, table[:full_blocks])))
            self._synchronize()  # kvtierd copies what the model's kernels have written
            try:
                for index, chunk in enumerate(chunks):
                    saved = self.client.save(conversation.session_id, chunk,
                                             end_of_turn=index == len(chunks) - 1)
                    result.saved_blocks += saved.stored
                    result.deduplicated_blocks += saved.deduplicated
                    if saved.saved < len(chunk):
                        # A partial Save: kvtierd kept the prefix that fit. The rest
                        # is recomputed next turn; later chunks would follow a hole.
                        result.unsaved_blocks += full_blocks - (index * len(chunks[0]) + saved.saved)
                        break
            except (kvtier.Unavailable, kvtier.ResourceExhausted) as error:
                print(f"torch-engine: turn not saved to kvtier: {error}", file=sys.stderr)
            finally:
                # Wiped, so a later turn can only see this KV again through kvtierd.
                self.cache.free(table, wipe=True)
            return
        self.cache.free(table)


def main(argv: list[str] | None = None) -> int:
    """One engine process: runs a conversation and prints each turn as a JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--socket", help="kvtierd socket (default: $KVTIER_SOCKET or the "
                        "daemon's default)")
    parser.add_argument("--mode", choices=MODES, default="kvtier")
    parser.add_argument("--model", default="small", help="model config: small or large")
    parser.add_argument("--seed", type=int, default=0, help="weights seed (another model)")
    parser.add_argument("--session", default="torch-engine-session")
    parser.add_argument("--system", default="", help="system prompt")
    parser.add_argument("--message", action="append", default=[],
                        help="a user message; repeat for more turns")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--num-blocks", type=int, default=256)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    parser.add_argument("--logits-out", help="torch.save every turn's answer logits here")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the model and its KV cache live (cuda: kvtierd --device cuda)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    config = config_named(args.model, args.seed)
    with Engine(config, args.mode, socket_path=args.socket, num_blocks=args.num_blocks,
                engine_name=f"torch-engine-{os.getpid()}", device=args.device) as engine:
        conversation = Conversation(args.session)
        if args.system:
            conversation.tokens = engine.tokenizer.message(engine.tokenizer.SYSTEM, args.system)
        all_logits = []
        for message in args.message:
            result = engine.turn(conversation, message, args.max_new_tokens)
            all_logits.append(torch.stack(result.logits).cpu())
            print(json.dumps(result.to_json()), flush=True)
        if args.logits_out:
            torch.save(all_logits, args.logits_out)
    return 0


if __name__ == "__main__":
    from checkout import use_checkout
    use_checkout()
    sys.exit(main())
