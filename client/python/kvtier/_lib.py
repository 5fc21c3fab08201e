"""ctypes bindings of libkvtier.so.0 (client/kvtier.h), loaded on first use.

Where the library comes from, first found wins:
  1. $KVTIER_LIBRARY, a path to the library (a build tree's client/libkvtier.so.0);
  2. a copy shipped inside this package (kvtier/libkvtier.so.0);
  3. "libkvtier.so.0" through the dynamic linker (the kvtier .deb installs it).

The structures below mirror kvtier.h field for field (ABI version 0). ctypes releases
the GIL around every call, so a blocking save or wait does not stall other threads.
"""

from __future__ import annotations

import ctypes
import os
import threading
from ctypes import (POINTER, Structure, c_char, c_char_p, c_double, c_int, c_int32, c_uint8,
                    c_size_t, c_uint32, c_uint64, c_void_p)

from .errors import KvtierError, StatusCode, Unavailable, error_from_status

SONAME = "libkvtier.so.0"

TIER_COUNT = 3
MAX_HASH_BYTES = 32
NAME_BYTES = 256
GPU_UUID_BYTES = 64
MAX_GPUS = 64
MESSAGE_BYTES = 512
IPC_HANDLE_BYTES = 64

TIER_NAMES = ("hbm", "ram", "nvme", "none", "remote")  # indexed by kvtier_tier
DEVICE_HOST = 0
DEVICE_CUDA = 1


class ClientOptions(Structure):
    """kvtier_client_options (ABI 0.3)."""
    _fields_ = [("reconnect", c_int32), ("initial_backoff_ms", c_uint32),
                ("max_backoff_ms", c_uint32), ("reserved", c_uint32)]


class Plane(Structure):
    _fields_ = [("region_id", c_uint32), ("reserved", c_uint32), ("offset_bytes", c_uint64),
                ("stride_bytes", c_uint64), ("bytes_per_block", c_uint64)]


class Layout(Structure):
    _fields_ = [("model_id", c_char_p), ("dtype", c_char_p), ("extra_key", c_char_p),
                ("num_layers", c_uint32), ("num_kv_heads", c_uint32), ("head_dim", c_uint32),
                ("tokens_per_block", c_uint32), ("tp_rank", c_uint32), ("tp_size", c_uint32),
                ("num_blocks", c_uint64), ("planes", POINTER(Plane)), ("plane_count", c_uint32),
                ("reserved", c_uint32)]


class HelloInfo(Structure):
    _fields_ = [("protocol_version", c_uint32), ("max_blocks_per_request", c_uint32),
                ("layout_digest", c_uint64), ("block_bytes", c_uint64),
                ("device_kind", c_uint32), ("gpu_count", c_uint32),
                ("namespace_name", c_char * NAME_BYTES), ("device_name", c_char * NAME_BYTES),
                ("gpu_uuids", (c_char * GPU_UUID_BYTES) * MAX_GPUS)]


class Hash(Structure):
    _fields_ = [("hash", c_char_p), ("hash_len", c_uint32)]  # bytes: ctypes keeps them alive


class TierChange(Structure):
    """kvtier_tier_change (ABI 0.9)."""
    _fields_ = [("hash", c_uint8 * 32), ("hash_len", c_uint32), ("tier", c_int)]


class BlockRef(Structure):
    _fields_ = [("hash", c_char_p), ("hash_len", c_uint32), ("engine_block_id", c_uint64)]


class Retention(Structure):
    _fields_ = [("priority", c_uint32), ("reserved", c_uint32), ("duration_ms", c_uint64)]


class RangeRetention(Structure):
    _fields_ = [("first", c_uint32), ("count", c_uint32), ("retention", Retention)]


class SaveResult(Structure):
    _fields_ = [("stored", c_uint32), ("deduplicated", c_uint32)]


class LoadResult(Structure):
    _fields_ = [("loaded_count", c_uint32), ("stop_code", c_uint32),
                ("stop_message", c_char * MESSAGE_BYTES)]


class BeginTurnResult(Structure):
    _fields_ = [("known_blocks", c_uint32), ("promoted_blocks", c_uint32)]


class TierStats(Structure):
    _fields_ = [("capacity_bytes", c_uint64), ("used_bytes", c_uint64), ("blocks", c_uint64)]


class StatsInfo(Structure):
    _fields_ = [("tiers", TierStats * TIER_COUNT), ("sessions_active", c_uint64),
                ("sessions_idle", c_uint64), ("lookup_hits", c_uint64),
                ("lookup_misses", c_uint64), ("bytes_saved", c_uint64),
                ("bytes_loaded", c_uint64), ("bytes_demoted", c_uint64),
                ("bytes_promoted", c_uint64), ("pinned_blocks", c_uint64),
                ("copies_in_flight", c_uint64), ("blocks_evicted", c_uint64),
                ("data_loss_blocks", c_uint64), ("uptime_ms", c_uint64),
                ("connections", c_uint32), ("pinned_sessions", c_uint32),
                ("device_name", c_char * NAME_BYTES), ("policy", c_char * NAME_BYTES)]


