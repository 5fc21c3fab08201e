"""KvtierConnector: vLLM's KVConnectorBase_V1 over kvtierd.

vLLM makes one instance per role: the scheduler's (``SchedulerSide``: lookups, sessions,
what each step loads and saves) and each worker's (``WorkerSide``: the copies). This
class routes vLLM's calls to the side of its role, and is where an unexpected error
inside kvtier stops: every method vLLM calls catches it, logs it (with its traceback,
the first time for each method; later ones at debug level), counts it
(``internal_errors``) and answers what vLLM can live with, keeping vLLM's books right:

- a lookup is 0 external tokens (and the request is neither loaded nor saved after);
- a Load that was promised is reported failed, block by block, so vLLM recomputes
  them (an asynchronous one is also reported finished receiving);
- a Save is dropped, but its request is still reported finished sending (vLLM holds
  its blocks until then); ``request_finished`` failing answers (False, None);
- ``register_kv_caches`` raises what the operator can fix (a KV cache kvtier cannot
  store: the model's or layout's fault, said at start-up); anything else is logged
  and vLLM serves without kvtier (every Load fails, every Save is dropped).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import sys
from collections.abc import Iterable
from types import FrameType
from typing import Any, Callable

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                               KVConnectorRole, KVConnectorWorkerMetadata)
from vllm.distributed.kv_events import KVCacheEvent
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from ..errors import InvalidArgument
from .blocks import UnsupportedModel, block_shape
from .config import ConnectorConfig
from .metadata import COUNTERS, Counters, KvtierConnectorMetadata
from .metrics import LATENCIES, KvtierPromMetrics, KvtierStats
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
    finished are issued, then waits (on every worker, through ``collective_rpc``) until
    kvtierd has answered them, or timeout_s passed; True when none is left.

    A Save is issued by the engine step after its request finished; ``LLM.generate``
    returns before that step, and a server's engine loop runs it by itself. On the
    staged path vLLM has its blocks back once they are copied, before kvtierd answers.
    Call this before the process exits, or before another process should find the blocks.
    """
    import time

    engine = llm.llm_engine
    deadline = time.monotonic() + timeout_s
    issued = False
    while time.monotonic() < deadline:
        core = getattr(getattr(engine, "engine_core", None), "engine_core", None)
        scheduler = getattr(core, "scheduler", None)
        if scheduler is not None and not scheduler.has_requests():
            issued = True
            break
        engine.step()
        if scheduler is None:  # engine in another process: one step is all we can do
            issued = True
            break
    if not issued:
        return False
    try:
        answered = all(llm.collective_rpc(_wait_for_worker_saves, args=(max(0.0, deadline - time.monotonic()),)))
    except Exception as error:  # an executor without RPCs to its workers
        logger.warning("kvtier.vllm: finish_saves could not reach the workers: %s", error)
        return False
    if answered:
        # Every worker has kvtierd's replies; their acknowledgements reach the scheduler
        # side with the next engine step, which an idle engine does not run: tell it now,
        # so that the next request does not wait a step for Saves that are over.
        core = getattr(getattr(engine, "engine_core", None), "engine_core", None)
        connector = getattr(getattr(core, "scheduler", None), "connector", None)
        for child in getattr(connector, "_connectors", None) or [connector]:
            if isinstance(child, KvtierConnector) and child._scheduler is not None:
                child._scheduler.forget_released_saves()
    return answered


def _wait_for_worker_saves(_worker, timeout_s: float) -> bool:
    """On a worker (finish_saves' RPC): waits until kvtierd answered this worker's Saves."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    if not has_kv_transfer_group():
        return True
    group = get_kv_transfer_group()
    children = getattr(group, "_connectors", None) or [group]
    return all(c.wait_for_saves_answered(timeout_s) for c in children if isinstance(c, KvtierConnector))


def scheduler_transfer_config(own):
    """The KVTransferConfig vLLM's scheduler reads: the connector's own, or, when a
    MultiConnector made this connector as one of its children (vLLM 0.32 gives a child
    a config of its own and no handle on its parent), the MultiConnector's."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector
    except ImportError:
        return own
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, MultiConnector):
            return getattr(owner, "_kv_transfer_config", None) or own
        frame = frame.f_back
    return own


