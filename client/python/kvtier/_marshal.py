"""Conversions between Python values and kvtier.h's C structures, for client.py."""

from __future__ import annotations

import ctypes
import sys
from array import array
from collections.abc import Iterable, Sequence
from ctypes import c_int, c_uint32, c_void_p
from itertools import accumulate
from typing import cast

from . import _lib
from .errors import InvalidArgument
from .results import BeginTurnResult, BlockPriority, LoadResult, LookupResult, SaveResult

Block = tuple[bytes, int]  # (block hash, engine block id)


def text(name: str, value: str) -> bytes:
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a str, got {type(value).__name__}")
    return value.encode("utf-8")


# Hash and block lists are packed straight into kvtier_hash / kvtier_block_ref arrays
# as 64-bit words (pointer, length, [engine block id]), the hashes joined into one bytes
# object the pointers point into: an order of magnitude cheaper than ctypes structs,
# which matters for a Lookup of ~20 µs. The length field is a uint32 followed by 4
# bytes of padding, so writing it as a little-endian uint64 is exact; elsewhere, and
# for input the fast path refuses, the ctypes structs below do it field by field.
_PACK_WORDS = sys.byteorder == "little" and ctypes.sizeof(_lib.Hash) == 16 \
    and ctypes.sizeof(_lib.BlockRef) == 24


def _pack(hashes: Sequence[bytes], block_ids: Sequence[int] | None):
    """(array to pass, objects to keep alive) for hashes (and engine block ids)."""
    count = len(hashes)
    lengths = array("Q", map(len, hashes))
    joined = b"".join(hashes)
    base = ctypes.cast(ctypes.c_char_p(joined), c_void_p).value or 0
    addresses = array("Q", accumulate(lengths, initial=base))
    if addresses.pop() != base + len(joined):  # len() of a memoryview counts items
        raise TypeError("hashes must be bytes-like objects of bytes")
    step = 2 if block_ids is None else 3
    words = array("Q", bytes(8 * step * count))
    words[0::step] = addresses
    words[1::step] = lengths
    if block_ids is not None:
        words[2::step] = array("Q", block_ids)
    return words.buffer_info()[0], (words, joined)


def hash_array(hashes: Sequence[bytes]):
    """(pointer to kvtier_hash[count], count, keep-alive)."""
    count = len(hashes)
    if _PACK_WORDS:
        try:
            pointer, keep = _pack(hashes, None)
            return pointer, count, keep
        except TypeError:
            pass
    normalized = [_hash_bytes(h, f"hashes[{i}]") for i, h in enumerate(hashes)]
    refs = (_lib.Hash * count)(*[_lib.Hash(h, len(h)) for h in normalized])
    return refs, count, refs


