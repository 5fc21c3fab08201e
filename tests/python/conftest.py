"""Fixtures for the kvtier Python package's tests: a real kvtierd on a temp socket.

`daemon` is shared by the whole run (tests keep apart by model id and session id);
`own_daemon` is a fresh one per test, for tests that kill it.
"""

from __future__ import annotations

import itertools
import os

import pytest

from kvtierd_process import SMALL_SLABS, Kvtierd, use_built_client

use_built_client()  # before any test imports kvtier

_names = itertools.count()


@pytest.fixture(scope="session")
def daemon():
    process = Kvtierd(SMALL_SLABS)
    yield process
    alive = process.running()
    process.stop()
    assert alive, f"kvtierd died during the tests; its log:\n{process.log()}"


@pytest.fixture
def own_daemon():
    process = Kvtierd(SMALL_SLABS)
    yield process
    process.stop()


@pytest.fixture
def unique():
    """A fresh name per call, for model and session ids that no other test uses."""
    return lambda prefix: f"{prefix}-{os.getpid()}-{next(_names)}"


@pytest.fixture
def client(daemon):
    import kvtier

    with kvtier.Client(daemon.socket_path) as connection:
        yield connection
