"""kvtier's blocks on vLLM's KV-event stream, for the routers that read it.

Routers in front of vLLM (llm-d's precise prefix-cache scorer, NVIDIA Dynamo's KV router)
send a returning conversation to the node that holds its prefix, judged from vLLM's KV
events (``BlockStored`` / ``BlockRemoved`` with a ``medium``). vLLM announces only its own
GPU blocks; without this, a prefix vLLM evicted looks cold everywhere while kvtierd holds
it. The scheduler side of the connector therefore announces the blocks kvtierd holds for
it through vLLM's connector hook ``take_events`` (the scheduler publishes them with its
own events, once per step):

- a Save's blocks, once every rank's Save is answered, only the prefix kvtierd kept;
- each block with vLLM's own hash for it (the one vLLM's GPU events carry, so a router
  joins the two), its parent's, its token ids, LoRA and extra keys as vLLM's events have
  them;
- once per block: a block already announced is not announced again (a router that
  counts announcements would otherwise never see it leave).

Where a block is, as vLLM's media name it: kvtierd's HBM arena and RAM are ``CPU``
(host-memory weight in the routers: the arena is faster still, but ``GPU`` would mix
with vLLM's own blocks of the same hash, whose removal would then retract kvtier's
claim), NVMe is ``STORAGE``, the remote tier (shared by every node) is ``STORAGE`` with
locality ``REMOTE``, which routers ignore when ranking nodes. ``ownership`` is "kvtier".

When what was announced may be stale (kvtierd restarted or crashed, the connection
was lost), the connector looks every announced block up again once connected and
corrects the stream: removed what kvtierd lost, moved what it holds elsewhere (a kill -9
keeps what reached NVMe). The stream is corrected at the engine's next step: vLLM
publishes only when it steps, and an idle engine does not.

Memory is bounded: at most ``max_blocks`` announced blocks are remembered (their hashes
and token ids, about 200 bytes each); past that the oldest is announced removed and
forgotten, so nothing is ever claimed that cannot be withdrawn. Blocks of another
process of the same model are not announced here (each engine announces what it saved).
"""

from __future__ import annotations

import array
import collections
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import KvtierError

MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"
LOCAL = "LOCAL"
REMOTE = "REMOTE"
OWNERSHIP = "kvtier"
# kvtierd's tiers (as a Lookup names them) -> (medium, locality) on vLLM's stream.
PLACES: dict[str, tuple[str, str]] = {
    "hbm": (MEDIUM_CPU, LOCAL),
    "ram": (MEDIUM_CPU, LOCAL),
    "nvme": (MEDIUM_STORAGE, LOCAL),
    "remote": (MEDIUM_STORAGE, REMOTE),
}
SAVED = "ram"  # where a Save's blocks are when it is answered: kvtierd's memory tiers
RESYNC_TIMEOUT_S = 10.0  # a resynchronisation's Lookups not all answered by then: again
MAX_SAVES_HEARD = 4096  # Saves awaiting their answers, at most (the oldest are given up)


@dataclasses.dataclass(slots=True)
class _Block:
    """What a BlockStored of one block says, kept to announce it again elsewhere."""
    block_hash: Any  # vLLM's ExternalBlockHash (bytes, or int with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)
    parent: Any
    tokens: array.array
    lora_id: int | None
    lora_name: str | None
    extra_keys: Any  # vLLM's per-block event extra keys (untagged), or None
    chain: list[bytes]  # the kvtier keys of the Save that announced it: it is chain[index]
    index: int
    place: tuple[str, str] | None = None  # (medium, locality) announced; None: not yet