def _hash_bytes(value: object, name: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise InvalidArgument(f"{name} must be bytes (a block hash), got {type(value).__name__}")


def block_array(blocks: Sequence[Block]):
    """(pointer to kvtier_block_ref[count] or None, count, keep-alive)."""
    count = len(blocks)
    if count == 0:
        return None, 0, None
    if _PACK_WORDS:
        try:
            hashes, block_ids = zip(*blocks)
            pointer, keep = _pack(hashes, block_ids)
            return pointer, count, keep
        except (TypeError, ValueError, OverflowError):
            pass
    normalized = []
    for i, block in enumerate(blocks):
        try:
            block_hash, block_id = block
        except (TypeError, ValueError):
            raise InvalidArgument(
                f"blocks[{i}] must be a (hash, engine_block_id) pair, got {block!r}") from None
        if isinstance(block_id, bool) or not isinstance(block_id, int) \
                or not 0 <= block_id < 2**64:
            raise InvalidArgument(
                f"blocks[{i}] engine_block_id must be a non-negative int, got {block_id!r}")
        normalized.append((_hash_bytes(block_hash, f"blocks[{i}] hash"), block_id))
    refs = (_lib.BlockRef * count)(*[_lib.BlockRef(h, len(h), b) for h, b in normalized])
    return refs, count, refs


def check_int(name: str, value: object, low: int = 0, high: int = 2**64 - 1) -> int:
    """value, an int in low..high: ctypes would wrap a negative or oversized int silently,
    so anything else is refused here."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgument(f"{name} must be an int in {low}..{high}, got {value!r}")
    return value


def plane_range(planes: object) -> tuple[int, int] | None:
    """load()'s ``planes``: None (every plane) or a (begin, count) pair of ints that fit
    the C ABI's uint32 fields. The daemon checks the range against the layout."""
    if planes is None:
        return None
    try:
        # Not iterable, or not two items: the TypeError or ValueError caught below.
        begin, count = cast(Iterable[object], planes)
    except (TypeError, ValueError):
        raise InvalidArgument(
            f"planes must be a (begin, count) pair of ints or None, got {planes!r}") from None
    return check_int("planes begin", begin, 0, 2**32 - 1), check_int("planes count", count, 0, 2**32 - 1)


def check_region_id(region_id: int) -> None:
    check_int("region_id", region_id, 0, 2**32 - 1)


def tensor_extent_bytes(tensor) -> int:
    """Bytes from the tensor's first element to the end of its last (strides ≥ 0)."""
    if tensor.numel() == 0:
        return 0
    if any(stride < 0 for stride in tensor.stride()):
        raise InvalidArgument("a tensor with negative strides cannot be a region")
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    return (last + 1) * tensor.element_size()


def save_result(out: _lib.SaveResult) -> SaveResult:
    return SaveResult(stored=out.stored, deduplicated=out.deduplicated)


def tiers_out(count: int) -> array:
    """Room for kvtier_lookup's tiers_out (kvtier_tier is a C enum: an int)."""
    return array("i", bytes(ctypes.sizeof(c_int) * count))


def lookup_result(hit_count: c_uint32, tiers: array) -> LookupResult:
    hits = hit_count.value
    return LookupResult(hit_count=hits, tiers=list(map(_lib.TIER_NAMES.__getitem__, tiers[:hits])))


def load_result(out: _lib.LoadResult) -> LoadResult:
    return LoadResult(loaded_count=out.loaded_count,
                      stop_reason=_lib.error_or_none(out.stop_code, out.stop_message))


def begin_turn_result(out: _lib.BeginTurnResult) -> BeginTurnResult:
    return BeginTurnResult(known_blocks=out.known_blocks, promoted_blocks=out.promoted_blocks)


_MAX_DURATION_MS = 2**64 - 1


def _duration_ms(name: str, seconds: float | None) -> int:
    if seconds is None:
        return 0
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
            or not 0 < seconds < float("inf"):
        raise InvalidArgument(f"{name} must be a positive, finite number of seconds, "
                              f"got {seconds!r}")
    ms = max(1, round(seconds * 1000))
    if ms > _MAX_DURATION_MS:
        raise InvalidArgument(f"{name} is {seconds!r} s; at most {_MAX_DURATION_MS} ms")
    return ms


def _priority(name: str, value: int, allow_zero: bool) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an int, got {type(value).__name__}")
    low = 0 if allow_zero else 1
    if not low <= value <= 100:
        raise InvalidArgument(f"{name} is {value}; {low}..100 allowed")
    return value


def retention(priority: int | None, duration_s: float | None):
    """kvtier_retention for a session's priority, or None when none was given."""
    if priority is None:
        if duration_s is not None:
            raise InvalidArgument("priority_duration_s was given without a priority")
        return None
    return _lib.Retention(_priority("priority", priority, False), 0,
                          _duration_ms("priority_duration_s", duration_s))


def range_retentions(ranges: Sequence[BlockPriority], count: int):
    """(kvtier_range_retention array or None, how many) for a save of `count` blocks:
    ranges may overlap (later ones win) but cover at most `count` blocks in total."""
    ranges = list(ranges)
    if not ranges:
        return None, 0
    out = (_lib.RangeRetention * len(ranges))()
    covered = 0
    for i, r in enumerate(ranges):
        if not isinstance(r, BlockPriority):
            raise InvalidArgument(f"block_priorities[{i}] must be a kvtier.BlockPriority, "
                                  f"got {type(r).__name__}")
        if isinstance(r.first, bool) or not isinstance(r.first, int) or r.first < 0 \
                or isinstance(r.count, bool) or not isinstance(r.count, int) or r.count < 1 \
                or r.first + r.count > count:
            raise InvalidArgument(f"block_priorities[{i}] covers blocks[{r.first!r}:"
                                  f"{r.first!r}+{r.count!r}]; the save has {count} blocks")
        covered += r.count
        if covered > count:
            raise InvalidArgument(f"block_priorities cover {covered} blocks in total by "
                                  f"block_priorities[{i}]; at most the save's {count}")
        priority = _priority(f"block_priorities[{i}].priority", r.priority, True)
        if priority == 0 and r.duration_s is not None:
            raise InvalidArgument(f"block_priorities[{i}].duration_s without a priority")
        out[i] = _lib.RangeRetention(r.first, r.count, _lib.Retention(
            priority, 0, _duration_ms(f"block_priorities[{i}].duration_s", r.duration_s)))
    return out, len(ranges)


def layout_struct(layout):
    """The kvtier_layout of ``layout``, and its plane array (keep it alive alongside)."""
    planes = (_lib.Plane * len(layout.planes))(*[
        _lib.Plane(p.region_id, 0, p.offset_bytes, p.stride_bytes, p.bytes_per_block)
        for p in layout.planes])
    wire = _lib.Layout(
        model_id=layout.model_id.encode(), dtype=layout.dtype.encode(),
        extra_key=layout.extra_key.encode(), num_layers=layout.num_layers,
        num_kv_heads=layout.num_kv_heads, head_dim=layout.head_dim,
        tokens_per_block=layout.tokens_per_block, tp_rank=layout.tp_rank,
        tp_size=layout.tp_size, num_blocks=layout.num_blocks, planes=planes,
        plane_count=len(layout.planes), reserved=0)
    return wire, planes
