"""KvtierConnector with a fault injected: the side-object method behind one of the
entry points vLLM calls raises RuntimeError, chosen while vLLM runs. vLLM loads it as
``{"kv_connector": "FaultyKvtierConnector", "kv_connector_module_path":
"faulty_connector"}`` with tests/vllm on its path.

Which method raises: the name in the file $KVTIER_TEST_FAULT_FILE when that is set (an
engine process the test steers), else ``FAULT`` (in-process tests); "" or a name no
entry point has: none. The connector's recovery methods are never faulty.
"""

from __future__ import annotations

import os
from typing import cast

from kvtier.vllm import KvtierConnector
from kvtier.vllm.scheduler import SchedulerSide
from kvtier.vllm.worker import WorkerSide

FAULT_FILE = "KVTIER_TEST_FAULT_FILE"
# The side-object methods KvtierConnector calls for vLLM's entry points of the same name.
SCHEDULER_METHODS = ("on_new_request", "get_num_new_matched_tokens", "update_state_after_alloc",
                     "build_connector_meta", "update_connector_output", "request_finished", "take_events",
                     "has_pending_push_work", "shutdown")
WORKER_METHODS = ("register_kv_caches", "start_load_kv", "wait_for_layer_load", "wait_for_save", "get_finished",
                  "get_block_ids_with_load_errors", "build_connector_worker_meta", "shutdown")
FAULT = ""
_file_cache: tuple[float, str] = (-1.0, "")


def current_fault() -> str:
    global _file_cache
    path = os.environ.get(FAULT_FILE)
    if not path:
        return FAULT
    try:
        mtime = os.stat(path).st_mtime
        if mtime != _file_cache[0]:
            with open(path) as f:
                _file_cache = (mtime, f.read().strip())
    except OSError:
        return ""
    return _file_cache[1]


class _Faulty:
    """Forwards to a side object; its method named by current_fault() raises instead."""

    def __init__(self, side, methods: tuple[str, ...]) -> None:
        object.__setattr__(self, "_side", side)
        object.__setattr__(self, "_methods", methods)

    def __getattr__(self, name):
        value = getattr(self._side, name)
        if name in self._methods and current_fault() == name:
            def raising(*args, **kwargs):
                raise RuntimeError(f"fault injected in {name}")
            return raising
        return value

    def __setattr__(self, name, value):
        setattr(self._side, name, value)


class FaultyKvtierConnector(KvtierConnector):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        # Each _Faulty stands in for its side, forwarding every call it does not fail.
        if self._scheduler is not None:
            self._scheduler = cast(SchedulerSide, _Faulty(self._scheduler, SCHEDULER_METHODS))
        if self._worker is not None:
            self._worker = cast(WorkerSide, _Faulty(self._worker, WORKER_METHODS))
