"""Chained prefix hashes of token blocks, as vLLM's prefix caching computes them.

A block's hash names the block *and everything before it*, so equal hashes mean equal
prefixes and two conversations that share a system prompt share its blocks::

    hash[0] = sha256(ROOT        || tokens[0:B]  || extra_keys)
    hash[i] = sha256(hash[i - 1] || tokens[iB:(i+1)B] || extra_keys)

- ``B`` is ``tokens_per_block``; only *full* blocks are hashed (a partial last block
  changes as the conversation grows, so it is never saved).
- Tokens are encoded as little-endian signed 64-bit integers, ``8 * B`` bytes a block.
- ``ROOT`` is 32 zero bytes, or the ``parent`` given (the hash of the block before the
  first token passed, to extend a prefix hashed earlier).
- ``extra_keys`` are appended to every block's input unchanged: put there whatever
  makes the same tokens mean different KV (a LoRA id, image hashes, a cache salt).
  Layout fields (model, dtype, TP rank) need not go here: kvtierd keeps different
  layouts apart by itself. The layout's model id must name everything that changes the
  KV (the weights, their quantization, the KV dtype, rope and position settings): use
  ``kvtier.fingerprint``'s ``model_id`` of a fingerprint, not a model's name or path.

Each hash is 32 bytes (SHA-256), the most kvtierd accepts. The result depends on the
inputs only, never on the process, platform or Python's hash seed.
"""

from __future__ import annotations

import array
import ctypes
import hashlib
import struct
from collections.abc import Iterable, Sequence

from .errors import InvalidArgument

HASH_BYTES = 32
ROOT_HASH = bytes(HASH_BYTES)  # the parent of a conversation's first block


def _as_bytes(name: str, value: bytes | bytearray | memoryview | str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise InvalidArgument(f"{name} must be bytes or str, got {type(value).__name__}")


def _token_list(token_ids: Iterable[int]) -> list[int]:
    tolist = getattr(token_ids, "tolist", None)  # torch tensors and numpy arrays
    tokens = tolist() if callable(tolist) else list(token_ids)
    if tokens and isinstance(tokens[0], list):
        raise InvalidArgument("token_ids must be one-dimensional")
    return tokens


def block_hash(parent: bytes | None, block_token_ids: Sequence[int],
               extra_keys: bytes | str = b"") -> bytes:
    """The hash of one block: sha256(parent || tokens as int64 LE || extra_keys)."""
    parent_bytes = ROOT_HASH if parent is None else _as_bytes("parent", parent)
    if len(parent_bytes) != HASH_BYTES:
        raise InvalidArgument(f"parent is {len(parent_bytes)} bytes; a block hash has {HASH_BYTES}")
    tokens = _token_list(block_token_ids)
    try:
        packed = struct.pack(f"<{len(tokens)}q", *tokens)
    except struct.error as error:
        raise InvalidArgument(f"token ids must be integers in the int64 range: {error}") from None
    return hashlib.sha256(parent_bytes + packed + _as_bytes("extra_keys", extra_keys)).digest()


def block_hashes(token_ids: Iterable[int], tokens_per_block: int,
                 extra_keys: bytes | str = b"", parent: bytes | None = None) -> list[bytes]:
    """The chained hashes of the full blocks of ``token_ids`` (a trailing partial
    block is ignored). ``parent``: the hash of the block just before ``token_ids[0]``
    (None: the conversation starts here). ``block_hashes(a + b, B)`` equals
    ``h + block_hashes(b, B, parent=h[-1])`` with ``h = block_hashes(a, B)`` when
    ``len(a)`` is a multiple of ``B``.
    """
    if isinstance(tokens_per_block, bool) or not isinstance(tokens_per_block, int) \
            or tokens_per_block < 1:
        raise InvalidArgument(f"tokens_per_block must be a positive int, got {tokens_per_block!r}")
    tokens = _token_list(token_ids)
    extra = _as_bytes("extra_keys", extra_keys)
    previous = ROOT_HASH if parent is None else _as_bytes("parent", parent)
    if len(previous) != HASH_BYTES:
        raise InvalidArgument(f"parent is {len(previous)} bytes; a block hash has {HASH_BYTES}")
    full_blocks = len(tokens) // tokens_per_block
    native = _native_block_hashes(tokens[:full_blocks * tokens_per_block], tokens_per_block, extra,
                                  previous)
    if native is not None:
        return native
    block_format = struct.Struct(f"<{tokens_per_block}q")
    hashes: list[bytes] = []
    for i in range(full_blocks):
        try:
            packed = block_format.pack(*tokens[i * tokens_per_block:(i + 1) * tokens_per_block])
        except struct.error as error:
            raise InvalidArgument(
                f"token ids of block {i} must be integers in the int64 range: {error}") from None
        previous = hashlib.sha256(previous + packed + extra).digest()
        hashes.append(previous)
    return hashes


def _native_block_hashes(tokens: list[int], tokens_per_block: int, extra: bytes,
                         parent: bytes) -> list[bytes] | None:
    """The same hashes from libkvtier (kvtier_block_hashes: OpenSSL's SHA-256, several
    times faster than a loop here, and the GIL released while it runs); None when the
    library is not there or predates it (the Python loop then computes them)."""
    try:
        from . import _lib
        function = getattr(_lib.library(), "kvtier_block_hashes", None)
    except Exception:  # no library: the reference loop below
        return None
    if function is None:
        return None
    try:
        packed = array.array("q", tokens)
    except (OverflowError, TypeError) as error:
        raise InvalidArgument(f"token ids must be integers in the int64 range: {error}") from None
    if packed.itemsize != 8:
        return None
    blocks = len(tokens) // tokens_per_block
    out = ctypes.create_string_buffer(blocks * HASH_BYTES)
    written = ctypes.c_size_t(0)
    address = packed.buffer_info()[0] if tokens else None
    _lib.check(function(address, len(tokens), tokens_per_block, extra, len(extra), parent, out,
                        len(out), ctypes.byref(written)))
    raw = out.raw
    return [raw[i * HASH_BYTES:(i + 1) * HASH_BYTES] for i in range(written.value)]
