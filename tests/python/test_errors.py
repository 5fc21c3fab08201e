"""Bad input from Python raises a clear exception, and the daemon serves on."""

from __future__ import annotations

import pytest

import kvtier
from kvtier.hashing import block_hashes
from kvtierd_process import SMALL_SLABS, Kvtierd

pytest.importorskip("torch", reason="needs torch (Debian: python3-torch)")
import torch
from kvtier.torch import (flashinfer_planes, layout_from_tensors, memfd_tensor,
                          mla_planes, vllm_planes)

SHAPE = (2, 4, 4, 2, 8)  # [2, blocks, block_size, heads, head_dim]


def serving(daemon) -> bool:
    """A new connection gets answers: the daemon survived whatever came before."""
    with kvtier.Client(daemon.socket_path) as probe:
        cache = memfd_tensor(SHAPE, torch.float16)
        probe.hello(layout_from_tensors("probe", [cache], 0))
        probe.register_tensor(0, cache)
        return probe.lookup([b"\x01" * 32]).hit_count == 0 and probe.stats().connections >= 1


def test_wrong_dtype_is_invalid_argument():
    with pytest.raises(kvtier.InvalidArgument, match="float64 is not a KV cache dtype"):
        vllm_planes([memfd_tensor(SHAPE, torch.float64)], 0)
    with pytest.raises(kvtier.InvalidArgument, match="all layers must match"):
        vllm_planes([memfd_tensor(SHAPE, torch.float16), memfd_tensor(SHAPE, torch.bfloat16)], 0)
    with pytest.raises(ValueError):  # InvalidArgument is a ValueError too
        mla_planes([memfd_tensor((4, 4, 8), torch.int64)], 0)


def test_non_contiguous_or_misshapen_tensor_is_invalid_argument():
    cache = memfd_tensor(SHAPE, torch.float16)
    with pytest.raises(kvtier.InvalidArgument, match="not contiguous within a block"):
        vllm_planes([cache.transpose(3, 4)], 0)
    with pytest.raises(kvtier.InvalidArgument, match="not contiguous within a block"):
        vllm_planes([cache[..., :4]], 0)
    with pytest.raises(kvtier.InvalidArgument, match="dim 0 must be 2"):
        vllm_planes([memfd_tensor((3, 4, 4, 2, 8), torch.float16)], 0)
    with pytest.raises(kvtier.InvalidArgument, match="dim 1 must be 2"):
        flashinfer_planes([cache], 0)
    with pytest.raises(kvtier.InvalidArgument, match="expected"):
        mla_planes([cache], 0)
    with pytest.raises(kvtier.InvalidArgument, match="2 region ids for 1 layers"):
        vllm_planes([cache], [0, 1])


def test_layers_in_different_memfds_need_their_own_region_ids():
    first, second = memfd_tensor(SHAPE, torch.float16), memfd_tensor(SHAPE, torch.float16)
    with pytest.raises(kvtier.InvalidArgument, match="share region id 0"):
        vllm_planes([first, second], 0)
    planes = vllm_planes([first, second], [0, 1])
    assert [p.region_id for p in planes] == [0, 0, 1, 1]
    assert planes[2].offset_bytes == planes[0].offset_bytes == 0


def test_memfd_registry_forgets_a_freed_cache_and_keeps_a_live_one():
    from kvtier import _memfd

    live = memfd_tensor(SHAPE, torch.float16)
    dead = memfd_tensor(SHAPE, torch.float16)
    dead_address = dead.data_ptr()
    del dead
    import gc
    gc.collect()
    assert _memfd.find(live.data_ptr()) is not None
    assert _memfd.find(dead_address) is None  # nothing else was mapped since


