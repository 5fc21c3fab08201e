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


def test_layerwise_auto_follows_the_device():
    auto = ConnectorConfig.from_extra_config({"layerwise": "auto"})
    assert (auto.layerwise_for("cuda"), auto.layerwise_for("host")) == (True, False)
    assert ConnectorConfig.from_extra_config({}).layerwise_for("cuda") is True
    forced = ConnectorConfig.from_extra_config({"layerwise": True})
    assert forced.layerwise_for("host") is True
    assert ConnectorConfig.from_extra_config({"layerwise": "false"}).layerwise_for("cuda") is False


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
