"""Large binary answers (range reads) over the standard library's ``http.client``, in a thread.

ClickHouse sends a streamed answer in 4 KiB HTTP chunks: a 1M-point read is
~4,000 of them, and httpx's pure-Python HTTP/1.1 parser (h11) spends ~40 ms of
CPU per million points de-chunking them, twice ``http.client`` (measured, see
docs/storage.md). So reads go through a small pool of ``http.client``
connections per node, each request in a worker thread: the event loop stays
free while the answer arrives, and the body lands in a ``bytearray`` that numpy
views without a copy (writeable arrays).
"""

from __future__ import annotations

import asyncio
import http.client
import queue
import socket
import ssl
import urllib.parse
from typing import Any


class BulkError(Exception):
    """A request that did not get an answer (connection or timeout): the caller retries."""

    def __init__(self, message: str, timeout: bool) -> None:
        super().__init__(message)
        self.timeout = timeout


class BulkPool:
    """Connections to one node, reused across requests (one request per connection at a time)."""

    def __init__(self, url: str, headers: dict[str, str], timeout_s: float, size: int) -> None:
        u = urllib.parse.urlsplit(url)
        self.https = u.scheme == "https"
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (8443 if self.https else 8123)
        self.base = u.path.rstrip("/") + "/"
        self.headers = headers
        self.timeout_s = timeout_s
        self._idle: queue.LifoQueue[http.client.HTTPConnection] = queue.LifoQueue(size)
        self._ssl = ssl.create_default_context() if self.https else None

    def _connect(self) -> http.client.HTTPConnection:
        if self.https:
            return http.client.HTTPSConnection(
                self.host, self.port, timeout=self.timeout_s, context=self._ssl
            )
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)

    def _post(self, params: dict[str, Any], body: bytes) -> tuple[int, dict[str, str], bytearray]:
        try:
            con = self._idle.get_nowait()
        except queue.Empty:
            con = self._connect()
        path = self.base + "?" + urllib.parse.urlencode(params)
        try:
            con.request("POST", path, body, self.headers)
            resp = con.getresponse()
            length = resp.getheader("Content-Length")
            data = bytearray(int(length)) if length and length.isdigit() else None
            if data is not None:
                view = memoryview(data)
                got = 0
                while got < len(data):
                    n = resp.readinto(view[got:])
                    if not n:
                        raise http.client.IncompleteRead(bytes(view[:got]), len(data) - got)
                    got += n
            else:
                data = bytearray(resp.read())
            headers = {k.lower(): v for k, v in resp.getheaders()}
        except (OSError, http.client.HTTPException) as exc:
            con.close()
            timeout = isinstance(exc, socket.timeout | TimeoutError)
            raise BulkError(f"{type(exc).__name__}: {exc}", timeout) from exc
        if resp.will_close:
            con.close()
        else:
            try:
                self._idle.put_nowait(con)
            except queue.Full:
                con.close()
        return resp.status, headers, data

    async def post(
        self, params: dict[str, Any], body: bytes
    ) -> tuple[int, dict[str, str], bytearray]:
        """``(status, headers, body)`` of one POST, run in a worker thread."""
        return await asyncio.to_thread(self._post, params, body)

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return
