"""Read deadlines for the embedded HTTP server: a slow client cannot hold a connection.

uvicorn times out an idle keep-alive connection, but nothing bounds how long a
request's headers or body may take to arrive: a client dripping one byte a second
holds its connection, its buffers and (with ``limit_concurrency``) a slot forever.
:func:`guarded_protocol` wraps uvicorn's httptools protocol with two deadlines:

- headers: from the first byte of a request (or the connection's start) until its
  headers are complete; on expiry a ``408`` is sent and the connection closed;
- body: from the end of the headers until the body is complete; on expiry the
  connection is closed and the handler sees the client gone.

While the application works on a request no deadline runs (long queries are fine).
Each expiry calls ``on_timeout(phase)`` (counted and logged by the caller). Connections
beyond a cap are answered ``503`` and closed as they arrive (``on_refused``). The same
protocol writes large chunks of a streamed response without uvicorn's joined copy
(:mod:`services.common.http_body`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.common.http_body import gather_large_bodies

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HttpLimits:
    """Deadlines of one HTTP server, in seconds."""

    header_timeout_s: float = 10.0
    """A request's headers must arrive within this time of its first byte."""
    body_timeout_s: float = 120.0
    """A request's body must arrive within this time of its headers (256 MB at 2 MB/s)."""
    max_connections: int = 4096
    """Open connections beyond this (and beyond the descriptor limit less a margin, see
    :mod:`services.common.fdlimits`) get a ``503`` and are closed at once."""


def _response_408() -> bytes:
    body = b"request headers did not arrive in time\n"
    return (
        b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body
    )


def _response_503() -> bytes:
    body = b"too many open connections: try again\n"
    return (
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"retry-after: 1\r\ncontent-length: " + str(len(body)).encode() + b"\r\n"
        b"connection: close\r\n\r\n" + body
    )


def guarded_protocol(
    limits: HttpLimits,
    on_timeout: Callable[[str], None],
    max_connections: int | None = None,
    on_refused: Callable[[], None] = lambda: None,
) -> type[asyncio.Protocol] | str:
    """uvicorn's ``http`` protocol class with read deadlines and a connection cap
    (``max_connections``, default ``limits.max_connections``; ``"auto"`` without httptools)."""
    cap = limits.max_connections if max_connections is None else max_connections
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # uvicorn[standard] brings httptools; without it, no deadlines
        log.warning("httptools is not installed: HTTP read deadlines are off")
        return "auto"

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None
        _phase = ""

        def _arm(self, phase: str, seconds: float) -> None:
            self._disarm()
            self._phase = phase
            self._deadline = self.loop.call_later(seconds, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            on_timeout(self._phase)
            if self._phase == "headers" and (self.cycle is None or self.cycle.response_complete):
                self.transport.write(_response_408())
            self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > cap:
                # Refused at once, so that a flood of idle connections cannot take the
                # descriptors storage, the spool and the logs need.
                on_refused()
                transport.write(_response_503())
                transport.close()
                return
            self._arm("headers", limits.header_timeout_s)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm("headers", limits.header_timeout_s)

        def on_headers_complete(self) -> None:
            before = self.cycle
            super().on_headers_complete()
            if self.cycle is not None and self.cycle is not before:
                gather_large_bodies(self.cycle)
            self._arm("body", limits.body_timeout_s)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._disarm()

    return GuardedHttpToolsProtocol
