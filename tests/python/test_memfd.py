"""kvtier._memfd, the registry of memfd-backed buffers: a mapping freed by a garbage
collection that runs while the registry's lock is held (an allocation inside one of
its own functions can start one) never deadlocks, and its entry still goes."""

from __future__ import annotations

import os
import subprocess
import sys

BODY = """
import gc
from kvtier import _memfd

mapping, buffer = _memfd.create("kvtier-test", 4096)
cycle = [mapping]
cycle.append(cycle)  # only the cyclic collector frees it
del mapping
with _memfd._lock:  # as inside create() or find(), when an allocation starts a collection
    del cycle
    gc.collect()  # the mmap's finalizer runs here, in this thread, with the lock held
assert _memfd.find(buffer.address) is None
fresh, other = _memfd.create("kvtier-test-2", 4096)
assert _memfd.find(other.address) == other
assert buffer.address not in _memfd._by_address or _memfd._by_address[buffer.address][0] is other
print("ok")
"""


def test_a_mapping_freed_while_the_registry_is_locked_does_not_deadlock():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", BODY], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