def check_load_failure_policy(transfer_config, own=None) -> None:
    """Makes sure vLLM's scheduler recomputes a block kvtierd promised and could not load
    (a daemon restart, a block evicted between Lookup and Load) instead of failing the
    request ("fail" is vLLM 0.32's default). When the config the scheduler reads is the
    connector's own (kvtier alone), the setting concerns kvtier only: it is set to
    "recompute" (logged). Under MultiConnector it is the MultiConnector's, shared with the
    other connectors, and not kvtier's to change: a "fail" there refuses to start."""
    policy = getattr(transfer_config, "kv_load_failure_policy", "recompute")
    if policy == "recompute":
        return
    if own is not None and transfer_config is own:
        logger.info("kvtier.vllm: kv_load_failure_policy %r -> 'recompute' (a block kvtierd could "
                    "not deliver is recomputed, never a failed request)", policy)
        transfer_config.kv_load_failure_policy = "recompute"
        return
    raise ValueError(
        f"kvtier.vllm: vLLM's kv_load_failure_policy is {policy!r}: vLLM would fail a request "
        f"whenever a block kvtierd promised cannot be loaded (a daemon restart, a block evicted "
        f"between Lookup and Load), where a cache should recompute it. Set "
        f"\"kv_load_failure_policy\": \"recompute\" in --kv-transfer-config (with MultiConnector, "
        f"in its top-level config: that is the one vLLM's scheduler reads)")


class _Faults:
    """Unexpected errors inside the connector: logged (the first in each method with its
    traceback at error level, later ones at debug level) and counted."""

    def __init__(self, role: str) -> None:
        self._role = role
        self._seen: collections.Counter[str] = collections.Counter()
        self.count = 0

    def record(self, entry: str, error: BaseException) -> None:
        try:
            self.count += 1
            COUNTERS.add("internal_errors")
            self._seen[entry] += 1
            if self._seen[entry] == 1:
                logger.error("kvtier.vllm (%s): internal error in %s; vLLM goes on without kvtier for what it "
                             "touched (later errors in %s are counted in internal_errors and logged at debug "
                             "level)", self._role, entry, entry, exc_info=error)
            else:
                logger.debug("kvtier.vllm (%s): internal error %d in %s", self._role, self._seen[entry], entry,
                             exc_info=error)
        except Exception:  # reporting must never be what fails
            pass


