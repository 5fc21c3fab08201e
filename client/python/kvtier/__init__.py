"""kvtier: the Python client of kvtierd, the node-local KV-cache offload daemon.

- :class:`Client` — one connection: hello, register regions, save / lookup / load /
  begin_turn / close_session (blocking, or ``*_async`` returning a :class:`Pending`).
- :class:`Layout`, :class:`Plane` — the shape of the engine's paged KV cache.
- :mod:`kvtier.hashing` — chained prefix hashes of token blocks.
- :mod:`kvtier.torch` — memfd-backed KV tensors and plane helpers for paged layouts
  (imports torch; ``import kvtier`` alone does not).
- Exceptions, one per daemon status code, named for what the caller should do.

The package is pure Python over ``libkvtier.so.0`` (ctypes); see ``kvtier._lib`` for
where the library is looked for.
"""

from . import hashing
from .client import Block, Client, Session
from .errors import (ClientClosed, DataLoss, Internal, InvalidArgument, KvtierError, NotFound,
                     NotSupported, PermissionDenied, ResourceExhausted, StatusCode, Unavailable)
from .layout import Layout, Plane
from .pending import Pending
from .results import (BeginTurnResult, BlockPriority, HelloInfo, LoadResult, LookupResult, SaveResult, Stats,
                      TierNotices, TierStats)

__version__ = "0.1.0"


def library_version() -> str:
    """The version of the loaded libkvtier.so.0 ("MAJOR.MINOR.PATCH")."""
    from . import _lib

    return _lib.version()


__all__ = [
    "BeginTurnResult", "Block", "BlockPriority", "Client", "ClientClosed", "DataLoss", "HelloInfo", "Internal",
    "InvalidArgument", "KvtierError", "Layout", "LoadResult", "LookupResult", "NotFound",
    "NotSupported", "Pending", "PermissionDenied", "Plane", "ResourceExhausted", "SaveResult",
    "Session", "Stats", "StatusCode", "TierNotices", "TierStats", "Unavailable", "hashing", "library_version",
]
