"""kvtier's staging kernels on a GPU (C: ``kvtier_gpu_stager_*``; docs/gpu.md).

An engine whose KV cache is in GPU memory packs a request's blocks into a staging
buffer with kvtier's gather kernel and unpacks Loads with the scatter kernel, so
kvtierd moves each block in one contiguous copy instead of one per plane::

    ok, why = kvtier.gpu.staging_kernels_available(kv_cache.data_ptr())
    client.hello(layout, device="cuda", data_path="staging-kernels" if ok else "plane-copies")
    client.register_tensor(0, kv_cache)          # the plane-copy path stays usable
    stager = client.gpu_stager({0: kv_cache.data_ptr()}) if ok else None
    stager.save("conv-42", blocks, stream=torch.cuda.current_stream().cuda_stream)
    stager.load("conv-42", blocks, stream=...)   # the scatter is queued on the stream

Streams are CUstream handles as ints (0: the legacy default stream). The kernels run on
the engine's stream, so its own ordering holds: a save gathers behind the engine's
writes there, and the engine's later work sees a load's blocks without the host waiting.
"""

from __future__ import annotations

import threading
from ctypes import byref, c_uint32, c_uint64, c_void_p
from collections.abc import Sequence

from . import _lib, _marshal
from .errors import ClientClosed, InvalidArgument, KvtierError, NotSupported
from .results import LoadResult, SaveResult


def _function(lib, name: str):
    function = getattr(lib, name, None)
    if function is None:
        raise NotSupported(f"this libkvtier.so.0 predates the staging kernels ({name}, ABI 0.6)",
                           retryable=False)
    return function


def staging_kernels_available(device_ptr: int) -> tuple[bool, str]:
    """Whether the kernels run for a cache on the GPU holding ``device_ptr`` (any device
    address of it): (True, "") or (False, why). Ask before hello() to choose the data
    path; without them the engine keeps the plane-copy path."""
    _marshal.check_int("device_ptr", device_ptr, 1)
    lib = _lib.library()
    probe = getattr(lib, "kvtier_gpu_stager_probe", None)
    if probe is None:
        return False, "this libkvtier.so.0 predates the staging kernels (ABI 0.6)"
    try:
        _lib.check(probe(device_ptr))
    except KvtierError as error:
        return False, str(error)
    return True, ""


class GpuStager:
    """Made by :meth:`kvtier.Client.gpu_stager`. One thread at a time; a context
    manager (close() unregisters the staging buffer and frees it)."""

    def __init__(self, client, region_ptrs: dict[int, int], *, ring_bytes: int,
                 staging_region_id: int) -> None:
        if client.layout is None:
            raise InvalidArgument("hello() comes first")
        self._client = client
        self._lib = client._lib
        self._lock = threading.Lock()
        _marshal.check_int("ring_bytes", ring_bytes, 1)
        _marshal.check_region_id(staging_region_id)
        ids = list(region_ptrs)
        for region_id in ids:
            _marshal.check_region_id(region_id)
            _marshal.check_int(f"region_ptrs[{region_id}]", region_ptrs[region_id], 1)
        region_ids = (c_uint32 * len(ids))(*ids)
        pointers = (c_uint64 * len(ids))(*[region_ptrs[i] for i in ids])
        wire, planes = _marshal.layout_struct(client.layout)
        handle = c_void_p()
        create = _function(self._lib, "kvtier_gpu_stager_create")
        client_handle = client._acquire()
        try:
            _lib.check(create(client_handle, byref(wire), region_ids, pointers, len(ids),
                              ring_bytes, staging_region_id, byref(handle)))
        finally:
            client._release()
        del planes
        self._handle: int | None = handle.value

    def _stager(self) -> int:
        if self._handle is None:
            raise ClientClosed("the stager was closed")
        return self._handle

    def save(self, session_id: str, blocks: Sequence, end_of_turn: bool = True, *,
             stream: int = 0) -> SaveResult:
        """Gathers the blocks on ``stream`` (behind the engine's writes there) and saves
        them; returns once kvtierd holds the bytes. ``saved`` short of the blocks: the
        daemon kept that prefix (no room for the rest)."""
        session = _marshal.text("session_id", session_id)
        refs, count, keep = _marshal.block_array(blocks)
        out = _lib.SaveResult()
        with self._lock:
            _lib.check(self._lib.kvtier_gpu_stager_save(
                self._stager(), session, refs, count, 1 if end_of_turn else 0, int(stream),
                byref(out)))
        del keep
        return _marshal.save_result(out)

    def load(self, session_id: str, blocks: Sequence, *, planes: tuple[int, int] | None = None,
             stream: int = 0) -> LoadResult:
        """Loads the leading held blocks (``planes``: a range of each, as Client.load)
        and queues their scatter on ``stream``."""
        session = _marshal.text("session_id", session_id)
        plane_range = _marshal.plane_range(planes) or (0, 0)
        refs, count, keep = _marshal.block_array(blocks)
        out = _lib.LoadResult()
        with self._lock:
            _lib.check(self._lib.kvtier_gpu_stager_load(
                self._stager(), session, refs, count, plane_range[0], plane_range[1],
                int(stream), byref(out)))
        del keep
        return _marshal.load_result(out)

    def begin_load(self, session_id: str, blocks: Sequence,
                   ranges: Sequence[tuple[int, int]]) -> None:
        """A layer-wise load: one (begin, count) plane range per step, for the same
        blocks; then finish_range(0), finish_range(1), ... and end_load()."""
        session = _marshal.text("session_id", session_id)
        checked = [_marshal.plane_range(r) or (0, 0) for r in ranges]
        begins = (c_uint32 * len(checked))(*[b for b, _ in checked])
        counts = (c_uint32 * len(checked))(*[c for _, c in checked])
        refs, count, keep = _marshal.block_array(blocks)
        with self._lock:
            _lib.check(self._lib.kvtier_gpu_stager_begin_load(
                self._stager(), session, refs, count, begins, counts, len(checked)))
        del keep

    def finish_range(self, index: int, *, stream: int = 0) -> LoadResult:
        """Queues range ``index``'s scatter on ``stream`` once its bytes are staged."""
        _marshal.check_int("index", index, 0, 2**32 - 1)
        out = _lib.LoadResult()
        with self._lock:
            _lib.check(self._lib.kvtier_gpu_stager_finish_range(self._stager(), index,
                                                                int(stream), byref(out)))
        return _marshal.load_result(out)

    def end_load(self) -> None:
        with self._lock:
            _lib.check(self._lib.kvtier_gpu_stager_end_load(self._stager()))

    def close(self) -> None:
        with self._lock:
            handle, self._handle = self._handle, None
        if handle is not None:
            self._lib.kvtier_gpu_stager_destroy(handle)

    def __enter__(self) -> GpuStager:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None:
            self._handle = None
            self._lib.kvtier_gpu_stager_destroy(handle)