class BlockEvents:
    """The announced blocks and the events not yet taken (scheduler thread only)."""

    def __init__(self, block_size: int, ranks: int, max_blocks: int, cache_kind: str | None = None) -> None:
        self._block_size = block_size
        self._cache_kind = cache_kind  # as vLLM's own events name the cache group
        self._ranks = ranks
        self._max_blocks = max(1, max_blocks)
        # kvtier key -> block, announced ones, least recently announced first.
        self._announced: collections.OrderedDict[bytes, _Block] = collections.OrderedDict()
        # request -> (its Save's keys and blocks, ranks whose Save is over, fewest kept,
        # when it was captured).
        self._saving: dict[str, tuple[list[bytes], list[_Block | None], int, int, float]] = {}
        self._events: list[Any] = []
        # A resynchronisation: its Lookups (chain, pending) while they are out.
        self._resync: list[tuple[list[bytes], Any]] | None = None
        self._resync_started_s = 0.0
        self._resync_wanted = False

    def capture(self, request_id: str, request, keys: Sequence[bytes]) -> None:
        """Snapshots what a Save of keys (the request's first blocks) would announce,
        while the request is alive. Blocks already announced are skipped. Needs vLLM's
        block hashes (prefix caching on): without them nothing is announced, as vLLM
        then announces nothing of its own either."""
        hashes = getattr(request, "block_hashes", None) or ()
        count = min(len(keys), len(hashes))
        if count == 0:
            return
        # Imported here: kvtier.vllm's pure parts load without vLLM.
        from vllm.v1.core.kv_cache_utils import (
            generate_block_hash_extra_keys,
            maybe_convert_block_hash,
            to_event_extra_keys,
        )

        tokens = request.all_token_ids
        lora = getattr(request, "lora_request", None)
        chain = list(keys[:count])
        blocks: list[_Block | None] = []
        mm_index = 0
        for i in range(count):
            if keys[i] in self._announced:
                blocks.append(None)
                continue
            start = i * self._block_size
            extra, mm_index = generate_block_hash_extra_keys(request, start, start + self._block_size, mm_index)
            event_extra = to_event_extra_keys([extra])
            blocks.append(_Block(
                block_hash=maybe_convert_block_hash(hashes[i]),
                parent=maybe_convert_block_hash(hashes[i - 1]) if i > 0 else None,
                tokens=array.array("l", tokens[start:start + self._block_size]),
                lora_id=lora.adapter_id if lora else None,
                lora_name=lora.name if lora else None,
                extra_keys=event_extra[0] if event_extra else None, chain=chain, index=i))
        if any(block is not None for block in blocks):
            self._saving[request_id] = (chain, blocks, 0, count, time.monotonic())
            while len(self._saving) > MAX_SAVES_HEARD:  # answers that never came (a worker gone)
                del self._saving[next(iter(self._saving))]

    def save_over(self, request_id: str, ranks: int, kept: int) -> None:
        """ranks more ranks answered the request's Save, the fewest of them keeping the
        first `kept` blocks; once every rank did, those blocks are announced."""
        entry = self._saving.get(request_id)
        if entry is None:
            return
        keys, blocks, over, fewest, since_s = entry
        over, fewest = over + ranks, min(fewest, kept)
        if over < self._ranks:
            self._saving[request_id] = (keys, blocks, over, fewest, since_s)
            return
        del self._saving[request_id]
        self._announce(keys[:fewest], blocks[:fewest])

    def drop(self, request_id: str) -> None:
        """The request's Save will not be heard of (dropped, or its outcome unknown)."""
        self._saving.pop(request_id, None)

    def awaiting(self, within_s: float) -> bool:
        """Whether a Save captured less than within_s ago awaits its answers (vLLM keeps
        stepping while the connector says so, and publishes only when it steps: without
        this an idle engine would announce a Save's blocks only at its next request)."""
        if not self._saving:
            return False
        now = time.monotonic()
        return any(now - entry[4] < within_s for entry in self._saving.values())

    # ---- resynchronising: what kvtierd holds now, after a restart or a reconnect ----

    def want_resync(self) -> None:
        """What was announced may be stale (kvtierd restarted, the connection was lost):
        the next step_resync looks every announced block up again."""
        self._resync_wanted = True

    def step_resync(self, send: Callable[[list[bytes]], Any]) -> None:
        """Runs a resynchronisation one step on. First call: one Lookup per chain of
        announced blocks (send(keys) returns a pending Lookup of that prefix). Once every
        one is answered: each block kvtierd no longer holds (or holds only past a hole in
        its chain) is announced removed, each it holds elsewhere moved. A Lookup that
        fails or is not answered in RESYNC_TIMEOUT_S starts it over."""
        if self._resync is None:
            if not self._resync_wanted:
                return
            self._resync_wanted = False
            longest: dict[int, tuple[list[bytes], int]] = {}
            for block in self._announced.values():
                seen = longest.get(id(block.chain))
                if seen is None or seen[1] <= block.index:
                    longest[id(block.chain)] = (block.chain, block.index + 1)
            if not longest:
                return
            try:
                self._resync = [(chain, send(chain[:length])) for chain, length in longest.values()]
            except KvtierError:
                self._resync_wanted = True  # kvtierd not reachable yet: the next step tries again
                return
            self._resync_started_s = time.monotonic()
            return
        if not all(pending.done() for _, pending in self._resync):
            if time.monotonic() - self._resync_started_s > RESYNC_TIMEOUT_S:
                self._resync, self._resync_wanted = None, True
            return
        found: dict[int, Any] = {}
        for chain, pending in self._resync:
            try:
                found[id(chain)] = pending.result()
            except KvtierError:
                self._resync, self._resync_wanted = None, True
                return
        self._resync = None
        for key, block in list(self._announced.items()):
            result = found.get(id(block.chain))
            if result is None:  # announced after the Lookups went out: its own Save said so
                continue
            place = PLACES.get(result.tiers[block.index]) if block.index < result.hit_count else None
            if place == block.place:
                continue
            self._removed([block.block_hash], block.place)
            if place is None:
                del self._announced[key]
            else:
                block.place = place
                self._stored([block], place)

    def newest_key(self) -> bytes:
        return next(reversed(self._announced))

    def resynchronising(self) -> bool:
        return self._resync is not None or self._resync_wanted

    def take(self) -> list[Any]:
        events, self._events = self._events, []
        return events

    def announced(self) -> int:
        return len(self._announced)

    def _announce(self, keys: list[bytes], blocks: list[_Block | None]) -> None:
        place = PLACES[SAVED]
        run: list[_Block] = []
        for key, block in zip(keys, blocks):
            if block is None or key in self._announced:  # announced meanwhile (another request)
                self._stored(run, place)
                run = []
                continue
            block.place = place
            self._announced[key] = block
            run.append(block)
        self._stored(run, place)
        while len(self._announced) > self._max_blocks:
            _, oldest = self._announced.popitem(last=False)
            self._removed([oldest.block_hash], oldest.place)

    def _stored(self, run: list[_Block], place: tuple[str, str]) -> None:
        """One BlockStored for consecutive blocks of a chain (same LoRA), as vLLM sends."""
        if not run:
            return
        from vllm.distributed.kv_events import BlockStored

        extra = [block.extra_keys for block in run]
        tokens: list[int] = []
        for block in run:
            tokens.extend(block.tokens)
        self._events.append(BlockStored(
            block_hashes=[block.block_hash for block in run], parent_block_hash=run[0].parent,
            token_ids=tokens, block_size=self._block_size, lora_id=run[0].lora_id,
            medium=place[0], lora_name=run[0].lora_name,
            extra_keys=extra if any(e is not None for e in extra) else None,
            group_idx=0, kv_cache_spec_kind=self._cache_kind, locality=place[1], ownership=OWNERSHIP))

    def _removed(self, block_hashes: list[Any], place: tuple[str, str] | None) -> None:
        if not block_hashes or place is None:
            return
        from vllm.distributed.kv_events import BlockRemoved

        self._events.append(BlockRemoved(block_hashes=block_hashes, medium=place[0], group_idx=0,
                                         locality=place[1], ownership=OWNERSHIP))
