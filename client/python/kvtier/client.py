"""kvtier.Client: one connection to kvtierd, over libkvtier.so.0.

Typical use (host backend; ``kvtier.torch`` builds the layout from tensors)::

    with kvtier.Client() as client:                      # $KVTIER_SOCKET or the default
        client.hello(layout, engine_name="my-engine")     # once, first
        client.register_tensor(0, kv_cache)               # per region the planes name
        with client.session("conv-42") as session:        # closes the session on exit
            session.begin_turn()                          # a new message arrived
            hits = client.lookup(hashes).hit_count
            client.load("conv-42", list(zip(hashes[:hits], block_ids)))
            ...                                           # prefill the rest, decode
            client.save("conv-42", list(zip(hashes, block_ids)))
    # leaving the client's block unregisters its regions and closes the connection

Blocks are ``(hash, engine_block_id)`` pairs: ``hash`` is 1..32 bytes (see
``kvtier.hashing``), the id an index into the layout's ``num_blocks`` engine blocks.

Errors raise :class:`kvtier.KvtierError` subclasses, named for what to do about them.

Thread-safety: every method may be called from several threads at once (requests are
pipelined on the one connection); close() waits for blocking calls in flight on
other threads. Blocking calls release the GIL while they wait.
"""

from __future__ import annotations

import contextlib
import threading
from ctypes import byref, c_int, c_uint8, c_uint32, c_uint64, c_void_p
from collections.abc import Iterator, Sequence

from . import _lib, _marshal, _memfd
from ._marshal import Block
from .errors import ClientClosed, InvalidArgument, KvtierError, NotFound, NotSupported
from .layout import Layout
from .pending import Pending
from .results import (BeginTurnResult, BlockPriority, HelloInfo, LoadResult, LookupResult, SaveResult, Stats,
                      TierNotices, TierStats)

_DEVICE_KINDS = {"host": _lib.DEVICE_HOST, "cuda": _lib.DEVICE_CUDA}


