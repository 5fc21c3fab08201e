"""The connector's options, read from vLLM's ``kv_connector_extra_config``.

Every key is optional:

- ``socket``: kvtierd's socket (default: $KVTIER_SOCKET, else the client's default).
- ``model_id``: names the model's KV instead of the model fingerprint
  (kvtier.vllm.fingerprint, the default: a digest of the weights, quantization, KV dtype,
  configuration and attention, so the same weights share blocks whatever their path,
  and anything that changes the KV never does). Setting it is a promise: every engine
  given the same id computes the same KV for the same tokens; kvtier cannot check it.
- ``lookup_timeout_ms`` (200): a Lookup not answered by then counts as 0 hits.
- ``lookup_spin_us`` (100, and never more): how long the scheduler may poll a Lookup
  sent when the request arrived before it answers "ask again next step" (which costs
  the request a whole engine step); 0: never wait.
- ``load_timeout_ms`` (5000): on the host path, a Load not done by then fails its blocks
  (vLLM recomputes them). CUDA Loads always wait: the daemon writes straight into
  vLLM's blocks, which must not be reused while it may still write.
- ``save_timeout_ms`` (5000): on the host path, how long a Save may wait for room in the
  staging buffer before it is dropped (vLLM's blocks are released as soon as they are
  copied into it; kvtierd answering the Save is not waited for).
- ``save_wait_ms`` (2000): how long a new request waits for a Save of its own prefix
  that is still in flight before it looks up without it.
- ``reconnect_ms`` (1000): how often to try again to reach a daemon that was not
  there when vLLM started (after that, the client library reconnects by itself).
- ``staging_bytes`` (1 GiB): size of the host path's staging buffer (a memfd the
  daemon maps); a step's loads and saves past it wait for the next step.
- ``host_zero_copy`` (false): vLLM on the CPU allocates its KV cache in a memfd the
  daemon maps (through the connector's allocation context), so no staging copy is
  made. The price: like CUDA, a Load or Save the daemon has started is always waited
  for (a hung but connected daemon stalls the engine); with staging, timeouts apply.
- ``async_load`` ("auto"): report hits as loaded asynchronously: vLLM holds the
  request (other requests keep running) while one Load per request fills its blocks,
  and schedules it once the worker reports the Load done. Off: Loads run inside the
  request's forward pass. "auto" is true for a CUDA vLLM: no Python runs inside the
  forward pass, so vLLM keeps full CUDA graphs, and a daemon that hangs holds only the
  requests whose Loads it owes (kvtierd writes straight into vLLM's blocks there, so
  those blocks are never given back before it answers or its process is gone); false
  for a CPU vLLM, where a staged Load that times out is simply recomputed.
- ``layerwise`` ("auto"): true loads layer by layer (one Load per layer, each waited for
  by that layer's attention: on CUDA this needs piecewise CUDA graphs, and a hung daemon
  stalls the step); false sends one Load per request, waited for before the first layer.
  Only for Loads that are not asynchronous. "auto" is false: on a CPU vLLM the copies and
  the attention share the same cores and memory bandwidth and layer-wise measured 0.95
  to 1.14 x the TTFT of whole-request Loads (docs/vllm.md); on CUDA Loads are
  asynchronous by default.
- ``kv_events_max_blocks`` (262144): with vLLM's KV events on (``--kv-events-config``),
  the most blocks the connector announces at once (kvtier.vllm.events; about 220 bytes
  each in the scheduler's process with 16-token blocks, 280 with 32: 60-75 MB at the
  default); past it the oldest are announced removed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class ConnectorConfig:
    socket: str | None = None
    model_id: str | None = None
    lookup_timeout_ms: float = 200.0
    lookup_spin_us: float = 100.0
    load_timeout_ms: float = 5000.0
    save_timeout_ms: float = 5000.0
    save_wait_ms: float = 2000.0
    reconnect_ms: float = 1000.0
    staging_bytes: int = 1 << 30
    host_zero_copy: bool = False
    async_load: bool | None = None  # None: "auto"
    layerwise: bool | None = None  # None: "auto"
    kv_events_max_blocks: int = 1 << 18

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> ConnectorConfig:
        extra = dict(extra or {})
        known = {field.name: field for field in dataclasses.fields(cls)}
        unknown = sorted(set(extra) - set(known))
        if unknown:
            raise ValueError(f"kvtier.vllm: unknown kv_connector_extra_config key(s) "
                             f"{', '.join(unknown)}; known: {', '.join(sorted(known))}")
        values: dict[str, Any] = {}
        for name, value in extra.items():
            default = known[name].default
            if name in ("layerwise", "async_load"):
                if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
                    values[name] = None
                    continue
                default = True
            try:
                if isinstance(default, bool):
                    if isinstance(value, str):
                        value = value.strip().lower() in ("1", "true", "yes", "on")
                    values[name] = bool(value)
                elif isinstance(default, int):
                    values[name] = int(value)
                elif isinstance(default, float):
                    values[name] = float(value)
                else:
                    values[name] = None if value is None else str(value)
            except (TypeError, ValueError):
                raise ValueError(f"kvtier.vllm: kv_connector_extra_config[{name!r}] = {value!r} "
                                 f"is not a {type(default).__name__}") from None
        for name in ("lookup_timeout_ms", "lookup_spin_us", "load_timeout_ms", "save_timeout_ms", "save_wait_ms",
                     "reconnect_ms", "staging_bytes", "kv_events_max_blocks"):
            if name in values and values[name] < 0:
                raise ValueError(f"kvtier.vllm: {name} must not be negative, got {values[name]}")
        if values.get("socket") is None:
            values["socket"] = os.environ.get("KVTIER_SOCKET") or None
        return cls(**values)

    def async_load_for(self, device: str) -> bool:
        """Whether Loads are asynchronous on this device ("host" or "cuda")."""
        return self.async_load if self.async_load is not None else device == "cuda"

    def layerwise_for(self, device: str) -> bool:
        """Whether the Loads that are not asynchronous go layer by layer on this device."""
        return bool(self.layerwise) and not self.async_load_for(device)
