"""Pending: a reply not yet waited for, from a Client's *_async call."""

from __future__ import annotations

import threading
from ctypes import byref, c_int
from typing import Callable, Generic, TypeVar

from . import _lib
from .errors import InvalidArgument

T = TypeVar("T")


class Pending(Generic[T]):
    """The reply to one request sent by ``Client.*_async``.

    ``done()`` never blocks; ``result()`` waits for the reply and returns what the
    blocking call would have returned, or raises what it would have raised. result()
    may be called again and gives the same outcome. Requests may complete in any
    order. Dropping a Pending without waiting discards its reply; the request itself
    still runs. A Pending stays valid after its client is closed (it keeps the
    connection open until it is waited for or dropped). Meant for one thread at a
    time; a lock keeps misuse safe.
    """

    def __init__(self, handle: int | None, wait: Callable[[int], T]) -> None:
        self._handle = handle  # the kvtier_pending*, None once waited for
        self._wait = wait
        self._lock = threading.Lock()
        # (the result,) or the error raised, once waited for: a 1-tuple, as T may be None.
        self._outcome: tuple[T] | Exception | None = None

    def done(self) -> bool:
        """True when result() would return without waiting. Never blocks: False while
        another thread is inside result()."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._outcome is not None:
                return True
            ready = c_int(0)
            _lib.check(_lib.library().kvtier_pending_poll(self._handle, byref(ready)))
            return bool(ready.value)
        finally:
            self._lock.release()

    def result(self) -> T:
        """Waits for the reply; returns the result or raises its KvtierError."""
        with self._lock:
            if self._outcome is None:
                handle, self._handle = self._handle, None
                if handle is None:  # an earlier result() was interrupted (KeyboardInterrupt)
                    raise InvalidArgument("this reply is gone: an earlier result() was interrupted "
                                          "while it waited")
                try:
                    self._outcome = (self._wait(handle),)
                except Exception as error:  # kept, so every call sees it
                    self._outcome = error
                finally:
                    _lib.library().kvtier_pending_free(handle)
            outcome = self._outcome
        if isinstance(outcome, Exception):
            raise outcome
        return outcome[0]

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None:
            try:
                _lib.library().kvtier_pending_free(handle)
            except Exception:  # interpreter shutdown: the library may be gone
                pass
