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
claim), NVMe is ``STORAGE``, locality ``LOCAL``. A block left only in the remote tier is
withdrawn: every node can read it, so it makes no node warmer. ``ownership`` is None, as
for vLLM's own offloading connector's CPU tier (vLLM names only a secondary offloading
tier there; NVIDIA Dynamo's indexer drops every event that names one).
With tensor parallelism a block is where its slowest rank's shard is, and withdrawn once
any rank's shard is gone (the engine can load it only whole).

kvtierd's own moves (demotion, promotion, eviction, drain) reach the stream through tier
notices (Client.watch_tiers_async, one long poll per rank): each block that changed place
is announced removed from its old medium and stored in its new one, or only removed
when it left the node. A notice for a block whose Save is not announced yet (kvtierd
moved it, or gave a Save's write up to retry it, before the Save's answer reached the
scheduler) cannot be ordered against that answer: its Save is announced, then looked
up again and corrected (at most MAX_EARLY such blocks remembered, for EARLY_S).

When what was announced may be stale (kvtierd restarted or crashed, the connection was
lost, kvtierd dropped notices because they were not taken in time), the connector looks
every announced block up again once connected and corrects the stream: removed what
kvtierd lost, moved what it holds elsewhere (a kill -9 keeps what reached NVMe). The
stream is corrected at the engine's next step: vLLM publishes only when it steps, and
an idle engine does not.

Cost on vLLM's scheduler thread: a Save is recorded as references to the request's own
lists (its tokens, vLLM's block hashes) and the chain of kvtier keys, never copied; the
per-block work (vLLM's hash in the form its events use, the once-only check, the
compact copy) is done when the events are taken, at most ANNOUNCE_BLOCKS_PER_STEP blocks
a step, so a long prompt's announcement is spread over steps instead of stalling one.

Memory is bounded: at most ``max_blocks`` announced blocks are remembered (past that
the oldest are announced removed and forgotten, so nothing is ever claimed that cannot
be withdrawn), each once, by the Save that announced it (its key, vLLM's hash and its
token ids: about 220 bytes with 16-token blocks). Blocks of another process of the
same model are not announced here (each engine announces what it saved).
"""

from __future__ import annotations

import array
import dataclasses
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import KvtierError

MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"
LOCAL = "LOCAL"
OWNERSHIP = None  # the engine's offloading tier itself, not a secondary one
# kvtierd's tiers (as a Lookup or a tier notice names them) -> (medium, locality) on
# vLLM's stream. The remote tier is not there: it is every node's, so a block held only
# there makes no node warmer than another, and it is withdrawn like one not held.
PLACES: dict[str, tuple[str, str]] = {
    "hbm": (MEDIUM_CPU, LOCAL),
    "ram": (MEDIUM_CPU, LOCAL),
    "nvme": (MEDIUM_STORAGE, LOCAL),
}
_PREFERENCE = {(MEDIUM_CPU, LOCAL): 0, (MEDIUM_STORAGE, LOCAL): 1}  # the slower, the higher
SAVED = PLACES["ram"]  # where a Save's blocks are when it is answered: kvtierd's memory tiers
RESYNC_TIMEOUT_S = 10.0  # a resynchronisation's Lookups not all answered by then: again
MAX_SAVES_HEARD = 4096  # Saves awaiting their answers, at most (the oldest are given up)
ANNOUNCE_BLOCKS_PER_STEP = 512  # blocks made into events per take(), at most
MAX_EARLY = 65536  # tier notices kept for blocks not announced yet, at most
EARLY_S = 30.0  # ... for this long: a Save is announced well within it
_SEGMENT_SEQ = itertools.count()
TOKEN_TYPE = "l" if array.array("i").itemsize < 4 else "i"  # 4 bytes a token id (vocabularies < 2**31)


def _hash_converter() -> Callable[[bytes], Any]:
    """vLLM's maybe_convert_block_hash (the form its events carry a BlockHash in), with
    the environment read once: vLLM reads it on every call, which cost 5 µs a block."""
    from vllm import envs

    if not envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES:
        return lambda block_hash: block_hash
    mask = (1 << 64) - 1
    from_bytes = int.from_bytes
    return lambda block_hash: from_bytes(block_hash, "big") & mask


@dataclasses.dataclass(eq=False, slots=True)
class _Segment:
    """A Save as announced: blocks start..end-1 of a request. Until they are all in
    events it refers to the request's own lists (vLLM does not change them once the
    request finished); as they go into events it keeps its own compact copy of those
    blocks alone, and lets the request's lists go once done."""
    source_keys: Sequence[bytes]  # the request's kvtier keys, blocks 0..count-1
    source_hashes: Sequence[Any]  # vLLM's hashes of the request's blocks (BlockHash bytes)
    source_tokens: Sequence[int]  # the request's token ids
    start: int  # the first block not announced when the Save was recorded
    count: int  # blocks the Save covers
    lora_id: int | None
    lora_name: str | None
    first_extra: Any  # block 0's event extra keys (cache salt, LoRA), or None
    extra: Any  # every later block's (LoRA only: no multimodal or embeds are saved)
    parent: Any  # vLLM's hash of block start-1 in event form, None for block 0
    end: int = 0  # blocks start..end-1 were kept: announced, or being announced
    done: int = 0  # blocks start..done-1 went into events
    keys: list[bytes] = dataclasses.field(default_factory=list)  # blocks start..done-1's
    hashes: list[Any] = dataclasses.field(default_factory=list)  # theirs, in event form
    tokens: array.array = dataclasses.field(default_factory=lambda: array.array(TOKEN_TYPE))  # theirs
    places: dict[int, tuple[str, str]] = dataclasses.field(default_factory=dict)  # block -> place, if not SAVED
    verify: bool = False  # tier notices of its blocks came before it was announced
    seq: int = dataclasses.field(default_factory=lambda: next(_SEGMENT_SEQ))  # the order of Saves

    def index_of(self, key: bytes, positions: dict[int, dict[bytes, int]]) -> int:
        """The block `key` is; `positions` caches each segment's key -> block for the
        caller's one pass (not kept: it would cost as much memory as the keys)."""
        mine = positions.get(id(self))
        if mine is None:
            mine = positions[id(self)] = {k: self.start + i for i, k in enumerate(self.keys)}
        return mine[key]

    def place(self, index: int) -> tuple[str, str]:
        return self.places.get(index, SAVED)

    def hash_of(self, index: int) -> Any:
        return self.hashes[index - self.start]

    def parent_of(self, index: int) -> Any:
        return self.parent if index == self.start else self.hashes[index - self.start - 1]


def _slowest(places: Sequence[tuple[str, str] | None]) -> tuple[str, str] | None:
    """Where a block is, given each rank's shard's place: the slowest, None if any is gone."""
    if None in places:
        return None
    return max(places, key=lambda place: _PREFERENCE[place])  # type: ignore[index]


class BlockEvents:
    """The announced blocks and the events not yet taken (scheduler thread only)."""

    def __init__(self, block_size: int, ranks: int, max_blocks: int, cache_kind: str | None = None) -> None:
        self._convert = _hash_converter()
        self._block_size = block_size
        self._ranks = ranks
        self._max_blocks = max(1, max_blocks)
        self._cache_kind = cache_kind  # as vLLM's own events name the cache group
        # kvtier key -> the segment that announced it, oldest first.
        self._announced: dict[bytes, _Segment] = {}
        # request -> (its segment, ranks whose Save is over, fewest kept, when recorded).
        self._saving: dict[str, tuple[_Segment, int, int, float]] = {}
        self._announcing: list[_Segment] = []  # answered, not all in events yet
        self._events: list[Any] = []
        # A resynchronisation: its Lookups (segment, pending) while they are out.
        self._resync: list[tuple[_Segment, Any]] | None = None
        self._resync_started_s = 0.0
        self._resync_wanted = False
        # TP > 1: blocks whose ranks' shards are not all where the block was announced
        # (key -> each rank's place, None: gone), for the blocks tier notices moved.
        self._rank_places: dict[bytes, list[tuple[str, str] | None]] = {}
        # Tier notices of blocks not announced yet: key -> when. A Save announced with
        # one of them is looked up again (_verifying, then its Lookups while out).
        self._early: dict[bytes, float] = {}
        self._verifying: list[_Segment] = []
        self._verify: list[tuple[_Segment, Any]] | None = None
        self._verify_started_s = 0.0
        # While Lookups of a resynchronisation or a verification are out: the keys tier
        # notices told of since (newer than what those Lookups answer).
        self._noticed: set[bytes] | None = None

    # ---- Saves ------------------------------------------------------------------

    def capture(self, request_id: str, request, keys: Sequence[bytes]) -> None:
        """Records what a Save of keys (the request's first blocks) would announce, while
        the request is alive: references, no copies. Needs vLLM's block hashes (prefix
        caching on): without them nothing is announced, as vLLM then announces nothing
        of its own either."""
        hashes = getattr(request, "block_hashes", None) or ()
        count = min(len(keys), len(hashes))
        if count == 0:
            return
        start = self._announced_prefix(keys, count)
        if start == count:
            return
        from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys, to_event_extra_keys

        def extra_of(block: int) -> Any:
            first = block * self._block_size
            extra, _ = generate_block_hash_extra_keys(request, first, first + self._block_size, 0)
            converted = to_event_extra_keys([extra])
            return converted[0] if converted else None

        lora = getattr(request, "lora_request", None)
        segment = _Segment(source_keys=keys, source_hashes=hashes, source_tokens=request.all_token_ids,
                           start=start, count=count,
                           lora_id=lora.adapter_id if lora else None, lora_name=lora.name if lora else None,
                           first_extra=extra_of(0) if start == 0 else None,
                           extra=extra_of(1) if count > 1 else None,
                           parent=self._convert(hashes[start - 1]) if start > 0 else None)
        self._saving[request_id] = (segment, 0, count, time.monotonic())
        while len(self._saving) > MAX_SAVES_HEARD:  # answers that never came (a worker gone)
            del self._saving[next(iter(self._saving))]

    def _announced_prefix(self, keys: Sequence[bytes], count: int) -> int:
        """How many leading blocks are announced already, found by bisection: a chain's
        announced blocks are nearly always a prefix of it (the blocks of the turns before).
        Where they are not, a block found announced later is skipped then."""
        low, high = 0, count
        while low < high:
            middle = (low + high) // 2
            if keys[middle] in self._announced:
                low = middle + 1
            else:
                high = middle
        return low

    def save_over(self, request_id: str, ranks: int, kept: int) -> None:
        """ranks more ranks answered the request's Save, the fewest of them keeping the
        first `kept` blocks; once every rank did, those blocks are announced."""
        entry = self._saving.get(request_id)
        if entry is None:
            return
        segment, over, fewest, since_s = entry
        over, fewest = over + ranks, min(fewest, kept)
        if over < self._ranks:
            self._saving[request_id] = (segment, over, fewest, since_s)
            return
        del self._saving[request_id]
        if fewest > segment.start:
            segment.end, segment.done = fewest, segment.start
            self._announcing.append(segment)

    def drop(self, request_id: str) -> None:
        """The request's Save will not be heard of (dropped, or its outcome unknown)."""
        self._saving.pop(request_id, None)

    def awaiting(self, within_s: float) -> bool:
        """Whether events are still to come soon: a Save recorded less than within_s ago
        awaits its answers, or answered blocks wait to be announced. vLLM keeps stepping
        while the connector says so, and publishes only when it steps: without this an
        idle engine would announce a Save's blocks only at its next request."""
        if self._announcing or self._resync is not None or self.verifying():
            return True
        if not self._saving:
            return False
        now = time.monotonic()
        return any(now - entry[3] < within_s for entry in self._saving.values())

    def take(self) -> list[Any]:
        """The events so far, after announcing up to ANNOUNCE_BLOCKS_PER_STEP more blocks."""
        budget = ANNOUNCE_BLOCKS_PER_STEP
        while self._announcing and budget > 0:
            segment = self._announcing[0]
            budget -= self._announce(segment, min(segment.end, segment.done + budget))
            if segment.done >= segment.end:
                self._announcing.pop(0)
        if len(self._announced) > self._max_blocks:
            self._withdraw_oldest(len(self._announced) - self._max_blocks)
        events, self._events = self._events, []
        return events

    def announced(self) -> int:
        return len(self._announced)

    def newest_key(self) -> bytes:
        return next(reversed(self._announced))

    def _announce(self, segment: _Segment, until: int) -> int:
        """Blocks segment.done..until-1 into BlockStored events (runs of blocks not
        announced by then) and into the segment's own copy; returns how many."""
        first, size = segment.done, self._block_size
        keys = segment.source_keys[first:until]
        tokens = segment.source_tokens[first * size:until * size]
        segment.keys.extend(keys)
        convert = self._convert
        segment.hashes.extend(convert(h) for h in segment.source_hashes[first:until])
        segment.tokens.extend(tokens)
        segment.done = until
        announced = self._announced
        fresh = [key not in announced for key in keys]
        if self._early:  # kvtierd told of some before this answer
            now, early = time.monotonic(), self._early
            told = [early.pop(key, None) for key in itertools.compress(keys, fresh)]
            segment.verify = segment.verify or any(at is not None and now - at <= EARLY_S for at in told)
        announced.update(dict.fromkeys(itertools.compress(keys, fresh), segment))
        index = first
        for is_fresh, run in itertools.groupby(fresh):
            length = sum(1 for _ in run)
            if is_fresh:
                offset = (index - first) * size
                self._stored(segment, index, index + length, SAVED, tokens[offset:offset + length * size])
            index += length
        if until >= segment.end:  # all in events: the request's lists may go
            segment.source_keys = segment.source_hashes = segment.source_tokens = ()
            if segment.verify:
                self._verifying.append(segment)
        return until - first

    # ---- tier notices: kvtierd moved blocks ---------------------------------------

    def tiers_changed(self, rank: int, changes: Sequence[tuple[bytes, str]]) -> None:
        """A rank's tier notices (key, tier now) into events: each announced block that
        changed place is announced removed from its old place and stored in the new one,
        or only removed once it is gone; runs of one Save's blocks go in one event."""
        removed: dict[tuple[str, str], list[Any]] = {}
        stored: list[tuple[_Segment, int, tuple[str, str]]] = []
        positions: dict[int, dict[bytes, int]] = {}
        noticed = self._noticed
        for key, tier in changes:
            if noticed is not None:
                noticed.add(key)
            place = PLACES.get(tier)
            segment = self._announced.get(key)
            if segment is None:
                self._note_early(key)
                continue
            index = segment.index_of(key, positions)
            old = segment.place(index)
            if self._ranks > 1:
                ranks = self._rank_places.get(key) or [old] * self._ranks
                ranks[rank] = place
                place = _slowest(ranks)
                if all(r == place for r in ranks):
                    self._rank_places.pop(key, None)
                else:
                    self._rank_places[key] = ranks
            if place == old:
                continue
            removed.setdefault(old, []).append(segment.hash_of(index))
            if place is None:
                del self._announced[key]
                segment.places.pop(index, None)
                self._rank_places.pop(key, None)
                continue
            if place == SAVED:
                segment.places.pop(index, None)
            else:
                segment.places[index] = place
            stored.append((segment, index, place))
        for old, hashes in removed.items():
            self._removed(hashes, old)
        stored.sort(key=lambda entry: (entry[0].seq, entry[1]))  # a chain's parents first
        run_start = 0
        for i in range(1, len(stored) + 1):
            if i < len(stored):
                (segment, index, place), (last_segment, last_index, last_place) = stored[i], stored[i - 1]
                if segment is last_segment and index == last_index + 1 and place == last_place:
                    continue
            segment, begin, place = stored[run_start]
            self._stored(segment, begin, stored[i - 1][1] + 1, place)
            run_start = i

    def _note_early(self, key: bytes) -> None:
        self._early.pop(key, None)  # the newest last
        self._early[key] = time.monotonic()
        if len(self._early) > MAX_EARLY:  # most are blocks that will never be announced
            del self._early[next(iter(self._early))]

    def verifying(self) -> bool:
        return bool(self._verifying) or self._verify is not None

    def step_verify(self, send: Callable[[list[bytes]], Any]) -> None:
        """Looks up again the Saves announced while tier notices of their blocks had come
        first, and corrects what they announced (as a resynchronisation does, for them)."""
        if self._verify is None:
            if not self._verifying:
                return
            segments, self._verifying = self._verifying, []
            try:
                self._verify = [(s, send(list(s.keys))) for s in segments if s.keys]
            except KvtierError:
                # Not connected: the resynchronisation once it is looks them up anyway
                # (and the engine does not step for them meanwhile).
                self.want_resync()
                return
            self._noticed = set()
            self._verify_started_s = time.monotonic()
            return
        if not all(pending.done() for _, pending in self._verify):
            if time.monotonic() - self._verify_started_s > RESYNC_TIMEOUT_S:
                self._verify = None
                self.want_resync()
            return
        out, self._verify = self._verify, None
        for segment, pending in out:
            try:
                result = pending.result()
            except KvtierError:
                self.want_resync()
                continue
            self._correct(segment, result)
        self._forget_noticed()

    def _withdraw_oldest(self, count: int) -> None:
        """The `count` oldest announced blocks are announced removed and forgotten."""
        count = max(count, self._max_blocks // 16)  # in batches: iterating a dict's front is not free
        victims = list(itertools.islice(self._announced.items(), count))
        for key, _ in victims:
            del self._announced[key]
            self._rank_places.pop(key, None)
        by_place: dict[tuple[str, str], list[Any]] = {}
        positions: dict[int, dict[bytes, int]] = {}
        for key, segment in victims:
            index = segment.index_of(key, positions)
            by_place.setdefault(segment.place(index), []).append(segment.hash_of(index))
            segment.places.pop(index, None)
        for place, hashes in by_place.items():
            self._removed(hashes, place)

    def _stored(self, segment: _Segment, begin: int, end: int, place: tuple[str, str],
                tokens: Sequence[int] | None = None) -> None:
        """One BlockStored for blocks begin..end-1 of a segment's chain, as vLLM sends
        (tokens: theirs, when the caller has them at hand)."""
        from vllm.distributed.kv_events import BlockStored

        size = self._block_size
        if tokens is None:
            offset = (begin - segment.start) * size
            tokens = segment.tokens[offset:offset + (end - begin) * size].tolist()
        extra = [segment.first_extra if i == 0 else segment.extra for i in range(begin, end)]
        self._events.append(BlockStored(
            block_hashes=segment.hashes[begin - segment.start:end - segment.start],
            parent_block_hash=segment.parent_of(begin), token_ids=list(tokens), block_size=size,
            lora_id=segment.lora_id, medium=place[0], lora_name=segment.lora_name,
            extra_keys=extra if any(e is not None for e in extra) else None,
            group_idx=0, kv_cache_spec_kind=self._cache_kind, locality=place[1], ownership=OWNERSHIP))

    def _removed(self, block_hashes: list[Any], place: tuple[str, str]) -> None:
        if not block_hashes:
            return
        from vllm.distributed.kv_events import BlockRemoved

        self._events.append(BlockRemoved(block_hashes=block_hashes, medium=place[0], group_idx=0,
                                         locality=place[1], ownership=OWNERSHIP))

    # ---- resynchronising: what kvtierd holds now, after a restart or a reconnect ----

    def want_resync(self) -> None:
        """What was announced may be stale (kvtierd restarted, the connection was lost):
        the next step_resync looks every announced block up again."""
        self._resync_wanted = True

    def resynchronising(self) -> bool:
        return self._resync is not None or self._resync_wanted

    def step_resync(self, send: Callable[[list[bytes]], Any]) -> None:
        """Runs a resynchronisation one step on. First call: one Lookup per announced
        Save (send(keys) returns a pending Lookup of that prefix of its chain). Once every
        one is answered: each block kvtierd no longer holds (or holds only past a hole in
        its chain) is announced removed, each it holds elsewhere moved. A Lookup that
        fails or is not answered in RESYNC_TIMEOUT_S starts it over."""
        if self._resync is None:
            if not self._resync_wanted:
                return
            self._resync_wanted = False
            segments = list({id(s): s for s in self._announced.values()}.values())
            if not segments:
                return
            try:
                # kvtierd answers for each key in turn until the first it does not hold:
                # a segment's own blocks need not start at block 0.
                self._resync = [(s, send(list(s.keys))) for s in segments if s.keys]
            except KvtierError:
                self._resync_wanted = True  # kvtierd not reachable yet: the next step tries again
                return
            self._resync_started_s = time.monotonic()
            self._noticed = set()
            return
        if not all(pending.done() for _, pending in self._resync):
            if time.monotonic() - self._resync_started_s > RESYNC_TIMEOUT_S:
                self._resync, self._resync_wanted = None, True
            return
        answers = []
        for segment, pending in self._resync:
            try:
                answers.append((segment, pending.result()))
            except KvtierError:
                self._resync, self._resync_wanted = None, True
                return
        self._resync = None
        for segment, result in answers:
            self._correct(segment, result)
        self._forget_noticed()

    def _forget_noticed(self) -> None:
        if self._resync is None and self._verify is None:
            self._noticed = None

    def _correct(self, segment: _Segment, result) -> None:
        """Each block the segment announced and still owns, where the Lookup says it is
        (unless a tier notice told of it after the Lookup went out: that is newer)."""
        noticed = self._noticed or ()
        for offset, key in enumerate(segment.keys):
            if self._announced.get(key) is not segment or key in noticed:
                continue
            index = segment.start + offset
            place = PLACES.get(result.tiers[offset]) if offset < result.hit_count else None
            self._rank_places.pop(key, None)  # the Lookup asked every rank
            old = segment.place(index)
            if place == old:
                continue
            self._removed([segment.hash_of(index)], old)
            if place is None:
                del self._announced[key]
                segment.places.pop(index, None)
                continue
            segment.places[index] = place
            self._stored(segment, index, index + 1, place)
