"""KvtierConnector: vLLM's KVConnectorBase_V1 over kvtierd.

vLLM makes one instance per role: the scheduler's (``SchedulerSide``: lookups, sessions,
what each step loads and saves) and each worker's (``WorkerSide``: the copies). This
class only routes vLLM's calls to the side of its role.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                               KVConnectorRole)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from .blocks import block_shape
from .config import ConnectorConfig
from .metadata import COUNTERS, KvtierConnectorMetadata
from .scheduler import SchedulerSide
from .worker import WorkerSide

logger = logging.getLogger("kvtier.vllm")


def counters() -> dict[str, int]:
    """This process's connector counters (both roles), cumulative."""
    return COUNTERS.snapshot()


@contextlib.contextmanager
def memfd_kv_allocation():
    """While active, ``torch.zeros(n, dtype=torch.int8, device="cpu")`` — the call vLLM
    0.32 makes for the KV cache's one backing buffer — returns a memfd-backed tensor
    (``kvtier.torch.memfd_tensor``); every other call is torch's own."""
    from .. import torch as kvtier_torch

    original = torch.zeros

    def zeros(*args, **kwargs):
        size = args[0] if len(args) == 1 else kwargs.get("size")
        device = kwargs.get("device")
        if (isinstance(size, int) and kwargs.get("dtype") is torch.int8 and device is not None
                and torch.device(device).type == "cpu" and not kwargs.get("out")
                and set(kwargs) <= {"dtype", "device"}):
            return kvtier_torch.memfd_tensor((size,), torch.int8, name="kvtier-vllm-kv-cache")
        return original(*args, **kwargs)

    torch.zeros = zeros
    try:
        yield
    finally:
        torch.zeros = original


def finish_saves(llm, timeout_s: float = 30.0) -> bool:
    """Offline ``vllm.LLM`` only: steps the engine until the Saves of the requests that
    finished are acknowledged (or timeout_s passed); True when none is left.

    A Save is issued by the engine step after its request finished; ``LLM.generate``
    returns before that step, and a server's engine loop runs it by itself. Call this
    before the process exits, or before another process should find the blocks.
    """
    import time

    engine = llm.llm_engine
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        core = getattr(getattr(engine, "engine_core", None), "engine_core", None)
        scheduler = getattr(core, "scheduler", None)
        if scheduler is not None and not scheduler.has_requests():
            return True
        engine.step()
        if scheduler is None:  # engine in another process: one step is all we can do
            return True
    return False


class KvtierStats(KVConnectorStats):
    """Per-interval counters a worker reports to vLLM's stats logger (summed)."""

    def reset(self):
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for name, value in (other.data or {}).items():
            self.data[name] = self.data.get(name, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not any(self.data.values())


class KvtierConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        self._config = ConnectorConfig.from_extra_config(extra)
        if kv_cache_config is None:
            raise ValueError("kvtier.vllm needs vLLM's kv_cache_config (vLLM 0.32 passes it)")
        self._shape = block_shape(vllm_config, kv_cache_config, self._config.model_id)
        device = "host" if vllm_config.device_config.device_type == "cpu" else "cuda"
        self._device = device
        self._scheduler: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        self._reported = COUNTERS.snapshot()
        if role == KVConnectorRole.SCHEDULER:
            if self._kv_transfer_config.kv_load_failure_policy != "recompute":
                # A block kvtierd could not deliver is a cache miss, never a failed request.
                logger.info("kvtier.vllm: kv_load_failure_policy %r -> 'recompute' (blocks a Load could "
                            "not fill are recomputed)", self._kv_transfer_config.kv_load_failure_policy)
                self._kv_transfer_config.kv_load_failure_policy = "recompute"
            self._scheduler = SchedulerSide(self._config, self._shape, device)
        else:
            self._worker = WorkerSide(self._config, self._shape)
        logger.info("kvtier.vllm: %s side, %d layers, %d tokens a block, %d bytes a block, socket %s",
                    role.name.lower(), len(self._shape.layer_names), self._shape.tokens_per_block,
                    self._shape.block_bytes, self._config.socket or "(default)")

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        # wait_for_layer_load runs between layers only where vLLM runs Python there.
        try:
            return ConnectorConfig.from_extra_config(extra_config).layerwise_for("cuda")
        except ValueError:
            return False

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: a Save dropped is a later miss, never wrong output

    # ---- worker side -------------------------------------------------------------

    def get_mem_pool_context(self):
        """With ``host_zero_copy`` on a CPU vLLM: vLLM allocates its KV cache inside this
        context, which makes that one allocation a memfd the daemon can map."""
        if self._worker is None or not self._config.host_zero_copy or self._device != "host":
            return None
        return memfd_kv_allocation()

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        self._worker.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvtierConnectorMetadata)
        self._worker.start_load_kv(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._worker.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata, **kwargs: Any) -> None:
        return  # Saves go at request end, from wait_for_save, once every layer is written

    def wait_for_save(self):
        meta = self._connector_metadata if isinstance(self._connector_metadata, KvtierConnectorMetadata) else None
        self._worker.wait_for_save(meta)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return self._worker.get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.get_block_ids_with_load_errors()

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        if self._worker is None:
            return None  # the worker's report covers the process (counters are per process)
        now = COUNTERS.snapshot()
        delta = {name: now[name] - self._reported.get(name, 0) for name in now}
        self._reported = now
        stats = KvtierStats(data={k: v for k, v in delta.items() if v})
        return None if stats.is_empty() else stats

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return KvtierStats(data=dict(data or {}))

    def shutdown(self):
        if self._worker is not None:
            self._worker.shutdown()
        if self._scheduler is not None:
            self._scheduler.shutdown()

    # ---- scheduler side ----------------------------------------------------------

    def on_new_request(self, request) -> None:
        self._scheduler.on_new_request(request)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        return self._scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output):
        self._scheduler.update_connector_output(connector_output)

    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self._scheduler.request_finished(request, block_ids)
