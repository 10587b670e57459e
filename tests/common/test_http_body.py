"""Gathered chunks on a real HTTP server over loopback, read by raw sockets.

The server is Kelvin's (uvicorn with its guarded protocol); the clients read the
raw bytes, so the chunk framing itself is checked, not a library's view of it.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from services.common import http_body
from services.common.http import HttpServer
from services.common.metrics import ServiceMetrics
from tests.support.http import serving

SIZES = [300_000, 10, 65_536, 65_535, 1 << 20, 5, 6 << 20, 200_000]
"""Chunk sizes of the streamed answer: large ones gathered, small ones joined (6 MiB:
more than loopback's largest send buffer, so a slow reader makes the socket take only
part of it)."""


def _piece(i: int, size: int) -> bytes:
    return bytes([65 + i % 26]) * size


EXPECTED = b"".join(_piece(i, n) for i, n in enumerate(SIZES))
LARGE = sum(1 for n in SIZES if n >= http_body.GATHER_BYTES)
"""At most this many are gathered (the last piece too: the end of the answer is an
empty chunk of its own); one that finds the transport still holding part of the one
before takes uvicorn's path."""


@pytest.fixture
async def port() -> AsyncIterator[int]:
    app = FastAPI()

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def body() -> AsyncIterator[bytes | memoryview]:
            for i, n in enumerate(SIZES):
                piece = _piece(i, n)
                yield memoryview(piece) if i % 2 else piece
                await asyncio.sleep(0)

        return StreamingResponse(body(), media_type="application/octet-stream")

    @app.get("/small")
    async def small() -> dict[str, str]:
        return {"ok": "yes"}

    async with serving(
        HttpServer(app, "127.0.0.1", 0, "gathered HTTP", metrics=ServiceMetrics("g"))
    ) as port:
        yield port


def _get(port: int, path: str, rcvbuf: int | None = None, pause_s: float = 0.0) -> bytes:
    """The raw response to ``GET path`` (connection closed after it)."""
    with socket.socket() as s:
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.connect(("127.0.0.1", port))
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        got = bytearray()
        while chunk := s.recv(rcvbuf or 1 << 20):
            got += chunk
            time.sleep(pause_s)
        return bytes(got)


def _dechunk(raw: bytes) -> tuple[bytes, list[int]]:
    """Body and chunk sizes of a chunked response, checking every size line and CRLF."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"transfer-encoding: chunked" in head.lower(), head
    body, sizes = bytearray(), []
    while True:
        line, _, rest = rest.partition(b"\r\n")
        size = int(line, 16)
        if size == 0:
            assert rest == b"\r\n", rest[:20]
            return bytes(body), sizes
        assert rest[size : size + 2] == b"\r\n"
        body += rest[:size]
        sizes.append(size)
        rest = rest[size + 2 :]


async def test_large_chunks_are_gathered_and_framed_as_uvicorn_frames_them(port: int) -> None:
    """Byte for byte the chunks uvicorn would write; the first large one is gathered
    for sure (the head before it leaves nothing unsent), the others when the socket
    has taken all of the one before."""
    before = http_body.tally.gathered
    body, sizes = _dechunk(await asyncio.to_thread(_get, port, "/stream"))
    assert body == EXPECTED
    assert sizes == SIZES
    assert 1 <= http_body.tally.gathered - before <= LARGE


async def test_a_slow_reader_gets_every_byte_through_the_transports_buffer(port: int) -> None:
    """A small receive buffer read slowly: the socket takes part of a chunk, the
    transport buffers the rest and flow control waits for it."""
    before = http_body.tally.partial
    raw = await asyncio.to_thread(_get, port, "/stream", 8192, 0.0005)
    body, sizes = _dechunk(raw)
    assert body == EXPECTED and sizes == SIZES
    assert http_body.tally.partial > before


async def test_a_client_that_leaves_mid_answer_leaves_the_server_answering(port: int) -> None:
    def leave() -> bytes:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            return s.recv(1000)

    for _ in range(5):
        assert (await asyncio.to_thread(leave)).startswith(b"HTTP/1.1 200")
    async with httpx.AsyncClient() as c:
        r = await c.get(f"http://127.0.0.1:{port}/small")
        assert r.json() == {"ok": "yes"}
        r = await c.get(f"http://127.0.0.1:{port}/stream")
        assert r.content == EXPECTED


async def test_head_and_small_answers_take_uvicorns_path(port: int) -> None:
    before = http_body.tally.gathered
    async with httpx.AsyncClient() as c:
        assert (await c.get(f"http://127.0.0.1:{port}/small")).json() == {"ok": "yes"}
        r = await c.head(f"http://127.0.0.1:{port}/stream")
        assert r.status_code in (200, 405) and r.content == b""
    assert http_body.tally.gathered == before


def test_a_cycle_of_another_uvicorn_keeps_its_own_send() -> None:
    """A cycle without the state the gathered send reads (another uvicorn's, which
    cannot run here beside this one) is left as it is; so is one over TLS (no socket)."""

    class Cycle:
        def __init__(self, transport: object) -> None:
            self.transport = transport

        async def send(self, message: object) -> None: ...

    class Transport:
        def __init__(self, sock: object) -> None:
            self._sock = sock

    with socket.socket() as sock:
        for transport in (Transport(sock), Transport(None)):
            cycle = Cycle(transport)
            before = cycle.send
            http_body.gather_large_bodies(cycle)
            assert cycle.send == before
