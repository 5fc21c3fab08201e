"""The connector's stats as vLLM reports them: logged per interval (KvtierStats) and
exported to Prometheus (KvtierPromMetrics, through vLLM's connector metrics hook).

A stats payload is a flat dict: each counter of ``Counters.NAMES`` that moved in the
interval (an int), and latency observations in seconds (lists) under LATENCIES. Each
role reports what it counts itself (``Counters.SCHEDULER_NAMES`` from the scheduler,
the rest from each worker), so the payloads vLLM sums count nothing twice.

Prometheus, every metric labelled like vLLM's own (model_name, engine):

- ``vllm:kvtier_<counter>_total`` for each counter (lookups, hits, loads, loaded and
  failed blocks, bytes, saves, dropped blocks, errors, timeouts, internal errors, ...);
- ``vllm:kvtier_lookup_hit_blocks_by_tier_total{tier}``: hit blocks by where kvtierd's
  Lookup found them (hbm, ram, nvme, remote), and
  ``vllm:kvtier_loaded_blocks_by_tier_total{tier}``: loaded blocks by where the Lookup
  saw them;
- histograms ``vllm:kvtier_lookup_seconds``, ``vllm:kvtier_load_seconds`` (a request's
  Load, sent to done) and ``vllm:kvtier_save_seconds`` (a Save, sent to acknowledged).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Histogram
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

from .metadata import TIERS, Counters

LATENCIES = ("lookup_seconds", "load_seconds", "save_seconds")
MAX_OBSERVATIONS = 4096  # per latency, per payload
BY_TIER = ("lookup_hit_blocks", "loaded_blocks")
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
DOCS = {
    "lookups": "Lookups sent to kvtierd",
    "lookup_hit_blocks": "Blocks kvtierd's Lookups found",
    "lookup_timeouts": "Lookups not answered within lookup_timeout_ms (counted as 0 hits)",
    "lookup_errors": "Lookups that failed (counted as 0 hits)",
    "lookup_waits_for_save": "Requests that waited for a Save of their own prefix",
    "begin_turns": "BeginTurn messages sent",
    "begin_turn_errors": "BeginTurn messages that could not be sent",
    "daemon_unavailable": "Attempts to reach kvtierd that failed",
    "connects": "Connections made to kvtierd",
    "internal_errors": "Unexpected errors inside the connector (vLLM went on without kvtier for what they touched)",
    "loads": "Loads sent to kvtierd",
    "loaded_blocks": "Blocks loaded from kvtierd into vLLM's cache",
    "load_failed_blocks": "Blocks vLLM was told are loaded that were not (vLLM recomputed them)",
    "load_timeouts": "Loads given up after load_timeout_ms",
    "load_errors": "Loads that failed",
    "loaded_bytes": "Bytes loaded from kvtierd",
    "layer_loads": "Per-layer Loads sent",
    "layer_waits": "Waits for a layer's Load",
    "saves": "Saves sent to kvtierd",
    "saved_blocks": "Blocks kvtierd kept from Saves",
    "save_partial": "Saves kvtierd kept only a prefix of (out of room)",
    "save_dropped_blocks": "Blocks of Saves that were dropped",
    "save_errors": "Saves that failed",
    "save_timeouts": "Saves whose blocks were given back to vLLM after save_timeout_ms",
    "saved_bytes": "Bytes copied into kvtierd by Saves",
    "staging_waits": "Loads or Saves that found the staging buffer full",
    "zero_copy_caches": "KV caches kvtierd maps directly (no staging)",
}


def merge(into: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Adds payload other to payload into (in place); returns into."""
    for name, value in (other or {}).items():
        if isinstance(value, list):
            kept = into.setdefault(name, [])
            kept.extend(value[:max(0, MAX_OBSERVATIONS - len(kept))])
        else:
            into[name] = into.get(name, 0) + value
    return into


class KvtierStats(KVConnectorStats):
    """One interval's payload (see the module docstring); summed across workers."""

    def reset(self):
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        merge(self.data, other.data)
        return self

    def reduce(self) -> dict[str, int | float]:
        out: dict[str, int | float] = {}
        for name, value in self.data.items():
            if isinstance(value, list):
                if value:
                    out[f"{name[:-len('_seconds')]}_ms_avg"] = round(1000.0 * sum(value) / len(value), 3)
            elif value:
                out[name] = value
        return out

    def is_empty(self) -> bool:
        return not any(self.data.values())


class KvtierPromMetrics(KVConnectorPromMetrics):
    """kvtier's Prometheus metrics (module docstring), fed by KvtierStats payloads."""

    def __init__(self, vllm_config, metric_types, labelnames: list[str],
                 per_engine_labelvalues: dict[int, list[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        counter, histogram = metric_types.get(Counter, Counter), metric_types.get(Histogram, Histogram)
        plain = [n for n in Counters.NAMES if not any(n.startswith(f"{p}_") and n[len(p) + 1:] in TIERS
                                                       for p in BY_TIER)]
        self._counters = {
            name: self._per_engine(counter(name=f"vllm:kvtier_{name}", documentation=DOCS.get(name, name),
                                           labelnames=labelnames))
            for name in plain}
        self._by_tier: dict[str, dict[int, Any]] = {}
        for prefix in BY_TIER:
            metric = counter(name=f"vllm:kvtier_{prefix}_by_tier",
                             documentation=f"{DOCS[prefix]}, by the tier kvtierd's Lookup found them in",
                             labelnames=labelnames + ["tier"])
            for tier in TIERS:
                self._by_tier[f"{prefix}_{tier}"] = {
                    engine: metric.labels(*values, tier) for engine, values in per_engine_labelvalues.items()}
        self._histograms = {
            name: self._per_engine(histogram(name=f"vllm:kvtier_{name}", buckets=BUCKETS,
                                             documentation=f"kvtier {name[:-len('_seconds')]} latency (seconds)",
                                             labelnames=labelnames))
            for name in LATENCIES}

    def _per_engine(self, metric) -> dict[int, Any]:
        return {engine: metric.labels(*values) for engine, values in self.per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0):
        for name, value in (transfer_stats_data or {}).items():
            if name in self._histograms:
                metric = self._histograms[name].get(engine_idx)
                if metric is not None:
                    for seconds in value:
                        metric.observe(seconds)
                continue
            metric = (self._counters.get(name) or self._by_tier.get(name) or {}).get(engine_idx)
            if metric is not None and value:
                metric.inc(value)
