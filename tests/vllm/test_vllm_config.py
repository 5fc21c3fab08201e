"""kvtier.vllm's options and its vLLM version check."""

from __future__ import annotations

import pytest

import kvtier.vllm
from kvtier.vllm.config import ConnectorConfig


def test_defaults_and_types():
    config = ConnectorConfig.from_extra_config({"socket": "/s", "lookup_timeout_ms": "50", "async_load": "true",
                                                "staging_bytes": 1 << 20})
    assert (config.socket, config.lookup_timeout_ms, config.async_load, config.staging_bytes) == \
        ("/s", 50.0, True, 1 << 20)
    assert ConnectorConfig.from_extra_config({}).lookup_timeout_ms == 200.0


def test_loads_are_asynchronous_on_cuda_and_whole_on_the_cpu_by_default():
    auto = ConnectorConfig.from_extra_config({"layerwise": "auto", "async_load": "auto"})
    assert (auto.async_load_for("cuda"), auto.async_load_for("host")) == (True, False)
    # Asynchronous Loads are one per request: never layer by layer (so CUDA graphs stay whole).
    assert (auto.layerwise_for("cuda"), auto.layerwise_for("host")) == (False, False)
    assert ConnectorConfig.from_extra_config({}).layerwise_for("cuda") is False
    forced = ConnectorConfig.from_extra_config({"layerwise": True})
    assert (forced.layerwise_for("host"), forced.layerwise_for("cuda")) == (True, False)
    synchronous = ConnectorConfig.from_extra_config({"layerwise": True, "async_load": False})
    assert synchronous.layerwise_for("cuda") is True
    assert ConnectorConfig.from_extra_config({"async_load": "true"}).async_load_for("host") is True
    assert ConnectorConfig.from_extra_config({"layerwise": "false"}).layerwise_for("cuda") is False


def test_only_a_layer_wise_cuda_vllm_needs_piecewise_cuda_graphs():
    from kvtier.vllm import KvtierConnector

    assert KvtierConnector.requires_piecewise_for_cudagraph({}) is False
    assert KvtierConnector.requires_piecewise_for_cudagraph({"layerwise": True}) is False
    assert KvtierConnector.requires_piecewise_for_cudagraph({"layerwise": True, "async_load": False}) is True


@pytest.mark.parametrize("extra, message", [
    ({"sockett": "/s"}, r"unknown kv_connector_extra_config key\(s\) sockett; known: async_load"),
    ({"lookup_timeout_ms": "soon"}, r"\['lookup_timeout_ms'\] = 'soon' is not a float"),
    ({"save_timeout_ms": -1}, "save_timeout_ms must not be negative"),
])
def test_bad_options_are_refused_by_name(extra, message):
    with pytest.raises(ValueError, match=message):
        ConnectorConfig.from_extra_config(extra)


def test_another_vllm_release_is_refused_with_the_supported_ones(monkeypatch):
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.31.2")
    with pytest.raises(ImportError, match=r"implements vLLM 0\.32\.x's KV connector API; this is vLLM 0\.31\.2"):
        kvtier.vllm._check_vllm_version()
    monkeypatch.setattr(vllm, "__version__", "0.32.5")
    assert kvtier.vllm._check_vllm_version() == "0.32.5"


def test_block_keys_mix_in_the_model_the_adapter_and_the_salt():
    import hashlib
    import struct
    from types import SimpleNamespace

    from kvtier.vllm.blocks import request_hashes

    tokens = list(range(1, 40))
    plain = SimpleNamespace(lora_request=None, cache_salt=None)
    keys = request_hashes("m", plain, tokens, 16)
    assert len(keys) == 2  # full blocks only
    # Chained SHA-256 over int64 token ids and the extra keys: the same in any process.
    extra = b"model=m\x00lora=\x00salt="
    first = hashlib.sha256(bytes(32) + struct.pack("<16q", *tokens[:16]) + extra).digest()
    assert keys[0] == first
    assert keys[1] == hashlib.sha256(first + struct.pack("<16q", *tokens[16:32]) + extra).digest()
    assert request_hashes("m", plain, tokens, 16, keys[:1]) == keys  # extends a known prefix
    adapter = SimpleNamespace(lora_request=SimpleNamespace(lora_name="a", lora_int_id=3, lora_path="/w/a"),
                              cache_salt=None)
    renumbered = SimpleNamespace(lora_request=SimpleNamespace(lora_name="a", lora_int_id=9, lora_path="/w/a"),
                                 cache_salt=None)
    salted = SimpleNamespace(lora_request=None, cache_salt="s")
    variants = [request_hashes("m", r, tokens, 16)[0] for r in (plain, adapter, salted)]
    variants.append(request_hashes("other", plain, tokens, 16)[0])
    assert len(set(variants)) == 4
    assert request_hashes("m", renumbered, tokens, 16) == request_hashes("m", adapter, tokens, 16)
