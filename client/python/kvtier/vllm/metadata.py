"""What the scheduler side tells the worker side each step, and the counters both keep."""

from __future__ import annotations

import dataclasses
import threading

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata


@dataclasses.dataclass
class LoadJob:
    """Load hashes[i] into vLLM block block_ids[i] (a prefix: stops at the first miss)."""
    request_id: str
    session_id: str  # "" for a request without a session
    hashes: list[bytes]
    block_ids: list[int]
    asynchronous: bool = False  # vLLM holds the request until get_finished reports it


@dataclasses.dataclass
class SaveJob:
    """Save vLLM block block_ids[i] as hashes[i] under session_id, then report
    request_id finished sending (vLLM frees the blocks then)."""
    request_id: str
    session_id: str
    anonymous: bool  # a per-request session, closed once the Save is acknowledged
    priority: int | None
    hashes: list[bytes]
    block_ids: list[int]


@dataclasses.dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    loads: list[LoadJob] = dataclasses.field(default_factory=list)
    saves: list[SaveJob] = dataclasses.field(default_factory=list)


class Counters:
    """Process-wide counters of the connector (both roles), for metrics and tests."""

    NAMES = (
        "lookups", "lookup_hit_blocks", "lookup_timeouts", "lookup_errors", "lookup_waits_for_save",
        "begin_turns", "begin_turn_errors",
        "loads", "loaded_blocks", "load_failed_blocks", "load_timeouts", "load_errors",
        "loaded_bytes", "layer_loads", "layer_waits",
        "saves", "saved_blocks", "save_partial", "save_dropped_blocks", "save_errors", "save_timeouts",
        "saved_bytes", "staging_waits", "zero_copy_caches", "daemon_unavailable", "connects",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(self.NAMES, 0)

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._values[name] += amount

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)


COUNTERS = Counters()
