"""What a kvtier block is for a vLLM model: its layout and its keys.

Both sides of the connector compute the same kvtier Layout from vLLM's KVCacheConfig,
so the scheduler's Lookups and the worker's Loads and Saves name the same blocks:

- one kvtier block = one vLLM block (``block_size`` tokens) of every attention layer;
- vLLM 0.32 views each layer's cache as ``[num_blocks, H, N, C]`` (heads, tokens,
  K and V concatenated) in the physical order its ``kv_cache_layout`` names:
  - block-major layouts (``BLHNC``, ``BLNHC``, ``BHLNC``: vLLM's cross-layer blocks)
    keep a block's bytes for every layer in one contiguous run: the block is one plane,
    copied whole (such a block is never loaded layer by layer);
  - layer-major layouts whose pages are contiguous (``LBHNC``, ``LBNHC``) have one plane
    per layer; ``LHBNC`` one per layer and head;
- the byte order inside a block goes into ``extra_key``, and the daemon's layout
  digest covers it and the planes' sizes: engines whose block bytes could differ never
  share blocks.

Keys are ``kvtier.hashing`` chained SHA-256 over the token ids, with the model id,
LoRA adapter and cache salt in ``extra_keys``. The model id is the model fingerprint's
(kvtier.vllm.fingerprint: weights, quantization, KV dtype, configuration after
overrides, attention), unless the operator names the model with ``model_id``; it is
also the Layout's model id, which kvtierd keeps caches apart by.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Sequence

from .. import hashing
from ..layout import Layout, Plane

MAX_SESSION_BYTES = 256  # kvtierd's limit on a session id
logger = logging.getLogger("kvtier.vllm")

class UnsupportedModel(ValueError):
    """The model's KV cache is of a kind the connector does not store."""


@dataclasses.dataclass(frozen=True)
class BlockShape:
    """What the scheduler and the worker agree on, from vLLM's KVCacheConfig."""
    model_id: str  # the fingerprint's (fingerprint.model_id), or the operator's model_id
    layer_names: tuple[str, ...]
    tokens_per_block: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    layer_bytes: int  # one block of one layer: H * N * C elements
    planes_per_layer: int  # 1 when a block's layer bytes are contiguous, else H
    layout_name: str
    cross_layer: bool  # a block's bytes for every layer are one run: one plane a block
    tp_rank: int
    tp_size: int
    num_blocks: int

    @property
    def plane_bytes(self) -> int:
        return self.block_bytes if self.cross_layer else self.layer_bytes // self.planes_per_layer

    @property
    def block_bytes(self) -> int:
        return self.layer_bytes * len(self.layer_names)

    @property
    def num_planes(self) -> int:
        return 1 if self.cross_layer else self.planes_per_layer * len(self.layer_names)

    def layer_planes(self, layer: int) -> range:
        """The plane indexes holding a layer's bytes (a cross-layer block's one plane
        holds every layer: it counts as layer 0's)."""
        if self.cross_layer:
            return range(0, 1 if layer == 0 else 0)
        return range(layer * self.planes_per_layer, (layer + 1) * self.planes_per_layer)

    @property
    def extra_key(self) -> str:
        if self.cross_layer:
            return f"vllm:block={self.layout_name}"
        page = {"LBHNC": "HNC", "LBNHC": "NHC"}.get(self.layout_name, self.layout_name)
        return f"vllm:page={page}"

    def session(self, session_id: str) -> str:
        """The session this rank's shard is kept under (rank_session_id)."""
        return rank_session_id(session_id, self.tp_rank, self.tp_size)

    def for_rank(self, tp_rank: int) -> BlockShape:
        """The same blocks as TP rank tp_rank holds them (its layout, its sessions)."""
        return dataclasses.replace(self, tp_rank=tp_rank)

    def staging_layout(self, num_slots: int, region_id: int = 0) -> Layout:
        """The Layout of a staging buffer of num_slots blocks, each block's planes in
        order, one after another (the host path's region)."""
        planes = [Plane(region_id=region_id, offset_bytes=i * self.plane_bytes,
                        stride_bytes=self.block_bytes, bytes_per_block=self.plane_bytes)
                  for i in range(self.num_planes)]
        return self.layout(planes, num_slots)

    def layout(self, planes: Sequence[Plane], num_blocks: int) -> Layout:
        return Layout(model_id=self.model_id, num_layers=len(self.layer_names),
                      num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, dtype=self.dtype,
                      tokens_per_block=self.tokens_per_block, num_blocks=num_blocks,
                      planes=list(planes), tp_rank=self.tp_rank, tp_size=self.tp_size,
                      extra_key=self.extra_key)


