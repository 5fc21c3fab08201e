"""Client.load(planes=(begin, count)): a Load of a range of each block's planes, the
building block of layer-wise loading (one Load per layer, each waited for on its own)."""

from __future__ import annotations

import re

import pytest

import kvtier
from kvtier.hashing import block_hashes

pytest.importorskip("torch", reason="needs torch (Debian: python3-torch)")
import torch
from kvtier.torch import layout_from_tensors, memfd_tensor

LAYERS = 3
SHAPE = (LAYERS, 2, 16, 4, 2, 8)  # [layers, 2, blocks, block_size, heads, head_dim]
PLANES = 2 * LAYERS  # layer 0 K, layer 0 V, layer 1 K, ...
BLOCKS = 8


def engine(client, model_id):
    """A vLLM-shaped cache of LAYERS layers in one memfd, its first BLOCKS blocks saved."""
    kv = memfd_tensor(SHAPE, torch.float16)
    kv.copy_(torch.arange(kv.numel(), dtype=torch.float32).view(SHAPE) % 1000 + 1)
    layout = layout_from_tensors(model_id, kv, 0)
    assert len(layout.planes) == PLANES
    client.hello(layout, engine_name="test-load-planes")
    client.register_tensor(0, kv)
    return kv


def saved_session(client, unique, kv):
    session = unique("session")
    hashes = block_hashes(range(4 * BLOCKS), 4, session)
    assert client.save(session, list(zip(hashes, range(BLOCKS)))).stored == BLOCKS
    expected = kv[:, :, :BLOCKS].clone()
    kv.zero_()
    return session, hashes, expected


def bits(tensor):
    return tensor.view(torch.int16)


def test_a_range_fills_exactly_its_planes(client, unique):
    kv = engine(client, unique("planes"))
    session, hashes, expected = saved_session(client, unique, kv)
    targets = list(zip(hashes, range(BLOCKS, 2 * BLOCKS)))
    before = client.stats()

    result = client.load(session, targets, planes=(2, 2))  # layer 1: K and V
    assert result.loaded_count == BLOCKS and result.stop_reason is None
    assert torch.equal(bits(kv[1, :, BLOCKS:]), bits(expected[1]))
    untouched = kv.clone()
    untouched[1, :, BLOCKS:] = 0
    assert not untouched.any(), "a plane outside the range (or another block) was written"

    after = client.stats()
    plane_bytes = kv[0, 0, 0].numel() * kv.element_size()
    assert after.bytes_loaded - before.bytes_loaded == BLOCKS * 2 * plane_bytes
    assert after.lookup_hits == before.lookup_hits  # only a range at plane 0 counts hits

    # planes=None: every plane; then one plane (layer 2's V) through a Session.
    kv.zero_()
    assert client.load(session, targets, planes=None).loaded_count == BLOCKS
    assert torch.equal(bits(kv[:, :, BLOCKS:]), bits(expected))
    kv.zero_()
    with client.session(session) as bound:
        assert bound.load(targets, planes=(PLANES - 1, 1)).loaded_count == BLOCKS
    assert torch.equal(bits(kv[2, 1, BLOCKS:]), bits(expected[2, 1]))
    kv[2, 1, BLOCKS:] = 0
    assert not kv.any()


def test_layer_wise_loads_pipelined_rebuild_every_block(client, unique):
    kv = engine(client, unique("layers"))
    session, hashes, expected = saved_session(client, unique, kv)
    targets = list(zip(hashes, range(BLOCKS, 2 * BLOCKS)))
    before = client.stats()
    layers = [client.load_async(session, targets, planes=(2 * layer, 2)) for layer in range(LAYERS)]
    for layer in reversed(range(LAYERS)):  # waited for out of order
        result = layers[layer].result()
        assert result.loaded_count == BLOCKS and result.stop_reason is None
    assert torch.equal(bits(kv[:, :, BLOCKS:]), bits(expected))
    after = client.stats()
    assert after.lookup_hits - before.lookup_hits == BLOCKS  # once, not once per layer
    assert after.bytes_loaded - before.bytes_loaded == BLOCKS * client.hello_info.block_bytes


@pytest.mark.parametrize("planes, message", [
    ((PLANES, 1), f"planeBegin {PLANES} is past the layout's {PLANES} planes"),
    ((PLANES - 1, 2), f"planeBegin {PLANES - 1} + planeCount 2 = {PLANES + 1} passes the "
                      f"layout's {PLANES} planes"),
    ((1, 2**32 - 1), f"planeBegin 1 + planeCount 4294967295 = 4294967296 passes the layout's "
                     f"{PLANES} planes"),
    ((2, 0), "planeBegin is 2 with planeCount 0, which means every plane"),
])
def test_a_range_outside_the_layout_is_refused_by_the_daemon(client, unique, planes, message):
    kv = engine(client, unique("bad-range"))
    session, hashes, _ = saved_session(client, unique, kv)
    targets = list(zip(hashes, range(BLOCKS, 2 * BLOCKS)))
    with pytest.raises(kvtier.InvalidArgument, match=re.escape(message)) as refused:
        client.load(session, targets, planes=planes)
    assert refused.value.retryable is False
    pending = client.load_async(session, targets, planes=planes)  # sent; refused in result()
    with pytest.raises(kvtier.InvalidArgument, match=re.escape(message)):
        pending.result()
    assert not kv.any()
    assert client.load(session, targets, planes=(0, PLANES)).loaded_count == BLOCKS  # serves on


@pytest.mark.parametrize("planes, message", [
    ((-1, 2), "planes begin must be an int in 0..4294967295, got -1"),
    ((0, -2), "planes count must be an int in 0..4294967295, got -2"),
    ((2**32, 1), "planes begin must be an int in 0..4294967295"),
    ((1.0, 2), "planes begin must be an int"),
    ((True, 1), "planes begin must be an int"),
    ((0, "2"), "planes count must be an int"),
    ((1,), "planes must be a (begin, count) pair of ints or None"),
    ((1, 2, 3), "planes must be a (begin, count) pair"),
    (3, "planes must be a (begin, count) pair"),
])
def test_bad_planes_are_refused_before_sending(client, unique, planes, message):
    engine(client, unique("bad-planes"))
    blocks = [(b"\x01" * 16, 0)]
    with pytest.raises(kvtier.InvalidArgument, match=re.escape(message)) as refused:
        client.load("", blocks, planes=planes)
    assert isinstance(refused.value, ValueError)
    with pytest.raises(kvtier.InvalidArgument, match=re.escape(message)):
        client.load_async("", blocks, planes=planes)


class _LibraryBefore05:
    """libkvtier.so.0 as it was before ABI 0.5: no kvtier_load_planes_async."""

    def __init__(self, library):
        self._library = library

    def __getattr__(self, name):
        if name.startswith("kvtier_load_planes"):
            raise AttributeError(name)
        return getattr(self._library, name)


def test_an_older_library_says_plane_ranges_are_not_supported(client, unique):
    kv = engine(client, unique("old-library"))
    session, hashes, expected = saved_session(client, unique, kv)
    targets = list(zip(hashes, range(BLOCKS, 2 * BLOCKS)))
    library = client._lib
    client._lib = _LibraryBefore05(library)
    try:
        with pytest.raises(kvtier.NotSupported, match=r"predates plane ranges") as refused:
            client.load(session, targets, planes=(0, 2))
        assert refused.value.retryable is False
        assert not kv.any()
        assert client.load(session, targets).loaded_count == BLOCKS  # whole blocks still load
        assert torch.equal(bits(kv[:, :, BLOCKS:]), bits(expected))
    finally:
        client._lib = library
