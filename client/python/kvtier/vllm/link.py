"""DaemonLink: the connector's connection to kvtierd, made lazily and again when needed.

vLLM must start and serve whether or not kvtierd is there. The link connects on first
use; when no daemon answers it returns None and tries again after ``reconnect_ms``.
Once connected, the client library reconnects by itself after a daemon restart
(repeating hello and the region registrations), and calls made while it is away raise
Unavailable at once, which the connector counts and treats as a miss.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from ..client import Client
from ..errors import KvtierError
from .metadata import COUNTERS

logger = logging.getLogger("kvtier.vllm")


class DaemonLink:
    """Thread-safe. ``setup(client)`` says hello and registers regions on a new client;
    if it raises, the client is closed and the link tries again later."""

    def __init__(self, socket_path: str | None, reconnect_ms: float,
                 setup: Callable[[Client], None], role: str) -> None:
        self._socket_path = socket_path
        self._reconnect_s = reconnect_ms / 1000.0
        self._setup = setup
        self._role = role
        self._lock = threading.Lock()
        self._client: Client | None = None
        self._next_attempt = 0.0
        self._warned = False

    def get(self) -> Client | None:
        with self._lock:
            if self._client is not None:
                return self._client
            now = time.monotonic()
            if now < self._next_attempt:
                return None
            self._next_attempt = now + self._reconnect_s
            client = None
            try:
                client = Client(self._socket_path, reconnect=True)
                self._setup(client)
            except KvtierError as error:
                if client is not None:
                    client.close()
                COUNTERS.add("daemon_unavailable")
                if not self._warned:
                    logger.warning("kvtier.vllm (%s): kvtierd not reachable at %s (%s); serving "
                                   "without it and retrying every %.1f s", self._role,
                                   self._socket_path or "the default socket", error,
                                   self._reconnect_s)
                    self._warned = True
                return None
            COUNTERS.add("connects")
            if self._warned:
                logger.warning("kvtier.vllm (%s): connected to kvtierd", self._role)
            self._warned = False
            self._client = client
            return client

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
