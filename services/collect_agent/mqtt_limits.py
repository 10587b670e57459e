"""Limits that keep the built-in MQTT endpoint bounded under abusive clients.

* :class:`PartialBudget`: one memory budget for partially received packets
  across all connections. A connection reserves the whole declared size of the
  packet it is receiving; one that cannot is paused (it holds at most one socket
  read) until others complete or close, so memory stays near the budget whatever
  the number of connections.
* ``max_connections`` is capped below the descriptor limit
  (:mod:`services.common.fdlimits`), so the endpoint never takes the last
  descriptors the spool, storage and HTTP need.
* :class:`Listener`: the accept loop. Out of descriptors (EMFILE and kin) it stops
  accepting for a moment and logs once per episode instead of a traceback per try.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from services.collect_agent.metrics import AgentMetrics
from services.common.fdlimits import RESOURCE_ERRNOS

if TYPE_CHECKING:
    from prometheus_client import Counter

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EndpointLimits:
    connect_timeout_s: float = 10.0
    max_connections: int = 10_000
    max_packet_bytes: int = 4 << 20
    connect_max_bytes: int = 8 << 10
    """Largest first packet (the CONNECT): nothing bigger is buffered before credentials."""
    partial_budget_bytes: int = 64 << 20
    stall_timeout_s: float = 30.0
    """A connection inside a packet that sends nothing for this long is closed."""


class Waiter(Protocol):
    """A connection as the budget sees it."""

    reserved: int

    @property
    def pending_bytes(self) -> int:
        """Total size of the packet it is receiving (0: none)."""

    @property
    def buffered_bytes(self) -> int:
        """What it holds of that packet so far."""

    def resume(self, why: str) -> None: ...


class PartialBudget:
    """Bytes of partially received packets, all connections together.

    Two pools: whole-packet reservations (at most ``limit``), and what paused
    connections already hold while they wait for a reservation (at most a
    quarter of it). A connection that fits in neither is closed by the caller
    (it sends again after reconnecting: nothing it sent was acknowledged). The
    pools are separate so waiters can never starve the reservations: each
    completed or closed packet frees room for the oldest waiter.
    """

    def __init__(self, limit_bytes: int, metrics: AgentMetrics) -> None:
        self.limit = limit_bytes
        self.hold_limit = limit_bytes // 4
        self.reserved = 0
        self.held = 0
        self.metrics = metrics
        self.waiting: OrderedDict[Waiter, int] = OrderedDict()
        metrics.partial_bytes.set_function(lambda: self.reserved + self.held)
        metrics.partial_limit.set(limit_bytes)

    def reserve(self, conn: Waiter, need: int) -> bool:
        """Hold ``need`` bytes for ``conn``'s pending packet; False = over budget."""
        delta = need - conn.reserved
        if delta > 0 and self.reserved + delta > self.limit:
            return False
        self.reserved += delta
        conn.reserved = need
        if delta < 0 and self.waiting:
            self.wake()
        return True

    def wait(self, conn: Waiter) -> bool:
        """Park ``conn`` (paused by the caller) with what it holds; False = no room."""
        hold = conn.buffered_bytes
        if self.held + hold > self.hold_limit:
            return False
        self.release(conn)
        self.held += hold
        self.waiting[conn] = hold
        self.metrics.partial_waits.inc()
        return True

    def release(self, conn: Waiter) -> None:
        hold = self.waiting.pop(conn, None)
        if hold is not None:
            self.held -= hold
        if conn.reserved:
            self.reserved -= conn.reserved
            conn.reserved = 0
            if self.waiting:
                self.wake()

    def wake(self) -> None:
        """Resume waiting connections, oldest first, while their packets fit."""
        while self.waiting:
            conn, hold = next(iter(self.waiting.items()))
            need = conn.pending_bytes
            if self.reserved + need > self.limit:
                return
            del self.waiting[conn]
            self.held -= hold
            self.reserved += need
            conn.reserved = need
            conn.resume("budget")


class Listener:
    """Non-blocking accept loop on a bound socket (see the module docstring)."""

    def __init__(
        self,
        sock: socket.socket,
        on_socket: Callable[[socket.socket], None],
        errors: Counter,
        pause_s: float = 0.5,
    ) -> None:
        self.sock = sock
        self.on_socket = on_socket
        self.errors = errors
        self.pause_s = pause_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starved_since: float | None = None
        self._starved_errors = 0
        self._resume_handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.sock.fileno(), self._accept)

    def close(self) -> None:
        if self._resume_handle is not None:
            self._resume_handle.cancel()
        if self._loop is not None and self.sock.fileno() >= 0:
            self._loop.remove_reader(self.sock.fileno())
        self.sock.close()

    def _accept(self) -> None:
        for _ in range(128):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in RESOURCE_ERRNOS:
                    self._starve(exc)
                    return
                # The peer gave up before we accepted (ECONNABORTED and kin): next one.
                self.errors.labels(errno.errorcode.get(exc.errno or 0, "other")).inc()
                continue
            if self._starved_since is not None:
                log.warning(
                    "MQTT: accepting connections again after %.1f s out of file descriptors "
                    "(%d refused attempts)",
                    time.monotonic() - self._starved_since,
                    self._starved_errors,
                )
                self._starved_since = None
            conn.setblocking(False)
            self.on_socket(conn)

    def _starve(self, exc: OSError) -> None:
        name = errno.errorcode.get(exc.errno or 0, "other")
        self.errors.labels(name).inc()
        self._starved_errors += 1
        if self._starved_since is None:
            self._starved_since = time.monotonic()
            self._starved_errors = 1
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            log.warning(
                "MQTT: cannot accept connections: %s (RLIMIT_NOFILE %d); pausing accept "
                "for %.1f s at a time until descriptors free up (logged once)",
                name,
                soft,
                self.pause_s,
            )
        assert self._loop is not None
        self._loop.remove_reader(self.sock.fileno())
        self._resume_handle = self._loop.call_later(self.pause_s, self._resume)

    def _resume(self) -> None:
        self._resume_handle = None
        if self._loop is not None and self.sock.fileno() >= 0:
            self._loop.add_reader(self.sock.fileno(), self._accept)
            self._accept()