def test_tensor_outside_a_registered_region(client, daemon, unique):
    plain = torch.zeros(SHAPE, dtype=torch.float16)
    with pytest.raises(kvtier.InvalidArgument, match="outside any kvtier.torch.memfd_tensor"):
        vllm_planes([plain], 0)
    cache = memfd_tensor(SHAPE, torch.float16)
    other = memfd_tensor(SHAPE, torch.float16)
    layout = layout_from_tensors(unique("unregistered"), [cache, other], [0, 1])
    client.hello(layout)
    with pytest.raises(kvtier.InvalidArgument, match="memfd_tensor"):
        client.register_tensor(1, plain)
    with pytest.raises(kvtier.InvalidArgument, match="takes a torch.Tensor"):
        client.register_tensor(1, [1, 2, 3])
    client.register_tensor(0, cache)  # region 1 never registered
    hashes = block_hashes(range(8), 4)
    with pytest.raises(kvtier.InvalidArgument) as error:
        client.save(unique("session"), list(zip(hashes, [0, 1])))
    assert "region" in error.value.message
    # The connection is still good: register the missing region and save.
    client.register_tensor(1, other)
    assert client.save(unique("session"), list(zip(hashes, [0, 1]))).stored == 2
    assert serving(daemon)


def test_bad_requests_name_the_problem(client, daemon, unique):
    cache = memfd_tensor(SHAPE, torch.float16)
    client.hello(layout_from_tensors(unique("bad-requests"), [cache], 0))
    client.register_tensor(0, cache)
    session = unique("session")
    with pytest.raises(kvtier.InvalidArgument):
        client.lookup([b"x" * 33])  # hashes are 1..32 bytes
    with pytest.raises(kvtier.InvalidArgument):
        client.lookup([b""])
    with pytest.raises(kvtier.InvalidArgument, match="must be bytes"):
        client.lookup(["not bytes"])
    with pytest.raises(kvtier.InvalidArgument, match="non-negative"):
        client.save(session, [(b"h" * 32, -1)])
    with pytest.raises(kvtier.InvalidArgument, match="pair"):
        client.save(session, [b"h" * 32])
    with pytest.raises(kvtier.InvalidArgument):
        client.save(session, [(b"h" * 32, 4)])  # the layout has blocks 0..3
    with pytest.raises(kvtier.NotFound):
        client.begin_turn(unique("never-saved"))
    with pytest.raises(kvtier.NotFound):
        client.unregister_region(9)
    missing = client.load(session, [(b"m" * 32, 0)])
    assert missing.loaded_count == 0 and isinstance(missing.stop_reason, kvtier.NotFound)
    assert serving(daemon)


def test_layout_validation():
    plane = kvtier.Plane(0, 0, 64, 64)
    with pytest.raises(kvtier.InvalidArgument, match="bytes_per_block"):
        kvtier.Plane(0, 0, 64, 0)
    with pytest.raises(kvtier.InvalidArgument, match="region_id"):
        kvtier.Plane(-1, 0, 64, 64)
    with pytest.raises(kvtier.InvalidArgument, match="model_id is empty"):
        kvtier.Layout("", 1, 1, 1, "fp16", 16, 4, [plane])
    with pytest.raises(kvtier.InvalidArgument, match="planes is empty"):
        kvtier.Layout("m", 1, 1, 1, "fp16", 16, 4, [])
    with pytest.raises(kvtier.InvalidArgument, match="overlap"):
        kvtier.Layout("m", 1, 1, 1, "fp16", 16, 4, [kvtier.Plane(0, 0, 32, 64)])
    with pytest.raises(kvtier.InvalidArgument, match="tp_rank"):
        kvtier.Layout("m", 1, 1, 1, "fp16", 16, 4, [plane], tp_rank=2, tp_size=2)
    assert kvtier.Layout("m", 1, 1, 1, "fp16", 16, 4, [plane, plane]).block_bytes == 128


def test_hello_mismatch_is_reported(client):
    cache = memfd_tensor(SHAPE, torch.float16)
    # A well-formed request this (host-backend) daemon does not serve: NotSupported.
    with pytest.raises(kvtier.NotSupported, match="host backend") as refused:
        client.hello(layout_from_tensors("cuda-engine", [cache], 0), device="cuda")
    assert refused.value.code == kvtier.StatusCode.NOT_SUPPORTED
    assert refused.value.retryable is False
    with pytest.raises(kvtier.InvalidArgument, match="device"):
        client.hello(layout_from_tensors("x", [cache], 0), device="tpu")


