"""Embedded uvicorn with sockets bound up front, and the health routes."""

from __future__ import annotations

import socket

import httpx
import pytest
from fastapi import FastAPI

from services.common.errors import KelvinError, NotFoundError, PortInUseError, RetryableStorageError
from services.common.http import HttpServer, HttpService, health_router, install_error_handlers
from services.common.metrics import ServiceMetrics


def _app(ready: list[bool]) -> FastAPI:
    metrics = ServiceMetrics("testsvc")
    metrics.counter("widgets_total", "widgets").inc(3)
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(
        health_router(metrics, lambda: (ready[0], "warming up" if not ready[0] else "ok"))
    )

    @app.get("/missing")
    async def missing() -> None:
        raise NotFoundError("sensor /x/y does not exist")

    @app.get("/down")
    async def down() -> None:
        raise RetryableStorageError("influxdb unreachable")

    return app


async def test_health_ready_metrics_and_error_bodies() -> None:
    ready = [False]
    server = HttpServer(_app(ready), "127.0.0.1", 0, "test HTTP", "--test-port")
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
            assert (await client.get("/healthz")).json() == {"status": "ok", "service": "testsvc"}
            r = await client.get("/readyz")
            assert r.status_code == 503 and r.json()["reason"] == "warming up"
            ready[0] = True
            assert (await client.get("/readyz")).status_code == 200
            metrics = (await client.get("/metrics")).text
            assert "kelvin_testsvc_widgets_total 3.0" in metrics
            assert "process_resident_memory_bytes" in metrics
            r = await client.get("/missing")
            assert r.status_code == 404 and r.json() == {
                "error": "not_found",
                "detail": "sensor /x/y does not exist",
            }
            r = await client.get("/down")
            assert r.status_code == 503 and r.json()["error"] == "storage_unavailable"
    finally:
        await server.stop()
    with socket.create_server(("127.0.0.1", server.port or 0)):
        pass  # the port is free again


async def test_port_in_use_names_service_port_and_flag() -> None:
    with socket.create_server(("127.0.0.1", 0)) as holder:
        taken = holder.getsockname()[1]
        svc = HttpService("widget-api", FastAPI(), "127.0.0.1", taken, "--widget-port")
        with pytest.raises(
            PortInUseError, match=rf"widget-api HTTP: port {taken} .* in use.*--widget-port"
        ):
            await svc.start()


async def test_http_service_stop_is_idempotent_and_closes() -> None:
    closed: list[int] = []

    class Svc(HttpService):
        async def close(self) -> None:
            closed.append(1)

    svc = Svc("s", FastAPI(), "127.0.0.1", 0, None)
    await svc.start()
    await svc.stop()
    await svc.stop()
    assert closed == [1]


class _Bad(KelvinError):
    reason = "bad_widget"
    position = 4


class _Huge(KelvinError):
    reason = "too_large"
    http_status = 413


async def test_counted_bad_input_names_reason_position_and_status() -> None:
    from prometheus_client import CollectorRegistry, Counter

    rejects = Counter("rejects", "bad input", ["reason"], registry=CollectorRegistry())
    app = FastAPI()
    install_error_handlers(app, rejects)

    @app.get("/bad")
    async def bad() -> None:
        raise _Bad("widget expected at position 5")

    @app.get("/huge")
    async def huge() -> None:
        raise _Huge("body beyond 1 MB")

    @app.get("/typed")
    async def typed(n: int) -> int:
        return n

    server = HttpServer(app, "127.0.0.1", 0, "test HTTP")
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
            r = await client.get("/bad")
            assert r.status_code == 400
            assert r.json() == {
                "error": "bad_widget",
                "detail": "widget expected at position 5",
                "position": 5,
            }
            assert (await client.get("/huge")).status_code == 413
            r = await client.get("/typed", params={"n": "x"})
            assert r.status_code == 422 and r.json()["error"] == "invalid_request"
    finally:
        await server.stop()
    counts = {
        s.labels["reason"]: s.value
        for s in rejects.collect()[0].samples
        if s.name == "rejects_total"
    }
    assert counts == {"bad_widget": 1.0, "too_large": 1.0, "invalid_request": 1.0}
