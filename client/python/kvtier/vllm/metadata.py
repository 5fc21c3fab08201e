"""What the scheduler side tells the worker side each step, and the counters both keep."""

from __future__ import annotations

import collections
import dataclasses
import threading

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata, KVConnectorWorkerMetadata


@dataclasses.dataclass
class LoadJob:
    """Load hashes[i] into vLLM block block_ids[i] (a prefix: stops at the first miss)."""
    request_id: str
    session_id: str  # "" for a request without a session
    hashes: list[bytes]
    block_ids: list[int]
    asynchronous: bool = False  # vLLM holds the request until get_finished reports it
    tiers: list[str] = dataclasses.field(default_factory=list)  # where the Lookup saw each block


@dataclasses.dataclass
class FailedLoad:
    """Blocks the scheduler promised vLLM but could not plan a Load for (an internal
    error): the worker reports them failed (vLLM recomputes them) and, for an
    asynchronous Load, the request finished receiving."""
    request_id: str
    block_ids: list[int]
    asynchronous: bool


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
    failed_loads: list[FailedLoad] = dataclasses.field(default_factory=list)
    dropped_saves: list[str] = dataclasses.field(default_factory=list)  # report finished, save nothing


@dataclasses.dataclass
class KvtierWorkerMetadata(KVConnectorWorkerMetadata):
    """What the workers tell the scheduler side each step: the requests whose Save is
    over on a rank (kvtierd answered it, or it was dropped), one count per rank, and how
    many of the request's first blocks kvtierd kept (the fewest of the ranks reporting).

    On the staged path a request is reported finished sending as soon as its blocks
    are copied into the staging buffer (vLLM reuses them at once), before kvtierd has
    the bytes; until every rank's Save is over, a next turn of the same prefix waits for
    it (SchedulerSide.update_connector_output). vLLM merges these over the ranks of a
    step: counts add up, kept blocks take the smallest."""
    saves_over: dict[str, int] = dataclasses.field(default_factory=dict)
    saves_kept: dict[str, int] = dataclasses.field(default_factory=dict)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        merged = dict(self.saves_over)
        for request_id, count in getattr(other, "saves_over", {}).items():
            merged[request_id] = merged.get(request_id, 0) + count
        kept = dict(self.saves_kept)
        for request_id, blocks in getattr(other, "saves_kept", {}).items():
            kept[request_id] = min(blocks, kept.get(request_id, blocks))
        return KvtierWorkerMetadata(saves_over=merged, saves_kept=kept)


TIERS = ("hbm", "ram", "nvme", "remote")  # where kvtierd's Lookup says a block is


class Counters:
    """Process-wide counters of the connector (both roles), for metrics and tests.

    SCHEDULER_NAMES are counted by the scheduler side, LINK_NAMES and internal_errors
    by both, the rest by the worker side (what each role reports to vLLM's stats)."""

    SCHEDULER_NAMES = (
        "lookups", "lookup_hit_blocks", "lookup_timeouts", "lookup_errors", "lookup_waits_for_save",
        "begin_turns", "begin_turn_errors",
    ) + tuple(f"lookup_hit_blocks_{tier}" for tier in TIERS)
    LINK_NAMES = ("daemon_unavailable", "connects")
    NAMES = SCHEDULER_NAMES + LINK_NAMES + (
        "internal_errors",
        "loads", "loaded_blocks", "load_failed_blocks", "load_timeouts", "load_errors",
        "loaded_bytes", "layer_loads", "layer_waits",
        "saves", "saved_blocks", "save_partial", "save_dropped_blocks", "save_errors", "save_timeouts",
        "saved_bytes", "staging_waits", "zero_copy_caches",
    ) + tuple(f"loaded_blocks_{tier}" for tier in TIERS)
    WORKER_NAMES = NAMES[len(SCHEDULER_NAMES + LINK_NAMES) + 1:]

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(self.NAMES, 0)

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._values[name] += amount

    def add_by_tier(self, prefix: str, tiers: list[str]) -> None:
        """Adds one to f"{prefix}_{tier}" for each tier in tiers (kvtierd's names)."""
        counts = collections.Counter(tiers)  # counted in C: a long prompt has thousands
        with self._lock:
            for tier, count in counts.items():
                if tier in TIERS:
                    self._values[f"{prefix}_{tier}"] += count

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)


COUNTERS = Counters()
