"""vLLM's general plugin for kvtier (entry point group ``vllm.general_plugins``, name
``kvtier``): registers the connector name ``KvtierConnector`` with vLLM's
KVConnectorFactory in every vLLM process, so a ``--kv-transfer-config`` can name it
without ``kv_connector_module_path`` (and vLLM's MultiConnector can rebuild its stats
by that name)."""

from __future__ import annotations

NAME = "KvtierConnector"


def register() -> None:
    """Registers KvtierConnector (module kvtier.vllm, imported when first used) unless a
    connector of that name is registered already."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    if NAME not in KVConnectorFactory._registry:
        KVConnectorFactory.register_connector(NAME, "kvtier.vllm", NAME)
