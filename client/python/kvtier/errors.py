"""Exceptions raised by the kvtier client.

Each class is named after the daemon's status code and says what the caller should do,
the same vocabulary as kvtierd's wire protocol and the C interface (``kvtier.h``).
Every exception carries ``code`` (a :class:`StatusCode`), ``message`` (the daemon's
or the library's text, naming the bad field where there is one) and ``retryable``: True
when the same call, unchanged, may succeed later (after a wait, or for
:class:`Unavailable` a new client). The daemon sets it per error; where it does not say
(an exception built here, a library older than ``kvtier_last_error_retryable``),
UNAVAILABLE and RESOURCE_EXHAUSTED are retryable and every other code is not.
"""

from __future__ import annotations

import enum
from typing import Callable


class StatusCode(enum.IntEnum):
    """The codes of ``kvtier_status``; equal to the wire protocol's ``ErrorCode``."""

    OK = 0
    INVALID_ARGUMENT = 1
    NOT_FOUND = 2
    RESOURCE_EXHAUSTED = 3
    PERMISSION_DENIED = 4
    UNAVAILABLE = 5
    DATA_LOSS = 6
    INTERNAL = 7
    NOT_SUPPORTED = 8


def retryable_by_default(code: StatusCode | int) -> bool:
    """The retryable flag of an error whose producer did not set one."""
    return int(code) in (StatusCode.UNAVAILABLE, StatusCode.RESOURCE_EXHAUSTED)


class KvtierError(Exception):
    """Base of every kvtier error: ``code`` says what to do, ``message`` why, and
    ``retryable`` whether the same call may succeed later unchanged."""

    def __init__(self, code: StatusCode | int, message: str,
                 retryable: bool | None = None) -> None:
        try:
            code = StatusCode(code)
        except ValueError:
            code = StatusCode.INTERNAL
            message = f"unknown status code: {message}"
        super().__init__(code, message)
        self.code: StatusCode = code
        self.message: str = message
        self.retryable: bool = (retryable_by_default(code) if retryable is None
                                else bool(retryable))

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"

    def __reduce__(self):  # subclasses take (message) only: rebuild without __init__
        return (_rebuild, (type(self), int(self.code), self.message, self.retryable))


def _rebuild(cls: type[KvtierError], code: int, message: str,
             retryable: bool | None = None) -> KvtierError:
    error = cls.__new__(cls)
    KvtierError.__init__(error, code, message, retryable)
    return error


class InvalidArgument(KvtierError, ValueError):
    """The request was wrong: fix it. The message names the bad field or tensor.

    Retrying the same request fails the same way. Also a :class:`ValueError`.
    """

    def __init__(self, message: str, retryable: bool | None = None) -> None:
        super().__init__(StatusCode.INVALID_ARGUMENT, message, retryable)


class NotFound(KvtierError):
    """The session or region named does not exist (never saved, closed or evicted).

    For a session this is not a failure of the engine: treat it as "nothing held" and
    compute the prefix.
    """

    def __init__(self, message: str, retryable: bool | None = None) -> None:
        super().__init__(StatusCode.NOT_FOUND, message, retryable)


class ResourceExhausted(KvtierError):
    """The daemon is out of room or at a limit: retry later, or with fewer blocks."""

    def __init__(self, message: str, retryable: bool | None = None) -> None:
        super().__init__(StatusCode.RESOURCE_EXHAUSTED, message, retryable)


class PermissionDenied(KvtierError):
    """The caller may not do this (admin requests, another namespace's data)."""

    def __init__(self, message: str, retryable: bool | None = None) -> None:
        super().__init__(StatusCode.PERMISSION_DENIED, message, retryable)


class Unavailable(KvtierError):
    """The daemon went away or never answered: make a new :class:`kvtier.Client`,
    say hello and register the regions again. Blocks saved before may still be held
    (the NVMe tier survives restarts); meanwhile compute the prefix.

    Also raised, not retryable, when ``libkvtier.so.0`` cannot be loaded.
    """

    def __init__(self, message: str, retryable: bool | None = None) -> None:
        super().__init__(StatusCode.UNAVAILABLE, message, retryable)


class DataLoss(KvtierError):
    """The bytes are gone or corrupt: recompute them. The daemon has dropped them."""

    def __init__(self, message: str, retryable: bool | None = None) -> None:
        super().__init__(StatusCode.DATA_LOSS, message, retryable)


class Internal(KvtierError):
    """A bug in kvtier: report it with the message. The connection may still work."""

    def __init__(self, message: str, retryable: bool | None = None) -> None:
        super().__init__(StatusCode.INTERNAL, message, retryable)


class NotSupported(KvtierError):
    """This daemon or library build does not implement the request (e.g. CUDA regions on
    a host-backend kvtierd, CUDA pointers in a libkvtier built without CUDA): do it
    another way. Retrying the same request fails the same way.
    """

    def __init__(self, message: str, retryable: bool | None = None) -> None:
        super().__init__(StatusCode.NOT_SUPPORTED, message, retryable)


class ClientClosed(KvtierError):
    """The :class:`kvtier.Client` (or the reply's client) was closed by this process:
    a bug in the caller. Make a new client to go on. Its code is ``UNAVAILABLE``; it
    is not an :class:`Unavailable`, so reconnect-on-Unavailable loops do not hide it.
    """

    def __init__(self, message: str = "the kvtier client is closed") -> None:
        super().__init__(StatusCode.UNAVAILABLE, message, retryable=False)


# Each class here is built from (message, retryable): their codes are their own.
_BY_CODE: dict[int, Callable[[str, bool | None], KvtierError]] = {
    StatusCode.INVALID_ARGUMENT: InvalidArgument,
    StatusCode.NOT_FOUND: NotFound,
    StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    StatusCode.PERMISSION_DENIED: PermissionDenied,
    StatusCode.UNAVAILABLE: Unavailable,
    StatusCode.DATA_LOSS: DataLoss,
    StatusCode.INTERNAL: Internal,
    StatusCode.NOT_SUPPORTED: NotSupported,
}


def error_from_status(code: int, message: str, retryable: bool | None = None) -> KvtierError:
    """The exception (not raised) for a non-OK ``kvtier_status``, its message and its
    retryable flag (None: the code's default)."""
    cls = _BY_CODE.get(int(code))
    if cls is None:
        return Internal(f"unknown kvtier_status {int(code)}: {message}")
    return cls(message, retryable)
