"""Never another model's KV: the model fingerprint (kvtier.vllm.fingerprint) in every
block key and in the Layout kvtierd keeps caches apart by.

Each difference that changes the KV a vLLM engine computes changes the model id, from
vLLM's config as vLLM builds it for the same flags a server takes; the same weights at
another path, or under another served name, do not. End to end, through vLLM's engine
and a real kvtierd: a server whose weights were replaced in the same folder (the
operator's commonest case: kvtierd's NVMe still holds the old weights' KV), and one with
its rope overridden, find none of the first server's blocks; one over a copy of the
same weights elsewhere finds all of them and answers as without kvtier."""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import HERE, ChatEngine, Kvtierd

sys.path.insert(0, str(HERE.parent.parent / "examples" / "vllm"))
from tiny_llama import write_tiny_llama

BLOCK = 32  # engine_process.py's block size


def model_id(model: Path, **flags) -> str:
    from vllm.engine.arg_utils import EngineArgs

    from kvtier.vllm.fingerprint import model_fingerprint

    flags = {"dtype": "float32", **flags}
    config = EngineArgs(model=str(model), max_model_len=512, skip_tokenizer_init=True, **flags).create_engine_config()
    return model_fingerprint(config).model_id


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_llama, other_llama):
    root = tmp_path_factory.mktemp("fingerprint")
    same = root / "elsewhere" / "same-weights"
    shutil.copytree(tiny_llama, same)
    return {"base": tiny_llama, "same": same, "other": other_llama, "root": root}


def test_the_same_weights_elsewhere_or_under_another_name_share_the_model_id(models):
    base = model_id(models["base"])
    assert base.startswith("kvtier-model:")
    assert model_id(models["same"]) == base
    assert model_id(models["base"], served_model_name="prod-chat") == base
    assert model_id(models["base"]) == base  # computed again: the same


def test_replaced_weights_in_the_same_folder_change_the_model_id(models):
    folder = models["root"] / "replaced"
    shutil.copytree(models["base"], folder)
    before = model_id(folder)
    write_tiny_llama(folder, seed=1)  # the operator copies other weights over the old ones
    assert model_id(folder) != before


def test_another_model_under_the_same_served_name_has_another_model_id(models):
    assert model_id(models["other"], served_model_name="prod-chat") != model_id(models["base"],
                                                                                served_model_name="prod-chat")


OVERRIDES: dict[str, dict[str, Any]] = {
    "rope theta": {"hf_overrides": {"rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}}},
    "rope scaling": {"hf_overrides": {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "linear",
                                                          "factor": 2.0}}},
    "max positions": {"hf_overrides": {"max_position_embeddings": 8192}},
    "fp8 kv cache": {"kv_cache_dtype": "fp8"},
    "fp8 e5m2 kv cache": {"kv_cache_dtype": "fp8_e5m2"},
    "weights dtype": {"dtype": "bfloat16"},
    "weight quantization": {"dtype": "bfloat16", "quantization": "fp8"},
    "attention backend": {"attention_backend": "CPU_ATTN"},
    "dummy weights": {"load_format": "dummy"},
}


@pytest.mark.parametrize("difference", list(OVERRIDES))
def test_each_setting_that_changes_the_kv_changes_the_model_id(models, difference):
    flags = OVERRIDES[difference]
    # Quantization against the same weights dtype (fp8 needs bf16 or fp16 activations).
    base = model_id(models["base"], dtype="bfloat16" if "quantization" in flags else "float32")
    changed = model_id(models["base"], **flags)
    assert changed != base, difference
    if difference == "weight quantization":  # and another quantization again
        assert model_id(models["base"], dtype="bfloat16", quantization="fp8") == changed


def test_a_checkpoints_own_quantization_config_changes_the_model_id(models):
    folder = models["root"] / "quantized"
    shutil.copytree(models["base"], folder)
    config = json.loads((folder / "config.json").read_text())
    before = model_id(folder, dtype="bfloat16")
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    (folder / "config.json").write_text(json.dumps(config))
    assert model_id(folder, dtype="bfloat16") != before


# ---- end to end ------------------------------------------------------------------

def _prompt(seed: int, blocks: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 500) for _ in range(blocks * BLOCK + 5)]


def _turn(model: Path, socket: str, prompt: list[int], *flags: str) -> dict:
    engine = ChatEngine(model, socket, *flags)
    try:
        return engine.turn(prompt, max_tokens=6, session="fingerprint")
    finally:
        engine.close()


def test_servers_share_blocks_only_when_they_compute_the_same_kv(models, reference):
    daemon = Kvtierd(["--nvme-bytes", "256MiB"])
    try:
        folder = models["root"] / "served"
        shutil.copytree(models["base"], folder)
        prompt = _prompt(3, 6)
        first = _turn(folder, daemon.socket_path, prompt)
        assert first["counters"]["saved_blocks"] >= 6, first["counters"]
        truth = reference.turn(prompt, max_tokens=6)["tokens"]
        assert first["tokens"] == truth

        # The same weights at another path: every block of the first server's prompt.
        same = _turn(models["same"], daemon.socket_path, prompt)
        assert same["counters"]["lookup_hit_blocks"] == 6, same["counters"]
        assert same["tokens"] == truth

        # The rope overridden: none (its KV differs from the first position on).
        rope = _turn(models["same"], daemon.socket_path, prompt, "--hf-overrides",
                     json.dumps({"rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}}))
        assert rope["counters"]["lookup_hit_blocks"] == 0, rope["counters"]
        assert rope["cached_tokens"] == 0

        # Other weights copied over the first server's folder, the engine restarted:
        # kvtierd still holds the old weights' blocks; the new engine finds none of them
        # and answers as the new weights do.
        write_tiny_llama(folder, seed=1)
        replaced = ChatEngine(folder, daemon.socket_path)
        try:
            reply = replaced.turn(prompt, max_tokens=6, session="fingerprint")
            assert reply["counters"]["lookup_hit_blocks"] == 0, reply["counters"]
            assert reply["cached_tokens"] == 0
            # Its own blocks it does find again, and answers the same from them.
            again = replaced.turn(prompt, max_tokens=6, session="fingerprint-again")
            assert again["counters"]["lookup_hit_blocks"] - reply["counters"]["lookup_hit_blocks"] == 6
            assert again["tokens"] == reply["tokens"]
        finally:
            replaced.close()
        assert reply["tokens"] != truth, "the two models answer alike: the test cannot tell them apart"
    finally:
        daemon.stop()
