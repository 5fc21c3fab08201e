"""The real attention model (examples/torch_engine) on a real GPU: its KV cache is a
CUDA tensor registered by pointer, kvtierd runs with --device cuda, and a conversation
whose history is restored from kvtierd answers bit for bit as the engine that kept its
cache on the GPU — with the session demoted to NVMe and kvtierd killed with SIGKILL
and restarted in the middle of the conversation.

Needs a CUDA build of torch and a GPU: skipped without them, unless /dev/nvidiactl
exists or KVTIER_REQUIRE_GPU=1 (then a machine that should run it fails instead).
CI has no GPU; tests/python/test_cuda_fake.py covers the same calls on the fake driver.
"""

from __future__ import annotations

import os
import sys

import pytest

from kvtierd_process import REPO, Kvtierd

pytest.importorskip("torch", reason="needs torch (Debian: python3-torch)")
import torch

sys.path.insert(0, str(REPO / "examples" / "torch_engine"))

from engine import Conversation, Engine
from model import LlamaModel, config_named
from test_torch_engine import MESSAGES, NEW_TOKENS, wait_until_on_nvme


def _gpu_required() -> bool:
    return os.environ.get("KVTIER_REQUIRE_GPU") == "1" or os.path.exists("/dev/nvidiactl")


if not torch.cuda.is_available():
    if _gpu_required():
        pytest.fail("a GPU is required here (/dev/nvidiactl or KVTIER_REQUIRE_GPU=1) but torch "
                    "sees none", pytrace=False)
    pytest.skip("torch has no CUDA device", allow_module_level=True)

SYSTEM = "You are the assistant of a KV-cache offload daemon. Answer briefly and precisely."
# HBM is the daemon's arena on the GPU; every idle session goes all the way to NVMe.
CUDA_NVME_FLAGS = ["--device", "cuda", "--hbm-bytes", "64MiB", "--ram-bytes", "64MiB",
                   "--nvme-bytes", "128MiB", "--slab-bytes", "1MiB", "--hbm-idle-ms", "0",
                   "--ram-idle-ms", "0", "--plan-interval-ms", "10ms", "--drain-timeout", "5s"]


@pytest.fixture(scope="module")
def model():
    return LlamaModel(config_named("small"), "cuda")


def test_gpu_conversation_restored_through_every_tier_answers_bit_for_bit(model):
    daemon = Kvtierd(CUDA_NVME_FLAGS)
    config = model.config
    engine = Engine(config, "kvtier", socket_path=daemon.socket_path, model=model,
                    device="cuda")
    reference = Engine(config, "memory", model=model, device="cuda")
    recompute = Engine(config, "recompute", model=model, device="cuda")
    try:
        assert engine.hello.device == "cuda"
        assert engine.cache.tensor.is_cuda
        tokenizer = engine.tokenizer
        conversations = [Conversation("gpu", tokenizer.message(tokenizer.SYSTEM, SYSTEM))
                         for _ in range(3)]
        saved_blocks = 0
        for turn, message in enumerate(MESSAGES):
            if turn == 2:
                wait_until_on_nvme(engine)
                daemon.kill()
                daemon.restart()  # the engine reconnects on its next call
            restored = engine.turn(conversations[0], message, NEW_TOKENS)
            kept = reference.turn(conversations[1], message, NEW_TOKENS)
            recomputed = recompute.turn(conversations[2], message, NEW_TOKENS)
            # Nothing of the turn is left in the engine's own cache: NaN-wiped.
            assert engine.cache.free_blocks == engine.cache.num_blocks
            assert not torch.any(torch.nan_to_num(engine.cache.tensor, nan=0.0) != 0)
            if turn > 0:
                assert restored.lookup_hits == saved_blocks > 0
                assert restored.restored_tokens == kept.restored_tokens
            if turn == 2:
                # The restarted daemon began with an empty arena and pool: NVMe → GPU.
                assert engine.client.stats().bytes_promoted > 0
            saved_blocks += restored.saved_blocks
            assert restored.tokens == kept.tokens
            for row, (got, want) in enumerate(zip(restored.logits, kept.logits)):
                assert torch.equal(got, want), f"turn {turn}, answer token {row}: logits differ"
            assert restored.tokens == recomputed.tokens
            for got, want in zip(restored.logits, recomputed.logits):
                torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
        assert daemon.running(), daemon.log()
    finally:
        for e in (engine, reference, recompute):
            e.close()
        daemon.stop()
