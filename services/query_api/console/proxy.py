"""Read-only same-origin proxies from the console to the allocator and the collect agent.

``GET /console/api/allocator/<path>`` and ``GET /console/api/agent/<path>``
forward to ``allocator_url`` and ``collect_agent_url`` so the page needs no
CORS anywhere. Only GET, and only the upstreams' ``api/v1/...``, ``healthz``
and ``readyz``: the console looks, it never changes placements or kicks
clients. Reads here need the query API's read token like every other read, and the
query API calls its upstreams with its own read token (the services share the
``auth`` section).
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response

from services.common.auth import Role
from services.common.logs import RateLimitedLog
from services.query_api.context import ApiContext
from services.query_api.routes.common import error

log = logging.getLogger(__name__)
_upstream_log = RateLimitedLog(log, 30.0)

UPSTREAM_TIMEOUT_S = 5.0
ALLOWED_PATH = re.compile(r"(api/v1(/(?!\.\.?(/|$))[A-Za-z0-9_.-]+)*|healthz|readyz)")
"""Forwarded paths; no '.' or '..' segment, which the client would resolve out of api/v1."""
PASSED_HEADERS = ("content-type", "cache-control", "etag", "last-modified")


class _Upstreams:
    """One pooled HTTP client for both upstreams, closed with the app's lifespan."""

    def __init__(self, ctx: ApiContext) -> None:
        self.urls: dict[str, Callable[[], str]] = {
            "allocator": lambda: ctx.settings.allocator_url,
            "agent": lambda: ctx.settings.collect_agent_url,
        }
        self.client: httpx.AsyncClient | None = None

    def get_client(self) -> httpx.AsyncClient:
        if self.client is None:
            self.client = httpx.AsyncClient(timeout=UPSTREAM_TIMEOUT_S, trust_env=False)
        return self.client

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.aclose()
            self.client = None


def _close_with_lifespan(app: FastAPI, upstreams: _Upstreams) -> None:
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[Any]:
        try:
            async with inner(a) as state:
                yield state
        finally:
            await upstreams.aclose()

    app.router.lifespan_context = lifespan


def router(app: FastAPI, ctx: ApiContext, read: Any) -> APIRouter:
    upstreams = _Upstreams(ctx)
    _close_with_lifespan(app, upstreams)
    errors = ctx.metrics.registry.counter(
        "console_upstream_errors_total",
        "Console proxy requests the allocator or collect agent did not answer, by reason",
        ["upstream", "reason"],
    )
    r = APIRouter(prefix="/console/api", include_in_schema=False, dependencies=[read])

    @r.get("/{upstream}/{path:path}")
    async def forward(upstream: str, path: str, request: Request) -> Response:
        base = upstreams.urls.get(upstream)
        if base is None:
            ctx.metrics.rejects.labels("console_upstream").inc()
            return error(
                404, "not_found", f"console proxy: unknown upstream {upstream!r}; "
                "expected 'allocator' or 'agent'"
            )  # fmt: skip
        if not ALLOWED_PATH.fullmatch(path):
            ctx.metrics.rejects.labels("console_path").inc()
            return error(
                404, "not_found", f"console proxy: {upstream} path {path!r} is not forwarded; "
                "only api/v1/..., healthz and readyz are"
            )  # fmt: skip
        url = f"{base().rstrip('/')}/{path}"
        try:
            query = request.url.query  # as sent, in order, repeated keys and all
            token = ctx.auth.token(Role.READ) if ctx.auth is not None else None
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            up = await upstreams.get_client().get(
                f"{url}?{query}" if query else url, headers=headers
            )
        except httpx.TimeoutException:
            errors.labels(upstream, "timeout").inc()
            _upstream_log.warning(upstream, "console proxy: %s timed out", url)
            return error(
                504, "upstream_timeout", f"{upstream} at {base()} did not answer "
                f"within {UPSTREAM_TIMEOUT_S:g} s"
            )  # fmt: skip
        except httpx.HTTPError as exc:
            errors.labels(upstream, "unreachable").inc()
            _upstream_log.warning(upstream, "console proxy: %s: %s", url, exc)
            return error(
                502, "upstream_unavailable", f"{upstream} at {base()} is unreachable: "
                f"{type(exc).__name__}: {exc}"
            )  # fmt: skip
        if up.status_code >= 500:
            errors.labels(upstream, f"http_{up.status_code}").inc()
        headers = {k: v for k, v in up.headers.items() if k.lower() in PASSED_HEADERS}
        return Response(up.content, status_code=up.status_code, headers=headers)

    return r
