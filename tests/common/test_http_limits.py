"""Slow clients cannot hold the HTTP server: real sockets dripping headers and bodies.

The server runs with deadlines of a fraction of a second; each test waits for the
server to close the slow connections (an event, bounded only so a failure ends) and
checks that a normal request is answered meanwhile and that the closes were counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI, Request

from services.common.http import HttpServer, health_router
from services.common.http_limits import HttpLimits
from services.common.metrics import ServiceMetrics
from tests.support.http import serving

LIMITS = HttpLimits(header_timeout_s=0.5, body_timeout_s=0.5)
SLOW_CLIENTS = 20


@pytest.fixture
async def port() -> AsyncIterator[int]:
    metrics = ServiceMetrics("limited")
    app = FastAPI()
    app.include_router(health_router(metrics))

    @app.post("/sink")
    async def sink(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    async with serving(
        HttpServer(app, "127.0.0.1", 0, "limited HTTP", metrics=metrics, limits=LIMITS)
    ) as port:
        yield port


async def _drip(port: int, head: bytes, drip: bytes) -> bytes:
    """Send ``head``, then ``drip`` one byte every 50 ms until the server closes; return
    what the server sent."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    got = b""

    async def send() -> None:
        with contextlib.suppress(ConnectionError):
            for i in range(10_000):
                writer.write(drip[i % len(drip) : i % len(drip) + 1])
                await writer.drain()
                await asyncio.sleep(0.05)

    sender = asyncio.create_task(send())
    try:
        while chunk := await reader.read(4096):
            got += chunk
    except ConnectionError:
        pass
    finally:
        sender.cancel()
        writer.close()
    return got


async def _metric(port: int, name: str) -> float:
    async with httpx.AsyncClient() as c:
        text = (await c.get(f"http://127.0.0.1:{port}/metrics")).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


async def test_dripped_headers_get_408_and_the_server_keeps_answering(port: int) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    slow = [
        asyncio.create_task(_drip(port, head, b"X-Drip: aaaaaaaa\r\n")) for _ in range(SLOW_CLIENTS)
    ]
    async with httpx.AsyncClient() as c:  # answered while the slow ones are held
        assert (await c.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200
    answers = await asyncio.wait_for(asyncio.gather(*slow), 20)
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers[0][:80]
    assert (
        await _metric(port, 'kelvin_limited_http_timeouts_total{phase="headers"}') == SLOW_CLIENTS
    )


async def test_a_silent_connection_is_closed_too(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        got = await asyncio.wait_for(reader.read(4096), 20)
    finally:
        writer.close()
    assert got.startswith(b"HTTP/1.1 408")


async def test_a_dripped_body_is_cut_off_without_a_traceback(
    port: int, caplog: pytest.LogCaptureFixture
) -> None:
    head = (
        b"POST /sink HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
        b"Content-Length: 100000\r\n\r\n"
    )
    with caplog.at_level(logging.WARNING):
        answers = await asyncio.wait_for(
            asyncio.gather(*(_drip(port, head, b"x") for _ in range(5))), 20
        )
    assert all(not a.startswith(b"HTTP/1.1 200") for a in answers)
    assert await _metric(port, 'kelvin_limited_http_timeouts_total{phase="body"}') == 5
    assert "Traceback" not in caplog.text and "Exception in ASGI" not in caplog.text
    async with httpx.AsyncClient() as c:
        r = await c.post(f"http://127.0.0.1:{port}/sink", content=b"y" * 1000)
        assert r.json() == {"bytes": 1000}