def block_shape(vllm_config, kv_cache_config, model_id: str | None) -> BlockShape:
    """The BlockShape of a vLLM engine; UnsupportedModel for caches it cannot store
    (several KV cache groups: hybrid, sliding-window or Mamba layers). `model_id`: the
    operator's (None: the model fingerprint's, computed here)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.kv_cache_layout import KVCacheLayout

    if int(getattr(vllm_config.parallel_config, "pipeline_parallel_size", 1)) > 1:
        # Stages with as many layers would share a layout digest and load each other's KV.
        raise UnsupportedModel("kvtier.vllm does not support pipeline parallelism "
                               "(pipeline_parallel_size > 1) yet")
    groups = list(kv_cache_config.kv_cache_groups)
    if len(groups) != 1:
        raise UnsupportedModel(
            f"kvtier.vllm stores models whose attention layers share one KV cache group; this "
            f"model has {len(groups)} ({', '.join(type(g.kv_cache_spec).__name__ for g in groups)})")
    spec = groups[0].kv_cache_spec
    if not isinstance(spec, FullAttentionSpec) or getattr(spec, "sliding_window", None):
        raise UnsupportedModel(f"kvtier.vllm stores full-attention KV caches; this model's is a "
                               f"{type(spec).__name__}")
    layout_name = str(getattr(kv_cache_config, "kv_cache_layout", "LBHNC"))
    try:
        physical = KVCacheLayout[layout_name]
    except KeyError:
        raise UnsupportedModel(f"kvtier.vllm does not know vLLM's kv_cache_layout {layout_name!r}") from None
    heads = int(spec.num_kv_heads)
    layer_bytes = int(spec.real_page_size_bytes)
    planes_per_layer = 1 if physical.is_block_compact else heads
    # Blocks outermost, and no padding between a block's pages: one run a block.
    padded = getattr(spec, "page_size_padded", None)
    cross_layer = physical.stride_order[0] == 1 and padded in (None, layer_bytes)
    from ..torch import dtype_name

    dtype = dtype_name(spec.dtype)  # InvalidArgument for a dtype kvtier does not know
    parallel = vllm_config.parallel_config
    if not model_id:
        from .fingerprint import model_fingerprint

        fingerprint = model_fingerprint(vllm_config)
        logger.info("kvtier.vllm: %s: blocks are keyed as %s", fingerprint.describe(), fingerprint.model_id)
        model_id = fingerprint.model_id
    else:
        logger.info("kvtier.vllm: blocks are keyed by the model_id given, %r: every engine given it must "
                    "compute the same KV (no fingerprint is taken)", model_id)
    return BlockShape(
        model_id=model_id,
        layer_names=tuple(groups[0].layer_names), tokens_per_block=int(spec.block_size),
        num_kv_heads=heads, head_dim=int(spec.head_size), dtype=dtype, layer_bytes=layer_bytes,
        planes_per_layer=planes_per_layer, layout_name=layout_name, cross_layer=cross_layer,
        tp_rank=_tp_rank(parallel), tp_size=int(parallel.tensor_parallel_size),
        num_blocks=int(kv_cache_config.num_blocks))


def _tp_rank(parallel) -> int:
    """This process's tensor-parallel rank. A worker asks vLLM's TP group (set up
    before vLLM makes the worker's connector); elsewhere (the scheduler's process, which
    speaks for every rank, and tests without torch.distributed) it is the global rank
    modulo tp_size, which is the same number: vLLM 0.32 numbers an executor's ranks
    with TP innermost (its workers get parallel_config.rank = that global rank)."""
    size = max(1, int(parallel.tensor_parallel_size))
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank, model_parallel_is_initialized

        if size > 1 and model_parallel_is_initialized():
            return int(get_tensor_model_parallel_rank())
    except Exception:  # no TP group here: the rank vLLM gave the process
        pass
    return int(getattr(parallel, "rank", 0)) % size


def session_id_of(value: object) -> str:
    """A session id kvtierd accepts, from whatever the request carried: the text itself
    when it is 1..256 bytes of UTF-8 without NUL, else a digest of it (the same value
    always maps to the same id)."""
    if value is None or value == "":
        return ""
    text = value if isinstance(value, str) else str(value)
    try:
        encoded = text.encode("utf-8")
    except UnicodeEncodeError:
        encoded = text.encode("utf-8", "surrogatepass")
    else:
        if len(encoded) <= MAX_SESSION_BYTES and "\0" not in text:
            return text
    return "vllm-session-sha256:" + hashlib.sha256(encoded).hexdigest()


def rank_session_id(session_id: str, tp_rank: int, tp_size: int) -> str:
    """The session a TP rank saves and loads its shard under: the session itself with
    one rank, else ``{session}@tp{rank}of{size}`` (a digest past 256 bytes, as
    session_id_of makes). kvtierd ties a session to one layout, and each rank's layout
    differs (its tp_rank): one session a rank."""
    if not session_id or tp_size <= 1:
        return session_id
    return session_id_of(f"{session_id}@tp{tp_rank}of{tp_size}")


def request_extra_keys(model_id: str, request) -> str:
    """What besides the tokens makes a request's KV differ: the model, the LoRA adapter
    and the cache salt. Never Python's hash(): the keys must survive processes."""
    lora = getattr(request, "lora_request", None)
    # The adapter's name and where its weights come from; not lora_int_id, which each
    # vLLM process numbers on its own.
    lora_name = "" if lora is None else f"{getattr(lora, 'lora_name', '')}@{getattr(lora, 'lora_path', '')}"
    salt = getattr(request, "cache_salt", None) or ""
    return f"model={model_id}\x00lora={lora_name}\x00salt={salt}"


def request_hashes(model_id: str, request, token_ids: Sequence[int], tokens_per_block: int,
                   known: list[bytes] | None = None, num_blocks: int | None = None) -> list[bytes]:
    """Chained hashes of the first num_blocks full blocks of token_ids (None: all of
    them), extending `known` (the hashes of a prefix of the same tokens) instead of
    hashing it again; only the tokens past `known` are read."""
    known = list(known or ())
    full = len(token_ids) // tokens_per_block
    if num_blocks is not None:
        full = min(full, num_blocks)
    if len(known) >= full:
        return known[:full]
    start = len(known) * tokens_per_block
    tail = hashing.block_hashes(token_ids[start:full * tokens_per_block], tokens_per_block,
                                extra_keys=request_extra_keys(model_id, request),
                                parent=known[-1] if known else None)
    return known + tail
