"""The scheduler side of the connector: lookups, sessions, and what each step moves.

Runs on vLLM's scheduler thread, which must never wait on kvtierd, nor on a long
prompt's hashing:

- ``on_new_request`` sends BeginTurn (for a request with a session) and the request's
  Lookup as soon as it arrives, both without waiting. A prompt of up to
  ``INLINE_HASH_TOKENS`` new tokens is hashed right there; a longer one on the
  connector's hashing thread (``_Hasher``), a chunk of ``HASH_CHUNK_TOKENS`` at a time,
  which sends the Lookup once the hashes are ready and hands both back through a queue
  the scheduler thread drains (only the scheduler thread touches a request's state);
- ``get_num_new_matched_tokens`` only polls that Lookup: None ("ask again next step")
  while it is being hashed or in flight (polling for at most ``lookup_spin_us``, capped
  at ``MAX_SPIN_US``), 0 once it is older than ``lookup_timeout_ms`` or failed;
- a request whose Lookup stops short of a block that a finished request is still
  saving (the previous turn, usually) waits for that Save, up to ``save_wait_ms``, and
  then looks up again;
- ``request_finished`` queues a Save of every full block whose KV was computed and
  keeps the blocks (delay free) until the worker reports the Save done.

Requests whose KV depends on more than their token ids (multimodal inputs, prompt
embeddings) are neither looked up nor saved.

Tensor parallelism: each TP rank's worker keeps its shard of a block under its own
layout and session (``BlockShape.session``: ``{session}@tp{rank}of{size}``). The
scheduler speaks for every rank: one connection per rank (each hello with that rank's
layout), one Lookup per rank whose hits are the fewest any rank holds (a rank whose
Lookup fails or times out holds none), and a BeginTurn for each rank's session.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

from .. import hashing
from ..errors import InvalidArgument, KvtierError, NotSupported
from ..pending import Pending
from ..results import LookupResult
from .blocks import BlockShape, request_extra_keys, request_hashes, session_id_of
from .config import ConnectorConfig
from .events import BlockEvents
from .link import DaemonLink, LinkGroup
from .metadata import COUNTERS, TIERS, FailedLoad, KvtierConnectorMetadata, KvtierWorkerMetadata, LoadJob, SaveJob

logger = logging.getLogger("kvtier.vllm")

SESSION_FIELD = "kvtier_session"
PRIORITY_FIELD = "kvtier_priority"
MAX_LATENCIES = 4096  # latency observations kept between two stats reports
# New tokens a request's Lookup may hash on the scheduler thread (about half a
# millisecond); more go to the hashing thread. Also that thread's chunk: the longest it
# holds the GIL between two native hashing calls (which release it) is one chunk's
# conversion to int64 (about 0.25 ms).
INLINE_HASH_TOKENS = 8192
HASH_CHUNK_TOKENS = 8192
PROBE_S = 1.0  # with blocks announced, kvtierd is asked something at least this often
WATCH_WAIT_MS = 1000  # a tier notice poll waits this long for a change, then is sent again
WATCH_CHANGES = 1024  # tier notices a poll takes, at most (the rest come with the next)
MAX_SPIN_US = 100.0  # the longest get_num_new_matched_tokens polls a Lookup


@dataclasses.dataclass
class _Request:
    hashes: list[bytes]
    session_id: str
    priority: int | None
    lookup: Pending | _RankLookups | None = None
    lookup_sent_s: float = 0.0
    lookup_blocks: int = 0  # how many hashes the Lookup asked about
    hits: int | None = None  # its answer, once known
    tiers: list[str] = dataclasses.field(default_factory=list)  # where each hit block is
    waiting_for_save_since_s: float | None = None
    local_tokens: int = 0  # block-aligned local prefix hit the last match was for
    async_loading: bool = False  # an asynchronous Load went out and was not reported yet
    loading_block_ids: frozenset[int] = frozenset()  # the vLLM blocks that asynchronous Load fills
    load_failed: bool = False  # blocks of its asynchronous Load failed: not loaded again
    wait_from: int = 0  # first block neither kvtierd nor vLLM held, kept while waiting for a Save
    hashing: int | None = None  # the hashing thread's job for its Lookup, until handed back


@dataclasses.dataclass
class _HashJob:
    """Hash blocks len(known).. of tokens up to num_blocks, then send the Lookups."""
    request_id: str
    job_id: int
    tokens: Sequence[int]  # the request's token ids (a prefix of them never changes)
    known: list[bytes]
    num_blocks: int
    extra_keys: str
    clients: list


@dataclasses.dataclass
class _Hashed:
    """A _HashJob's result, handed back to the scheduler thread."""
    request_id: str
    job_id: int
    hashes: list[bytes]
    lookup: Pending | _RankLookups | None  # None: it could not be sent (error says why)
    sent_s: float
    error: BaseException | None = None


