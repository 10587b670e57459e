"""Embedded uvicorn with sockets bound up front, and the health routes."""

from __future__ import annotations

import socket

import httpx
import pytest
from fastapi import FastAPI

from services.common.errors import NotFoundError, PortInUseError, RetryableStorageError
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