_client_p = c_void_p
_pending_p = c_void_p
_status = c_int  # kvtier_status: an enum, passed as int

# name: (restype, argtypes). Every kvtier_* function of kvtier.h, ABI version 0.
_SIGNATURES = {
    "kvtier_last_error": (c_char_p, []),
    "kvtier_status_name": (c_char_p, [c_int]),
    "kvtier_version": (c_char_p, []),
    "kvtier_connect": (_status, [c_char_p, POINTER(_client_p)]),
    "kvtier_close": (None, [_client_p]),
    "kvtier_hello": (_status, [_client_p, POINTER(Layout), c_char_p, c_int, c_double,
                               POINTER(HelloInfo)]),
    "kvtier_register_memfd": (_status, [_client_p, c_uint32, c_int, c_uint64]),
    "kvtier_register_cuda_ipc": (_status, [_client_p, c_uint32, POINTER(c_uint8), c_uint64,
                                           c_uint64, c_char_p]),
    "kvtier_register_cuda_vmm": (_status, [_client_p, c_uint32, POINTER(c_int),
                                           POINTER(c_uint64), c_uint32, c_uint64, c_uint64,
                                           c_char_p]),
    "kvtier_register_cuda_pointer": (_status, [_client_p, c_uint32, c_uint64, c_uint64]),
    "kvtier_unregister_region": (_status, [_client_p, c_uint32]),
    "kvtier_save": (_status, [_client_p, c_char_p, c_void_p, c_uint32, c_int,
                              POINTER(SaveResult)]),
    "kvtier_lookup": (_status, [_client_p, c_void_p, c_uint32, POINTER(c_uint32), c_void_p]),
    "kvtier_load": (_status, [_client_p, c_char_p, c_void_p, c_uint32, POINTER(LoadResult)]),
    "kvtier_begin_turn": (_status, [_client_p, c_char_p, POINTER(BeginTurnResult)]),
    "kvtier_close_session": (_status, [_client_p, c_char_p, POINTER(c_uint32)]),
    "kvtier_stats": (_status, [_client_p, POINTER(StatsInfo)]),
    "kvtier_save_async": (_status, [_client_p, c_char_p, c_void_p, c_uint32, c_int,
                                    POINTER(_pending_p)]),
    "kvtier_lookup_async": (_status, [_client_p, c_void_p, c_uint32, POINTER(_pending_p)]),
    "kvtier_load_async": (_status, [_client_p, c_char_p, c_void_p, c_uint32,
                                    POINTER(_pending_p)]),
    "kvtier_begin_turn_async": (_status, [_client_p, c_char_p, POINTER(_pending_p)]),
    "kvtier_close_session_async": (_status, [_client_p, c_char_p, POINTER(_pending_p)]),
    "kvtier_pending_poll": (_status, [_pending_p, POINTER(c_int)]),
    "kvtier_pending_wait_save": (_status, [_pending_p, POINTER(SaveResult)]),
    "kvtier_pending_wait_lookup": (_status, [_pending_p, POINTER(c_uint32), c_void_p]),
    "kvtier_pending_wait_load": (_status, [_pending_p, POINTER(LoadResult)]),
    "kvtier_pending_wait_begin_turn": (_status, [_pending_p, POINTER(BeginTurnResult)]),
    "kvtier_pending_wait_close_session": (_status, [_pending_p, POINTER(c_uint32)]),
    "kvtier_pending_free": (None, [_pending_p]),
}

