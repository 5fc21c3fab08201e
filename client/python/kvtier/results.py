"""The values kvtier.Client returns. Plain frozen dataclasses."""

from __future__ import annotations

import dataclasses

from .errors import KvtierError


@dataclasses.dataclass(frozen=True)
class HelloInfo:
    """What kvtierd answered to hello."""

    layout_digest: int  # equal digests share blocks
    block_bytes: int  # one logical block: the sum of the layout's plane bytes
    namespace: str  # where this connection's blocks live (from the engine's uid)
    max_blocks_per_request: int  # longer save/lookup/load lists are refused
    device: str  # the daemon's backend: "host" (memfd regions) or "cuda"
    gpu_uuids: tuple[str, ...]  # cuda: the GPUs the daemon serves ("GPU-…")
    device_name: str = ""  # "host" or the GPU models, for logs
    protocol_version: int = 0


@dataclasses.dataclass(frozen=True)
class BlockPriority:
    """A retention priority (1..100) for blocks[first : first + count] of one save,
    overriding the session's: keep a system prompt (high), let a failed tool call go
    first (low); 0 clears a priority given before. ``duration_s``: how long it holds
    (None: while the blocks are held)."""

    first: int
    count: int
    priority: int
    duration_s: float | None = None


@dataclasses.dataclass(frozen=True)
class SaveResult:
    """What a Save kept: ``saved`` (stored + deduplicated) leading blocks of it.

    Fewer than the Save's blocks when the daemon ran out of room (its tiers full of
    blocks sessions hold): a partial Save keeps the longest prefix that fits, perhaps
    none, and the engine recomputes the rest next turn. A turn saved in several Saves
    stops at the first short one.
    """

    stored: int  # blocks copied into the daemon by this save
    deduplicated: int  # blocks it already held: nothing copied

    @property
    def saved(self) -> int:
        """Leading blocks of the Save the daemon holds now."""
        return self.stored + self.deduplicated


@dataclasses.dataclass(frozen=True)
class LookupResult:
    hit_count: int  # leading hashes held and readable
    tiers: list[str]  # where each of the first hit_count is: "hbm", "ram", "nvme" or "remote"


@dataclasses.dataclass(frozen=True)
class TierNotices:
    """Blocks of this engine's layout that changed place on the daemon's node since the
    last answer (Client.watch_tiers_async), each with where it is now: "hbm", "ram",
    "nvme", or "none" (no longer on this node). ``resync``: notices were dropped (the
    engine asked too seldom): look up again every block you keep a belief about."""

    changes: list[tuple[bytes, str]]
    resync: bool


@dataclasses.dataclass(frozen=True)
class LoadResult:
    """How much of the prefix was restored. Blocks past loaded_count hold unspecified
    bytes: the engine computes those tokens."""

    loaded_count: int  # leading blocks restored into the engine's blocks
    stop_reason: KvtierError | None  # why the prefix ended early (NotFound, DataLoss,
    # ...), not raised; None when every block asked for was restored


@dataclasses.dataclass(frozen=True)
class BeginTurnResult:
    known_blocks: int  # blocks the session references
    promoted_blocks: int  # of those, moves toward HBM started


@dataclasses.dataclass(frozen=True)
class TierStats:
    capacity_bytes: int
    used_bytes: int
    blocks: int


@dataclasses.dataclass(frozen=True)
class Stats:
    """Counters and tier occupancy of the caller's namespace (as kvtierctl status)."""

    tiers: dict[str, TierStats]  # "hbm", "ram", "nvme"; capacity 0 when not configured
    sessions_active: int
    sessions_idle: int
    lookup_hits: int
    lookup_misses: int
    bytes_saved: int
    bytes_loaded: int
    bytes_demoted: int
    bytes_promoted: int
    pinned_blocks: int
    copies_in_flight: int
    blocks_evicted: int
    data_loss_blocks: int
    uptime_ms: int
    connections: int
    pinned_sessions: int
    device_name: str
    policy: str  # "lru", "session" or "predictive"