def test_dead_daemon_is_unavailable(own_daemon):
    cache = memfd_tensor(SHAPE, torch.float16)
    client = kvtier.Client(own_daemon.socket_path)
    client.hello(layout_from_tensors("dead-daemon", [cache], 0))
    client.register_tensor(0, cache)
    hashes = block_hashes(range(8), 4)
    assert client.save("s", list(zip(hashes, [0, 1]))).stored == 2
    own_daemon.kill()
    with pytest.raises(kvtier.Unavailable) as gone:
        client.lookup(hashes)
    assert gone.value.retryable is True  # reconnect and ask again
    with pytest.raises(kvtier.Unavailable):
        client.save_async("s", list(zip(hashes, [0, 1]))).result()
    client.close()  # unregistering fails quietly: the daemon is gone
    with pytest.raises(kvtier.Unavailable):
        kvtier.Client(own_daemon.socket_path)


def test_closed_client_raises_client_closed(daemon):
    client = kvtier.Client(daemon.socket_path)
    cache = memfd_tensor(SHAPE, torch.float16)
    client.hello(layout_from_tensors("closed-client", [cache], 0))
    client.register_tensor(0, cache)
    pending = client.lookup_async([b"p" * 32])
    client.close()
    client.close()  # idempotent
    assert client.closed
    for call in (lambda: client.lookup([b"x"]), lambda: client.stats(),
                 lambda: client.save("s", []), lambda: client.register_tensor(0, cache),
                 lambda: client.begin_turn_async("s")):
        with pytest.raises(kvtier.ClientClosed):
            call()
    assert pending.result().hit_count == 0  # sent before close(): its reply still comes
    assert isinstance(kvtier.ClientClosed(), kvtier.KvtierError)
    assert serving(daemon)


def test_no_daemon_is_unavailable(tmp_path):
    with pytest.raises(kvtier.Unavailable):
        kvtier.Client(str(tmp_path / "nobody.sock"))


def test_retryable_flag_from_the_daemon_reaches_python():
    """The region limit is RESOURCE_EXHAUSTED, retryable by default, but the daemon marks
    it final (waiting does not lift it): the flag crossed the wire and the C library."""
    process = Kvtierd(SMALL_SLABS + ["--max-regions-per-connection", "1"])
    try:
        first = memfd_tensor(SHAPE, torch.float16)
        second = memfd_tensor(SHAPE, torch.float16)
        with kvtier.Client(process.socket_path) as client:
            client.hello(layout_from_tensors("limited", [first, second], [0, 1]))
            client.register_tensor(0, first)
            with pytest.raises(kvtier.ResourceExhausted, match="the limit") as limited:
                client.register_tensor(1, second)
            assert limited.value.retryable is False
            assert client.lookup([b"\x02" * 32]).hit_count == 0  # the connection serves on
    finally:
        process.stop()


def test_retryable_defaults_and_overrides():
    from kvtier.errors import error_from_status

    assert kvtier.Unavailable("gone").retryable is True
    assert kvtier.ResourceExhausted("full").retryable is True
    for cls in (kvtier.InvalidArgument, kvtier.NotFound, kvtier.PermissionDenied,
                kvtier.DataLoss, kvtier.Internal, kvtier.NotSupported):
        assert cls("x").retryable is False, cls
    assert kvtier.ClientClosed().retryable is False  # a bug in the caller, not a wait
    assert kvtier.ResourceExhausted("limit", retryable=False).retryable is False
    assert kvtier.DataLoss("x", retryable=True).retryable is True
    error = error_from_status(8, "no memfd on cuda")
    assert isinstance(error, kvtier.NotSupported) and error.retryable is False
    assert str(error) == "NOT_SUPPORTED: no memfd on cuda"
    assert error_from_status(5, "gone", False).retryable is False
    assert isinstance(error_from_status(99, "future"), kvtier.Internal)


def test_errors_pickle_with_their_flag():
    import pickle

    for error in (kvtier.ResourceExhausted("limit", retryable=False), kvtier.NotSupported("x"),
                  kvtier.Unavailable("gone"), kvtier.ClientClosed()):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert (copy.code, copy.message, copy.retryable) == (error.code, error.message,
                                                             error.retryable)
