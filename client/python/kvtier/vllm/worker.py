"""The worker side of the connector: moving KV between vLLM's cache and kvtierd.

Two paths, chosen by where vLLM keeps its cache:

- **CUDA**: vLLM's cache tensors are registered with the daemon as they are (CUDA IPC
  or VMM handles); Loads and Saves name vLLM's own block ids, with no copy in between.
- **Host (vLLM on the CPU)**: vLLM allocates its cache with the ordinary allocator,
  which the daemon cannot map, so the connector registers one *staging* memfd instead
  (``staging_bytes``) and copies blocks between it and vLLM's cache with torch: one
  memcpy of each block each way. That copy is what the host path costs; it also means
  a Save's blocks are vLLM's to reuse as soon as they are staged.

Loads are layer-wise: ``start_load_kv`` sends one Load per layer, each naming that
layer's planes, pipelined on one connection; ``wait_for_layer_load(layer)`` waits for
that layer's reply only (and, on the host path, copies that layer's planes from staging
into vLLM's blocks). Blocks a Load could not fill are reported through
``get_block_ids_with_load_errors`` so vLLM recomputes them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable

import torch

from .. import _memfd
from .. import torch as kvtier_torch
from ..errors import InvalidArgument, KvtierError, NotSupported
from ..layout import Plane
from ..pending import Pending
from .blocks import BlockShape
from .config import ConnectorConfig
from .link import DaemonLink
from .metadata import COUNTERS, KvtierConnectorMetadata, KvtierWorkerMetadata, LoadJob, SaveJob

logger = logging.getLogger("kvtier.vllm")

STAGING_REGION = 0
# How long one step's wait_for_save may wait for its Saves' replies, so that they are
# reported in the same step; the rest are reported by a later step's get_finished.
SAVE_WAIT_PER_STEP_MS = 20.0
# How long start-up waits for the first attempt to reach kvtierd (it goes on either way).
START_WAIT_S = 2.0
MAX_LATENCIES = 4096  # latency observations kept between two stats reports


def _wait(pending: Pending, timeout_s: float | None):
    """pending.result(), giving up (TimeoutError) after timeout_s (None: never)."""
    if timeout_s is not None and not pending.done():
        deadline = time.monotonic() + timeout_s
        delay = 20e-6
        while not pending.done():
            if time.monotonic() >= deadline:
                raise TimeoutError
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)
    return pending.result()


class SlotPool:
    """The staging buffer's block slots (host path)."""

    def __init__(self, count: int) -> None:
        self.count = count  # slots in all, free or taken
        self._free = list(range(count - 1, -1, -1))
        self._is_free = set(self._free)

    def take(self, count: int) -> list[int]:
        taken = self._free[-count:] if count else []
        del self._free[len(self._free) - len(taken):]
        self._is_free.difference_update(taken)
        return taken[::-1]

    def give(self, slots: Iterable[int]) -> None:
        for slot in slots:
            if slot not in self._is_free:  # a slot given back twice is still one slot
                self._is_free.add(slot)
                self._free.append(slot)

    @property
    def free(self) -> int:
        return len(self._free)


@dataclasses.dataclass
class _Load:
    job: LoadJob
    blocks: list[tuple[bytes, int]]  # what the daemon was asked for: (hash, slot or block id)
    pendings: list[Pending | None]  # one per layer (or one for all layers)
    layers_done: list[bool]
    loaded: int  # blocks every layer done so far filled
    failed: bool = False
    started_s: float = 0.0
    index: tuple[torch.Tensor, torch.Tensor] | None = None  # (staging slots, vLLM block ids)
    ended: bool = False  # counted, and its slots given back or quarantined


@dataclasses.dataclass
class _Save:
    job: SaveJob
    slots: list[int]
    pendings: list[Pending]  # one per chunk of at most max_blocks_per_request blocks
    sent_s: float
    reported: bool = False
    chunk_blocks: list[int] = dataclasses.field(default_factory=list)  # each pending's blocks


