"""DaemonLink: the connector's connection to kvtierd, made in the background.

vLLM must start and serve whether or not kvtierd is there, and its scheduler and
worker threads must never wait for it. The link connects (and says hello, registers
regions) on a thread of its own, again every ``reconnect_ms`` until it succeeds;
``get()`` never blocks: it returns the client once connected, else None (a miss).
Once connected, the client library reconnects by itself after a daemon restart
(repeating hello and the region registrations, bounded by its own deadline), and calls
made while the daemon is away raise Unavailable at once, which the connector counts and
treats as a miss.
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
    if it raises, the client is closed and the link tries again ``reconnect_ms`` later."""

    def __init__(self, socket_path: str | None, reconnect_ms: float,
                 setup: Callable[[Client], object], role: str) -> None:
        self._socket_path = socket_path
        self._reconnect_s = reconnect_ms / 1000.0
        self._setup = setup
        self._role = role
        self._lock = threading.Lock()
        self._client: Client | None = None
        self._closed = threading.Event()
        self._first_attempt = threading.Event()
        self.connects = 0  # this link's, for the stats its role reports
        self.unavailable = 0
        self._thread = threading.Thread(target=self._connect_until_done, name=f"kvtier-{role}-connect",
                                        daemon=True)
        self._thread.start()

    def get(self) -> Client | None:
        """The connected client, or None while there is none (never waits)."""
        with self._lock:
            return self._client

    def wait_first_attempt(self, timeout_s: float) -> Client | None:
        """Waits up to timeout_s for the first attempt to connect to end, however it
        ended (for start-up, where a short wait is fine); the client or None."""
        self._first_attempt.wait(timeout_s)
        return self.get()

    def _connect_until_done(self) -> None:
        warned = False
        while not self._closed.is_set():
            client = None
            try:
                client = Client(self._socket_path, reconnect=True)
                self._setup(client)
            except Exception as error:
                if client is not None:
                    client.close()
                if not isinstance(error, KvtierError):  # a fault of the connector's own: same retry
                    COUNTERS.add("internal_errors")
                    logger.error("kvtier.vllm (%s): setting up the connection to kvtierd failed", self._role,
                                 exc_info=error)
                COUNTERS.add("daemon_unavailable")
                self.unavailable += 1
                self._first_attempt.set()
                if not warned:
                    logger.warning("kvtier.vllm (%s): kvtierd not reachable at %s (%s); serving "
                                   "without it and retrying every %.1f s", self._role,
                                   self._socket_path or "the default socket", error, self._reconnect_s)
                    warned = True
                self._closed.wait(self._reconnect_s)
                continue
            with self._lock:
                if self._closed.is_set():
                    client.close()
                    return
                self._client = client
            self._first_attempt.set()
            COUNTERS.add("connects")
            self.connects += 1
            if warned:
                logger.warning("kvtier.vllm (%s): connected to kvtierd", self._role)
            return

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


class LinkGroup:
    """The scheduler's links, one per tensor-parallel rank (each says hello with that
    rank's layout: kvtierd keeps each rank's shard apart). ``get()`` is every rank's
    client, in rank order, or None while any rank's is missing (a Lookup needs them all)."""

    def __init__(self, links: list[DaemonLink]) -> None:
        self.links = links

    def get(self) -> list[Client] | None:
        clients = [client for client in (link.get() for link in self.links) if client is not None]
        return clients if len(clients) == len(self.links) else None

    def wait_first_attempt(self, timeout_s: float) -> list[Client] | None:
        deadline = time.monotonic() + timeout_s
        for link in self.links:
            link.wait_first_attempt(max(0.0, deadline - time.monotonic()))
        return self.get()

    @property
    def connects(self) -> int:
        return sum(link.connects for link in self.links)

    @property
    def unavailable(self) -> int:
        return sum(link.unavailable for link in self.links)

    def close(self) -> None:
        for link in self.links:
            link.close()
