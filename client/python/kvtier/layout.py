"""Plane and Layout: the shape of an engine's paged KV cache, as kvtierd sees it.

A *plane* is one per-block slice of engine memory ("layer 7, K"): engine block ``b``'s
bytes of the plane are ``[offset_bytes + b * stride_bytes, + bytes_per_block)`` of the
registered region ``region_id``. A logical block, the unit kvtierd stores, is the
concatenation of its planes in order. ``kvtier.torch`` derives planes from tensors, so
engines rarely write offsets by hand.

Both classes validate on construction and raise :class:`kvtier.InvalidArgument`
naming the bad field; the daemon validates again against the regions registered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .errors import InvalidArgument

_UINT32_MAX = 2**32 - 1
_UINT64_MAX = 2**64 - 1


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidArgument(f"{name} is {value}; it must lie in {low}..{high}")


def _check_text(name: str, value: object, max_bytes: int, allow_empty: bool) -> None:
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a str, got {type(value).__name__}")
    encoded = value.encode("utf-8")
    if not allow_empty and not encoded:
        raise InvalidArgument(f"{name} is empty")
    if len(encoded) > max_bytes:
        raise InvalidArgument(f"{name} is {len(encoded)} bytes long; at most {max_bytes} allowed")
    if "\0" in value:
        raise InvalidArgument(f"{name} contains a NUL character")


@dataclasses.dataclass(frozen=True)
class Plane:
    """One per-block slice of a registered region (see the module docstring)."""

    region_id: int  # the id the region was (or will be) registered under
    offset_bytes: int  # where engine block 0's slice starts, from the region's start
    stride_bytes: int  # bytes from engine block b's slice to block b+1's
    bytes_per_block: int  # bytes of one block's slice

    def __post_init__(self) -> None:
        _check_int("Plane.region_id", self.region_id, 0, _UINT32_MAX)
        _check_int("Plane.offset_bytes", self.offset_bytes, 0, _UINT64_MAX)
        _check_int("Plane.stride_bytes", self.stride_bytes, 0, _UINT64_MAX)
        _check_int("Plane.bytes_per_block", self.bytes_per_block, 1, _UINT64_MAX)


@dataclasses.dataclass(frozen=True)
class Layout:
    """An engine's KV cache layout. Blocks are shared only between equal layouts:
    every field counts (the daemon digests them), so two engines share a system
    prompt's blocks only when model, shape, dtype, planes' sizes and extra_key agree.

    ``dtype`` is a name, e.g. "fp16", "bf16", "fp32", "fp8_e4m3" (``kvtier.torch``
    names torch dtypes this way). ``extra_key``: anything else that makes blocks
    incompatible (a LoRA adapter id, a quantization recipe).
    """

    model_id: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    tokens_per_block: int
    num_blocks: int
    planes: Sequence[Plane]
    tp_rank: int = 0
    tp_size: int = 1
    extra_key: str = ""

    def __post_init__(self) -> None:
        _check_text("Layout.model_id", self.model_id, 256, allow_empty=False)
        _check_text("Layout.dtype", self.dtype, 32, allow_empty=False)
        _check_text("Layout.extra_key", self.extra_key, 256, allow_empty=True)
        _check_int("Layout.num_layers", self.num_layers, 0, _UINT32_MAX)
        _check_int("Layout.num_kv_heads", self.num_kv_heads, 0, _UINT32_MAX)
        _check_int("Layout.head_dim", self.head_dim, 0, _UINT32_MAX)
        _check_int("Layout.tokens_per_block", self.tokens_per_block, 1, _UINT32_MAX)
        _check_int("Layout.num_blocks", self.num_blocks, 1, _UINT64_MAX)
        _check_int("Layout.tp_size", self.tp_size, 1, _UINT32_MAX)
        _check_int("Layout.tp_rank", self.tp_rank, 0, self.tp_size - 1)
        if isinstance(self.planes, (str, bytes)) or not isinstance(self.planes, Sequence):
            raise InvalidArgument("Layout.planes must be a list of kvtier.Plane")
        planes = tuple(self.planes)
        if not planes:
            raise InvalidArgument("Layout.planes is empty; a block needs at least one plane")
        for i, plane in enumerate(planes):
            if not isinstance(plane, Plane):
                raise InvalidArgument(
                    f"Layout.planes[{i}] is a {type(plane).__name__}, not a kvtier.Plane")
            if self.num_blocks > 1 and plane.stride_bytes < plane.bytes_per_block:
                raise InvalidArgument(
                    f"Layout.planes[{i}].stride_bytes {plane.stride_bytes} is below "
                    f"bytes_per_block {plane.bytes_per_block}: blocks would overlap")
        object.__setattr__(self, "planes", planes)  # frozen: a tuple nobody can change

    @property
    def block_bytes(self) -> int:
        """Bytes of one logical block: the sum of its planes' slices."""
        return sum(plane.bytes_per_block for plane in self.planes)

    @property
    def region_ids(self) -> list[int]:
        """The region ids the planes name, each once, in first-use order."""
        return list(dict.fromkeys(plane.region_id for plane in self.planes))
