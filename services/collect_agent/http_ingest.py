"""One HTTP ingest path for every body format: line protocol and Prometheus remote write.

:func:`ingest` does what every HTTP way in must do, in one place: refuse while
the agent drains before it exits (503), wait out back-pressure (503 with
``Retry-After`` when it lasts), read the body within
``max_payload_bytes`` (413; gzip undone when the client says so), hand it to
the format's decoder, count every rejected item by reason, and answer 204 only
once the readings are durable in the spool (503 when the spool refuses them),
or 400 naming the first rejected item after keeping the good ones (a partial
write). A format supplies only ``decode(body) -> Decoded``; it raises
:class:`BodyError` for a body it refuses whole.

These routes carry most of an agent's HTTP traffic (a request per 1,000 lines),
so :class:`FastIngest` answers them before FastAPI's routing and dependency
machinery, which cost about as much as parsing the body: behind the browser
guard (Host/Origin, :func:`services.common.http.install_auth`), it runs the very
role check the route declares (``requires(Role.WRITE)``) and then the endpoint.
The FastAPI routes stay declared (the API description, the route walk of the
auth tests, which reaches them through this path) and answer the same way.
"""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from starlette.middleware import Middleware

from services.collect_agent.spool import SpoolError
from services.common.http import read_capped
from services.common.readings import Batch
from services.common.tasks import wait_for

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from services.collect_agent.ingest import Ingestor

ADMIT_TIMEOUT_S = 10.0


@dataclass
class Decoded:
    """What a decoder made of a body."""

    batch: Batch
    received: int
    """Items received (lines, series), for the messages counter."""
    errors: list[tuple[int, str, str]] = field(default_factory=list)
    """(item number, reason, message) of each rejected item; ``what`` names the item."""
    what: str = "line"
    counts: dict[str, int] = field(default_factory=dict)
    """Items rejected per reason where one entry of ``errors`` stands for many (remote
    write lists one per reason and counts samples)."""
    summary: str | None = None
    """The 400 answer's text for a partial write (default: the first error)."""


class BodyError(ValueError):
    """A body refused whole (400): ``reason`` labels the reject counter."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


async def read_body(request: Request, limit: int) -> bytes:
    """The body, at most ``limit`` bytes (also once gzip is undone); HTTPException 413/400."""
    body = await read_capped(request, limit)
    if body is None:
        raise HTTPException(413, f"body exceeds max_payload_bytes={limit}")
    if request.headers.get("content-encoding", "").lower() == "gzip":
        d = zlib.decompressobj(wbits=31)
        try:
            body = d.decompress(body, limit + 1)
        except zlib.error as exc:
            raise HTTPException(400, f"gzip body does not decompress: {exc}") from exc
        if len(body) > limit or d.unconsumed_tail:
            raise HTTPException(413, f"decompressed body exceeds max_payload_bytes={limit}")
    return body


async def ingest(
    ing: Ingestor,
    request: Request,
    limit: int,
    decode: Callable[[bytes], Decoded],
    transport: str,
) -> Response:
    """Admit, read, decode, count rejects, wait until durable (see the module docstring)."""
    if ing.draining:  # refused before the body is read (receive_batch would refuse it too)
        return JSONResponse(
            {"error": "the collect agent is shutting down; send to another agent"},
            status_code=503,
            headers={"Retry-After": "5"},
        )
    try:
        if ing.paused:  # only when there is something to wait for
            await wait_for(ing.admitted(), ADMIT_TIMEOUT_S)
    except TimeoutError:
        return JSONResponse(
            {"error": "spool full (storage behind); retry later"},
            status_code=503,
            headers={"Retry-After": "5"},
        )
    try:
        body = await read_body(request, limit)
    except HTTPException as exc:
        reason = "too_large" if exc.status_code == 413 else "bad_gzip"
        ing.reject(None, reason, f"{_where(request)}: {exc.detail}")
        raise
    try:
        got = decode(body)
    except BodyError as exc:
        ing.reject(None, exc.reason, f"{_where(request)}: {exc}")
        return JSONResponse({"error": str(exc)}, status_code=400)
    for no, reason, msg in got.errors:
        ing.reject(
            None, reason, f"{_where(request)} {got.what} {no}: {msg}", got.counts.get(reason, 1)
        )
    try:
        await ing.receive_batch(got.batch, got.received, transport)
    except SpoolError as exc:
        return JSONResponse({"error": str(exc)}, status_code=503, headers={"Retry-After": "5"})
    if got.errors:
        no, _, msg = got.errors[0]
        text = got.summary or (
            f"partial write: {got.what} {no}: {msg} ({len(got.errors)} {got.what}(s) rejected)"
        )
        return JSONResponse({"error": text}, status_code=400)
    return Response(status_code=204)


def _where(request: Request) -> str:
    return f"HTTP {request.url.path} from {request.client}"


@dataclass(frozen=True)
class Route:
    """A POST route :class:`FastIngest` answers: the route's own role check, its endpoint."""

    check: Callable[[Request], Awaitable[None]]
    """The dependency the FastAPI route declares (``requires(role).dependency``)."""
    endpoint: Callable[[Request], Awaitable[Response]]


class FastIngest:
    """ASGI middleware: POSTs to the ingest routes skip FastAPI's routing (module docstring).

    Errors are answered by the app's own exception handlers, as FastAPI would answer
    them (``{"detail": ...}`` for an HTTPException, Kelvin's for its errors)."""

    def __init__(self, app: ASGIApp, routes: dict[str, Route]) -> None:
        self.app, self.routes = app, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = (
            self.routes.get(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST"
            else None
        )
        if route is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            await route.check(request)
            response = await route.endpoint(request)
        except Exception as exc:
            handler = _handler(request.app, exc)
            if handler is None:
                raise
            response = await handler(request, exc)
        await response(scope, receive, send)


def _handler(
    app: Any, exc: Exception
) -> Callable[[Request, Exception], Awaitable[Response]] | None:
    handlers = getattr(app, "exception_handlers", {})
    for cls in type(exc).__mro__:
        if cls in handlers:
            return handlers[cls]  # type: ignore[no-any-return]
    return None


def install(app: FastAPI, routes: dict[str, Route]) -> None:
    """Answer ``routes`` through :class:`FastIngest`, inside the middleware added so far
    (so behind the browser guard of ``install_auth``)."""
    if app.middleware_stack is not None:
        raise RuntimeError("FastIngest must be installed before the app starts")
    app.user_middleware.append(Middleware(FastIngest, routes=routes))
