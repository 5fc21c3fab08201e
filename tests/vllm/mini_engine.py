"""vLLM's own Scheduler and the connector's two sides in one process, with a stand-in
for the model: the way vLLM's connector unit tests drive a connector, without a GPU.

The "model" writes each computed token's KV as a pure function of (layer, token id,
position), so any block's bytes can be predicted from the tokens: a block loaded from
kvtierd must equal what computing it would have written, bit for bit.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Callable

import torch
from vllm import SamplingParams
from vllm.config import (CacheConfig, DeviceConfig, KVEventsConfig, KVTransferConfig, ModelConfig, SchedulerConfig,
                         VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm.utils.hashing import sha256

from kvtier.vllm import KvtierConnector
from kvtier.vllm.metadata import KvtierConnectorMetadata, LoadJob, SaveJob

LAYERS, HEADS, HEAD_DIM = 3, 2, 8
BLOCK = 16
_ids = itertools.count(1)
init_none_hash(sha256)


def kv_value(layer: int, token: int, position: int) -> torch.Tensor:
    """The [HEADS, 2 * HEAD_DIM] KV the stand-in model computes for one token."""
    base = (layer * 1_000_003 + token * 7919 + position * 104_729) % 65_521
    return (torch.arange(HEADS * 2 * HEAD_DIM, dtype=torch.float32) + base).view(HEADS, 2 * HEAD_DIM)


class MiniEngine:
    """One "vLLM process": a Scheduler with a KvtierConnector, a worker-side connector
    over a CPU cache of num_blocks blocks, and the stand-in model."""

    def __init__(self, model_dir: Path, socket: str, num_blocks: int = 64, prefix_caching: bool = False,
                 model_id: str | None = None, max_num_batched_tokens: int = 1024, kv_cache_layout: str = "LBHNC",
                 connector: str = "KvtierConnector", module: str = "kvtier.vllm", kv_role: str = "kv_both",
                 kv_events: bool = False, **extra) -> None:
        extra = {"socket": socket, "reconnect_ms": 100, "layerwise": True, **extra}
        if model_id:
            extra["model_id"] = model_id
        self.config = VllmConfig(
            model_config=ModelConfig(model=str(model_dir), dtype="float32", seed=0, max_model_len=2048,
                                     skip_tokenizer_init=True),
            scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=max_num_batched_tokens,
                                             max_model_len=2048, is_encoder_decoder=False),
            cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=prefix_caching),
            kv_transfer_config=KVTransferConfig(kv_connector=connector, kv_connector_module_path=module,
                                                kv_role=kv_role, kv_connector_extra_config=extra,
                                                kv_load_failure_policy="recompute"),
            device_config=DeviceConfig("cpu"),
            kv_events_config=KVEventsConfig(enable_kv_cache_events=kv_events, publisher="null"))
        self.layer_names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
        self.kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(self.layer_names, FullAttentionSpec(
                block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD_DIM, dtype=torch.float32))],
            kv_cache_layout=kv_cache_layout)
        self.config.cache_config.num_gpu_blocks = num_blocks
        self.scheduler = Scheduler(vllm_config=self.config, kv_cache_config=self.kv_cache_config,
                                   log_stats=True, structured_output_manager=StructuredOutputManager(self.config),
                                   block_size=BLOCK)
        self.worker = type(self.scheduler.connector)(self.config, KVConnectorRole.WORKER, self.kv_cache_config)
        # Every KV event the scheduler publishes (vLLM's own and the connector's), in order.
        self.events: list = []
        self.scheduler.kv_event_publisher.publish = lambda batch: self.events.extend(batch.events)
        # self.cache is always indexed [layer, block, head, token, K|V]; its memory is laid
        # out in the physical order kv_cache_layout names (LBHNC: vLLM's CPU default).
        order = KVCacheLayout[kv_cache_layout].stride_order
        logical = (LAYERS, num_blocks, HEADS, BLOCK, 2 * HEAD_DIM)
        physical = torch.zeros([logical[axis] for axis in order])
        self.cache = physical.permute([order.index(axis) for axis in range(5)])
        self.worker.register_kv_caches({name: self.cache[i] for i, name in enumerate(self.layer_names)})
        self.requests: dict[str, Request] = {}
        self.loads: list[LoadJob] = []  # every LoadJob the scheduler sent, in order
        self.saves: list[SaveJob] = []  # every SaveJob
        self.failed_blocks: set[int] = set()  # every block a Load reported it could not fill
        # Called (layer index, metadata) after each wait_for_layer_load.
        self.on_layer_loaded: Callable[[int, KvtierConnectorMetadata], None] | None = None

    @property
    def connector(self) -> KvtierConnector:
        return self.scheduler.connector

    def add(self, prompt: list[int], max_tokens: int = 4, session: str | None = None) -> Request:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        request = Request(request_id=f"r{next(_ids)}", prompt_token_ids=list(prompt), sampling_params=params,
                          pooling_params=None, mm_features=None,
                          block_hasher=get_request_block_hasher(BLOCK, sha256))
        if session:
            request.kv_transfer_params = {"kvtier_session": session}
        self.requests[request.request_id] = request
        self.scheduler.add_request(request)
        return request

    def step(self) -> list[str]:
        """One engine step; returns the ids of requests that finished in it."""
        output = self.scheduler.schedule()
        meta = output.kv_connector_metadata
        for job in meta.loads + meta.failed_loads:
            self.cache[:, job.block_ids] = -1.0  # poison: only the Load may fill these
        self.loads += meta.loads
        self.saves += meta.saves
        self.worker.bind_connector_metadata(output.kv_connector_metadata)
        self.worker.start_load_kv(None)
        for layer, name in enumerate(self.layer_names):
            self.worker.wait_for_layer_load(name)
            if self.on_layer_loaded is not None:
                self.on_layer_loaded(layer, meta)
        # Blocks a Load could not fill: vLLM runs this step anyway and then recomputes
        # them, discarding what the step produced for their requests.
        failed = set(self.worker.get_block_ids_with_load_errors())
        self.failed_blocks |= failed
        sampled = {}
        for request_id, count in output.num_scheduled_tokens.items():
            request = self.requests[request_id]
            start = request.num_computed_tokens - count  # schedule() already advanced it
            blocks = self.scheduler.kv_cache_manager.get_blocks(request_id).get_block_ids()[0]
            # What the model is about to read: every full block before the tokens it
            # computes now must hold that prefix's KV, whether computed or loaded.
            for index in range(start // BLOCK):
                if blocks[index] in failed:
                    continue
                assert self.cache[:, blocks[index]].equal(self.expected_block(request.all_token_ids, index)), \
                    f"{request_id}: block {index} (engine block {blocks[index]}) is not its prefix's KV"
            for position in range(start, start + count):
                token = request.all_token_ids[position]
                block, offset = blocks[position // BLOCK], position % BLOCK
                for layer in range(LAYERS):
                    self.cache[layer, block, :, offset] = kv_value(layer, token, position)
            if start + count >= request.num_tokens:
                sampled[request_id] = [(sum(request.all_token_ids) + 17) % 400 + 1]
        self.worker.wait_for_save()
        sending, receiving = self.worker.get_finished(output.finished_req_ids)
        errors = failed | self.worker.get_block_ids_with_load_errors()  # asynchronous Loads' too
        self.failed_blocks |= errors
        self.worker.clear_connector_metadata()
        ids = list(output.num_scheduled_tokens)
        runner_output = ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[sampled.get(r, []) for r in ids],
            kv_connector_output=KVConnectorOutput(finished_sending=sending, finished_recving=receiving,
                                                  invalid_block_ids=errors,
                                                  kv_connector_worker_meta=self.worker.build_connector_worker_meta()))
        results = self.scheduler.update_from_output(output, runner_output)
        finished = []
        for engine_outputs in results.values():
            finished += [o.request_id for o in engine_outputs.outputs if o.finish_reason is not None]
        return finished

    def run(self, request: Request, timeout_s: float = 60.0) -> list[int]:
        """Steps until the request finished and its Save is done; returns its output."""
        import time

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.step()
            # vLLM has its blocks back once a Save is staged; the Save is over once
            # kvtierd answered it (the scheduler side hears of it from the worker).
            if (request.is_finished() and not self.scheduler.has_requests()
                    and self.connector._scheduler_side.saves_in_flight() == 0):
                return list(request.output_token_ids)
        raise AssertionError(f"{request.request_id} did not finish in {timeout_s} s")

    def expected_block(self, tokens: list[int], index: int) -> torch.Tensor:
        """[LAYERS, HEADS, BLOCK, 2*HEAD_DIM]: what computing block `index` writes."""
        out = torch.empty(LAYERS, HEADS, BLOCK, 2 * HEAD_DIM)
        for offset in range(BLOCK):
            position = index * BLOCK + offset
            for layer in range(LAYERS):
                out[layer, :, offset] = kv_value(layer, tokens[position], position)
        return out

    def block_bytes(self, block_id: int) -> torch.Tensor:
        return self.cache[:, block_id].clone()

    def close(self) -> None:
        self.worker.shutdown()
        self.connector.shutdown()
