"""Torch helpers: memfd-backed KV tensors and the planes of paged KV layouts.

``import kvtier`` never imports torch; this module does, when it is imported.

Planes are derived from each tensor's shape, strides and data_ptr, so nobody writes
offsets by hand. Offsets count from the start of the *region* that holds the tensor:

- a CPU tensor from :func:`memfd_tensor`, or a view of one: the region is the whole
  memfd (what ``Client.register_tensor`` registers), so several layers carved out of
  one memfd tensor get their offsets from the data_ptr differences;
- a CUDA tensor: by default the region starts at the lowest data_ptr of the layers
  given the same region id (one tensor per region: its own start), which is what
  ``Client.register_tensor`` registers for the tensor holding them;
- ``region_bases={region_id: tensor_or_address}`` overrides both.

Every helper checks that all layers share one shape, dtype and device, that each
block's bytes within a plane are contiguous, and that blocks do not overlap; it raises
:class:`kvtier.InvalidArgument` naming the layer and the problem otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Union

import torch

from . import _memfd
from .errors import InvalidArgument
from .layout import Layout, Plane

# torch dtype -> the Layout.dtype name kvtierd and other engines use for it.
_DTYPE_NAMES = {
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float32: "fp32",
    torch.int8: "int8",
    torch.uint8: "uint8",
}
for _attr, _name in (("float8_e4m3fn", "fp8_e4m3"), ("float8_e5m2", "fp8_e5m2")):
    if hasattr(torch, _attr):
        _DTYPE_NAMES[getattr(torch, _attr)] = _name

RegionIds = Union[int, Sequence[int]]
Tensors = Union[torch.Tensor, Sequence[torch.Tensor]]
RegionBase = Union[torch.Tensor, int]  # where a region starts: a tensor (its data_ptr) or an address


def dtype_name(dtype: torch.dtype) -> str:
    """The Layout.dtype name of a torch dtype ("fp16", "bf16", ...); InvalidArgument
    for dtypes a KV cache does not use."""
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        accepted = ", ".join(str(d).replace("torch.", "") for d in _DTYPE_NAMES)
        raise InvalidArgument(f"dtype {dtype} is not a KV cache dtype kvtier knows "
                              f"(accepted: {accepted})") from None


def memfd_tensor(shape: Sequence[int] | int, dtype: torch.dtype = torch.float16,
                 name: str = "kvtier-kv") -> torch.Tensor:
    """A zero-filled, contiguous CPU tensor over a new memfd, registrable with
    ``Client.register_tensor`` on kvtierd's host backend. The memfd lives as long as
    the tensor or any view of it; the package records it so register_tensor finds it.
    """
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(not isinstance(n, int) or n < 0 for n in shape):
        raise InvalidArgument(f"memfd_tensor shape must be non-negative ints, got {shape}")
    element_bytes = torch.empty((), dtype=dtype).element_size()
    size_bytes = math.prod(shape) * element_bytes
    if size_bytes == 0:
        raise InvalidArgument(f"memfd_tensor of shape {shape} would be empty")
    mapping, _ = _memfd.create(name, size_bytes)
    # The storage holds the mmap; when the last view goes, the mapping and the memfd go.
    flat = torch.frombuffer(mapping, dtype=dtype)
    del mapping
    return flat.view(shape)


def _layers(kv_caches: Tensors, rank: int, helper: str) -> list[torch.Tensor]:
    if isinstance(kv_caches, torch.Tensor):
        if kv_caches.dim() == rank + 1:  # [num_layers, ...]: one tensor holding all layers
            return list(kv_caches.unbind(0))
        return [kv_caches]
    layers = list(kv_caches)
    if not layers:
        raise InvalidArgument(f"{helper}: no layer tensors given")
    for i, layer in enumerate(layers):
        if not isinstance(layer, torch.Tensor):
            raise InvalidArgument(f"{helper}: layer {i} is a {type(layer).__name__}, "
                                  f"not a torch.Tensor")
    return layers


def _region_id_list(region_ids: RegionIds, count: int, helper: str) -> list[int]:
    if isinstance(region_ids, int):
        return [region_ids] * count
    ids = list(region_ids)
    if len(ids) != count:
        raise InvalidArgument(f"{helper}: {len(ids)} region ids for {count} layers; give one "
                              f"per layer, or one int for all")
    return ids


def _check_layers(layers: list[torch.Tensor], rank: int, layout_text: str, helper: str) -> None:
    first = layers[0]
    for i, layer in enumerate(layers):
        where = f"{helper}: layer {i}"
        if layer.dim() != rank:
            raise InvalidArgument(f"{where} has shape {tuple(layer.shape)}; expected "
                                  f"{layout_text}")
        if layer.shape != first.shape or layer.dtype != first.dtype \
                or layer.device != first.device:
            raise InvalidArgument(
                f"{where} is {tuple(layer.shape)} {layer.dtype} on {layer.device}, layer 0 is "
                f"{tuple(first.shape)} {first.dtype} on {first.device}: all layers must match")
        dtype_name(layer.dtype)


def _check_block_dense(layer: torch.Tensor, inner_dims: range, where: str) -> None:
    """The dims in inner_dims (one block's worth of a plane) must be C-contiguous."""
    expected = 1
    for dim in reversed(inner_dims):
        if layer.shape[dim] != 1 and layer.stride(dim) != expected:
            raise InvalidArgument(
                f"{where} is not contiguous within a block (shape {tuple(layer.shape)}, "
                f"strides {layer.stride()}); kvtierd copies each block of a plane as one "
                f"range: allocate the cache contiguous, e.g. with kvtier.torch.memfd_tensor")
        expected *= layer.shape[dim]


def _region_base(region_id: int, layer_index: int, layer: torch.Tensor,
                 region_bases: Mapping[int, RegionBase] | None, lowest: dict[int, int],
                 helper: str) -> int:
    if region_bases is not None and region_id in region_bases:
        base = region_bases[region_id]
        return base.data_ptr() if isinstance(base, torch.Tensor) else int(base)
    if layer.device.type == "cpu":
        buffer = _memfd.find(layer.data_ptr())
        if buffer is None:
            raise InvalidArgument(
                f"{helper}: layer {layer_index} is a CPU tensor outside any "
                f"kvtier.torch.memfd_tensor, so kvtierd cannot map it; allocate the cache "
                f"with memfd_tensor (or pass region_bases)")
        return buffer.address
    return lowest[region_id]


def _planes(kv_caches: Tensors, region_ids: RegionIds, rank: int, layout_text: str,
            helper: str, region_bases: Mapping[int, RegionBase] | None,
            plane_dims: Sequence[int | None], block_dim: int) -> list[Plane]:
    """Shared by the layout helpers. plane_dims: for each plane of a layer, the dim
    that selects it (index = plane number) or None for a single-plane layout."""
    layers = _layers(kv_caches, rank, helper)
    ids = _region_id_list(region_ids, len(layers), helper)
    _check_layers(layers, rank, layout_text, helper)
    lowest: dict[int, int] = {}
    holders: dict[int, tuple[object, int]] = {}  # region id → (what holds it, first layer)
    for i, (region_id, layer) in enumerate(zip(ids, layers)):
        lowest[region_id] = min(lowest.get(region_id, layer.data_ptr()), layer.data_ptr())
        # One region is one memfd (CPU) or one allocation (CUDA): layers in different
        # ones under one region id would get offsets into memory kvtierd never maps.
        if layer.device.type == "cpu":
            holder = _memfd.find(layer.data_ptr())
        else:
            holder = layer.untyped_storage().data_ptr()
        if holder is None:
            continue  # reported by _region_base
        first = holders.setdefault(region_id, (holder, i))
        if first[0] != holder:
            raise InvalidArgument(
                f"{helper}: layers {first[1]} and {i} are in different memory "
                f"(memfd tensors or CUDA allocations) but share region id {region_id}; give "
                f"each its own region id")
    planes: list[Plane] = []
    for i, (region_id, layer) in enumerate(zip(ids, layers)):
        element = layer.element_size()
        # One block of one plane: the dims after both the block dim and the K/V dim.
        inner = range(max(block_dim, plane_dims[0] if plane_dims[0] is not None else -1) + 1,
                      rank)
        _check_block_dense(layer, inner, f"{helper}: layer {i}")
        bytes_per_block = math.prod(layer.shape[d] for d in inner) * element
        stride_bytes = layer.stride(block_dim) * element
        if layer.shape[block_dim] > 1 and stride_bytes < bytes_per_block:
            raise InvalidArgument(f"{helper}: layer {i}'s blocks overlap (block stride "
                                  f"{stride_bytes} B < {bytes_per_block} B a block)")
        base = _region_base(region_id, i, layer, region_bases, lowest, helper)
        for plane_index, plane_dim in enumerate(plane_dims):
            start = layer.data_ptr()
            if plane_dim is not None:
                start += plane_index * layer.stride(plane_dim) * element
            if start < base:
                raise InvalidArgument(f"{helper}: layer {i} starts {base - start} bytes before "
                                      f"the start of region {region_id}")
            planes.append(Plane(region_id=region_id, offset_bytes=start - base,
                                stride_bytes=stride_bytes, bytes_per_block=bytes_per_block))
    return planes


def vllm_planes(kv_caches: Tensors, region_ids: RegionIds, *,
                region_bases: Mapping[int, RegionBase] | None = None) -> list[Plane]:
    """Planes of vLLM's flash-attention cache: per layer a tensor shaped
    ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` (K then V). Returns the K
    plane then the V plane of each layer, in layer order. ``kv_caches``: the layer
    tensors, or one tensor with a leading layer dim. ``region_ids``: one per layer, or
    one int when a single region holds every layer."""
    layers = _layers(kv_caches, 5, "vllm_planes")
    for i, layer in enumerate(layers):
        if layer.dim() == 5 and layer.shape[0] != 2:
            raise InvalidArgument(f"vllm_planes: layer {i} has shape {tuple(layer.shape)}; dim 0 "
                                  f"must be 2 (K, V)")
    return _planes(layers, region_ids, 5, "[2, num_blocks, block_size, num_kv_heads, head_dim]",
                   "vllm_planes", region_bases, plane_dims=(0, 0), block_dim=1)


def flashinfer_planes(kv_caches: Tensors, region_ids: RegionIds, *,
                      region_bases: Mapping[int, RegionBase] | None = None) -> list[Plane]:
    """Planes of FlashInfer's cache: per layer ``[num_blocks, 2, block_size,
    num_kv_heads, head_dim]`` (NHD). K then V plane per layer, as vllm_planes."""
    layers = _layers(kv_caches, 5, "flashinfer_planes")
    for i, layer in enumerate(layers):
        if layer.dim() == 5 and layer.shape[1] != 2:
            raise InvalidArgument(f"flashinfer_planes: layer {i} has shape "
                                  f"{tuple(layer.shape)}; dim 1 must be 2 (K, V)")
    return _planes(layers, region_ids, 5, "[num_blocks, 2, block_size, num_kv_heads, head_dim]",
                   "flashinfer_planes", region_bases, plane_dims=(1, 1), block_dim=0)


def mla_planes(kv_caches: Tensors, region_ids: RegionIds, *,
               region_bases: Mapping[int, RegionBase] | None = None) -> list[Plane]:
    """Planes of an MLA (DeepSeek) latent cache: per layer ``[num_blocks, block_size,
    latent_dim]``, one plane per layer."""
    return _planes(kv_caches, region_ids, 3, "[num_blocks, block_size, latent_dim]",
                   "mla_planes", region_bases, plane_dims=(None,), block_dim=0)


_KINDS = {
    # kind: (planes helper, tensor rank, dims of (num_blocks, block_size, heads, head_dim))
    "vllm": (vllm_planes, 5, (1, 2, 3, 4)),
    "flashinfer": (flashinfer_planes, 5, (0, 2, 3, 4)),
    "mla": (mla_planes, 3, (0, 1, None, 2)),
}


def layout_from_tensors(model_id: str, kv_caches: Tensors, region_ids: RegionIds, *,
                        kind: str = "vllm", tp_rank: int = 0, tp_size: int = 1,
                        extra_key: str = "",
                        region_bases: Mapping[int, RegionBase] | None = None) -> Layout:
    """A complete Layout for a paged cache of the given kind ("vllm", "flashinfer" or
    "mla"): layers, heads (1 for MLA), head dim, dtype, tokens per block and block
    count from the tensors' shape, planes from the matching helper."""
    if kind not in _KINDS:
        raise InvalidArgument(f'kind must be one of {", ".join(_KINDS)}, got {kind!r}')
    helper, rank, (blocks_dim, block_size_dim, heads_dim, head_dim_dim) = _KINDS[kind]
    layers = _layers(kv_caches, rank, "layout_from_tensors")
    planes = helper(layers, region_ids, region_bases=region_bases)
    first = layers[0]
    return Layout(
        model_id=model_id, num_layers=len(layers),
        num_kv_heads=1 if heads_dim is None else first.shape[heads_dim],
        head_dim=first.shape[head_dim_dim], dtype=dtype_name(first.dtype),
        tokens_per_block=first.shape[block_size_dim], num_blocks=first.shape[blocks_dim],
        planes=planes, tp_rank=tp_rank, tp_size=tp_size, extra_key=extra_key)