def _cache_kind(kv_cache_config) -> str | None:
    """The kind vLLM's own KV events name the cache group by ("full_attention"), for ours."""
    try:
        from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind

        return str(get_kv_cache_spec_kind(kv_cache_config.kv_cache_groups[0].kv_cache_spec).value)
    except Exception:  # a vLLM without it: the events go without
        return None


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
        # kv_role: a consumer loads (kv_consumer, kv_both), a producer saves (kv_producer,
        # kv_both): a prefill-only instance fills kvtierd for the decode instances, a
        # decode-only one reads what they left.
        transfer = self._kv_transfer_config
        self._loads = bool(getattr(transfer, "is_kv_consumer", True))
        self._saves = bool(getattr(transfer, "is_kv_producer", True))
        self._scheduler: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        self._faults = _Faults(role.name.lower())
        self._reported: dict[str, int] = COUNTERS.snapshot()
        self._reported_own = (0, 0, 0)  # (internal errors, connects, unavailable) reported
        if role == KVConnectorRole.SCHEDULER:
            check_load_failure_policy(scheduler_transfer_config(self._kv_transfer_config),
                                      own=self._kv_transfer_config)
            events = getattr(vllm_config, "kv_events_config", None)
            self._scheduler = SchedulerSide(self._config, self._shape, device,
                                            kv_events=bool(getattr(events, "enable_kv_cache_events", False)),
                                            cache_kind=_cache_kind(kv_cache_config))
        else:
            self._worker = WorkerSide(self._config, self._shape)
        logger.info("kvtier.vllm: %s side, %d layers, %d tokens a block, %d bytes a block, socket %s",
                    role.name.lower(), len(self._shape.layer_names), self._shape.tokens_per_block,
                    self._shape.block_bytes, self._config.socket or "(default)")

    @property
    def _worker_side(self) -> WorkerSide:
        """This connector's WorkerSide. vLLM calls the worker's methods only on a worker's
        connector: on the scheduler's this raises, and the caller recovers as from any error."""
        if self._worker is None:
            raise RuntimeError("kvtier.vllm: a worker method called on the scheduler's connector")
        return self._worker

    @property
    def _scheduler_side(self) -> SchedulerSide:
        """This connector's SchedulerSide (the scheduler's methods, as _worker_side)."""
        if self._scheduler is None:
            raise RuntimeError("kvtier.vllm: a scheduler method called on a worker's connector")
        return self._scheduler

    def _recover(self, entry: str, error: BaseException, fallback: Callable[[], Any] | None = None,
                 default: Any = None) -> Any:
        """Records the error, then runs fallback (what vLLM is owed); its result, or
        default when there is none or it failed too. A fallback that calls a side gets it
        when it runs (``lambda: self._worker_side...``): a wrong role fails there too."""
        self._faults.record(entry, error)
        if fallback is None:
            return default
        try:
            result = fallback()
        except Exception as again:
            self._faults.record(f"{entry} (recovery)", again)
            return default
        return default if result is None else result

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
        try:
            self._worker_side.register_kv_caches(kv_caches)
        except (InvalidArgument, UnsupportedModel):
            raise  # a KV cache kvtier cannot store: said at start-up, where it can be fixed
        except Exception as error:
            self._recover("register_kv_caches", error, lambda: self._worker_side.disable())
            logger.error("kvtier.vllm: serving without kvtier (the worker could not be set up)")

    def _meta(self) -> KvtierConnectorMetadata | None:
        meta = self._connector_metadata
        return meta if isinstance(meta, KvtierConnectorMetadata) else None

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        meta = self._meta()
        try:
            if meta is None:
                raise TypeError(f"connector metadata {type(self._connector_metadata).__name__}, "
                                f"not KvtierConnectorMetadata")
            self._worker_side.start_load_kv(meta)
        except Exception as error:
            self._recover("start_load_kv", error, lambda: self._worker_side.fail_step_loads(meta))

    def wait_for_layer_load(self, layer_name: str) -> None:
        try:
            self._worker_side.wait_for_layer_load(layer_name)
        except Exception as error:
            self._recover("wait_for_layer_load", error, lambda: self._worker_side.fail_step_loads(self._meta()))

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata, **kwargs: Any) -> None:
        return  # Saves go at request end, from wait_for_save, once every layer is written

    def wait_for_save(self):
        meta = self._meta()
        try:
            expected = self._worker_side.saves_in_hand(meta)
        except Exception as error:
            expected = set()
            self._recover("wait_for_save", error)
        try:
            self._worker_side.wait_for_save(meta)
        except Exception as error:

            def recover():
                self._worker_side.end_loads_after_error()
                self._worker_side.drop_saves_not_in_hand(expected)

            self._recover("wait_for_save", error, recover)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        try:
            expected = self._worker_side.saves_in_hand(None)
        except Exception as error:
            expected = set()
            self._recover("get_finished", error)
        try:
            return self._worker_side.get_finished(finished_req_ids)
        except Exception as error:
            return self._recover("get_finished", error, lambda: self._worker_side.salvage_finished(expected),
                                 default=(None, None))

    def wait_for_saves_answered(self, timeout_s: float) -> bool:
        """Worker side (finish_saves): waits up to timeout_s for kvtierd's replies to
        the Saves sent; True when none is left unanswered or waiting to be sent."""
        return self._worker is None or self._worker.wait_for_saves_answered(timeout_s)

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        if self._worker is None:
            return None
        try:
            return self._worker.build_connector_worker_meta()
        except Exception as error:
            # Lost acknowledgements cost the scheduler at most save_wait_ms of waiting.
            return self._recover("build_connector_worker_meta", error)

    def get_block_ids_with_load_errors(self) -> set[int]:
        try:
            return self._worker_side.get_block_ids_with_load_errors()
        except Exception as error:
            return self._recover("get_block_ids_with_load_errors", error,
                                 lambda: self._worker_side.take_load_errors(), default=set())

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        try:
            return self._stats()
        except Exception as error:
            return self._recover("get_kv_connector_stats", error)

    def _stats(self) -> KvtierStats | None:
        """This role's counts since its last report (see kvtier.vllm.metrics)."""
        side = self._scheduler if self._scheduler is not None else self._worker
        now = COUNTERS.snapshot()
        names = Counters.SCHEDULER_NAMES if self._scheduler is not None else Counters.WORKER_NAMES
        data: dict[str, Any] = {name: now[name] - self._reported.get(name, 0) for name in names}
        self._reported = now
        link = getattr(side, "_link", None)
        own = (self._faults.count, getattr(link, "connects", 0), getattr(link, "unavailable", 0))
        for name, value, reported in zip(("internal_errors", "connects", "daemon_unavailable"), own,
                                         self._reported_own):
            data[name] = max(0, value - reported)
        self._reported_own = own
        for name in LATENCIES:
            observed = getattr(side, name, None)
            if observed:
                data[name], observed[:] = list(observed), []
        data = {name: value for name, value in data.items() if value}
        return KvtierStats(data=data) if data else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return KvtierStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return KvtierPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self):
        for side in (self._worker, self._scheduler):
            if side is not None:
                try:
                    side.shutdown()
                except Exception as error:
                    self._recover("shutdown", error)

    # ---- scheduler side ----------------------------------------------------------

    def on_new_request(self, request) -> None:
        try:
            self._scheduler_side.on_new_request(request)
        except Exception as error:
            self._recover("on_new_request", error, lambda: self._scheduler_side.forget(request.request_id))

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        if not self._loads:
            return 0, False
        try:
            return self._scheduler_side.get_num_new_matched_tokens(request, num_computed_tokens)
        except Exception as error:
            self._recover("get_num_new_matched_tokens", error, lambda: self._scheduler_side.forget(request.request_id))
            return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        try:
            self._scheduler_side.update_state_after_alloc(request, blocks, num_external_tokens)
        except Exception as error:
            # vLLM counts those tokens as loaded: the worker must report their blocks failed.
            self._recover("update_state_after_alloc", error,
                          lambda: self._scheduler_side.abandon_load(request, blocks, num_external_tokens)
                          if num_external_tokens > 0 else self._scheduler_side.forget(request.request_id))

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        try:
            return self._scheduler_side.build_connector_meta(scheduler_output)
        except Exception as error:
            return self._recover("build_connector_meta", error, lambda: self._scheduler_side.salvage_meta(),
                                 default=KvtierConnectorMetadata())

    def update_connector_output(self, connector_output):
        try:
            self._scheduler_side.update_connector_output(connector_output)
        except Exception as error:
            self._recover("update_connector_output", error, lambda: self._scheduler_side.reset_saving())

    def has_pending_push_work(self) -> bool:
        if self._scheduler is None:
            return False
        try:
            return self._scheduler.has_pending_push_work()
        except Exception as error:
            return bool(self._recover("has_pending_push_work", error, default=False))

    def take_events(self) -> Iterable[KVCacheEvent]:
        try:
            return self._scheduler_side.take_events()
        except Exception as error:
            return self._recover("take_events", error, default=())

    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        if not self._saves:
            try:
                self._scheduler_side.drop_save(request.request_id)  # forgets the request
            except Exception as error:
                self._recover("request_finished", error)
            return False, None
        try:
            return self._scheduler_side.request_finished(request, block_ids)
        except Exception as error:
            # vLLM frees the blocks now: no Save of them may go out.
            self._recover("request_finished", error, lambda: self._scheduler_side.drop_save(request.request_id))
            return False, None
