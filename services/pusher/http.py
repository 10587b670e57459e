"""A small HTTP/1.1 server for the pusher's REST API, on asyncio streams (no web framework).

Routes are declared with their method, path template (``/api/v1/plugins/{name}``;
``{sensor:path}`` takes the rest of the path), query parameters and the
:class:`~services.common.auth.Role` they need (None = public: health, readiness,
metrics). :meth:`Router.table` lists them, so a test can walk every route and
prove the rule. Answers and errors are JSON as the FastAPI services write them:
``{"error": .., "detail": ..}`` for Kelvin errors, ``{"detail": ..}`` for
401/403/404/405/413/415 and ``{"detail": [{"loc": .., "msg": ..}]}`` for a 422.

Before a handler runs: the Host header must be one the service answers to (for
a service bound to loopback: a loopback name, against DNS rebinding), a
state-changing request must not come from another origin (the ``Origin``
header, when a browser sends one) and must carry JSON if it has a body (a web
page cannot send JSON to another origin without a CORS preflight, which is
never granted), and the credential must hold the route's role. Headers must
arrive within ``header_timeout_s`` and bodies within ``body_timeout_s``, and
are bounded in size; a slow or oversized client gets 408/413/431, never a
worker held forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from services.common.auth import (
    BrowserPolicy,
    Credentials,
    Role,
    check_host_origin,
    token_from_headers,
)
from services.common.errors import KelvinError, NotFoundError
from services.common.logs import RateLimitedLog
from services.common.net import bind_tcp, bound_port
from services.common.tasks import wait_for

log = logging.getLogger(__name__)
_rlog = RateLimitedLog(log, 10.0)

_REASONS = {
    200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 408: "Request Timeout", 411: "Length Required",
    413: "Content Too Large", 415: "Unsupported Media Type", 422: "Unprocessable Content",
    431: "Request Header Fields Too Large", 500: "Internal Server Error",
    503: "Service Unavailable",
}  # fmt: skip
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def dumps(value: Any) -> bytes:
    """JSON as the API answers it (NaN and infinities become null, never a 500)."""
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    except ValueError:
        return json.dumps(_finite(value), separators=(",", ":")).encode()


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


def json_response(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(status, dumps(value), "application/json", dict(headers or {}))


class HttpError(Exception):
    """An answer other than 200 (``{"detail": detail}``)."""

    def __init__(self, status: int, detail: Any, headers: dict[str, str] | None = None) -> None:
        super().__init__(str(detail))
        self.status = status
        self.detail = detail
        self.headers = headers or {}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    """Lower-case names."""
    body: bytes = b""
    path_params: dict[str, str] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    """Validated query parameters."""

    def json(self) -> Any:
        """The body as JSON (None when empty); 422 when it is not JSON."""
        if not self.body.strip():
            return None
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise HttpError(
                422, [{"loc": ["body"], "msg": f"JSON decode error: {exc}", "type": "json_invalid"}]
            ) from None


@dataclass(frozen=True)
class Param:
    """A query parameter: name, type (str, float, bool), constraints, description."""

    name: str
    kind: type = str
    default: Any = None
    gt: float | None = None
    description: str = ""
    example: str | None = None


Handler = Callable[[Request], Awaitable[Any]]


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    """Path template, ``{name}`` and ``{name:path}`` for parameters."""
    role: Role | None
    """What the caller needs (None: public)."""
    handler: Handler
    summary: str = ""
    params: tuple[Param, ...] = ()
    body: str | None = None
    """What a JSON body holds (None: no body)."""
    pattern: re.Pattern[str] = field(default=re.compile(""), compare=False)

    @property
    def mutating(self) -> bool:
        return self.method not in _SAFE


def _compile(template: str) -> re.Pattern[str]:
    out = "^"
    pos = 0
    for m in re.finditer(r"\{(\w+)(:path)?\}", template):
        out += re.escape(template[pos : m.start()])
        out += f"(?P<{m.group(1)}>.+)" if m.group(2) else f"(?P<{m.group(1)}>[^/]+)"
        pos = m.end()
    return re.compile(out + re.escape(template[pos:]) + "$")


class Router:
    """Routes in declaration order; the first whose template matches answers."""

    def __init__(self) -> None:
        self.routes: list[Route] = []

    def add(
        self,
        method: str,
        path: str,
        role: Role | None,
        summary: str = "",
        params: Iterable[Param] = (),
        body: str | None = None,
    ) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            self.routes.append(
                Route(method, path, role, handler, summary, tuple(params), body, _compile(path))
            )
            return handler

        return register

    def table(self) -> list[tuple[str, str, Role | None]]:
        """(method, path template, role) of every route: what a route-walking test needs."""
        return [(r.method, r.path.replace(":path}", "}"), r.role) for r in self.routes]

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        allowed = False
        for r in self.routes:
            m = r.pattern.match(path)
            if m is None:
                continue
            if r.method == method or (method == "HEAD" and r.method == "GET"):
                return r, {k: unquote(v) for k, v in m.groupdict().items()}
            allowed = True
        if allowed:
            raise HttpError(405, "Method Not Allowed")
        raise HttpError(404, "Not Found")

    def openapi(self, title: str, version: str, description: str) -> dict[str, Any]:
        """An OpenAPI 3.1 description of the routes (paths, parameters, roles)."""
        paths: dict[str, dict[str, Any]] = {}
        for r in self.routes:
            template = r.path.replace(":path}", "}")
            op: dict[str, Any] = {"summary": r.summary, "responses": {"200": {"description": "OK"}}}
            parameters = [
                {"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
                for n in re.findall(r"\{(\w+)", template)
            ]
            for p in r.params:
                schema: dict[str, Any] = {
                    "type": {str: "string", float: "number", bool: "boolean"}[p.kind]
                }
                if p.gt is not None:
                    schema["exclusiveMinimum"] = p.gt
                if p.default is not None:
                    schema["default"] = p.default
                entry = {"name": p.name, "in": "query", "required": False, "schema": schema}
                if p.description:
                    entry["description"] = p.description
                parameters.append(entry)
            if parameters:
                op["parameters"] = parameters
            if r.body:
                op["requestBody"] = {
                    "required": False,
                    "description": r.body,
                    "content": {"application/json": {"schema": {"type": "object"}}},
                }
            if r.role is not None:
                op["security"] = [{"bearer": []}]
                op["x-kelvin-role"] = r.role.value
                op["responses"]["401"] = {"description": "missing or unknown credential"}
                op["responses"]["403"] = {"description": f"needs the {r.role.value} role"}
            paths.setdefault(template, {})[r.method.lower()] = op
        return {
            "openapi": "3.1.0",
            "info": {"title": title, "version": version, "description": description},
            "paths": paths,
            "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        }


_BOOL = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False,
         "no": False, "off": False}  # fmt: skip


def _params(route: Route, query: dict[str, list[str]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    problems = []
    for p in route.params:
        given = query.get(p.name)
        if not given:
            out[p.name] = p.default
            continue
        raw = given[-1]
        try:
            if p.kind is float:
                value: Any = float(raw)
                if not math.isfinite(value):
                    raise ValueError("Input should be a finite number")
                if p.gt is not None and not value > p.gt:
                    raise ValueError(f"Input should be greater than {p.gt:g}")
            elif p.kind is bool:
                if raw.lower() not in _BOOL:
                    raise ValueError("Input should be a valid boolean")
                value = _BOOL[raw.lower()]
            else:
                value = raw
        except ValueError as exc:
            msg = str(exc) if "Input" in str(exc) else "Input should be a valid number"
            problems.append({"loc": ["query", p.name], "msg": msg, "input": raw})
            continue
        out[p.name] = value
    if problems:
        raise HttpError(422, problems)
    return out


@dataclass
class Guard:
    """What the server checks before any handler: credentials, hosts and origins."""

    credentials: Callable[[], Credentials]
    """Read on every request, so that a configuration reload takes effect."""
    browser: Callable[[], BrowserPolicy]
    """Host names the service answers to and foreign origins it accepts."""
    count: Callable[[str], None] = lambda reason: None


def check_request(req: Request, route: Route, guard: Guard) -> None:
    """Raise HttpError unless ``req`` may reach ``route``'s handler."""
    h = req.headers
    denied = check_host_origin(
        req.method, h.get("host"), h.get("origin"), h.get("sec-fetch-site"), guard.browser()
    )
    if denied is not None:
        guard.count(denied.message.split(":", 1)[0])
        raise HttpError(denied.status, denied.message)
    if route.mutating:
        ctype = h.get("content-type", "").split(";")[0].strip().lower()
        if req.body and ctype != "application/json":
            guard.count("content_type")
            raise HttpError(415, "a request body must be JSON (Content-Type: application/json)")
    if route.role is not None:
        token = token_from_headers(h.get)
        denied = guard.credentials().decide(token, route.role)
        if denied is not None:
            guard.count("auth")
            raise HttpError(
                denied.status, denied.message, {"WWW-Authenticate": 'Bearer realm="kelvin"'}
            )


