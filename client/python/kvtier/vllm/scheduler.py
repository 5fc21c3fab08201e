"""The scheduler side of the connector: lookups, sessions, and what each step moves.

Runs on vLLM's scheduler thread, which must never wait on kvtierd:

- ``on_new_request`` sends BeginTurn (for a request with a session) and the request's
  Lookup as soon as it arrives, both without waiting;
- ``get_num_new_matched_tokens`` only polls that Lookup: None ("ask again next step")
  while it is in flight, 0 once it is older than ``lookup_timeout_ms`` or failed;
- a request whose prefix is still being saved (the previous turn, just finished) waits
  for that Save, up to ``save_wait_ms``, then looks up again;
- ``request_finished`` queues a Save of every full block whose KV was computed and
  keeps the blocks (delay free) until the worker reports the Save done.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from typing import Any

from ..errors import KvtierError, NotFound
from ..pending import Pending
from .blocks import BlockShape, request_hashes
from .config import ConnectorConfig
from .link import DaemonLink
from .metadata import COUNTERS, KvtierConnectorMetadata, LoadJob, SaveJob

logger = logging.getLogger("kvtier.vllm")

SESSION_FIELD = "kvtier_session"
PRIORITY_FIELD = "kvtier_priority"


@dataclasses.dataclass
class _Request:
    hashes: list[bytes]
    session_id: str
    priority: int | None
    lookup: Pending | None = None
    lookup_sent_s: float = 0.0
    lookup_blocks: int = 0  # how many hashes the Lookup asked about
    hits: int | None = None  # its answer, once known
    waiting_for_save_since_s: float | None = None
    local_tokens: int = 0  # block-aligned local prefix hit the last match was for
    begin_turn: Pending | None = None
    load_sent: bool = False  # an asynchronous Load went out (vLLM may call again after it)


def _session_of(request) -> tuple[str, int | None]:
    params = getattr(request, "kv_transfer_params", None) or {}
    session = params.get(SESSION_FIELD) or ""
    if not isinstance(session, str):
        session = str(session)
    priority = params.get(PRIORITY_FIELD)
    try:
        priority = None if priority is None else max(1, min(100, int(priority)))
    except (TypeError, ValueError):
        logger.warning("kvtier.vllm: ignoring %s=%r (an int 1..100 expected)", PRIORITY_FIELD, priority)
        priority = None
    return session, priority


class SchedulerSide:
    def __init__(self, config: ConnectorConfig, shape: BlockShape, device: str) -> None:
        self._config = config
        self._shape = shape
        self._block = shape.tokens_per_block
        layout = shape.staging_layout(1)  # Lookups only: no region is ever registered
        self._link = DaemonLink(config.socket, config.reconnect_ms,
                                lambda c: c.hello(layout, engine_name="vllm-scheduler", device=device),
                                "scheduler")
        self._requests: dict[str, _Request] = {}
        self._loads: list[LoadJob] = []
        self._saves: list[SaveJob] = []
        # Hashes whose Save was queued and not yet reported done, counted per request.
        self._saving: collections.Counter[bytes] = collections.Counter()
        self._saving_by_request: dict[str, list[bytes]] = {}
        self._closers: list[Pending] = []

    # ---- arrival ----------------------------------------------------------------

    def on_new_request(self, request) -> None:
        session, priority = _session_of(request)
        if getattr(request, "mm_features", None):
            return  # multimodal prompts: their KV depends on more than the token ids
        state = _Request(hashes=[], session_id=session, priority=priority)
        self._requests[request.request_id] = state
        client = self._link.get()
        if client is None:
            return
        if session:
            try:
                state.begin_turn = client.begin_turn_async(session)
                COUNTERS.add("begin_turns")
            except KvtierError:
                COUNTERS.add("begin_turn_errors")
        self._send_lookup(request, state, client)

    def _send_lookup(self, request, state: _Request, client) -> None:
        max_blocks = max(0, (request.num_tokens - 1) // self._block)
        state.hashes = request_hashes(self._shape.model_id, request,
                                      request.all_token_ids[:max_blocks * self._block],
                                      self._block, state.hashes)
        state.hits, state.lookup = None, None
        state.lookup_blocks = max_blocks
        if max_blocks == 0:
            state.hits = 0
            return
        try:
            state.lookup = client.lookup_async(state.hashes[:max_blocks])
            state.lookup_sent_s = time.monotonic()
            COUNTERS.add("lookups")
        except KvtierError:
            COUNTERS.add("lookup_errors")
            state.hits = 0

    # ---- matching ---------------------------------------------------------------

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        state = self._requests.get(request.request_id)
        if state is None:  # multimodal, or a request vLLM showed us only now
            if getattr(request, "mm_features", None):
                return 0, False
            self.on_new_request(request)
            state = self._requests.get(request.request_id)
            if state is None:
                return 0, False
        self._reap_closers()
        max_blocks = max(0, (request.num_tokens - 1) // self._block)
        local_blocks = num_computed_tokens // self._block
        if max_blocks <= local_blocks:
            return 0, False
        if max_blocks != state.lookup_blocks and state.lookup is None and state.hits is not None:
            # The request grew (resumed after preemption): ask about its new length.
            client = self._link.get()
            if client is None:
                return 0, False
            self._send_lookup(request, state, client)
        # Its own prefix still being saved (the turn before, just finished): wait for it,
        # then ask again, so the Lookup sees it.
        if any(self._saving[h] for h in state.hashes[local_blocks:max_blocks]):
            now = time.monotonic()
            if state.waiting_for_save_since_s is None:
                state.waiting_for_save_since_s = now
                COUNTERS.add("lookup_waits_for_save")
            if (now - state.waiting_for_save_since_s) * 1000.0 < self._config.save_wait_ms:
                state.lookup, state.hits = None, None
                return None, False
        elif state.waiting_for_save_since_s is not None and state.lookup is None and state.hits is None:
            client = self._link.get()
            state.waiting_for_save_since_s = None
            if client is None:
                return 0, False
            self._send_lookup(request, state, client)
        if state.hits is None:
            if state.lookup is None:
                client = self._link.get()
                if client is None:
                    return 0, False
                self._send_lookup(request, state, client)
                if state.hits is not None:
                    return self._matched(state, local_blocks, max_blocks)
            if not self._lookup_answered(state):
                if (time.monotonic() - state.lookup_sent_s) * 1000.0 < self._config.lookup_timeout_ms:
                    return None, False
                COUNTERS.add("lookup_timeouts")
                state.lookup, state.hits = None, 0  # dropped: its reply is discarded
                return 0, False
            try:
                state.hits = state.lookup.result().hit_count
                COUNTERS.add("lookup_hit_blocks", state.hits)
            except KvtierError:
                COUNTERS.add("lookup_errors")
                state.hits = 0
            state.lookup = None
        return self._matched(state, local_blocks, max_blocks)

    def _lookup_answered(self, state: _Request) -> bool:
        """Polls the Lookup, spinning for at most lookup_spin_us the first time: a reply
        is usually that close, and "ask again" costs the request a whole engine step."""
        if state.lookup.done():
            return True
        spin_until = state.lookup_sent_s + self._config.lookup_spin_us / 1e6
        while time.monotonic() < spin_until:
            if state.lookup.done():
                return True
        return False

    def _matched(self, state: _Request, local_blocks: int, max_blocks: int) -> tuple[int, bool]:
        external_blocks = min(state.hits or 0, max_blocks) - local_blocks
        if external_blocks <= 0:
            return 0, False
        state.local_tokens = local_blocks * self._block
        return external_blocks * self._block, self._config.async_load

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        if num_external_tokens <= 0:
            return
        state = self._requests.get(request.request_id)
        if state is None or state.load_sent:
            return  # an asynchronous Load's second call (blocks for the rest): nothing to load
        first = state.local_tokens // self._block
        count = num_external_tokens // self._block
        block_ids = list(blocks.get_block_ids()[0][first:first + count])
        hashes = state.hashes[first:first + count]
        if len(block_ids) != count or len(hashes) != count:
            logger.warning("kvtier.vllm: request %s: %d blocks allocated for %d external; not loading",
                           request.request_id, len(block_ids), count)
            return
        self._loads.append(LoadJob(request.request_id, state.session_id, hashes, block_ids,
                                   asynchronous=self._config.async_load))
        state.load_sent = self._config.async_load
        # Asked again (the Load failed and vLLM recomputes, or a preemption): ask kvtierd
        # again too, rather than promise the same blocks.
        state.hits, state.lookup = None, None

    def build_connector_meta(self, scheduler_output) -> KvtierConnectorMetadata:
        meta = KvtierConnectorMetadata(loads=self._loads, saves=self._saves)
        self._loads, self._saves = [], []
        return meta

    # ---- finishing ----------------------------------------------------------------

    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        state = self._requests.pop(request.request_id, None)
        if state is None or self._link.get() is None:
            if state is not None and state.lookup is not None:
                state.lookup = None
            return False, None
        computed = min(int(request.num_computed_tokens), len(request.all_token_ids))
        count = min(computed // self._block, len(block_ids))
        if count == 0:
            return False, None
        hashes = request_hashes(self._shape.model_id, request, request.all_token_ids[:count * self._block],
                                self._block, state.hashes)
        anonymous = not state.session_id
        session = state.session_id or f"vllm-request:{request.request_id}"
        self._saves.append(SaveJob(request.request_id, session, anonymous, state.priority, hashes,
                                   list(block_ids[:count])))
        self._saving.update(hashes)
        self._saving_by_request[request.request_id] = hashes
        return True, None

    def update_connector_output(self, connector_output) -> None:
        for request_id in connector_output.finished_sending or ():
            hashes = self._saving_by_request.pop(request_id, None)
            if hashes:
                self._saving.subtract(hashes)
                self._saving = +self._saving  # drop zero counts

    def _reap_closers(self) -> None:
        self._closers = [p for p in self._closers if not p.done()]

    def close_session_later(self, session_id: str) -> None:
        client = self._link.get()
        if client is None:
            return
        try:
            self._closers.append(client.close_session_async(session_id))
        except (KvtierError, NotFound):
            pass

    def shutdown(self) -> None:
        self._link.close()