# Later additions (version node KVTIER_0.2 and on): used when the loaded library has them,
# so this package still works with an older libkvtier.so.0.
_OPTIONAL_SIGNATURES = {
    "kvtier_last_error_retryable": (c_int, []),
    "kvtier_block_hashes": (_status, [c_void_p, c_size_t, c_uint32, c_char_p, c_size_t, c_char_p,
                                      c_void_p, c_size_t, POINTER(c_size_t)]),
    "kvtier_connect_with_options": (_status, [c_char_p, POINTER(ClientOptions),
                                              POINTER(_client_p)]),
    "kvtier_reconnects": (c_uint64, [_client_p]),
    # KVTIER_0.8: the model fingerprint's checkpoint digest (kvtier.fingerprint).
    "kvtier_checkpoint_digest": (_status, [c_char_p, c_char_p, c_size_t, POINTER(c_uint64)]),
    "kvtier_save_with_retention_async": (_status, [_client_p, c_char_p, c_void_p, c_uint32,
                                                   c_int, POINTER(Retention),
                                                   POINTER(RangeRetention), c_uint32,
                                                   POINTER(_pending_p)]),
    "kvtier_load_planes_async": (_status, [_client_p, c_char_p, c_void_p, c_uint32, c_uint32,
                                           c_uint32, POINTER(_pending_p)]),
    # KVTIER_0.6: the data path in the Hello, the GPU staging kernels (kvtier.gpu).
    "kvtier_hello_with_data_path": (_status, [_client_p, POINTER(Layout), c_char_p, c_int,
                                              c_double, c_int, POINTER(HelloInfo)]),
    "kvtier_gpu_stager_probe": (_status, [c_uint64]),
    "kvtier_gpu_stager_create": (_status, [_client_p, POINTER(Layout), POINTER(c_uint32),
                                           POINTER(c_uint64), c_uint32, c_uint64, c_uint32,
                                           POINTER(c_void_p)]),
    "kvtier_gpu_stager_save": (_status, [c_void_p, c_char_p, c_void_p, c_uint32, c_int,
                                         c_uint64, POINTER(SaveResult)]),
    "kvtier_gpu_stager_load": (_status, [c_void_p, c_char_p, c_void_p, c_uint32, c_uint32,
                                         c_uint32, c_uint64, POINTER(LoadResult)]),
    "kvtier_gpu_stager_begin_load": (_status, [c_void_p, c_char_p, c_void_p, c_uint32,
                                               POINTER(c_uint32), POINTER(c_uint32), c_uint32]),
    "kvtier_gpu_stager_finish_range": (_status, [c_void_p, c_uint32, c_uint64,
                                                 POINTER(LoadResult)]),
    "kvtier_gpu_stager_end_load": (_status, [c_void_p]),
    "kvtier_gpu_stager_destroy": (None, [c_void_p]),
    # KVTIER_0.9: tier notices (Client.watch_tiers_async).
    "kvtier_watch_tiers_async": (_status, [_client_p, c_uint32, c_uint32, POINTER(_pending_p)]),
    "kvtier_pending_wait_tier_notices": (_status, [_pending_p, c_void_p, c_uint32,
                                                   POINTER(c_uint32), POINTER(c_int)]),
}

DATA_PATHS = {"plane-copies": 0, "staging-kernels": 1, "staging-host": 2}

_load_lock = threading.Lock()
_library: ctypes.CDLL | None = None  # set once, under _load_lock


def _candidates() -> list[str]:
    paths = []
    override = os.environ.get("KVTIER_LIBRARY")
    if override:
        return [override]  # an explicit choice: no silent fallback to another copy
    shipped = os.path.join(os.path.dirname(os.path.abspath(__file__)), SONAME)
    if os.path.exists(shipped):
        paths.append(shipped)
    paths.append(SONAME)
    return paths


def library() -> ctypes.CDLL:
    """The loaded library with every signature declared; Unavailable if none loads."""
    global _library
    if _library is not None:
        return _library
    with _load_lock:
        if _library is None:
            failures = []
            for path in _candidates():
                try:
                    loaded = ctypes.CDLL(path)
                except OSError as error:
                    failures.append(f"{path}: {error}")
                    continue
                for name, (restype, argtypes) in _SIGNATURES.items():
                    try:
                        function = getattr(loaded, name)
                    except AttributeError:
                        raise Unavailable(f"{path} lacks {name}: not a libkvtier.so.0 of "
                                          f"ABI version 0", retryable=False) from None
                    function.restype = restype
                    function.argtypes = argtypes
                for name, (restype, argtypes) in _OPTIONAL_SIGNATURES.items():
                    function = getattr(loaded, name, None)
                    if function is not None:
                        function.restype = restype
                        function.argtypes = argtypes
                _library = loaded
                break
            else:
                raise Unavailable(
                    "cannot load the kvtier client library (set KVTIER_LIBRARY to the path "
                    "of libkvtier.so.0, or install the kvtier package): " + "; ".join(failures),
                    retryable=False)
    return _library


def last_error_message() -> str:
    """The calling thread's latest kvtier_* message (kvtier_last_error)."""
    return library().kvtier_last_error().decode("utf-8", "replace")


def last_error_retryable() -> bool | None:
    """Whether the calling thread's latest kvtier_* call failed retryably
    (kvtier_last_error_retryable); None when the library predates that function."""
    function = getattr(library(), "kvtier_last_error_retryable", None)
    return None if function is None else bool(function())


def check(status: int) -> None:
    """Raises the exception for a non-OK kvtier_status, with this thread's message and
    retryable flag."""
    if status != StatusCode.OK:
        raise error_from_status(status, last_error_message(), last_error_retryable())


def error_or_none(code: int, message: bytes) -> KvtierError | None:
    """A result's stop code and message as an exception object (not raised), or None."""
    if code == StatusCode.OK:
        return None
    return error_from_status(code, message.decode("utf-8", "replace"))


def version() -> str:
    """The library's version, "MAJOR.MINOR.PATCH"."""
    return library().kvtier_version().decode()
