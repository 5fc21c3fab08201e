"""The CUDA path from Python without a GPU: kvtierd --device cuda and the engine both
on the fake driver (tests/fakecuda), whose device pointers are host addresses, so the
test can fill and check "GPU" memory directly. A tensor-like object that says it is
on CUDA goes through Client.register_tensor -> kvtier_register_cuda_pointer; an engine
packs and unpacks blocks with the staging kernels through kvtier.gpu."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvtierd_process import BUILD_DIR, REPO, Kvtierd

pytest.importorskip("torch", reason="the engine scripts need torch (Debian: python3-torch)")

# What both engine scripts start with: the fake driver's primary context made current
# (its device pointers are host addresses the script can view as tensors).
PREAMBLE = r'''
import ctypes, sys, types
import torch
import kvtier
import kvtier.gpu
from kvtier.hashing import block_hashes
from kvtier.torch import layout_from_tensors

cuda = ctypes.CDLL("libcuda.so.1")
def ok(result):
    assert result == 0, f"CUDA error {result}"
ok(cuda.cuInit(0))
device, context, pointer = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
ok(cuda.cuDeviceGet(ctypes.byref(device), 0))
ok(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device))
ok(cuda.cuCtxSetCurrent(context))
'''

ENGINE = PREAMBLE + r'''
shape = (2, 8, 4, 2, 16)  # vLLM: [2, blocks, block_size, heads, head_dim]
size = 2 * 8 * 4 * 2 * 16 * 2
ok(cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size + 4096)))
base = pointer.value
# The fake's device memory is host memory: view the cache, 4 KiB into the allocation.
raw = (ctypes.c_uint8 * size).from_address(base + 4096)
cache = torch.frombuffer(raw, dtype=torch.float16).view(shape)

class CudaTensor:  # what register_tensor reads of a torch CUDA tensor
    device = types.SimpleNamespace(type="cuda")
    def __init__(self, view): self.view = view
    def data_ptr(self): return self.view.data_ptr()
    def numel(self): return self.view.numel()
    def stride(self): return self.view.stride()
    def element_size(self): return self.view.element_size()
    shape = property(lambda self: self.view.shape)

with kvtier.Client(sys.argv[1]) as client:
    layout = layout_from_tensors("fake-cuda", [cache], 0, region_bases={0: cache})
    info = client.hello(layout, device="cuda")
    assert info.device == "cuda" and info.gpu_uuids, info
    client.register_tensor(0, CudaTensor(cache))
    cache.copy_(torch.randn(shape, generator=torch.Generator().manual_seed(3)))
    expected = cache[:, [6, 1]].clone()
    hashes = block_hashes(range(8), 4, "fake-cuda")
    assert client.save("s", list(zip(hashes, [6, 1]))).stored == 2
    cache.zero_()
    assert client.load("s", list(zip(hashes, [0, 5]))).loaded_count == 2
    assert torch.equal(cache[:, [0, 5]].view(torch.int16), expected.view(torch.int16))
    assert cache[:, [1, 2, 3, 4, 6, 7]].abs().sum() == 0
    print("restored", client.lookup(hashes).tiers)
'''


def fake_driver_dir() -> Path | None:
    configured = os.environ.get("KVTIER_FAKECUDA_DIR")
    directory = Path(configured) if configured else BUILD_DIR / "tests" / "fakecuda"
    return directory if (directory / "libcuda.so.1").exists() else None


def run_engine(tmp_path, script_text: str) -> tuple[subprocess.CompletedProcess, str]:
    """Runs an engine script against kvtierd --device cuda, both on the fake driver (the
    test skips without one); its result and kvtierd's log."""
    directory = fake_driver_dir()
    if directory is None:
        pytest.skip("no fake CUDA driver built (target kvtier_fakecuda)")
    env = {"LD_LIBRARY_PATH": str(directory), "KVTIER_FAKECUDA_DEVICES": "1"}
    daemon = Kvtierd(["--device", "cuda", "--hbm-bytes", "8MiB", "--ram-bytes", "16MiB",
                      "--slab-bytes", "1MiB"], env=env)
    try:
        script = tmp_path / "engine.py"
        script.write_text(script_text)
        run = subprocess.run(
            [sys.executable, str(script), daemon.socket_path], capture_output=True, text=True,
            timeout=120, env={**os.environ, **env,
                              "PYTHONPATH": str(REPO / "client" / "python")})
        assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\nkvtierd:\n{daemon.log()}"
        return run, daemon.log()
    finally:
        daemon.stop()


def test_cuda_pointer_region_round_trip_on_the_fake_driver(tmp_path):
    run, _ = run_engine(tmp_path, ENGINE)
    assert run.stdout.startswith("restored")

STAGING_ENGINE = PREAMBLE + r'''
shape = (2, 2, 16, 4, 2, 16)  # 2 layers of vLLM's [2, blocks, block_size, heads, head_dim]
size = 2 * 2 * 16 * 4 * 2 * 16 * 2
ok(cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size)))
raw = (ctypes.c_uint8 * size).from_address(pointer.value)
cache = torch.frombuffer(raw, dtype=torch.float16).view(shape)
layers = [cache[0], cache[1]]

available, why = kvtier.gpu.staging_kernels_available(pointer.value)
if not available:
    assert "without nvcc" in why, why  # the only reason on the fake driver
    print("skipped:", why)
    sys.exit(0)
with kvtier.Client(sys.argv[1]) as client:
    layout = layout_from_tensors("fake-cuda-staged", layers, 0, region_bases={0: cache})
    info = client.hello(layout, device="cuda", data_path="staging-kernels")
    with client.gpu_stager({0: pointer.value}, ring_bytes=3 * info.block_bytes) as stager:
        cache.copy_(torch.randn(shape, generator=torch.Generator().manual_seed(5)))
        ids = [11, 3, 7, 14, 0]
        expected = cache[:, :, ids].clone()
        hashes = block_hashes(range(5 * 4), 4, "fake-cuda-staged")
        saved = stager.save("s", list(zip(hashes, ids)))
        assert saved.stored == 5 and saved.saved == 5, saved
        targets = [1, 2, 9, 15, 6]
        cache.zero_()
        loaded = stager.load("s", list(zip(hashes, targets)))
        assert loaded.loaded_count == 5, loaded
        ok(cuda.cuCtxSynchronize())
        assert torch.equal(cache[:, :, targets].view(torch.int16), expected.view(torch.int16))
        others = [b for b in range(16) if b not in targets]
        assert cache[:, :, others].abs().sum() == 0
        # Layer by layer (K and V of a layer are planes 2l, 2l + 1).
        cache.zero_()
        stager.begin_load("s", list(zip(hashes, targets)), [(0, 2), (2, 2)])
        first = stager.finish_range(0)
        second = stager.finish_range(1)
        stager.end_load()
        assert first.loaded_count == second.loaded_count == 5, (first, second)
        ok(cuda.cuCtxSynchronize())
        assert torch.equal(cache[:, :, targets].view(torch.int16), expected.view(torch.int16))
        # A prefix that ends early: the last hash was never saved.
        cache.zero_()
        missing = hashes[:3] + [b"never-saved"]
        short = stager.load("s", list(zip(missing, targets[:4])))
        assert short.loaded_count == 3, short
    print("staged", client.stats().lookup_hits)
'''


def test_staging_kernels_from_python_on_the_fake_driver(tmp_path):
    run, log = run_engine(tmp_path, STAGING_ENGINE)
    if run.stdout.startswith("skipped:"):
        pytest.skip(run.stdout.strip())
    assert run.stdout.startswith("staged")
    assert "data path stagingKernels" in log
