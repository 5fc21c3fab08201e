"""Each plane helper (vLLM, FlashInfer, MLA) round-trips bit-exact through kvtierd:
save some engine blocks, wipe the cache, load them into other blocks, compare bits."""

from __future__ import annotations

import pytest

import kvtier
from kvtier.hashing import block_hashes

pytest.importorskip("torch", reason="needs torch (Debian: python3-torch)")
import torch
from kvtier.torch import layout_from_tensors, memfd_tensor

LAYERS, BLOCKS, TOKENS_PER_BLOCK, HEADS, HEAD_DIM, LATENT = 3, 8, 4, 2, 16, 24
SAVED_IDS = [5, 2, 7]
LOADED_IDS = [0, 1, 3]


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(torch.uint8)


def fill_random(layers, seed):
    generator = torch.Generator().manual_seed(seed)
    for layer in layers:  # in fp32, then rounded: bf16 arithmetic is not needed
        layer.copy_(torch.randn(layer.shape, generator=generator, dtype=torch.float32))


def vllm_one_memfd():
    cache = memfd_tensor((LAYERS, 2, BLOCKS, TOKENS_PER_BLOCK, HEADS, HEAD_DIM), torch.bfloat16)
    return list(cache), 0, {0: cache}


def vllm_memfd_per_layer():
    layers = [memfd_tensor((2, BLOCKS, TOKENS_PER_BLOCK, HEADS, HEAD_DIM), torch.float16)
              for _ in range(LAYERS)]
    return layers, [10, 11, 12], {10 + i: layer for i, layer in enumerate(layers)}


def vllm_at_an_offset():
    per_layer = 2 * BLOCKS * TOKENS_PER_BLOCK * HEADS * HEAD_DIM
    flat = memfd_tensor((123 + LAYERS * per_layer,), torch.float16)
    cache = flat[123:].view(LAYERS, 2, BLOCKS, TOKENS_PER_BLOCK, HEADS, HEAD_DIM)
    return list(cache), 0, {0: flat}


def vllm_strided_blocks():
    # Allocated block-major and permuted: K and V of a block are neighbours.
    cache = memfd_tensor((LAYERS, BLOCKS, 2, TOKENS_PER_BLOCK, HEADS, HEAD_DIM), torch.float32)
    return [layer.permute(1, 0, 2, 3, 4) for layer in cache], 0, {0: cache}


def flashinfer_memfd_per_layer():
    layers = [memfd_tensor((BLOCKS, 2, TOKENS_PER_BLOCK, HEADS, HEAD_DIM), torch.float16)
              for _ in range(LAYERS)]
    return layers, [0, 1, 2], dict(enumerate(layers))


def flashinfer_one_memfd():
    cache = memfd_tensor((LAYERS, BLOCKS, 2, TOKENS_PER_BLOCK, HEADS, HEAD_DIM), torch.bfloat16)
    return cache, 3, {3: cache}  # one tensor with a leading layer dim


def mla_one_memfd():
    cache = memfd_tensor((LAYERS, BLOCKS, TOKENS_PER_BLOCK, LATENT), torch.bfloat16)
    return list(cache), 0, {0: cache[1]}  # a view registers its whole memfd


CASES = {
    "vllm-one-memfd": ("vllm", 1, vllm_one_memfd),
    "vllm-memfd-per-layer": ("vllm", 1, vllm_memfd_per_layer),
    "vllm-at-an-offset": ("vllm", 1, vllm_at_an_offset),
    "vllm-strided-blocks": ("vllm", 1, vllm_strided_blocks),
    "flashinfer-memfd-per-layer": ("flashinfer", 0, flashinfer_memfd_per_layer),
    "flashinfer-one-memfd": ("flashinfer", 0, flashinfer_one_memfd),
    "mla-one-memfd": ("mla", 0, mla_one_memfd),
}


@pytest.mark.parametrize("case", list(CASES))
def test_round_trip_is_bit_exact(case, client, unique):
    kind, block_dim, make = CASES[case]
    kv_caches, region_ids, regions = make()
    layout = layout_from_tensors(unique(case), kv_caches, region_ids, kind=kind)
    layers = list(kv_caches)
    assert layout.num_layers == LAYERS and layout.num_blocks == BLOCKS
    assert layout.tokens_per_block == TOKENS_PER_BLOCK
    assert len(layout.planes) == LAYERS * (1 if kind == "mla" else 2)
    assert layout.block_bytes == LAYERS * TOKENS_PER_BLOCK * layers[0].element_size() * (
        LATENT if kind == "mla" else 2 * HEADS * HEAD_DIM)

    info = client.hello(layout, engine_name=case)
    assert info.block_bytes == layout.block_bytes and info.device == "host"
    for region_id, tensor in regions.items():
        client.register_tensor(region_id, tensor)

    fill_random(layers, seed=len(case))
    saved = [layer.index_select(block_dim, torch.tensor(SAVED_IDS)).clone() for layer in layers]
    hashes = block_hashes(range(len(SAVED_IDS) * TOKENS_PER_BLOCK), TOKENS_PER_BLOCK, case)
    session = unique("session")
    result = client.save(session, list(zip(hashes, SAVED_IDS)))
    assert (result.stored, result.deduplicated) == (len(SAVED_IDS), 0)

    for layer in layers:  # the engine drops its cache
        layer.zero_()
    lookup = client.lookup(hashes)
    assert lookup.hit_count == len(hashes)
    assert set(lookup.tiers) <= {"hbm", "ram"}
    loaded = client.load(session, list(zip(hashes, LOADED_IDS)))
    assert loaded.loaded_count == len(hashes) and loaded.stop_reason is None

    for layer, expected_blocks in zip(layers, saved):
        expected = torch.zeros_like(layer)
        expected.index_copy_(block_dim, torch.tensor(LOADED_IDS), expected_blocks)
        assert torch.equal(bits(layer), bits(expected)), "restored bytes differ"


def test_planes_of_a_one_tensor_vllm_cache_follow_its_strides():
    cache = memfd_tensor((2, 2, 4, 3, 1, 5), torch.float16)  # layers, K/V, blocks, ...
    planes = kvtier.torch.vllm_planes(cache, 7)
    block = 3 * 1 * 5 * 2
    assert [p.offset_bytes for p in planes] == [0, 4 * block, 8 * block, 12 * block]
    assert {(p.region_id, p.stride_bytes, p.bytes_per_block) for p in planes} == {(7, block, block)}
    flash = kvtier.torch.flashinfer_planes(memfd_tensor((4, 2, 3, 1, 5), torch.float16), 0)
    assert [(p.offset_bytes, p.stride_bytes) for p in flash] == [(0, 2 * block), (block, 2 * block)]
