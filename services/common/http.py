"""HTTP plumbing shared by every service: embedded uvicorn and the health routes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Generator
from typing import Any

import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from services.common.errors import KelvinError, NotFoundError
from services.common.metrics import CONTENT_TYPE_LATEST, ServiceMetrics
from services.common.net import bind_tcp, bound_port
from services.common.service import Service

log = logging.getLogger(__name__)

ReadyCheck = Callable[[], tuple[bool, str]]


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # Kelvin's runner owns SIGTERM (flush, then exit 0); uvicorn would
        # otherwise re-raise the signal after shutdown and kill the process.
        yield


class HttpServer:
    """Serve an ASGI app with uvicorn on a socket bound up front."""

    def __init__(
        self,
        app: Any,
        host: str,
        port: int,
        what: str,
        flag: str | None = None,
        access_log: bool = False,
    ) -> None:
        self.app, self.host, self.what, self.flag = app, host, what, flag
        self.requested_port = port
        self.access_log = access_log
        self.port: int | None = None
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        sock = bind_tcp(self.host, self.requested_port, self.what, self.flag)
        self.port = bound_port(sock)
        config = uvicorn.Config(
            self.app,
            log_config=None,
            access_log=self.access_log,
            lifespan="on",
            timeout_graceful_shutdown=5,
            timeout_keep_alive=30,
            # No Kelvin API speaks WebSocket; "auto" would import a library (~3 MB
            # of RSS) on every compute node's pusher.
            ws="none",
        )
        self._server = _Server(config)
        self._task = asyncio.create_task(
            self._server.serve(sockets=[sock]), name=f"http:{self.what}"
        )
        while not self._server.started:
            if self._task.done():
                sock.close()
                exc = self._task.exception()
                raise RuntimeError(f"{self.what}: HTTP server failed to start") from exc
            await asyncio.sleep(0.01)

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._server = None


def health_router(metrics: ServiceMetrics, ready: ReadyCheck | None = None) -> APIRouter:
    """``/healthz`` (alive), ``/readyz`` (able to do its job), ``/metrics``."""
    router = APIRouter(tags=["health"])

    @router.get("/healthz", summary="Liveness")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "service": metrics.service}

    @router.get("/readyz", summary="Readiness", responses={503: {"description": "not ready"}})
    async def readyz() -> Response:
        ok, reason = ready() if ready else (True, "ready")
        return JSONResponse(
            {"status": "ready" if ok else "not ready", "reason": reason},
            status_code=200 if ok else 503,
        )

    @router.get("/metrics", summary="Prometheus metrics")
    async def prom() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return router


def install_error_handlers(app: FastAPI) -> None:
    """Kelvin errors become JSON bodies ``{"error": .., "detail": ..}`` with a fitting status."""

    @app.exception_handler(NotFoundError)
    async def _not_found(_: Request, exc: NotFoundError) -> JSONResponse:
        return JSONResponse({"error": "not_found", "detail": str(exc)}, status_code=404)

    @app.exception_handler(KelvinError)
    async def _kelvin(_: Request, exc: KelvinError) -> JSONResponse:
        from services.common.errors import RetryableStorageError, StorageError

        if isinstance(exc, RetryableStorageError):
            return JSONResponse(
                {"error": "storage_unavailable", "detail": str(exc)}, status_code=503
            )
        if isinstance(exc, StorageError):
            return JSONResponse({"error": "storage_error", "detail": str(exc)}, status_code=500)
        return JSONResponse({"error": type(exc).__name__, "detail": str(exc)}, status_code=400)


class HttpService(Service):
    """A service whose front door is one HTTP app; subclasses add ``open``/``close``.

    Start order: ``open()`` (clients, background tasks, other listeners) then
    the HTTP server. Stop order: HTTP first (no new requests), then ``close()``
    which flushes.
    """

    def __init__(
        self, name: str, app: Any, host: str, port: int, flag: str | None, access_log: bool = False
    ) -> None:
        super().__init__()
        self.name = name
        self.http = HttpServer(app, host, port, f"{name} HTTP", flag, access_log)
        self._stopped = False

    @property
    def port(self) -> int | None:
        return self.http.port

    async def open(self) -> None:
        """Acquire resources before the HTTP server starts."""

    async def close(self) -> None:
        """Flush and release after the HTTP server stopped."""

    async def start(self) -> None:
        await self.open()
        try:
            await self.http.start()
        except BaseException:
            await self.close()
            raise
        if self.http.task is not None:
            self.watch(self.http.task)

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            await self.http.stop()
        finally:
            await self.close()