@dataclass(frozen=True)
class HttpLimits:
    """How long and how much a client may take before it is cut off."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    idle_timeout_s: float = 30.0
    """A keep-alive connection with no new request for this long is closed."""
    max_header_bytes: int = 16 << 10
    max_body_bytes: int = 1 << 20
    max_connections: int = 64
    close_timeout_s: float = 2.0
    """How long a closing connection may take to send what it still holds (a client that
    stopped reading would keep it, and the server's stop, for ever); then it is cut."""


class HttpServer:
    """Serve a :class:`Router` on a socket bound in :meth:`start`."""

    def __init__(
        self,
        router: Router,
        guard: Guard,
        host: str,
        port: int,
        what: str = "pusher HTTP",
        flag: str | None = None,
        limits: HttpLimits = HttpLimits(),
    ) -> None:
        self.router, self.guard, self.limits = router, guard, limits
        self.host, self.requested_port, self.what, self.flag = host, port, what, flag
        self.port: int | None = None
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Bind (PortInUseError naming the flag when the port is taken) and serve."""
        sock = bind_tcp(self.host, self.requested_port, self.what, self.flag)
        self.port = bound_port(sock)
        self._server = await asyncio.start_server(
            self._serve, sock=sock, limit=self.limits.max_header_bytes
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            conns = list(self._conns)
            for t in conns:
                t.cancel()
            if conns:  # each ends within close_timeout_s (a client reading nothing: cut)
                await asyncio.wait(conns, timeout=2 * self.limits.close_timeout_s)
            with contextlib.suppress(Exception):
                await wait_for(self._server.wait_closed(), 5)
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._conns) >= self.limits.max_connections:
            self.guard.count("connections")
            writer.close()
            return
        self._conns.add(task)
        try:
            first = True
            while True:
                wait_s = self.limits.header_timeout_s if first else self.limits.idle_timeout_s
                keep = await self._one(reader, writer, wait_s)
                first = False
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # The server stops: end quietly (asyncio's streams report a cancelled
            # connection task as an error in a callback).
            pass
        finally:
            self._conns.discard(task)
            writer.close()
            try:
                # A client that stopped reading never lets the rest of an answer out.
                await wait_for(writer.wait_closed(), self.limits.close_timeout_s)
            except TimeoutError:
                writer.transport.abort()
            except Exception:  # the connection's own error: it is closed either way
                pass

    async def _one(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, wait_s: float
    ) -> bool:
        """Read and answer one request; whether the connection stays open."""
        lim = self.limits
        try:
            async with asyncio.timeout(wait_s):
                head = await reader.readuntil(b"\r\n\r\n")
        except (TimeoutError, asyncio.IncompleteReadError):
            return False  # idle keep-alive, or headers too slow: close without an answer
        except asyncio.LimitOverrunError:
            return await self._refuse(writer, 431, "headers too large", "header_size")
        try:
            req, version = self._parse(head)
        except HttpError as exc:
            return await self._refuse(writer, exc.status, exc.detail)
        keep = version == "HTTP/1.1" and req.headers.get("connection", "").lower() != "close"
        if req.headers.get("transfer-encoding"):
            return await self._refuse(
                writer, 411, "chunked bodies are not accepted; send Content-Length"
            )
        length_text = req.headers.get("content-length")
        if length_text:
            if not length_text.isdigit():
                return await self._refuse(writer, 400, "bad Content-Length")
            length = int(length_text)
            if length > lim.max_body_bytes:
                detail = f"body larger than {lim.max_body_bytes} bytes"
                return await self._refuse(writer, 413, detail, "body_size")
            try:
                async with asyncio.timeout(lim.body_timeout_s):
                    req.body = await reader.readexactly(length)
            except TimeoutError:
                return await self._refuse(writer, 408, "body too slow", "body_timeout")
        response = await self.dispatch(req)
        await self._write(writer, response, keep, head_only=req.method == "HEAD")
        return keep

    async def _refuse(
        self, writer: asyncio.StreamWriter, status: int, detail: Any, reason: str | None = None
    ) -> bool:
        """Answer ``status`` and close (counted under ``reason``); False: the connection ends."""
        if reason:
            self.guard.count(reason)
        await self._write(writer, json_response({"detail": detail}, status), False)
        return False

    def _parse(self, head: bytes) -> tuple[Request, str]:
        try:
            text = head.decode("latin-1")
            line, *lines = text.split("\r\n")
            method, target, version = line.split(" ")
        except ValueError:
            raise HttpError(400, "malformed request line") from None
        if not version.startswith("HTTP/1."):
            raise HttpError(400, "HTTP/1.x only")
        headers: dict[str, str] = {}
        for h in lines:
            if not h:
                continue
            name, sep, value = h.partition(":")
            if not sep:
                raise HttpError(400, "malformed header")
            headers[name.strip().lower()] = value.strip()
        parts = urlsplit(target)
        return (
            Request(method.upper(), unquote(parts.path) or "/", parse_qs(parts.query), headers),
            version,
        )

    async def dispatch(self, req: Request) -> Response:
        """Route, check and run ``req``; every failure is a JSON answer, never a traceback."""
        try:
            route, req.path_params = self.router.match(req.method, req.path)
            check_request(req, route, self.guard)
            req.params = _params(route, req.query)
            out = await route.handler(req)
            return out if isinstance(out, Response) else json_response(out)
        except HttpError as exc:
            return json_response({"detail": exc.detail}, exc.status, exc.headers)
        except NotFoundError as exc:
            return json_response({"error": "not_found", "detail": str(exc)}, 404)
        except KelvinError as exc:
            status = int(getattr(exc, "http_status", 400))
            return json_response({"error": type(exc).__name__, "detail": str(exc)}, status)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("%s %s failed", req.method, req.path)
            return json_response(
                {"error": "internal_error", "detail": f"{type(exc).__name__}: {exc}"}, 500
            )

    async def _write(
        self,
        writer: asyncio.StreamWriter,
        response: Response,
        keep: bool,
        head_only: bool = False,
    ) -> None:
        headers = {
            "content-type": response.content_type,
            "content-length": str(len(response.body)),
            "connection": "keep-alive" if keep else "close",
            **{k.lower(): v for k, v in response.headers.items()},
        }
        head = f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Status')}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        writer.write(head.encode("latin-1") + (b"" if head_only else response.body))
        await writer.drain()
