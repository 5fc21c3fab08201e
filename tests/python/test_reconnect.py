"""A Python engine rides through kvtierd restarts: the same kvtier.Client raises
Unavailable (retryable) while the daemon is away, then reconnects by itself (hello and
regions again) and loads, bit-exact, what the daemon kept on NVMe."""

from __future__ import annotations

import signal
import time

import pytest
import torch

import kvtier
from kvtier.hashing import block_hashes
from kvtier.torch import layout_from_tensors, memfd_tensor
from kvtierd_process import SMALL_SLABS, Kvtierd

SHAPE = (2, 16, 4, 2, 8)  # [2, blocks, block_size, heads, head_dim]
NVME = SMALL_SLABS + ["--nvme-bytes", "64MiB", "--hbm-idle-ms", "0", "--ram-idle-ms", "0",
                      "--plan-interval-ms", "10ms"]


def until_back(client, hashes, timeout_s=30.0):
    """Calls until one goes through; the backoff may refuse the first ones."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.lookup(hashes)
        except kvtier.Unavailable as away:
            assert away.retryable
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_python_engine_rides_through_a_daemon_restart(how):
    process = Kvtierd(NVME)
    try:
        cache = memfd_tensor(SHAPE, torch.float16)
        cache.copy_(torch.arange(cache.numel(), dtype=torch.float32).view(SHAPE) % 1000)
        with kvtier.Client(process.socket_path) as client:
            client.hello(layout_from_tensors("reconnect-model", [cache], 0))
            client.register_tensor(0, cache)
            hashes = block_hashes(range(32), 4, "py-conversation")  # 8 blocks
            assert client.save("py-conversation", list(zip(hashes, range(8)))).stored == 8
            expected = cache[:, :8].clone()
            deadline = time.monotonic() + 30
            while client.lookup(hashes).tiers != ["nvme"] * 8:  # durable before a SIGKILL
                assert time.monotonic() < deadline, client.lookup(hashes)
                time.sleep(0.01)

            if how == "SIGTERM":
                process.process.send_signal(signal.SIGTERM)
                process.process.wait(timeout=30)
            else:
                process.kill()
            with pytest.raises(kvtier.Unavailable) as away:
                client.lookup(hashes)
            assert away.value.retryable
            process.restart()

            assert until_back(client, hashes).hit_count == 8
            assert client.reconnects == 1
            cache[:, 8:16].zero_()
            loaded = client.load("py-conversation", list(zip(hashes, range(8, 16))))
            assert loaded.loaded_count == 8
            assert torch.equal(cache[:, 8:16], expected)
    finally:
        process.stop()


def test_reconnect_off_stays_away():
    process = Kvtierd(SMALL_SLABS)
    try:
        with kvtier.Client(process.socket_path, reconnect=False) as client:
            client.stats()
            process.kill()
            process.restart()
            for _ in range(3):
                with pytest.raises(kvtier.Unavailable):
                    client.stats()
                time.sleep(0.03)
            assert client.reconnects == 0
        with pytest.raises(kvtier.InvalidArgument, match="initial_backoff_ms"):
            kvtier.Client(process.socket_path, initial_backoff_ms=500, max_backoff_ms=100)
    finally:
        process.stop()