class Client:
    """One connection to kvtierd. ``socket_path`` None: $KVTIER_SOCKET, else
    $XDG_RUNTIME_DIR/kvtier/kvtierd.sock, else ./var/kvtierd.sock.

    Raises Unavailable when no daemon answers (or libkvtier.so.0 cannot be loaded).
    A context manager: leaving the ``with`` block calls close().

    ``reconnect`` (default True): when kvtierd goes away (a restart, a crash), calls
    raise Unavailable (retryable) at once instead of waiting, and the first call after
    the backoff (``initial_backoff_ms`` doubling to ``max_backoff_ms``, with jitter)
    connects again, repeats hello() and registers the regions again, then proceeds.
    An engine keeps serving meanwhile by recomputing; ``reconnects`` counts the
    connections made again.
    """

    def __init__(self, socket_path: str | None = None, *, reconnect: bool = True,
                 initial_backoff_ms: int = 0, max_backoff_ms: int = 0) -> None:
        self._lib = _lib.library()
        self._lock = threading.Condition(threading.Lock())
        self._handle: int | None = None  # kvtier_client*; None once closed (under _lock)
        self._calls_in_flight = 0  # blocking calls using _handle (under _lock)
        self._regions: dict[int, object] = {}  # region id -> what keeps it alive (under _lock)
        self.hello_info: HelloInfo | None = None  # set by hello()
        self.layout: Layout | None = None
        path = None if socket_path is None else _marshal.text("socket_path", str(socket_path))
        handle = c_void_p()
        connect_with_options = getattr(self._lib, "kvtier_connect_with_options", None)
        if connect_with_options is not None:
            options = _lib.ClientOptions(1 if reconnect else 0, int(initial_backoff_ms),
                                         int(max_backoff_ms), 0)
            _lib.check(connect_with_options(path, byref(options), byref(handle)))
        elif not reconnect or initial_backoff_ms or max_backoff_ms:
            raise NotSupported("this libkvtier.so.0 predates reconnect options (ABI 0.3)",
                               retryable=False)
        else:
            _lib.check(self._lib.kvtier_connect(path, byref(handle)))
        self._handle = handle.value

    # ---- lifetime ----------------------------------------------------------------

    def close(self) -> None:
        """Unregisters this client's regions (each waits for the daemon's copies on
        it), then closes the connection. Sessions stay in the daemon. Idempotent.
        A Pending from before close() can still be waited for."""
        with self._lock:
            if self._handle is None:
                return
            regions = list(self._regions)
        for region_id in regions:
            with contextlib.suppress(KvtierError):
                self.unregister_region(region_id)
        with self._lock:
            if self._handle is None:
                return
            handle, self._handle = self._handle, None
            while self._calls_in_flight:
                self._lock.wait()
            self._regions.clear()
        self._lib.kvtier_close(handle)  # a kvtier_pending keeps the connection open

    @property
    def closed(self) -> bool:
        return self._handle is None

    @property
    def reconnects(self) -> int:
        """How many times this client connected again after kvtierd went away (0 with a
        library that predates reconnecting)."""
        function = getattr(self._lib, "kvtier_reconnects", None)
        with self._lock:
            handle = self._handle
            return 0 if handle is None or function is None else int(function(handle))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None:  # never closed: the daemon drops the regions itself
            self._handle = None
            with contextlib.suppress(Exception):
                self._lib.kvtier_close(handle)

    # Every call that uses the kvtier_client* brackets it with _acquire/_release, so
    # close() can wait for calls in flight on other threads before freeing it.
    def _acquire(self) -> int:
        with self._lock:
            handle = self._handle
            if handle is None:
                raise ClientClosed()
            self._calls_in_flight += 1
            return handle

    def _release(self) -> None:
        with self._lock:
            self._calls_in_flight -= 1
            if self._calls_in_flight == 0 and self._handle is None:
                self._lock.notify_all()

    def _pending(self, send, wait, keep_alive: object = None) -> Pending:
        """Sends a request; keep_alive (the packed arrays) lives until it was sent."""
        pending_handle = c_void_p()
        handle = self._acquire()
        try:
            _lib.check(send(handle, byref(pending_handle)))
        finally:
            self._release()
        del keep_alive
        return Pending(pending_handle.value, wait)

    # ---- setup -------------------------------------------------------------------

    def hello(self, layout: Layout, engine_name: str = "python", device: str = "host",
              prefill_tokens_per_second: float = 0.0, *,
              data_path: str = "plane-copies") -> HelloInfo:
        """Says who the engine is; must come first, once. ``device`` is the kind of
        regions it registers and must match the daemon's backend: "host" (memfd) or
        "cuda". InvalidArgument names a bad layout field; NotSupported says the daemon
        runs the other backend. ``data_path`` says how the engine moves bytes:
        "plane-copies" (kvtierd copies every plane), "staging-kernels" (a
        :class:`kvtier.gpu.GpuStager` packs blocks on the GPU; see
        :func:`kvtier.gpu.staging_kernels_available`) or "staging-host"."""
        if data_path not in _lib.DATA_PATHS:
            raise InvalidArgument(f"data_path must be one of {sorted(_lib.DATA_PATHS)}, "
                                  f"got {data_path!r}")
        if not isinstance(layout, Layout):
            raise InvalidArgument(f"layout must be a kvtier.Layout, got {type(layout).__name__}")
        if device not in _DEVICE_KINDS:
            raise InvalidArgument(f'device must be "host" or "cuda", got {device!r}')
        wire, planes = _marshal.layout_struct(layout)
        name = _marshal.text("engine_name", engine_name)
        out = _lib.HelloInfo()
        with_data_path = getattr(self._lib, "kvtier_hello_with_data_path", None)
        if data_path != "plane-copies" and with_data_path is None:
            raise NotSupported("this libkvtier.so.0 predates data paths (ABI 0.6)",
                               retryable=False)
        handle = self._acquire()
        try:
            if data_path == "plane-copies" or with_data_path is None:  # None: plane-copies, see above
                _lib.check(self._lib.kvtier_hello(handle, byref(wire), name,
                                                  _DEVICE_KINDS[device],
                                                  float(prefill_tokens_per_second), byref(out)))
            else:
                _lib.check(with_data_path(handle, byref(wire), name, _DEVICE_KINDS[device],
                                          float(prefill_tokens_per_second),
                                          _lib.DATA_PATHS[data_path], byref(out)))
        finally:
            self._release()
        del planes
        gpus = min(out.gpu_count, _lib.MAX_GPUS)
        self.hello_info = HelloInfo(
            layout_digest=out.layout_digest, block_bytes=out.block_bytes,
            namespace=out.namespace_name.decode("utf-8", "replace"),
            max_blocks_per_request=out.max_blocks_per_request,
            device="cuda" if out.device_kind == _lib.DEVICE_CUDA else "host",
            gpu_uuids=tuple(out.gpu_uuids[i].value.decode("utf-8", "replace") for i in range(gpus)),
            device_name=out.device_name.decode("utf-8", "replace"), protocol_version=out.protocol_version)
        self.layout = layout
        return self.hello_info

    def gpu_stager(self, region_ptrs: dict[int, int], *, ring_bytes: int = 64 << 20,
                   staging_region_id: int = 0x7FFF0000):
        """A :class:`kvtier.gpu.GpuStager` for this client's layout (after a hello()
        with data_path="staging-kernels"): ``region_ptrs`` maps each region id the
        layout's planes name to the device address its memory starts at."""
        from .gpu import GpuStager

        return GpuStager(self, region_ptrs, ring_bytes=ring_bytes,
                         staging_region_id=staging_region_id)

    def register_memfd(self, region_id: int, fd: int, size_bytes: int) -> None:
        """Host backend: shares a memfd of exactly size_bytes. The fd stays yours; keep
        the memory until unregister_region (or close) returned."""
        _marshal.check_region_id(region_id)
        _marshal.check_int("fd", fd, 0, 2**31 - 1)
        _marshal.check_int("size_bytes", size_bytes, 1)
        self._register(region_id, None,
                       lambda h: self._lib.kvtier_register_memfd(h, region_id, fd, size_bytes))

    def register_cuda_pointer(self, region_id: int, device_ptr: int, size_bytes: int) -> None:
        """CUDA backend: shares [device_ptr, device_ptr + size_bytes) of this process's
        GPU memory (legacy IPC or VMM, chosen by how it was allocated). Unavailable
        without CUDA support in the library; InvalidArgument for memory the daemon
        cannot open (managed, pool, host), with the reason."""
        _marshal.check_region_id(region_id)
        _marshal.check_int("device_ptr", device_ptr, 1)
        _marshal.check_int("size_bytes", size_bytes, 1)
        self._register(region_id, None, lambda h: self._lib.kvtier_register_cuda_pointer(
            h, region_id, device_ptr, size_bytes))

    def register_cuda_ipc(self, region_id: int, ipc_handle: bytes, offset_bytes: int,
                          size_bytes: int, gpu_uuid: str = "") -> None:
        """CUDA backend, legacy IPC: a 64-byte CUipcMemHandle of the allocation; the
        region is size_bytes from offset_bytes past the allocation's base."""
        _marshal.check_region_id(region_id)
        if len(ipc_handle) != _lib.IPC_HANDLE_BYTES:
            raise InvalidArgument(f"ipc_handle is {len(ipc_handle)} bytes; a CUipcMemHandle "
                                  f"has {_lib.IPC_HANDLE_BYTES}")
        _marshal.check_int("offset_bytes", offset_bytes)
        _marshal.check_int("size_bytes", size_bytes, 1)
        raw = (c_uint8 * _lib.IPC_HANDLE_BYTES).from_buffer_copy(bytes(ipc_handle))
        uuid = _marshal.text("gpu_uuid", gpu_uuid)
        self._register(region_id, None, lambda h: self._lib.kvtier_register_cuda_ipc(
            h, region_id, raw, offset_bytes, size_bytes, uuid))

    def register_cuda_vmm(self, region_id: int, chunks: Sequence[tuple[int, int]],
                          offset_bytes: int, size_bytes: int, gpu_uuid: str = "") -> None:
        """CUDA backend, VMM: chunks are (fd, bytes) of each cuMemCreate handle in
        address order (the fds stay yours); the region is size_bytes from offset_bytes
        into the first chunk."""
        _marshal.check_region_id(region_id)
        _marshal.check_int("offset_bytes", offset_bytes)
        _marshal.check_int("size_bytes", size_bytes, 1)
        for i, (fd, chunk_bytes) in enumerate(chunks):
            _marshal.check_int(f"chunks[{i}] fd", fd, 0, 2**31 - 1)
            _marshal.check_int(f"chunks[{i}] bytes", chunk_bytes, 1)
        fds = (c_int * len(chunks))(*[fd for fd, _ in chunks])
        sizes = (c_uint64 * len(chunks))(*[size for _, size in chunks])
        uuid = _marshal.text("gpu_uuid", gpu_uuid)
        self._register(region_id, None, lambda h: self._lib.kvtier_register_cuda_vmm(
            h, region_id, fds, sizes, len(chunks), offset_bytes, size_bytes, uuid))

    def register_tensor(self, region_id: int, tensor) -> None:
        """Shares the memory of a torch tensor as a region:

        - a CPU tensor made by ``kvtier.torch.memfd_tensor`` (or a view of one): the
          whole memfd is the region, so plane offsets count from the memfd's start
          (what the ``kvtier.torch`` plane helpers compute);
        - a CUDA tensor: [data_ptr, end of its last element) through
          register_cuda_pointer.

        The client keeps the tensor alive until the region is unregistered.
        Anything else raises InvalidArgument.
        """
        _marshal.check_region_id(region_id)
        device = getattr(getattr(tensor, "device", None), "type", None)
        if device is None or not callable(getattr(tensor, "data_ptr", None)):
            raise InvalidArgument(
                f"register_tensor takes a torch.Tensor, got {type(tensor).__name__}")
        if device == "cuda":
            size = _marshal.tensor_extent_bytes(tensor)
            if size == 0:
                raise InvalidArgument("an empty CUDA tensor cannot be a region")
            self._register(region_id, tensor, lambda h: self._lib.kvtier_register_cuda_pointer(
                h, region_id, tensor.data_ptr(), size))
            return
        buffer = _memfd.find(tensor.data_ptr()) if device == "cpu" else None
        if buffer is None:
            raise InvalidArgument(
                f"register_tensor accepts a CPU tensor allocated by kvtier.torch.memfd_tensor "
                f"(or a view of one) or a CUDA tensor; this {device} tensor (data_ptr "
                f"{tensor.data_ptr():#x}) is not in memory kvtierd can map")
        self._register(region_id, tensor, lambda h: self._lib.kvtier_register_memfd(
            h, region_id, buffer.fd, buffer.size_bytes))

    def _register(self, region_id: int, keep_alive: object, call) -> None:
        handle = self._acquire()
        try:
            _lib.check(call(handle))
        finally:
            self._release()
        with self._lock:
            self._regions[region_id] = keep_alive

    def unregister_region(self, region_id: int) -> None:
        """Returns once every daemon copy touching the region finished and the daemon's
        mapping is closed: free the memory after this. NotFound for a region not
        registered on this connection. Save and Load naming it fail until it is
        registered again."""
        _marshal.check_region_id(region_id)
        handle = self._acquire()
        try:
            _lib.check(self._lib.kvtier_unregister_region(handle, region_id))
        except NotFound:
            with self._lock:
                self._regions.pop(region_id, None)
            raise
        finally:
            self._release()
        # Only now: after any other error the daemon may still map the region or be
        # copying into it, so the memory stays referenced until close().
        with self._lock:
            self._regions.pop(region_id, None)

    # ---- data path (blocking) ------------------------------------------------------

    def save(self, session_id: str, blocks: Sequence[Block], end_of_turn: bool = True, *,
             priority: int | None = None, priority_duration_s: float | None = None,
             block_priorities: Sequence[BlockPriority] = ()) -> SaveResult:
        """Copies the blocks' bytes into the daemon and returns when done: the engine
        may reuse those blocks then. Blocks already held are deduplicated.
        ``end_of_turn`` starts the session's idle clock. ResourceExhausted: no room,
        retry later or with fewer blocks.

        Retention (TensorRT-LLM's scale, 1..100, 35 when none is given; under pressure
        the lowest goes first, above 35 a session is never demoted for being idle):
        ``priority`` sets the session's, for ``priority_duration_s`` seconds (None:
        until changed); ``block_priorities`` override it for ranges of ``blocks``."""
        return self.save_async(session_id, blocks, end_of_turn, priority=priority,
                               priority_duration_s=priority_duration_s,
                               block_priorities=block_priorities).result()

    def lookup(self, hashes: Sequence[bytes]) -> LookupResult:
        """How many leading hashes the daemon holds, and in which tier each is."""
        refs, count, keep = _marshal.hash_array(hashes)
        hit_count = c_uint32()
        tiers = _marshal.tiers_out(count)
        handle = self._acquire()
        try:
            _lib.check(self._lib.kvtier_lookup(handle, refs, count, byref(hit_count),
                                               tiers.buffer_info()[0]))
        finally:
            self._release()
        del keep  # the hashes were serialized before kvtier_lookup returned
        return _marshal.lookup_result(hit_count, tiers)

    def load(self, session_id: str, blocks: Sequence[Block], *,
             planes: tuple[int, int] | None = None) -> LoadResult:
        """Restores the leading held blocks into the engine blocks named. A prefix
        that ends early is not an error: loaded_count says how far it got and
        stop_reason why (NotFound, DataLoss); compute the rest. ``session_id`` ""
        loads without marking a session active.

        ``planes=(begin, count)`` copies only planes begin..begin+count-1 of each block
        (in ``layout.planes`` order, e.g. layer 0 K, layer 0 V, layer 1 K, ...) and
        leaves the engine's other bytes as they are; None (or count 0 with begin 0)
        copies every plane. For layer-wise loading send one ``load_async`` per layer
        for the same blocks and wait for each on its own: a layer's result means its
        bytes are in place while later layers still copy. Each load stands alone (use
        the smallest loaded_count). InvalidArgument for a range outside the layout's
        planes (or not a pair of non-negative ints); NotSupported when the library or
        the daemon predates plane ranges."""
        return self.load_async(session_id, blocks, planes=planes).result()

    def begin_turn(self, session_id: str) -> BeginTurnResult:
        """A new message arrived for the session: marks it active and starts moving
        its blocks toward the fastest tier before the Load. NotFound for a session
        the daemon does not know (never saved, closed, evicted): nothing to restore."""
        return self.begin_turn_async(session_id).result()

    def close_session(self, session_id: str) -> int:
        """Drops the session's references; returns how many blocks it referenced.
        Blocks other sessions share stay. NotFound for an unknown session."""
        return self.close_session_async(session_id).result()

    def stats(self) -> Stats:
        """Counters and tier occupancy of this client's namespace."""
        out = _lib.StatsInfo()
        handle = self._acquire()
        try:
            _lib.check(self._lib.kvtier_stats(handle, byref(out)))
        finally:
            self._release()
        tiers = {_lib.TIER_NAMES[i]: TierStats(t.capacity_bytes, t.used_bytes, t.blocks)
                 for i, t in enumerate(out.tiers)}
        fields = {name: getattr(out, name) for name, *_ in _lib.StatsInfo._fields_
                  if name not in ("tiers", "device_name", "policy")}
        return Stats(tiers=tiers, device_name=out.device_name.decode("utf-8", "replace"),
                     policy=out.policy.decode("utf-8", "replace"), **fields)

    @contextlib.contextmanager
    def session(self, session_id: str) -> Iterator[Session]:
        """``with client.session(id) as s:`` — s.save/load/begin_turn/lookup act on the
        session; leaving the block closes it (a session never saved is no error).
        Leave the block only when the conversation is over: a closed session's blocks
        are no longer kept for it."""
        _marshal.text("session_id", session_id)
        session = Session(self, session_id)
        failed = False
        try:
            yield session
        except BaseException:
            failed = True
            raise
        finally:
            try:
                self.close_session(session_id)
            except NotFound:
                pass
            except KvtierError:
                if not failed:  # never hide the exception that ended the block
                    raise

    # ---- data path (non-blocking) --------------------------------------------------

    def save_async(self, session_id: str, blocks: Sequence[Block], end_of_turn: bool = True, *,
                   priority: int | None = None, priority_duration_s: float | None = None,
                   block_priorities: Sequence[BlockPriority] = ()) -> Pending[SaveResult]:
        """save() without waiting: the request is sent before this returns."""
        session = _marshal.text("session_id", session_id)
        refs, count, keep = _marshal.block_array(blocks)
        retention = _marshal.retention(priority, priority_duration_s)
        ranges, range_count = _marshal.range_retentions(block_priorities, count)

        def wait(pending: int) -> SaveResult:
            out = _lib.SaveResult()
            _lib.check(self._lib.kvtier_pending_wait_save(pending, byref(out)))
            return _marshal.save_result(out)

        turn_ends = 1 if end_of_turn else 0
        if retention is None and range_count == 0:
            return self._pending(lambda h, out: self._lib.kvtier_save_async(
                h, session, refs, count, turn_ends, out), wait, keep)
        save_with_retention = getattr(self._lib, "kvtier_save_with_retention_async", None)
        if save_with_retention is None:
            raise NotSupported("this libkvtier.so.0 predates retention priorities (ABI 0.4)",
                               retryable=False)
        return self._pending(lambda h, out: save_with_retention(
            h, session, refs, count, turn_ends, None if retention is None else byref(retention),
            ranges, range_count, out), wait, (keep, retention, ranges))

    def lookup_async(self, hashes: Sequence[bytes]) -> Pending[LookupResult]:
        """lookup() without waiting."""
        refs, count, keep = _marshal.hash_array(hashes)

        def wait(pending: int) -> LookupResult:
            hit_count = c_uint32()
            tiers = _marshal.tiers_out(count)
            _lib.check(self._lib.kvtier_pending_wait_lookup(pending, byref(hit_count),
                                                            tiers.buffer_info()[0]))
            return _marshal.lookup_result(hit_count, tiers)

        return self._pending(lambda h, out: self._lib.kvtier_lookup_async(h, refs, count, out),
                             wait, keep)

    def load_async(self, session_id: str, blocks: Sequence[Block], *,
                   planes: tuple[int, int] | None = None) -> Pending[LoadResult]:
        """load() without waiting. Do not touch the blocks named (the planes of
        ``planes``) until result()."""
        session = _marshal.text("session_id", session_id)
        plane_range = _marshal.plane_range(planes)
        refs, count, keep = _marshal.block_array(blocks)

        def wait(pending: int) -> LoadResult:
            out = _lib.LoadResult()
            _lib.check(self._lib.kvtier_pending_wait_load(pending, byref(out)))
            return _marshal.load_result(out)

        if plane_range is None:
            return self._pending(lambda h, out: self._lib.kvtier_load_async(
                h, session, refs, count, out), wait, keep)
        load_planes = getattr(self._lib, "kvtier_load_planes_async", None)
        if load_planes is None:
            raise NotSupported("this libkvtier.so.0 predates plane ranges in load (ABI 0.5)",
                               retryable=False)
        begin, plane_count = plane_range
        return self._pending(lambda h, out: load_planes(
            h, session, refs, count, begin, plane_count, out), wait, keep)

    def watch_tiers_async(self, max_wait_ms: int, max_changes: int) -> Pending[TierNotices]:
        """Tier notices: blocks of this engine's layout that changed place on the daemon's
        node (see :class:`TierNotices`). The first call subscribes the connection; after
        a reconnect (``reconnects`` grew) call again and look up what you believed, since
        notices were lost with the old connection. Answered at once with what changed
        since the last answer, else at the first change, else empty after max_wait_ms (at
        most 60000). One may wait per connection; at most max_changes (1..4096) a reply."""
        watch = getattr(self._lib, "kvtier_watch_tiers_async", None)
        if watch is None:
            raise NotSupported("this libkvtier.so.0 predates tier notices (ABI 0.9)", retryable=False)
        if not 1 <= max_changes <= 4096:
            raise InvalidArgument(f"max_changes must be 1..4096, got {max_changes}")
        names = _lib.TIER_NAMES

        def wait(pending: int) -> TierNotices:
            out = (_lib.TierChange * max_changes)()
            count, resync = c_uint32(), c_int()
            _lib.check(self._lib.kvtier_pending_wait_tier_notices(pending, out, max_changes,
                                                                  byref(count), byref(resync)))
            changes = [(bytes(c.hash[:c.hash_len]), names[c.tier] if 0 <= c.tier < len(names) else "none")
                       for c in out[:count.value]]
            return TierNotices(changes=changes, resync=bool(resync.value))

        return self._pending(lambda h, out: watch(h, max_wait_ms, max_changes, out), wait)

    def begin_turn_async(self, session_id: str) -> Pending[BeginTurnResult]:
        """begin_turn() without waiting: send it as soon as the message arrives."""
        session = _marshal.text("session_id", session_id)

        def wait(pending: int) -> BeginTurnResult:
            out = _lib.BeginTurnResult()
            _lib.check(self._lib.kvtier_pending_wait_begin_turn(pending, byref(out)))
            return _marshal.begin_turn_result(out)

        return self._pending(lambda h, out: self._lib.kvtier_begin_turn_async(h, session, out),
                             wait)

    def close_session_async(self, session_id: str) -> Pending[int]:
        """close_session() without waiting."""
        session = _marshal.text("session_id", session_id)

        def wait(pending: int) -> int:
            released = c_uint32()
            _lib.check(self._lib.kvtier_pending_wait_close_session(pending, byref(released)))
            return released.value

        return self._pending(
            lambda h, out: self._lib.kvtier_close_session_async(h, session, out), wait)


class Session:
    """A session id bound to its client (from ``Client.session``)."""

    def __init__(self, client: Client, session_id: str) -> None:
        self.client = client
        self.session_id = session_id

    def save(self, blocks: Sequence[Block], end_of_turn: bool = True, *,
             priority: int | None = None, priority_duration_s: float | None = None,
             block_priorities: Sequence[BlockPriority] = ()) -> SaveResult:
        return self.client.save(self.session_id, blocks, end_of_turn, priority=priority,
                                priority_duration_s=priority_duration_s,
                                block_priorities=block_priorities)

    def load(self, blocks: Sequence[Block], *,
             planes: tuple[int, int] | None = None) -> LoadResult:
        return self.client.load(self.session_id, blocks, planes=planes)

    def lookup(self, hashes: Sequence[bytes]) -> LookupResult:
        return self.client.lookup(hashes)

    def begin_turn(self) -> BeginTurnResult:
        return self.client.begin_turn(self.session_id)
