"""The model fingerprint of a vLLM engine (kvtier.fingerprint's key scheme).

What it covers, from vLLM's config as the engine runs it:

- the weights: :func:`kvtier.fingerprint.checkpoint_digest` of the folder vLLM reads
  them from (``model_weights``, else ``model``; a hub name is looked up in the local
  hub cache at its revision); ``load_format``, and the seed when the weights are
  vLLM's dummy (random) ones;
- the weights' dtype, the quantization method and its config (the checkpoint's is in
  its config.json, which the weights' digest reads whole; any given to vLLM);
- the KV cache dtype and the layers it skips (their scales are checkpoint tensors);
- the model configuration: config.json (in the weights' digest), ``--hf-overrides``
  (rope, positions, ...) and a config folder given apart (``hf_config_path``); the model
  implementation and the attention backends chosen. Never vLLM's live config object:
  a model's loading may amend it in a worker and not in the scheduler's process.

Both sides of the connector compute it in their own process; the same config gives the
same digest. ``kv_connector_extra_config["model_id"]`` replaces it: the operator's
promise that every engine given that id computes the same KV.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from typing import Any

from .. import fingerprint as fp

logger = logging.getLogger("kvtier.vllm")


@dataclasses.dataclass(frozen=True)
class ModelFingerprint:
    digest: str  # hex SHA-256 of parts
    parts: dict[str, Any]
    weights: fp.CheckpointDigest | None  # None: no local checkpoint was found to read

    @property
    def model_id(self) -> str:
        return fp.model_id(self.digest)

    def describe(self) -> str:
        w = self.weights
        weights = (f"{w.files} weight files, {w.bytes} bytes, {w.tensors} tensors sampled in {w.seconds:.2f} s"
                   if w is not None else "weights not found locally: named by model and revision only")
        return (f"model fingerprint {self.digest[:16]} ({weights}; dtype {self.parts['dtype']}, quantization "
                f"{self.parts['quantization'] or 'none'}, kv cache {self.parts['kv_cache_dtype']})")


def model_fingerprint(vllm_config) -> ModelFingerprint:
    model = vllm_config.model_config
    cache = vllm_config.cache_config
    load = getattr(vllm_config, "load_config", None)
    load_format = str(getattr(load, "load_format", "auto"))
    folder = _weights_folder(model, load)
    weights = fp.checkpoint_digest(folder) if folder is not None else None
    attention = getattr(vllm_config, "attention_config", None)
    parts: dict[str, Any] = {
        "weights": weights.digest if weights is not None else {
            "name": str(model.model_weights or model.model), "revision": model.revision},
        "load_format": load_format,
        "dummy_seed": model.seed if load_format == "dummy" else None,
        "dtype": str(model.dtype),
        "quantization": model.quantization,
        "quantization_config": _plain(getattr(model, "quantization_config", None)),
        "kv_cache_dtype": str(cache.cache_dtype),
        "kv_cache_dtype_skip_layers": sorted(getattr(cache, "kv_cache_dtype_skip_layers", None) or []),
        # The configuration as written (config.json is in the weights' digest) and what
        # overrides it; never the live config object, which a model's loading may amend in
        # one process and not in another (the scheduler's and the workers' ids would differ).
        "hf_overrides": _plain(getattr(model, "hf_overrides", None)),
        "hf_config_path": _config_folder(getattr(model, "hf_config_path", None)),
        "model_impl": str(getattr(model, "model_impl", "auto")),
        "attention_backend": str(getattr(attention, "backend", None)),
        "attention_backend_per_kind": _plain(getattr(attention, "backend_per_kind", None)),
        "attention_backend_env": os.environ.get("VLLM_ATTENTION_BACKEND"),
    }
    return ModelFingerprint(fp.digest_of(parts), parts, weights)


def _weights_folder(model, load) -> str | None:
    """The local folder vLLM reads the weights from, or None."""
    name = str(getattr(model, "model_weights", "") or model.model)
    if os.path.isdir(name):
        return name
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(name, revision=model.revision, local_files_only=True,
                                 cache_dir=getattr(load, "download_dir", None),
                                 allow_patterns=["*.json", "*.safetensors", "*.bin", "*.pt", "*.pth"])
    except Exception as error:  # not in the hub cache (or no hub): named only
        logger.warning("kvtier.vllm: %s is neither a folder nor in the local hub cache (%s); its blocks are keyed "
                       "by its name and revision, not its weights", name, error)
        return None


def _config_folder(path: str | None) -> str | None:
    """A config folder other than the weights' (hf_config_path): its digest, or its name."""
    if not path:
        return None
    return fp.checkpoint_digest(path).digest if os.path.isdir(path) else str(path)


def _plain(value: Any) -> Any:
    """A JSON-friendly copy (objects as their dict or str; digest_of writes the rest)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_plain(v) for v in value]
        return sorted(items, key=str) if isinstance(value, (set, frozenset)) else items
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return _plain(to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    return re.sub(r" at 0x[0-9a-fA-F]+", "", str(value))  # never an address: the same in every process