class WorkerSide:
    def __init__(self, config: ConnectorConfig, shape: BlockShape) -> None:
        self._config = config
        self._shape = shape
        self._layer_index = {name: i for i, name in enumerate(shape.layer_names)}
        self._link: DaemonLink | None = None
        self._host = True  # vLLM's cache is in host memory
        self._staged = True  # ... and the daemon reaches it through the staging buffer
        self._staging: torch.Tensor | None = None
        self._slots = SlotPool(0)  # the staging buffer's: none until register_kv_caches makes it
        self._staging_planes: list[torch.Tensor] = []  # per plane: [slots, plane bytes] view
        self._cache_planes: list[torch.Tensor] = []  # per plane: [vLLM blocks, plane bytes]
        self._loads: list[_Load] = []  # this step's, waited for layer by layer
        self._async_loads: list[_Load] = []  # vLLM waits for their requests between steps
        self._failed_async: set[str] = set()  # asynchronous Loads that could not even start
        self._load_errors: set[int] = set()
        self._saves: list[_Save] = []  # sent, not yet reported finished
        self._save_backlog: list[SaveJob] = []  # waiting for staging room
        # CUDA: Saves waiting for the step that wrote their KV to finish on the GPU (an
        # event recorded after it, polled: the step thread never waits for the GPU).
        self._gpu_saves: list[tuple[torch.cuda.Event | None, list[SaveJob]]] = []
        self._overdue_loads: set[int] = set()  # id() of asynchronous Loads counted overdue
        self._backlogged_since: dict[str, float] = {}  # request id -> when it first found no room
        self._finished_sending: set[str] = set()
        # Requests whose Save is over on this rank (answered or dropped) since the last
        # build_connector_worker_meta: the scheduler's next turns wait for these, not for
        # finished_sending (a staged Save is reported finished once copied).
        self._saves_over: dict[str, int] = {}
        self._saves_kept: dict[str, int] = {}  # of those, the first blocks kvtierd kept
        self._quarantined: list[tuple[list[Pending], list[int]]] = []  # (replies awaited, slots)
        self._supports_planes = True
        self._layerwise = False  # decided in register_kv_caches, by where vLLM's cache is
        self._failed_meta: KvtierConnectorMetadata | None = None  # the step fail_step_loads failed
        self.load_seconds: list[float] = []  # latencies since the last stats report
        self.save_seconds: list[float] = []

    # ---- registration ------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        shape = self._shape
        missing = [name for name in shape.layer_names if name not in kv_caches]
        if missing:
            raise InvalidArgument(f"kvtier.vllm: no KV cache tensor for layer(s) {', '.join(missing)}")
        layers = [kv_caches[name] for name in shape.layer_names]
        device = layers[0].device.type
        self._host = device == "cpu"
        storages: dict[int, torch.Tensor] = {}
        planes: list[Plane] = []
        views: list[torch.Tensor] = []
        per_layer = [(layer, _layer_planes(name, layer, shape)) for name, layer in zip(shape.layer_names, layers)]
        if shape.cross_layer:
            per_layer = [(layers[0], _cross_layer_plane(layers, shape))]
        for layer, layer_planes in per_layer:
            storage = layer.untyped_storage()
            region_id = storages.setdefault(storage.data_ptr(), len(storages)) if not self._host else 0
            base = torch.empty(0, dtype=torch.uint8, device=layer.device).set_(storage)
            for offset, stride, size in layer_planes:
                start = layer.data_ptr() - storage.data_ptr() + offset
                views.append(base.as_strided((layer.shape[0], size), (stride, 1), start))
                planes.append(Plane(region_id=region_id, offset_bytes=start, stride_bytes=stride,
                                    bytes_per_block=size))
        self._cache_planes = views
        # A cross-layer block is one plane: it cannot be loaded a layer at a time.
        self._layerwise = self._config.layerwise_for("host" if self._host else "cuda") and not shape.cross_layer
        memfd = _memfd.find(layers[0].data_ptr()) if self._host else None
        self._staged = self._host and memfd is None
        if memfd is not None:
            # vLLM's cache itself is in a memfd (host_zero_copy): the daemon maps it and
            # copies straight into vLLM's blocks, as on CUDA.
            for name, layer in zip(shape.layer_names, layers):
                if _memfd.find(layer.data_ptr()) is not memfd:
                    raise InvalidArgument(f"kvtier.vllm: layer {name} is outside the memfd holding layer "
                                          f"{shape.layer_names[0]}")
            layout = shape.layout(planes, layers[0].shape[0])
            first_layer = layers[0]
            COUNTERS.add("zero_copy_caches")
            logger.info("kvtier.vllm: vLLM's KV cache is a memfd (%d bytes) kvtierd maps: no staging",
                        memfd.size_bytes)

            def setup(client):
                client.hello(layout, engine_name="vllm", device="host")
                client.register_tensor(0, first_layer)  # the whole memfd
        elif self._staged:
            slots = max(1, min(shape.num_blocks, self._config.staging_bytes // shape.block_bytes))
            self._staging = kvtier_torch.memfd_tensor((slots, shape.block_bytes), torch.uint8,
                                                      name="kvtier-vllm-staging")
            self._slots = SlotPool(slots)
            self._staging_planes = [
                self._staging[:, i * shape.plane_bytes:(i + 1) * shape.plane_bytes]
                for i in range(shape.num_planes)]
            layout = shape.staging_layout(slots, STAGING_REGION)
            staging = self._staging

            def setup(client):
                client.hello(layout, engine_name="vllm", device="host")
                client.register_tensor(STAGING_REGION, staging)
        else:
            layout = shape.layout(planes, layers[0].shape[0])
            regions = {}
            for layer in layers:
                storage = layer.untyped_storage()
                regions[storages[storage.data_ptr()]] = (storage.data_ptr(), storage.nbytes())

            def setup(client):
                client.hello(layout, engine_name="vllm", device="cuda")
                for region_id, (pointer, size) in regions.items():
                    client.register_cuda_pointer(region_id, pointer, size)
        self._link = DaemonLink(self._config.socket, self._config.reconnect_ms, setup, "worker")
        self._link.wait_first_attempt(START_WAIT_S)

    # ---- loads -----------------------------------------------------------------

    def start_load_kv(self, meta: KvtierConnectorMetadata) -> None:
        self._report_failed_loads(meta)
        for job in meta.loads:
            self._start_load(job)
        if not self._layerwise:
            # One Load per request: done before the forward pass starts, which matters
            # where no Python runs between layers (a CUDA graph replayed whole).
            for load in self._loads:
                for layer in range(len(load.layers_done)):
                    self._finish_layer(load, layer)

    def _start_load(self, job: LoadJob) -> None:
        count = len(job.hashes)
        client = self._link.get() if self._link else None
        if client is None:
            self._fail_load(job.block_ids)
            if job.asynchronous:
                self._failed_async.add(job.request_id)
            return
        targets = job.block_ids
        if self._staged:
            slots = self._slots.take(count)
            targets = slots
        pendings: list[Pending | None] = []
        try:
            self._send_load(job, client, targets, pendings)
        except BaseException:
            # Not recorded: its blocks are reported failed by the caller's recovery;
            # slots nothing was sent for are free again, the others wait for replies.
            recorded = any(load.job is job for load in self._loads + self._async_loads)
            if self._staged and not recorded:
                if any(p is not None for p in pendings):
                    self._quarantined.append(([p for p in pendings if p is not None], list(targets)))
                else:
                    self._slots.give(targets)
            raise

    def _send_load(self, job: LoadJob, client, targets: list[int], pendings: list[Pending | None]) -> None:
        count = len(job.hashes)
        if self._staged and len(targets) < count:  # staging full: load what fits, recompute the rest
            COUNTERS.add("staging_waits")
            self._fail_load(job.block_ids[len(targets):])
        blocks = list(zip(job.hashes[:len(targets)], targets))
        if not blocks:
            if job.asynchronous:
                self._failed_async.add(job.request_id)
            return
        shape = self._shape
        layers = len(shape.layer_names)
        try:
            if self._layerwise and self._supports_planes and layers > 1 and not job.asynchronous:
                try:
                    for layer in range(layers):
                        pendings.append(client.load_async(
                            self._shape.session(job.session_id), blocks,
                            planes=(shape.layer_planes(layer).start, len(shape.layer_planes(layer)))))
                except NotSupported:  # a library or daemon before plane-range Loads
                    self._supports_planes = False
                    pendings.clear()
            if not pendings:
                pendings.append(client.load_async(self._shape.session(job.session_id), blocks))
        except KvtierError:
            COUNTERS.add("load_errors")
            self._fail_load(job.block_ids[:len(blocks)])
            # Layers already sent may still write into their targets: wait them out.
            load = _Load(job, blocks, pendings + [None] * (layers - len(pendings)), [False] * layers, 0,
                         failed=True)
            (self._async_loads if job.asynchronous else self._loads).append(load)
            return
        load = _Load(job, blocks, list(pendings), [False] * layers, len(blocks), started_s=time.monotonic())
        (self._async_loads if job.asynchronous else self._loads).append(load)
        COUNTERS.add("loads")
        COUNTERS.add("layer_loads", len(pendings) if len(pendings) > 1 else 0)

    def _fail_load(self, block_ids: list[int]) -> None:
        if block_ids:
            self._load_errors.update(block_ids)
            COUNTERS.add("load_failed_blocks", len(block_ids))

    def wait_for_layer_load(self, layer_name: str) -> None:
        layer = self._layer_index.get(layer_name)
        if layer is None:
            return
        for load in self._loads:
            self._finish_layer(load, layer)

    def _finish_layer(self, load: _Load, layer: int) -> None:
        if load.layers_done[layer]:
            return
        load.layers_done[layer] = True
        COUNTERS.add("layer_waits")
        if load.failed:  # timed out or refused already: its blocks were reported
            self._fail_load(load.job.block_ids[:load.loaded])
            load.loaded = 0
            return
        pending = load.pendings[layer] if len(load.pendings) > 1 else load.pendings[0]
        # Only a staged Load may be given up on: the daemon then writes staging slots
        # nobody reads. Straight into vLLM's blocks, it must be waited out.
        timeout = self._config.load_timeout_ms / 1000.0 if self._staged else None
        filled = 0
        if pending is not None:
            try:
                result = _wait(pending, timeout)
                filled = result.loaded_count
            except TimeoutError:
                COUNTERS.add("load_timeouts")
                load.failed = True
            except KvtierError:
                COUNTERS.add("load_errors")
        if filled < load.loaded:
            self._fail_load(load.job.block_ids[filled:load.loaded])
            load.loaded = filled
        if self._staged and filled and not load.failed:
            shape = self._shape
            if load.index is None:  # built once a Load, sliced for each layer
                load.index = (torch.tensor([slot for _, slot in load.blocks], dtype=torch.long),
                              torch.tensor(load.job.block_ids[:len(load.blocks)], dtype=torch.long))
            slots, ids = load.index[0][:filled], load.index[1][:filled]
            for plane in shape.layer_planes(layer):
                self._cache_planes[plane].index_copy_(0, ids, self._staging_planes[plane].index_select(0, slots))
            COUNTERS.add("loaded_bytes", filled * shape.layer_bytes)
        elif filled and not load.failed:
            COUNTERS.add("loaded_bytes", filled * self._shape.layer_bytes)

    def _end_loads(self) -> None:
        """After the forward pass: layers never waited for are waited for now (so no
        reply can write slots that go back to the pool), then the slots are freed."""
        for load in self._loads:
            self._end_load(load)
        self._loads = []

    def _end_load(self, load: _Load) -> None:
        for layer in range(len(load.layers_done)):
            self._finish_layer(load, layer)
        if self._staged:
            if all(p is None or p.done() for p in load.pendings):
                self._slots.give(slot for _, slot in load.blocks)
            else:  # timed out: the daemon may still write these slots until it replies
                self._quarantined.append(([p for p in load.pendings if p is not None],
                                          [slot for _, slot in load.blocks]))
        load.ended = True
        COUNTERS.add("loaded_blocks", load.loaded)
        COUNTERS.add_by_tier("loaded_blocks", load.job.tiers[:load.loaded])
        if load.loaded and len(self.load_seconds) < MAX_LATENCIES:
            self.load_seconds.append(time.monotonic() - load.started_s)

    def _poll_async_loads(self) -> set[str]:
        """Asynchronous Loads (vLLM holds their requests until reported): those whose
        reply came, or that timed out on the staged path, are finished and reported."""
        done: set[str] = set()
        waiting: list[_Load] = []
        now = time.monotonic()
        for load in self._async_loads:
            overdue = (now - load.started_s) * 1000.0 >= self._config.load_timeout_ms
            # Only a staged Load may be given up on (kvtierd then writes staging slots
            # nobody reads). Straight into vLLM's blocks (CUDA, zero copy), the request
            # keeps its blocks until kvtierd answers or its process is gone (the
            # connection fails): a late copy never lands in blocks given to another
            # request. Other requests run meanwhile; new Lookups time out to 0 hits.
            expired = self._staged and overdue
            if all(p is None or p.done() for p in load.pendings) or expired:
                self._overdue_loads.discard(id(load))
                self._end_load(load)
                done.add(load.job.request_id)
            else:
                if overdue and not self._staged and id(load) not in self._overdue_loads:
                    self._overdue_loads.add(id(load))
                    COUNTERS.add("load_timeouts")
                    logger.warning("kvtier.vllm: request %s has waited %.1f s for kvtierd's Load into vLLM's "
                                   "blocks; it keeps them until kvtierd answers or is gone (other requests "
                                   "run)", load.job.request_id, now - load.started_s)
                waiting.append(load)
        self._async_loads = waiting
        return done

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.take_load_errors()

    # ---- saves -------------------------------------------------------------------

    def wait_for_save(self, meta: KvtierConnectorMetadata | None) -> None:
        self._end_loads()
        if meta is not None:
            for request_id in meta.dropped_saves:
                self._save_over(request_id)
            self._save_backlog.extend(meta.saves)
        if not self._save_backlog:
            return
        if not self._host:
            # The KV these Saves read is written by kernels still queued on vLLM's stream
            # (with async scheduling, the next step's too): they go to kvtierd once an event
            # recorded now has completed, polled here and in get_finished. vLLM holds their
            # blocks until the Saves are reported.
            jobs, self._save_backlog = self._save_backlog, []
            self._gpu_saves.append((_record_step_event(), jobs))
            self._start_saves_whose_kv_is_written()
            return
        backlog, self._save_backlog = self._save_backlog, []
        sent_before = len(self._saves)
        for job in backlog:
            self._start_save(job)
        # The copies into the daemon's RAM take about a memcpy: waiting for this step's
        # replies here (at most SAVE_WAIT_PER_STEP_MS) lets get_finished report the Saves
        # over in this very step, so the scheduler's next Lookup sees the blocks. Only
        # this step's: a Save kvtierd keeps waiting for room is not waited for again
        # each step (vLLM's blocks are back already; the scheduler hears of it later).
        budget_end = time.monotonic() + min(self._config.save_timeout_ms, SAVE_WAIT_PER_STEP_MS) / 1000.0
        for save in self._saves[sent_before:]:
            try:
                for pending in save.pendings:
                    _wait(pending, max(0.0, budget_end - time.monotonic()))
            except (TimeoutError, KvtierError):
                pass  # reaped (and counted) in get_finished, a later step

    def _start_saves_whose_kv_is_written(self) -> None:
        """CUDA: starts the Saves whose step's event has completed, in order."""
        while self._gpu_saves:
            event, jobs = self._gpu_saves[0]
            if event is not None and not event.query():
                return
            self._gpu_saves.pop(0)
            for job in jobs:
                self._start_save(job)

    def _start_save(self, job: SaveJob) -> None:
        client = self._link.get() if self._link else None
        if client is None:
            COUNTERS.add("save_dropped_blocks", len(job.hashes))
            self._save_over(job.request_id)
            return
        count = len(job.hashes)
        slots: list[int] = []
        targets = job.block_ids
        if self._staged:
            if self._slots.free < count:
                if count > self._slots.count:  # never fits: save the prefix that does
                    COUNTERS.add("save_dropped_blocks", count - self._slots.count)
                    job = dataclasses.replace(job, hashes=job.hashes[:self._slots.count],
                                              block_ids=job.block_ids[:self._slots.count])
                    count = len(job.hashes)
                if self._slots.free < count:
                    COUNTERS.add("staging_waits")
                    self._backlogged_since.setdefault(job.request_id, time.monotonic())
                    self._save_backlog.append(job)  # next step, when slots came back
                    return
            self._backlogged_since.pop(job.request_id, None)
            slots = self._slots.take(count)
            try:
                slot_index = torch.tensor(slots, dtype=torch.long)
                ids = torch.tensor(job.block_ids, dtype=torch.long)
                for plane, staging in enumerate(self._staging_planes):
                    staging.index_copy_(0, slot_index, self._cache_planes[plane].index_select(0, ids))
            except BaseException:
                self._slots.give(slots)  # nothing was sent from them
                raise
            targets = slots
            # vLLM's blocks are copied out: vLLM may reuse them now, whatever kvtierd
            # does with the Save (the slots stay held until it answers).
            self._finished_sending.add(job.request_id)
        # No more than the daemon takes in one request: longer Saves go in chunks, the
        # session's turn ending with the last.
        chunk = getattr(client.hello_info, "max_blocks_per_request", 0) or count
        blocks = list(zip(job.hashes, targets))
        pendings: list[Pending] = []
        chunk_blocks: list[int] = []
        try:
            for start in range(0, count, chunk):
                pendings.append(client.save_async(self._shape.session(job.session_id),
                                                  blocks[start:start + chunk], start + chunk >= count,
                                                  priority=job.priority))
                chunk_blocks.append(len(blocks[start:start + chunk]))
        except KvtierError:
            COUNTERS.add("save_errors")
            if not pendings:
                COUNTERS.add("save_dropped_blocks", count)
                if slots:
                    self._slots.give(slots)
                self._save_over(job.request_id)
                return
            # The chunks sent may still read their slots: they go back with the replies.
        self._saves.append(_Save(job, slots, pendings, time.monotonic(), reported=self._staged,
                                 chunk_blocks=chunk_blocks[:len(pendings)]))
        COUNTERS.add("saves")

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        self._start_saves_whose_kv_is_written()
        self._reap()
        if self._save_backlog and self._staged:
            backlog, self._save_backlog = self._save_backlog, []
            now = time.monotonic()
            for job in backlog:
                # No staging room for save_timeout_ms (a daemon that does not answer
                # keeps its slots): give vLLM its blocks back, the Save is dropped.
                if (now - self._backlogged_since.get(job.request_id, now)) * 1000.0 >= self._config.save_timeout_ms:
                    COUNTERS.add("save_timeouts")
                    COUNTERS.add("save_dropped_blocks", len(job.hashes))
                    self._backlogged_since.pop(job.request_id, None)
                    self._save_over(job.request_id)
                    continue
                self._start_save(job)
        received = self._poll_async_loads()
        for request_id in self._failed_async:
            received.add(request_id)
        self._failed_async = set()
        done, self._finished_sending = self._finished_sending, set()
        return (done or None), (received or None)

    def _reap(self) -> None:
        now = time.monotonic()
        for save in list(self._saves):
            if all(pending.done() for pending in save.pendings):
                # Off the list first, then what vLLM and the pool are owed, then the
                # counting: an error half-way never hands the same slots out twice.
                self._saves.remove(save)
                self._save_over(save.job.request_id, report=not save.reported)
                if save.slots:
                    self._slots.give(save.slots)
                if save.job.anonymous:
                    self._close_session(self._shape.session(save.job.session_id))
                if len(self.save_seconds) < MAX_LATENCIES:
                    self.save_seconds.append(now - save.sent_s)
                stored, kept, short, failed = 0, 0, False, False
                for pending, blocks in zip(save.pendings, save.chunk_blocks):
                    try:
                        result = pending.result()
                    except KvtierError:
                        failed = True
                        continue
                    stored += result.stored
                    if not short:
                        kept += result.saved
                        # A partial Save (kvtierd out of room): the prefix it kept is
                        # what the session holds; chunks after it follow a hole.
                        short = result.saved < blocks
                if failed:
                    COUNTERS.add("save_errors")
                    COUNTERS.add("save_dropped_blocks", len(save.job.hashes))
                else:
                    if short:
                        COUNTERS.add("save_partial")
                        COUNTERS.add("save_dropped_blocks", len(save.job.hashes) - kept)
                    COUNTERS.add("saved_blocks", kept)
                    self._saves_kept[save.job.request_id] = kept
                COUNTERS.add("saved_bytes", stored * self._shape.block_bytes)
        for entry in list(self._quarantined):
            pendings, slots = entry
            if all(p.done() for p in pendings):
                self._quarantined.remove(entry)
                self._slots.give(slots)

    def wait_for_saves_answered(self, timeout_s: float) -> bool:
        """Waits up to timeout_s for the replies to the Saves sent (they are counted
        and reported by the next get_finished); True when none is left unanswered and
        none waits to be sent."""
        deadline = time.monotonic() + timeout_s
        for save in list(self._saves):
            for pending in save.pendings:
                try:
                    _wait(pending, max(0.0, deadline - time.monotonic()))
                except (TimeoutError, KvtierError):
                    pass
        answered = all(p.done() for save in self._saves for p in save.pendings)
        return answered and not self._save_backlog and not self._gpu_saves

    def _save_over(self, request_id: str, report: bool = True) -> None:
        """request_id's Save is over on this rank (answered, or dropped): vLLM gets its
        blocks back (unless `report` is False: they were given back when copied) and the
        scheduler hears of it through build_connector_worker_meta."""
        if report:
            self._finished_sending.add(request_id)
        self._saves_over[request_id] = self._saves_over.get(request_id, 0) + 1
        self._saves_kept[request_id] = 0  # until _reap counts what the answer kept

    def build_connector_worker_meta(self) -> KvtierWorkerMetadata | None:
        if not self._saves_over:
            return None
        over, self._saves_over = self._saves_over, {}
        kept, self._saves_kept = self._saves_kept, {}
        return KvtierWorkerMetadata(saves_over=over, saves_kept=kept)

    def _close_session(self, session_id: str) -> None:
        client = self._link.get() if self._link else None
        if client is None:
            return
        try:
            client.close_session_async(session_id)  # its reply is not needed: dropped
        except KvtierError:
            pass

    # ---- after an internal error (connector.py) ------------------------------------
    # What vLLM was told is loaded is reported failed unless it is known good, and
    # every request whose blocks vLLM holds for a Save is reported finished: vLLM's
    # books stay right whatever the connector's own state was left in.

    def disable(self) -> None:
        """Serve without kvtierd (register_kv_caches failed): every Load fails, every
        Save is dropped, both through the paths a missing daemon takes."""
        link, self._link = self._link, None
        if link is not None:
            link.close()

    def fail_step_loads(self, meta: KvtierConnectorMetadata | None) -> None:
        """start_load_kv or wait_for_layer_load failed: this step's Loads are not
        trusted; every block they were to fill is reported failed."""
        if meta is not None and self._failed_meta is not meta:  # once a step
            self._failed_meta = meta
            self._report_failed_loads(meta)
            recorded = {id(load.job) for load in self._loads + self._async_loads}
            for job in meta.loads:
                if id(job) not in recorded:  # never started: nothing writes its blocks
                    self._fail_load(job.block_ids)
                    if job.asynchronous:
                        self._failed_async.add(job.request_id)
        for load in self._loads:
            if not load.ended:
                load.failed = True
                load.loaded = 0
                self._fail_load(load.job.block_ids[:len(load.blocks)])

    def _report_failed_loads(self, meta: KvtierConnectorMetadata) -> None:
        for failed in meta.failed_loads:
            self._fail_load(failed.block_ids)
            if failed.asynchronous:
                self._failed_async.add(failed.request_id)

    def saves_in_hand(self, meta: KvtierConnectorMetadata | None) -> set[str]:
        """The requests whose blocks vLLM holds for a Save this worker owes a report:
        taken before a call, handed to drop_saves_not_in_hand if the call failed."""
        ids = {job.request_id for job in self._save_backlog}
        ids.update(job.request_id for _, jobs in self._gpu_saves for job in jobs)
        if meta is not None:
            ids.update(job.request_id for job in meta.saves)
            ids.update(meta.dropped_saves)
        return ids

    def drop_saves_not_in_hand(self, expected: set[str]) -> None:
        """Of the expected requests, those no Save in flight, in the backlog or in the
        next report accounts for (lost half-way through a failed call) are reported
        finished now: their Saves are dropped."""
        held = {save.job.request_id for save in self._saves}  # over once answered (_reap)
        held.update(job.request_id for job in self._save_backlog)
        held.update(job.request_id for _, jobs in self._gpu_saves for job in jobs)
        for request_id in expected - held - self._finished_sending:
            self._save_over(request_id)
            self._backlogged_since.pop(request_id, None)
            COUNTERS.add("save_errors")

    def end_loads_after_error(self) -> None:
        """wait_for_save failed: this step's Loads that were not ended have their
        blocks reported failed and their slots held until the daemon replied."""
        loads, self._loads = self._loads, []
        for load in loads:
            if load.ended:
                continue
            load.ended = True
            self._fail_load(load.job.block_ids[:len(load.blocks)])
            if self._staged:
                self._quarantined.append(([p for p in load.pendings if p is not None],
                                          [slot for _, slot in load.blocks]))

    def salvage_finished(self, expected: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """get_finished failed: what it should have reported, with nothing trusted
        that could be wrong. Saves whose bytes the daemon no longer reads (replied,
        or staged) and the backlog are reported finished; asynchronous Loads that
        are over (or staged) are reported received, their blocks failed unless the
        Load had ended."""
        self.drop_saves_not_in_hand(expected)
        backlog, self._save_backlog = self._save_backlog, []
        backlog += [job for _, jobs in self._gpu_saves for job in jobs]  # not sent: nothing reads them
        self._gpu_saves = []
        for job in backlog:
            self._save_over(job.request_id)
            self._backlogged_since.pop(job.request_id, None)
            COUNTERS.add("save_dropped_blocks", len(job.hashes))
        for save in self._saves:
            if not save.reported and (self._staged or all(p.done() for p in save.pendings)):
                save.reported = True  # its slots go back with the replies (_reap)
                self._finished_sending.add(save.job.request_id)
        received, self._failed_async = set(self._failed_async), set()
        for load in list(self._async_loads):
            over = all(p is None or p.done() for p in load.pendings)
            if not (load.ended or over or self._staged):
                continue  # the daemon still writes vLLM's blocks: reported once it replied
            self._async_loads.remove(load)
            received.add(load.job.request_id)
            if not load.ended:
                load.ended = True
                self._fail_load(load.job.block_ids[:len(load.blocks)])
                if self._staged:
                    self._quarantined.append(([p for p in load.pendings if p is not None],
                                              [slot for _, slot in load.blocks]))
        done, self._finished_sending = self._finished_sending, set()
        return (done or None), (received or None)

    def take_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        for save in self._saves:
            try:
                for pending in save.pendings:
                    _wait(pending, 1.0)
            except (TimeoutError, KvtierError):
                pass
        if self._link is not None:
            self._link.close()


def _record_step_event() -> torch.cuda.Event | None:
    """An event recorded on vLLM's current CUDA stream (None without CUDA: nothing to
    wait for)."""
    if not torch.cuda.is_available():
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream())
    return event


def _cross_layer_plane(layers: list[torch.Tensor], shape: BlockShape) -> list[tuple[int, int, int]]:
    """The one plane of a cross-layer cache (blocks outermost): every layer's bytes of a
    block in one run that starts at layer 0's data_ptr."""
    element = layers[0].element_size()
    stride = layers[0].stride(0) * element
    first = layers[0].data_ptr()
    for i, layer in enumerate(layers):
        if layer.stride(0) * element != stride or not first <= layer.data_ptr() < first + shape.block_bytes:
            raise InvalidArgument(f"kvtier.vllm: layer {shape.layer_names[i]} is not inside layer 0's blocks "
                                  f"although the layout {shape.layout_name} puts every layer of a block together")
    if stride != shape.block_bytes:
        raise InvalidArgument(f"kvtier.vllm: cross-layer blocks are {stride} bytes apart, not the {shape.block_bytes} "
                              f"bytes of their {len(layers)} layers' pages: padding kvtier.vllm does not expect")
    return [(0, stride, shape.block_bytes)]


def _layer_planes(name: str, layer: torch.Tensor, shape: BlockShape) -> list[tuple[int, int, int]]:
    """(offset from layer.data_ptr(), stride between blocks, bytes) of each plane of one
    layer, in bytes. vLLM 0.32 hands each layer as a [num_blocks, H, N, C] view."""
    if layer.dim() != 4:
        raise InvalidArgument(f"kvtier.vllm: layer {name} has shape {tuple(layer.shape)}; expected vLLM's "
                              f"[num_blocks, heads, block_size, head_dim*2] view")
    element = layer.element_size()
    blocks, heads, tokens, content = layer.shape
    block_stride = layer.stride(0) * element
    inner = sorted(((layer.stride(d), layer.shape[d]) for d in (1, 2, 3)), reverse=True)
    dense, expected = True, 1
    for stride, size in reversed(inner):
        if size != 1 and stride != expected:
            dense = False
        expected *= size
    layer_bytes = heads * tokens * content * element
    if layer_bytes != shape.layer_bytes:
        raise InvalidArgument(f"kvtier.vllm: layer {name} holds {layer_bytes} bytes a block; vLLM's "
                              f"KV cache spec says {shape.layer_bytes}")
    if shape.planes_per_layer == 1:
        if not dense:
            raise InvalidArgument(f"kvtier.vllm: layer {name}'s blocks are not contiguous (strides "
                                  f"{layer.stride()}) although its layout {shape.layout_name} says so")
        return [(0, block_stride, layer_bytes)]
    if layer.stride(3) != 1 or (tokens > 1 and layer.stride(2) != content):
        raise InvalidArgument(f"kvtier.vllm: layer {name}'s heads are not contiguous (strides {layer.stride()})")
    head_bytes = tokens * content * element
    return [(h * layer.stride(1) * element, block_stride, head_bytes) for h in range(heads)]
