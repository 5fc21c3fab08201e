"""kvtier.vllm beside other connectors: the name KvtierConnector registered by the
package's vLLM plugin, vLLM's MultiConnector around it and vLLM's ExampleConnector, its
Prometheus metrics, and the load-failure policy vLLM's scheduler reads."""

from __future__ import annotations

import functools
import json
import os
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector

import kvtier.vllm
from conftest import ChatEngine
from kvtier.vllm.connector import check_load_failure_policy, scheduler_transfer_config
from kvtier.vllm.plugin import register
from test_vllm_end_to_end import SMALL_CACHE, baseline, conversation, evict, run_chat  # noqa: F401 (baseline: a fixture)

REPO = Path(__file__).resolve().parents[2]


def plugin_dist(directory: Path) -> Path:
    """A kvtier-0.1.0.dist-info declaring the entry points client/python/pyproject.toml
    declares, for a process that runs the package from PYTHONPATH (not installed)."""
    project = tomllib.loads((REPO / "client" / "python" / "pyproject.toml").read_text())["project"]
    info = directory / f"{project['name']}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    lines = []
    for group, entries in project["entry-points"].items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in entries.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return directory


def multi_config(socket: str, storage: Path, policy: str = "recompute") -> dict:
    return {"kv_connector": "MultiConnector", "kv_role": "kv_both", "kv_load_failure_policy": policy,
            "kv_connector_extra_config": {"connectors": [
                # No kv_connector_module_path: the name comes from the package's vLLM plugin.
                {"kv_connector": "KvtierConnector", "kv_role": "kv_both",
                 "kv_connector_extra_config": {"socket": socket, "reconnect_ms": 200}},
                {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                 "kv_connector_extra_config": {"shared_storage_path": str(storage)}}]}}


def test_the_plugin_registers_the_connector_name_once():
    register()
    register()  # loaded again (vLLM loads general plugins in every process): no error
    assert KVConnectorFactory.get_connector_class_by_name("KvtierConnector") is kvtier.vllm.KvtierConnector


def test_beside_vllms_example_connector_under_multiconnector(tiny_llama, kvtierd, baseline, tmp_path):  # noqa: F811 - the fixture imported above
    path = plugin_dist(tmp_path / "site")
    env = {"PYTHONPATH": os.pathsep.join([str(path), str(REPO / "client" / "python"),
                                          os.environ.get("PYTHONPATH", "")])}
    config = multi_config(kvtierd.socket_path, tmp_path / "example")
    engine = ChatEngine(tiny_llama, kvtierd.socket_path, "--kv-transfer-config", json.dumps(config), *SMALL_CACHE,
                        env=env)
    try:
        # Each turn after the first, another session's request evicts the chat from
        # vLLM's cache but its first block: kvtier loads the rest.
        replies = run_chat(engine, conversation(7, 4), "multi",
                           between=lambda turn, _: evict(engine, 300 + turn, keep=1))
    finally:
        engine.close()
    assert [r["tokens"] for r in replies] == baseline
    for turn in (1, 2, 3):
        grew = {k: replies[turn]["counters"][k] - replies[turn - 1]["counters"][k] for k in replies[0]["counters"]}
        assert grew["loaded_blocks"] > 0 and grew["load_failed_blocks"] == 0, (turn, grew)
        assert grew["internal_errors"] == 0, (turn, grew)
    assert any((tmp_path / "example").iterdir())  # ExampleConnector saved beside it


def test_the_policy_vllms_scheduler_reads_must_recompute():
    # A MultiConnector's "fail" is shared with the other connectors: refused.
    shared = KVTransferConfig(kv_connector="MultiConnector", kv_role="kv_both")
    own = KVTransferConfig(kv_connector="KvtierConnector", kv_role="kv_both")
    with pytest.raises(ValueError, match=r"kv_load_failure_policy is 'fail'.*\"kv_load_failure_policy\": "
                                         r"\"recompute\".*top-level"):
        check_load_failure_policy(shared, own=own)
    assert shared.kv_load_failure_policy == "fail"
    check_load_failure_policy(KVTransferConfig(kv_connector="MultiConnector", kv_role="kv_both",
                                               kv_load_failure_policy="recompute"), own=own)
    # kvtier alone: the setting is its own, and set to recompute.
    check_load_failure_policy(own, own=own)
    assert own.kv_load_failure_policy == "recompute"
    # Under MultiConnector the child's own config (vLLM's default, "fail") is not what
    # the scheduler reads: the MultiConnector's is.
    child = KVTransferConfig(kv_connector="KvtierConnector", kv_role="kv_both")
    for policy in ("recompute", "fail"):
        parent = MultiConnector.__new__(MultiConnector)
        parent._kv_transfer_config = KVTransferConfig(kv_connector="MultiConnector", kv_role="kv_both",
                                                      kv_load_failure_policy=policy)

        def made_by(self):
            return scheduler_transfer_config(child)

        assert made_by(parent).kv_load_failure_policy == policy
    assert scheduler_transfer_config(child) is child


def test_prometheus_metrics_under_multiconnector(tmp_path):
    register()
    registry = CollectorRegistry()
    types = {cls: functools.partial(cls, registry=registry) for cls in (Counter, Gauge, Histogram)}
    config = SimpleNamespace(kv_transfer_config=KVTransferConfig(**multi_config("/s", tmp_path)))
    labels = {0: ["tiny", "0"]}
    prom = MultiConnector.build_prom_metrics(config, types, ["model_name", "engine"], labels)
    # MultiConnector accepts stats only from children with Prometheus support.
    prom.observe({"KvtierConnector": {"loaded_blocks": 5, "loaded_blocks_ram": 3, "loaded_blocks_nvme": 2,
                                      "lookup_hit_blocks_hbm": 7, "load_errors": 1, "internal_errors": 2,
                                      "load_seconds": [0.002, 0.004], "save_seconds": [0.01]}}, 0)

    def value(name, **labels):
        return registry.get_sample_value(name, {"model_name": "tiny", "engine": "0", **labels})

    assert value("vllm:kvtier_loaded_blocks_total") == 5
    assert value("vllm:kvtier_loaded_blocks_by_tier_total", tier="ram") == 3
    assert value("vllm:kvtier_loaded_blocks_by_tier_total", tier="nvme") == 2
    assert value("vllm:kvtier_lookup_hit_blocks_by_tier_total", tier="hbm") == 7
    assert value("vllm:kvtier_load_errors_total") == 1
    assert value("vllm:kvtier_internal_errors_total") == 2
    assert value("vllm:kvtier_load_seconds_count") == 2
    assert value("vllm:kvtier_save_seconds_sum") == pytest.approx(0.01)
