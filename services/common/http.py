"""HTTP plumbing shared by every service: embedded uvicorn, the health routes, and auth.

Auth: every route declares its role (:func:`requires`) or that it is public
(:func:`public`); :func:`install_auth` gives an app its credentials and the
browser guard (Host allow-list, Origin check) in front of every route.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import Counter
from starlette.requests import ClientDisconnect

from services.common.auth import (
    BrowserPolicy,
    Credentials,
    Denied,
    Role,
    check_host_origin,
    token_from_headers,
)
from services.common.errors import KelvinError, NotFoundError, RetryableStorageError, StorageError
from services.common.fdlimits import connection_cap, quiet_accept_errors, raise_nofile_limit
from services.common.http_limits import HttpLimits, guarded_protocol
from services.common.logs import RateLimitedLog, mask_url
from services.common.metrics import CONTENT_TYPE_LATEST, ServiceMetrics
from services.common.net import bind_tcp, bound_port
from services.common.service import Service
from services.common.tasks import stop_task

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from services.common.auth_settings import ServiceAuth

log = logging.getLogger(__name__)
_bad_input_log = RateLimitedLog(log, 10.0)

ReadyCheck = Callable[[], tuple[bool, str]]


_refusal_log = RateLimitedLog(log, 30.0)


def _refused(request: Request, denied: Denied, reason: str) -> None:
    counter = getattr(request.app.state, "auth_refused", None)
    if isinstance(counter, Counter):
        counter.labels(reason).inc()
    client = request.client.host if request.client else "?"
    _refusal_log.warning(
        f"refused:{reason}", "%s %s from %s refused: %s", request.method, request.url.path,
        client, denied.message,
    )  # fmt: skip


def requires(role: Role) -> Any:
    """A route dependency: the request needs a credential of ``role`` (or one above it).

    The app's credentials are ``app.state.credentials`` (a :class:`Credentials`, or a
    callable returning one, read on every request so that a reload takes effect).
    Declare it where the route is declared, ``dependencies=[requires(Role.ADMIN)]``;
    the returned object carries ``kelvin_role`` so tests can enumerate every route's role.
    Refusals are counted in ``app.state.auth_refused`` (by :func:`install_auth`).
    """

    async def check(request: Request) -> None:
        creds = getattr(request.app.state, "credentials", None)
        if callable(creds):
            creds = creds()
        if not isinstance(creds, Credentials):
            # Secure by default: an app that never set its credentials refuses.
            creds = Credentials()
        token = token_from_headers(request.headers.get, request.query_params.get("p"))
        denied = creds.decide(token, role)
        if denied is not None:
            reason = "role" if denied.status == 403 else "unknown" if token else "missing"
            _refused(request, denied, reason)
            raise HTTPException(
                status_code=denied.status,
                detail=denied.message,
                headers={"WWW-Authenticate": 'Bearer realm="kelvin"'},
            )

    check.kelvin_role = role  # type: ignore[attr-defined]
    return Depends(check)


def public() -> Any:
    """A route dependency that declares the route open to anyone (health, metrics, the
    console's page). Only the paths the route-walk test lists may carry it."""

    async def check() -> None:
        return None

    check.kelvin_public = True  # type: ignore[attr-defined]
    return Depends(check)


def route_role(dependant_calls: list[Callable[..., Any]]) -> Role | None:
    """The role a route declared through :func:`requires`, from its dependencies' calls."""
    for call in dependant_calls:
        role = getattr(call, "kelvin_role", None)
        if isinstance(role, Role):
            return role
    return None


def route_is_public(dependant_calls: list[Callable[..., Any]]) -> bool:
    """Whether a route declared itself public through :func:`public`."""
    return any(getattr(call, "kelvin_public", False) for call in dependant_calls)


class BrowserGuard:
    """ASGI middleware: every HTTP request passes :func:`check_host_origin` first.

    It runs before routing, so a request with a foreign Host or Origin is refused
    whatever its path, even one no route matches.
    """

    def __init__(self, app: ASGIApp, policy: Callable[[], BrowserPolicy], refused: Counter) -> None:
        self.app, self.policy, self.refused = app, policy, refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = origin = site = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
            elif name == b"sec-fetch-site":
                site = value.decode("latin-1")
        denied = check_host_origin(scope["method"], host, origin, site, self.policy())
        if denied is None:
            await self.app(scope, receive, send)
            return
        reason = denied.message.partition(":")[0]
        self.refused.labels(reason).inc()
        client = scope.get("client") or ("?", 0)
        _refusal_log.warning(
            f"refused:{reason}", "%s %s from %s refused: %s", scope["method"], scope["path"],
            client[0], denied.message,
        )  # fmt: skip
        response = JSONResponse(
            {"error": f"forbidden_{reason}", "detail": denied.message}, status_code=denied.status
        )
        await response(scope, receive, send)


def install_auth(app: FastAPI, auth: ServiceAuth, metrics: ServiceMetrics) -> None:
    """Give ``app`` its credentials, the refusal counter and the browser guard.

    ``kelvin_<service>_auth_refused_total{reason}`` counts refusals: ``missing``,
    ``unknown`` (401), ``role`` (403, too low a role), ``host``, ``origin`` (browser guard).
    """
    app.state.auth = auth
    app.state.credentials = auth.credentials
    refused = metrics.counter(
        "auth_refused_total",
        "Requests refused for a missing/unknown credential, too low a role, or a foreign "
        "Host/Origin",
        ["reason"],
    )
    app.state.auth_refused = refused
    app.add_middleware(BrowserGuard, policy=lambda: auth.browser, refused=refused)


HTTP_STOP_TIMEOUT_S = 10.0
"""How long an HTTP server's stop may take: uvicorn's 5 s for open requests, its lifespan."""


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # Kelvin's runner owns SIGTERM (flush, then exit 0); uvicorn would
        # otherwise re-raise the signal after shutdown and kill the process.
        yield


_timeout_log = RateLimitedLog(log, 30.0)


class _QuietDisconnects:
    """A client that went away (or was cut off by a read deadline) while its body was read
    is no error of ours: no traceback per slow or vanished client in the log."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with contextlib.suppress(ClientDisconnect):
            await self.app(scope, receive, send)


class HttpServer:
    """Serve an ASGI app with uvicorn on a socket bound up front.

    Requests whose headers or body arrive too slowly are cut off (:mod:`.http_limits`),
    counted in ``kelvin_<service>_http_timeouts_total{phase}`` when ``metrics`` is given.
    """

    def __init__(
        self,
        app: Any,
        host: str,
        port: int,
        what: str,
        flag: str | None = None,
        access_log: bool = False,
        metrics: ServiceMetrics | None = None,
        limits: HttpLimits | None = None,
    ) -> None:
        self.app, self.host, self.what, self.flag = app, host, what, flag
        self.requested_port = port
        self.access_log = access_log
        self.limits = limits or HttpLimits()
        self.timeouts = self.refused = self.accept_errors = None
        if metrics is not None:
            self.timeouts = metrics.counter(
                "http_timeouts_total",
                "Connections closed because a request's headers or body arrived too slowly",
                ["phase"],
            )
            self.refused = metrics.counter(
                "http_connections_refused_total",
                "Connections answered 503 and closed: over the connection cap",
            )
            self.accept_errors = metrics.counter(
                "http_accept_errors_total",
                "accept() failures for lack of file descriptors or memory",
                ["error"],
            )
        self.max_connections: int | None = None
        self.port: int | None = None
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        _, nofile = raise_nofile_limit()
        self.max_connections = connection_cap(self.limits.max_connections, nofile)
        sock = bind_tcp(self.host, self.requested_port, self.what, self.flag)
        self.port = bound_port(sock)
        quiet_accept_errors(sock, self.what, self._accept_failed)
        config = uvicorn.Config(
            _QuietDisconnects(self.app),
            log_config=None,
            access_log=self.access_log,
            lifespan="on",
            timeout_graceful_shutdown=5,
            timeout_keep_alive=30,
            # No Kelvin API speaks WebSocket; "auto" would import a library (~3 MB
            # of RSS) on every compute node's pusher.
            ws="none",
            http=guarded_protocol(
                self.limits, self._timed_out, self.max_connections, self._refused
            ),
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

    def _refused(self) -> None:
        if self.refused is not None:
            self.refused.inc()
        _timeout_log.warning(
            f"refused:{self.what}",
            "%s: %d connections open: refused another with 503",
            self.what, self.max_connections,
        )  # fmt: skip

    def _accept_failed(self, error: str) -> None:
        if self.accept_errors is not None:
            self.accept_errors.labels(error).inc()

    def _timed_out(self, phase: str) -> None:
        if self.timeouts is not None:
            self.timeouts.labels(phase).inc()
        limit = self.limits.header_timeout_s if phase == "headers" else self.limits.body_timeout_s
        _timeout_log.warning(
            f"timeout:{self.what}:{phase}",
            "%s: closed a connection whose request %s did not arrive within %g s",
            self.what, phase, limit,
        )  # fmt: skip

    async def stop(self) -> None:
        """Let open requests finish (uvicorn gives them ``timeout_graceful_shutdown``), run
        the app's lifespan shutdown; bounded: past :data:`HTTP_STOP_TIMEOUT_S` the server
        is forced out and its task cancelled."""
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        task = self._task
        done, _ = await asyncio.wait({task}, timeout=HTTP_STOP_TIMEOUT_S)
        if not done:
            log.warning("%s: still stopping after %g s; forcing it", self.what, HTTP_STOP_TIMEOUT_S)
            self._server.force_exit = True
            await stop_task(task, what=f"{self.what} server")
        self._server = None
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


async def read_capped(request: Request, limit: int) -> bytes | None:
    """The request body, or None once it passes ``limit`` bytes (read no further)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def health_router(metrics: ServiceMetrics, ready: ReadyCheck | None = None) -> APIRouter:
    """``/healthz`` (alive), ``/readyz`` (able to do its job), ``/metrics``."""
    router = APIRouter(tags=["health"], dependencies=[public()])

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


def install_error_handlers(
    app: FastAPI,
    rejects: Counter | None = None,
    reason_of: Callable[[KelvinError], str] | None = None,
) -> None:
    """Kelvin errors become JSON bodies ``{"error": .., "detail": ..}`` with a fitting status.

    With ``rejects`` (a counter labelled by ``reason``), bad input is also counted,
    logged with rate limiting, and the ``error`` key is the reason (``reason_of``,
    else the exception's ``reason`` attribute, else ``bad_request``); request
    validation errors then become counted 422 answers. An exception's
    ``http_status`` overrides 400, and an integer ``position`` (0-based, as
    parsers report it) is returned 1-based.
    """

    @app.exception_handler(NotFoundError)
    async def _not_found(_: Request, exc: NotFoundError) -> JSONResponse:
        if rejects is not None:
            rejects.labels("not_found").inc()
        return JSONResponse({"error": "not_found", "detail": str(exc)}, status_code=404)

    @app.exception_handler(KelvinError)
    async def _kelvin(request: Request, exc: KelvinError) -> JSONResponse:
        if isinstance(exc, RetryableStorageError):
            # storage messages name their server's URL: never hand its credentials out
            return JSONResponse(
                {"error": "storage_unavailable", "detail": mask_url(str(exc))}, status_code=503
            )
        if isinstance(exc, StorageError):
            log.error("storage error on %s: %s", request.url.path, exc)
            return JSONResponse(
                {"error": "storage_error", "detail": mask_url(str(exc))}, status_code=500
            )
        status = int(getattr(exc, "http_status", 400))
        if rejects is None:
            return JSONResponse(
                {"error": type(exc).__name__, "detail": str(exc)}, status_code=status
            )
        reason = reason_of(exc) if reason_of else str(getattr(exc, "reason", "") or "bad_request")
        rejects.labels(reason).inc()
        _bad_input_log.warning(reason, "%s %s: %s", request.url.path, reason, exc)
        body: dict[str, object] = {"error": reason, "detail": str(exc)}
        position = getattr(exc, "position", None)
        if isinstance(position, int):
            body["position"] = position + 1
        return JSONResponse(body, status_code=status)

    if rejects is None:
        return

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        rejects.labels("invalid_request").inc()
        details = [
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}"
            for e in exc.errors()
        ]
        return JSONResponse(
            {"error": "invalid_request", "detail": "; ".join(details)}, status_code=422
        )


class HttpService(Service):
    """A service whose front door is one HTTP app; subclasses add ``open``/``close``.

    Start order: ``open()`` (clients, background tasks, other listeners) then
    the HTTP server. Stop order: HTTP first (no new requests), then ``close()``
    which flushes.
    """

    def __init__(
        self,
        name: str,
        app: Any,
        host: str,
        port: int,
        flag: str | None,
        access_log: bool = False,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        super().__init__()
        self.name = name
        self.http = HttpServer(app, host, port, f"{name} HTTP", flag, access_log, metrics)
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
