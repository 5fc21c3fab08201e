"""The package's registry of memfd-backed buffers (kvtier.torch.memfd_tensor).

Client.register_tensor finds a CPU tensor's memfd here by address. An entry lives as
long as its mmap: the tensors made over it hold the mmap (through their storage), and
when the last of them is gone the mapping is unmapped and the entry and its fd are
dropped. Thread-safe: one lock guards the table.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
import weakref
from dataclasses import dataclass


@dataclass(frozen=True)
class MemfdBuffer:
    """A memfd and where this process mapped it. fd stays open while the map lives."""

    fd: int
    address: int  # of the first byte of the mapping
    size_bytes: int


_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # fault the pages in now, not mid-copy
_lock = threading.Lock()
# address → (buffer, its mmap): the weak reference reads None from the moment the mmap
# starts being freed, before the finalizer below runs, so a mapping being torn down (and
# whatever is mapped at its address next) is never mistaken for a live memfd.
_by_address: dict[int, tuple[MemfdBuffer, weakref.ref]] = {}  # guarded by _lock
# Buffers whose mmap is gone, their entries still to drop (under _lock, by the next
# create or find). The finalizer must not take _lock itself: it runs wherever the last
# reference to the mmap goes, which may be a garbage collection started by an
# allocation in this very thread while it holds _lock (a lock it would then wait on for
# ever). list.append is atomic.
_forgotten: list[MemfdBuffer] = []


def create(name: str, size_bytes: int) -> tuple[mmap.mmap, MemfdBuffer]:
    """A new memfd of exactly size_bytes, mapped shared and read-write.

    The caller wraps the mmap (e.g. torch.frombuffer) and drops its own reference; the
    entry and the fd go away with the mmap's last reference.
    """
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size_bytes)
        # A fixed size tells kvtierd it may map the memfd safely (it refuses one that
        # could shrink under its copies).
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        mapping = mmap.mmap(fd, size_bytes, flags=mmap.MAP_SHARED | _MAP_POPULATE,
                            prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise
    address = _address_of(mapping)
    buffer = MemfdBuffer(fd=fd, address=address, size_bytes=size_bytes)
    with _lock:
        _drop_forgotten_locked()
        _by_address[address] = (buffer, weakref.ref(mapping))
    weakref.finalize(mapping, _forget, buffer)
    return mapping, buffer


def find(address: int) -> MemfdBuffer | None:
    """The live memfd buffer whose mapping contains address, if any."""
    with _lock:
        _drop_forgotten_locked()
        for buffer, mapping in list(_by_address.values()):
            if mapping() is None:
                continue  # being unmapped
            if buffer.address <= address < buffer.address + buffer.size_bytes:
                return buffer
    return None


def _forget(buffer: MemfdBuffer) -> None:
    """The mmap's finalizer: its entry goes at the next create or find (its weak
    reference already reads None, so find skips it meanwhile)."""
    _forgotten.append(buffer)
    os.close(buffer.fd)


def _drop_forgotten_locked() -> None:
    while _forgotten:
        buffer = _forgotten.pop()
        entry = _by_address.get(buffer.address)
        # A new mapping may already sit at this address: drop only our own entry.
        if entry is not None and entry[0] is buffer:
            del _by_address[buffer.address]


def _address_of(mapping: mmap.mmap) -> int:
    import ctypes

    holder = ctypes.c_char.from_buffer(mapping)  # a temporary export of the buffer
    try:
        return ctypes.addressof(holder)
    finally:
        del holder