class _Hasher:
    """The connector's hashing thread: long prompts' block hashes, chunk by chunk
    (libkvtier's kvtier_block_hashes runs without the GIL), and their Lookups."""

    def __init__(self, block: int) -> None:
        self._block = block
        self._jobs: queue.SimpleQueue[_HashJob | None] = queue.SimpleQueue()
        self.results: queue.SimpleQueue[_Hashed] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="kvtier-scheduler-hash", daemon=True)
        self._thread.start()

    def submit(self, job: _HashJob) -> None:
        self._jobs.put(job)

    def close(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            hashes: list[bytes] = list(job.known)
            try:
                chunk = max(1, HASH_CHUNK_TOKENS // self._block)
                while len(hashes) < job.num_blocks:
                    first, end = len(hashes), min(job.num_blocks, len(hashes) + chunk)
                    hashes += hashing.block_hashes(job.tokens[first * self._block:end * self._block], self._block,
                                                   extra_keys=job.extra_keys, parent=hashes[-1] if hashes else None)
                lookup = _send_lookups(job.clients, hashes)
                self.results.put(_Hashed(job.request_id, job.job_id, hashes, lookup, time.monotonic()))
            except Exception as error:  # handed back: counted, 0 hits
                self.results.put(_Hashed(job.request_id, job.job_id, hashes, None, 0.0, error))


def _send_lookups(clients: list, hashes: list[bytes]) -> Pending | _RankLookups:
    """One Lookup per TP rank's client, as one (KvtierError if one cannot be sent)."""
    pendings = [client.lookup_async(hashes) for client in clients]
    return pendings[0] if len(pendings) == 1 else _RankLookups(pendings)


class _RankLookups:
    """A request's Lookups, one per TP rank, as one: done once every rank answered; its
    hits are the fewest any rank holds (a rank whose Lookup failed fails it: 0 hits),
    each block's tier the slowest any rank holds it in."""

    def __init__(self, pendings: list[Pending]) -> None:
        self._pendings = pendings

    def done(self) -> bool:
        return all(pending.done() for pending in self._pendings)

    def result(self) -> LookupResult:
        results, error = [], None
        for pending in self._pendings:  # every reply taken, even after an error
            try:
                results.append(pending.result())
            except KvtierError as failed:
                error = error or failed
        if error is not None:
            raise error
        hits = min(result.hit_count for result in results)
        tiers = results[0].tiers[:hits]
        if any(result.tiers[:hits] != tiers for result in results[1:]):  # usually all the same
            rank = {tier: i for i, tier in enumerate(TIERS)}
            tiers = [max((result.tiers[i] for result in results), key=lambda tier: rank.get(tier, len(TIERS)))
                     for i in range(hits)]
        return LookupResult(hit_count=hits, tiers=tiers)


def _session_of(request) -> tuple[str, int | None]:
    params = getattr(request, "kv_transfer_params", None) or {}
    if not isinstance(params, dict):
        return "", None
    session = session_id_of(params.get(SESSION_FIELD))
    priority = params.get(PRIORITY_FIELD)
    if priority is not None:
        try:
            number = float(priority)
            if not math.isfinite(number):
                raise ValueError(priority)
            priority = max(1, min(100, int(number)))
        except (TypeError, ValueError, OverflowError):
            logger.warning("kvtier.vllm: ignoring %s=%r (an int 1..100 expected)", PRIORITY_FIELD, priority)
            priority = None
    return session, priority


def _request_limit(clients) -> int:
    """The most blocks kvtierd takes in one request, the smallest any rank's Hello named."""
    limits = [getattr(getattr(client, "hello_info", None), "max_blocks_per_request", 0) for client in clients]
    return min([limit for limit in limits if limit] or [1 << 30])


def _cacheable(request) -> bool:
    """False when the request's KV depends on more than its token ids."""
    return not getattr(request, "mm_features", None) and getattr(request, "prompt_embeds", None) is None


class SchedulerSide:
    def __init__(self, config: ConnectorConfig, shape: BlockShape, device: str, kv_events: bool = False,
                 cache_kind: str | None = None) -> None:
        self._config = config
        self._shape = shape
        self._block = shape.tokens_per_block
        self._async_load = config.async_load_for(device)
        # One connection per TP rank, each with that rank's layout (Lookups only: no
        # region is ever registered); with one rank, the shape as it is.
        self._ranks = [shape] if shape.tp_size <= 1 else [shape.for_rank(r) for r in range(shape.tp_size)]
        self._link = LinkGroup([self._rank_link(rank, device) for rank in self._ranks])
        self._link.wait_first_attempt(2.0)  # start-up: so the first requests can hit
        self._requests: dict[str, _Request] = {}
        self._loads: list[LoadJob] = []
        self._saves: list[SaveJob] = []
        self._failed_loads: list[FailedLoad] = []  # promised Loads that could not be planned
        # The hashes of each Save queued and not yet over on every rank, by request;
        # how many ranks said it is over (KvtierWorkerMetadata); and, once vLLM had its
        # blocks back, when: an entry whose acknowledgement never comes (a hung daemon)
        # is forgotten save_wait_ms later, the longest any request waits for it anyway.
        self._saving_by_request: dict[str, list[bytes]] = {}
        self._saves_over: dict[str, int] = {}
        self._saving_released_s: dict[str, float] = {}
        self._hasher: _Hasher | None = None  # started by the first long prompt
        self._hash_jobs = itertools.count(1)
        self._spin_s = min(config.lookup_spin_us, MAX_SPIN_US) / 1e6
        # Requests the connector gave up on after an internal error: 0 hits, no Save.
        self._bypass: set[str] = set()
        self.lookup_seconds: list[float] = []  # Lookup latencies since the last stats report
        # kvtier's blocks on vLLM's KV-event stream, when vLLM publishes one.
        self._events = BlockEvents(self._block, max(1, shape.tp_size), config.kv_events_max_blocks,
                                   cache_kind) if kv_events else None
        self._link_marks: tuple | None = None  # (client, reconnects) per rank, at the last step
        self._probed_s = 0.0
        # Each rank's tier notice poll and the connection it went out on (its client's
        # reconnects then), None: to send; _watching is False once kvtierd said it has
        # no tier notices (until the next connection: it may have been upgraded).
        self._watches: list[tuple[Pending, int] | None] = [None] * len(self._ranks)
        self._watching = True

    def _rank_link(self, rank: BlockShape, device: str) -> DaemonLink:
        layout = rank.staging_layout(1)
        role = "scheduler" if rank.tp_size <= 1 else f"scheduler-tp{rank.tp_rank}"
        return DaemonLink(self._config.socket, self._config.reconnect_ms,
                          lambda c: c.hello(layout, engine_name="vllm-scheduler", device=device), role)

    def _max_blocks(self, request) -> int:
        """Blocks a hit may cover: whole blocks, at least one prompt token left to compute,
        and no more than the daemon takes in one request."""
        return min(max(0, (request.num_tokens - 1) // self._block), _request_limit(self._link.get() or ()))

    # ---- arrival ----------------------------------------------------------------

    def on_new_request(self, request) -> None:
        if not _cacheable(request):
            return
        session, priority = _session_of(request)
        state = _Request(hashes=[], session_id=session, priority=priority)
        self._requests[request.request_id] = state
        clients = self._link.get()
        if clients is None:
            return
        if session:
            for rank, client in zip(self._ranks, clients):  # every rank's shard moves up
                try:
                    client.begin_turn_async(rank.session(session))  # its reply is not needed: dropped
                    COUNTERS.add("begin_turns")
                except KvtierError:
                    COUNTERS.add("begin_turn_errors")
        self._send_lookup(request, state, clients)

    def _send_lookup(self, request, state: _Request, clients) -> None:
        max_blocks = self._max_blocks(request)
        state.hits, state.lookup = None, None
        state.lookup_blocks = max_blocks
        if max_blocks == 0:
            state.hits = 0
            return
        if (max_blocks - len(state.hashes)) * self._block > INLINE_HASH_TOKENS:
            # A long prompt: hashed, and its Lookup sent, on the hashing thread.
            if self._hasher is None:
                self._hasher = _Hasher(self._block)
            state.hashing = next(self._hash_jobs)
            self._hasher.submit(_HashJob(request.request_id, state.hashing, request.all_token_ids,
                                         state.hashes[:max_blocks], max_blocks,
                                         request_extra_keys(self._shape.model_id, request), clients))
            return
        state.hashes = request_hashes(self._shape.model_id, request, request.all_token_ids, self._block,
                                      state.hashes, num_blocks=max_blocks)
        try:
            state.lookup = _send_lookups(clients, state.hashes[:max_blocks])
            state.lookup_sent_s = time.monotonic()
            COUNTERS.add("lookups")
        except KvtierError:
            COUNTERS.add("lookup_errors")
            state.hits = 0

    def _take_hashed(self) -> None:
        """Hands the hashing thread's results to their requests (scheduler thread only)."""
        if self._hasher is None:
            return
        while True:
            try:
                done = self._hasher.results.get_nowait()
            except queue.Empty:
                return
            state = self._requests.get(done.request_id)
            if state is None or state.hashing != done.job_id:
                continue  # finished or given up meanwhile: its reply is dropped
            state.hashing = None
            state.hashes = done.hashes
            if done.lookup is not None:
                state.lookup, state.lookup_sent_s = done.lookup, done.sent_s
                COUNTERS.add("lookups")
            else:
                if not isinstance(done.error, KvtierError):
                    COUNTERS.add("internal_errors")
                    logger.error("kvtier.vllm: hashing request %s failed; it is computed", done.request_id,
                                 exc_info=done.error)
                COUNTERS.add("lookup_errors")
                state.hits = 0

    # ---- matching ---------------------------------------------------------------

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        if request.request_id in self._bypass:
            return 0, False
        state = self._requests.get(request.request_id)
        if state is None:  # not cacheable, or a request vLLM showed us only now
            if not _cacheable(request):
                return 0, False
            self.on_new_request(request)
            state = self._requests.get(request.request_id)
            if state is None:
                return 0, False
        self._take_hashed()
        if state.hashing is not None:
            return None, False  # its hashes are on their way
        local_blocks = num_computed_tokens // self._block
        if self._max_blocks(request) <= local_blocks or state.load_failed:
            # After a failed asynchronous Load vLLM asks again; answering with the same
            # hits could fail the same way for ever: it computes them instead.
            return 0, False
        if state.hits is None and state.lookup is None:
            if state.waiting_for_save_since_s is not None and self._still_waiting_for_save(state):
                return None, False
            clients = self._link.get()
            if clients is None:
                return 0, False
            self._send_lookup(request, state, clients)  # asked again: a preemption, a failed Load
            if state.hashing is not None:
                return None, False
        if state.hits is None:
            lookup = state.lookup
            if lookup is None:  # not reached: _send_lookup sets hits, hashing or lookup
                return 0, False
            if not self._lookup_answered(lookup, state.lookup_sent_s):
                if (time.monotonic() - state.lookup_sent_s) * 1000.0 < self._config.lookup_timeout_ms:
                    return None, False
                COUNTERS.add("lookup_timeouts")
                state.lookup, state.hits = None, 0  # dropped: its reply is discarded
                return 0, False
            try:
                result = lookup.result()
                state.hits, state.tiers = result.hit_count, list(result.tiers)
                COUNTERS.add("lookup_hit_blocks", state.hits)
                COUNTERS.add_by_tier("lookup_hit_blocks", state.tiers)
                if len(self.lookup_seconds) < MAX_LATENCIES:
                    self.lookup_seconds.append(time.monotonic() - state.lookup_sent_s)
            except KvtierError:
                COUNTERS.add("lookup_errors")
                state.hits = 0
            state.lookup = None
        # The hits stop at a block a finished request is still saving (the turn before,
        # just finished): wait for that Save and ask again, so the Lookup sees it. Only
        # past what vLLM holds itself (its prefix-cache hit): those blocks need no Save.
        state.wait_from = max(state.hits, local_blocks)
        if self._saving_past(state):
            if state.waiting_for_save_since_s is None:
                state.waiting_for_save_since_s = time.monotonic()
                COUNTERS.add("lookup_waits_for_save")
            if self._still_waiting_for_save(state):
                state.hits = None  # looked up again once the Save is reported
                return None, False
        state.waiting_for_save_since_s = None
        return self._matched(state, local_blocks, state.lookup_blocks)

    def _still_waiting_for_save(self, state: _Request) -> bool:
        """A block past the last Lookup's hits and vLLM's own hit is still being saved,
        and the request has waited less than save_wait_ms for it."""
        if state.waiting_for_save_since_s is None:
            return False
        waited_ms = (time.monotonic() - state.waiting_for_save_since_s) * 1000.0
        return waited_ms < self._config.save_wait_ms and self._saving_past(state)

    def _saving_past(self, state: _Request) -> bool:
        """Whether a Save in flight holds a block of the request from wait_from up to
        lookup_blocks. A chained hash names its whole prefix, and a Save is always a
        request's blocks 0..n: so some block from wait_from on is being saved exactly
        when block wait_from is, at the same index of that Save's hashes. One look per
        Save in flight, however long the prompt."""
        index = state.wait_from
        if index >= min(state.lookup_blocks, len(state.hashes)) or not self._saving_by_request:
            return False
        digest = state.hashes[index]
        return any(len(saving) > index and saving[index] == digest for saving in self._saving_by_request.values())

    def _lookup_answered(self, lookup: Pending | _RankLookups, sent_s: float) -> bool:
        """Polls the Lookup, spinning for at most lookup_spin_us after it was sent: a
        reply is usually that close, and "ask again" costs the request an engine step."""
        if lookup.done():
            return True
        spin_until = min(sent_s + self._spin_s, time.monotonic() + self._spin_s)
        while time.monotonic() < spin_until:
            if lookup.done():
                return True
        return False

    def _matched(self, state: _Request, local_blocks: int, max_blocks: int) -> tuple[int, bool]:
        external_blocks = min(state.hits or 0, max_blocks) - local_blocks
        if external_blocks <= 0:
            return 0, False
        state.local_tokens = local_blocks * self._block
        return external_blocks * self._block, self._async_load

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        # vLLM calls this a second time after an asynchronous Load, with 0 external tokens.
        if num_external_tokens <= 0:
            return
        state = self._requests.get(request.request_id)
        if state is None:
            return
        first = state.local_tokens // self._block
        count = num_external_tokens // self._block
        block_ids = list(blocks.get_block_ids()[0][first:first + count])
        hashes = state.hashes[first:first + count]
        if len(block_ids) != count or len(hashes) != count:
            # Promised to vLLM already: those blocks are reported failed, not left unfilled.
            logger.warning("kvtier.vllm: request %s: %d blocks allocated for %d external; not loading",
                           request.request_id, len(block_ids), count)
            self.abandon_load(request, blocks, num_external_tokens)
            return
        self._loads.append(LoadJob(request.request_id, state.session_id, hashes, block_ids,
                                   asynchronous=self._async_load, tiers=state.tiers[first:first + count]))
        state.async_loading = self._async_load
        state.loading_block_ids = frozenset(block_ids) if self._async_load else frozenset()
        # Asked again (the Load failed and vLLM recomputes, or a preemption): ask kvtierd
        # again too, rather than promise the same blocks.
        state.hits, state.lookup = None, None

    def build_connector_meta(self, scheduler_output) -> KvtierConnectorMetadata:
        # The queues are emptied last: until the metadata is out, salvage_meta has them.
        meta = KvtierConnectorMetadata(loads=list(self._loads), saves=list(self._saves),
                                       failed_loads=list(self._failed_loads))
        self._loads.clear()
        self._saves.clear()
        self._failed_loads.clear()
        return meta

    # ---- finishing ----------------------------------------------------------------

    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        if request.request_id in self._bypass:
            self._bypass.discard(request.request_id)
            self._requests.pop(request.request_id, None)
            return False, None
        state = self._requests.pop(request.request_id, None)
        if state is None or not _cacheable(request):
            return False, None
        if state.async_loading:
            # Aborted while its Load runs: vLLM holds the blocks until the Load is
            # reported, and some are not filled yet. Nothing of it is saved.
            return False, None
        if self._link.get() is None:
            return False, None
        computed = min(int(request.num_computed_tokens), len(request.all_token_ids))
        count = min(computed // self._block, len(block_ids))
        if count == 0:
            return False, None
        # The Lookup's hashes, extended by what was computed since (never hashed again).
        hashes = request_hashes(self._shape.model_id, request, request.all_token_ids, self._block, state.hashes,
                                num_blocks=count)
        anonymous = not state.session_id
        session = state.session_id or f"vllm-request:{request.request_id}"
        self._saves.append(SaveJob(request.request_id, session, anonymous, state.priority, hashes,
                                   list(block_ids[:count])))
        self._saving_by_request[request.request_id] = hashes
        if self._events is not None:
            self._events.capture(request.request_id, request, hashes)
        return True, None

    def update_connector_output(self, connector_output) -> None:
        invalid = connector_output.invalid_block_ids or ()
        if invalid:
            for state in self._requests.values():
                if state.async_loading and not state.loading_block_ids.isdisjoint(invalid):
                    state.load_failed = True
        for request_id in connector_output.finished_recving or ():
            received = self._requests.get(request_id)
            if received is not None:
                received.async_loading = False
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        if not isinstance(meta, KvtierWorkerMetadata):
            meta = KvtierWorkerMetadata()
        for request_id, count in meta.saves_over.items():
            if self._events is not None:
                self._events.save_over(request_id, count, meta.saves_kept.get(request_id, 0))
            if request_id not in self._saving_by_request:
                continue
            count += self._saves_over.get(request_id, 0)
            if count >= self._shape.tp_size:  # over on every rank
                self._release_saving(request_id)
            else:
                self._saves_over[request_id] = count
        now = time.monotonic()
        for request_id in connector_output.finished_sending or ():
            if request_id in self._saving_by_request:
                self._saving_released_s.setdefault(request_id, now)
        if self._saving_released_s:
            limit_s = self._config.save_wait_ms / 1000.0
            for request_id, since_s in list(self._saving_released_s.items()):
                if now - since_s >= limit_s:
                    self._release_saving(request_id)

    # ---- after an internal error (connector.py) ------------------------------------
    # Each leaves the books as vLLM sees them: what vLLM was promised is reported
    # failed, what it holds for a Save is reported finished.

    def forget(self, request_id: str) -> None:
        """Gives up on a request: 0 hits from now on, and no Save when it finishes."""
        self._requests.pop(request_id, None)
        self._bypass.add(request_id)

    def abandon_load(self, request, blocks, num_external_tokens: int) -> None:
        """vLLM counts num_external_tokens of the request as loaded (it was told so) but
        no Load was planned: its Load, if queued, goes; its blocks are reported failed."""
        request_id = request.request_id
        self._loads[:] = [job for job in self._loads if job.request_id != request_id]
        state = self._requests.get(request_id)
        all_ids = list(blocks.get_block_ids()[0])
        count = max(0, num_external_tokens) // self._block
        if state is not None:
            first = state.local_tokens // self._block
            block_ids = all_ids[first:first + count]
        else:  # where vLLM's own hit ends is unknown: every block it may count as computed
            block_ids = all_ids
        self.forget(request_id)
        self._failed_loads.append(FailedLoad(request_id, block_ids, self._async_load))

    def salvage_meta(self) -> KvtierConnectorMetadata:
        """The step's metadata when building it failed: its Loads are reported failed
        and its Saves finished (dropped)."""
        loads, saves, failed = list(self._loads), list(self._saves), list(self._failed_loads)
        self._loads.clear()
        self._saves.clear()
        self._failed_loads.clear()
        failed += [FailedLoad(job.request_id, list(job.block_ids), job.asynchronous) for job in loads]
        for job in loads:
            self.forget(job.request_id)
        return KvtierConnectorMetadata(failed_loads=failed, dropped_saves=[job.request_id for job in saves])

    def drop_save(self, request_id: str) -> None:
        """request_finished failed (vLLM frees the blocks now): no Save of them may go out."""
        self._saves[:] = [job for job in self._saves if job.request_id != request_id]
        if self._events is not None:
            self._events.drop(request_id)
        self._release_saving(request_id)
        self._requests.pop(request_id, None)
        self._bypass.discard(request_id)

    def forget_released_saves(self) -> None:
        """Every worker's Saves are answered (finish_saves made sure): the Saves vLLM has
        its blocks back from are over, whether or not their acknowledgements came yet."""
        for request_id in list(self._saving_released_s):
            self._release_saving(request_id)

    def has_pending_push_work(self) -> bool:
        """True while a Save whose blocks are to be announced awaits its answers, for at
        most save_timeout_ms, or tier notices are in (vLLM steps, and publishes the
        events, only while it has work)."""
        if self._events is None:
            return False
        if self._events.awaiting(self._config.save_timeout_ms / 1000.0):
            return True
        return self._watching and any(watch is not None and watch[0].done() for watch in self._watches)

    def take_events(self) -> list:
        """The KV events since the last call (vLLM publishes them with its own). A
        connection kvtierd dropped (a restart, a crash) makes what was announced suspect:
        once connected again, every announced block is looked up and the stream corrected."""
        if self._events is None:
            return []
        clients = self._link.get()
        if clients is not None:
            marks = tuple((id(client), client.reconnects) for client in clients)
            if marks != self._link_marks:
                if self._link_marks is not None:
                    self._events.want_resync()
                self._link_marks = marks
                self._watching = True  # a new connection: perhaps a kvtierd with notices
                # A poll sent on an older connection is lost with it: subscribe again.
                self._watches = [w if w is not None and len(self._watches) == len(clients)
                                 and w[1] == client.reconnects else None
                                 for w, client in zip(self._watches, clients)]
            if self._watching:
                self._watch(clients)  # first: subscribed before a resynchronisation looks
            else:
                self._probe(clients)
            if self._events.resynchronising():
                limit = _request_limit(clients)  # blocks past it are not looked up: withdrawn
                self._events.step_resync(lambda keys: _send_lookups(clients, keys[:limit]))
            if self._events.verifying():
                limit = _request_limit(clients)
                self._events.step_verify(lambda keys: _send_lookups(clients, keys[:limit]))
        return self._events.take()

    def _watch(self, clients) -> None:
        """Each rank's tier notices into events, and its poll sent again. A poll that
        failed (the connection broke) is sent again, which connects again (a resync
        follows); a kvtierd without tier notices leaves the probe to notice restarts."""
        assert self._events is not None
        for rank, client in enumerate(clients):
            watch = self._watches[rank]
            if watch is not None:
                if not watch[0].done():
                    continue
                self._watches[rank] = None
                try:
                    notices = watch[0].result()
                except NotSupported:
                    self._stop_watching()
                    return
                except InvalidArgument as error:
                    if "unknown request kind" in str(error):  # a kvtierd that predates WatchTiers
                        self._stop_watching()
                        return
                    notices = None
                except KvtierError:
                    notices = None
                if notices is not None:
                    if notices.resync:
                        self._events.want_resync()
                    self._events.tiers_changed(rank, notices.changes)
            try:
                pending = client.watch_tiers_async(WATCH_WAIT_MS, WATCH_CHANGES)
            except NotSupported:
                self._stop_watching()
                return
            except KvtierError:
                continue  # not connected: the next step tries again
            self._watches[rank] = (pending, client.reconnects)

    def _stop_watching(self) -> None:
        """kvtierd has no tier notices: the probe notices restarts instead."""
        self._watching = False
        self._watches = [None] * len(self._watches)

    def _probe(self, clients) -> None:
        """The client library notices a lost connection, and connects again, only when it
        is used: with blocks announced, it is used at least every PROBE_S (a Lookup of
        one announced block, its answer not needed), so a kvtierd that restarted while
        the engine only decodes is noticed too."""
        assert self._events is not None
        now = time.monotonic()
        if now - self._probed_s < PROBE_S or not self._events.announced():
            return
        self._probed_s = now
        for client in clients:
            try:
                client.lookup_async([self._events.newest_key()])  # its reply is not needed: dropped
            except KvtierError:
                pass

    def saves_in_flight(self) -> int:
        """Requests whose Save is not yet over on every rank (for tests and tools)."""
        return len(self._saving_by_request)

    def reset_saving(self) -> None:
        """update_connector_output failed: which Saves are in flight is unknown, so no
        request waits for one (a miss at worst)."""
        self._saving_by_request.clear()
        self._saves_over.clear()
        self._saving_released_s.clear()

    def _release_saving(self, request_id: str) -> None:
        self._saving_by_request.pop(request_id, None)
        self._saves_over.pop(request_id, None)
        self._saving_released_s.pop(request_id, None)

    def shutdown(self) -> None:
        if self._hasher is not None:
            self._hasher.close()
        self._link.close()
