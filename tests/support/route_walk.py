"""The apps the auth test walks (tests/test_auth_routes.py), and how to list their routes.

A *target* is an async context manager factory ``(tmp_path) -> (routes, client)``: it
builds one service the way ``kelvin run`` does (from a Config with the test tokens and
``auth.open_reads: false``, the chart's default), lists every route the app itself
declares, and yields an HTTP client that reaches it. Routes come from the app, never
from a list kept here, so a new route is walked without anyone adding it.

To walk another app (the pusher's own router), register a target::

    @target("pusher")
    @asynccontextmanager
    async def pusher(tmp_path: Path) -> AsyncIterator[Walk]:
        svc = ...start it on a loopback port with auth_section(tmp_path)...
        routes = [RouteInfo("POST", "/api/v1/plugins/{name}/stop", Role.ADMIN), ...]  # from its router
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.port}") as c:
            yield routes, c

and import its module in tests/test_auth_routes.py.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastapi.routing
import httpx
from fastapi import FastAPI
from starlette.routing import Mount, Route

from services.common.auth import Role
from services.common.http import route_is_public, route_role
from services.common.settings import Config
from tests.support.auth import with_auth


class Undeclared:
    """A route that declared neither a role nor that it is public."""

    def __repr__(self) -> str:
        return "UNDECLARED"


UNDECLARED = Undeclared()


@dataclass(frozen=True)
class RouteInfo:
    method: str
    path: str
    """As declared, with ``{parameters}``."""
    role: Role | Undeclared | None
    """The role it needs; None = public."""


Walk = tuple[list[RouteInfo], httpx.AsyncClient]
Target = Callable[[Path], AbstractAsyncContextManager[Walk]]
TARGETS: dict[str, Target] = {}


def target(name: str) -> Callable[[Target], Target]:
    def register(fn: Target) -> Target:
        TARGETS[name] = fn
        return fn

    return register


def _effective_routes(app: FastAPI) -> list[Any]:
    # FastAPI 0.16x keeps included routers lazily; iter_route_contexts flattens them
    # with the routers' own dependencies merged. Older versions list APIRoutes directly.
    iterate = getattr(fastapi.routing, "iter_route_contexts", None)
    return list(iterate(app.routes)) if iterate is not None else list(app.routes)


def fastapi_routes(app: FastAPI) -> list[RouteInfo]:
    """Every (method, path) of a FastAPI app with the role its dependencies declare."""
    out: list[RouteInfo] = []
    for r in _effective_routes(app):
        dependant = getattr(r, "dependant", None)
        kind = getattr(r, "_effective_route", r)
        if dependant is not None:
            calls = [d.call for d in dependant.dependencies]
            role: Role | Undeclared | None = route_role(calls)
            if role is None and not route_is_public(calls):
                role = UNDECLARED
            out += [RouteInfo(m, r.path, role) for m in sorted(r.methods)]
        elif isinstance(kind, Mount):  # static files: public, GET only
            out.append(RouteInfo("GET", r.path + "/{path}", None))
        elif isinstance(kind, Route):  # FastAPI's own /docs, /openapi.json
            out += [RouteInfo(m, r.path, None) for m in sorted(r.methods or {"GET"})]
        else:
            out.append(RouteInfo("GET", str(getattr(r, "path", r)), UNDECLARED))
    return out


_PARAM = re.compile(r"\{(\w+)(:path)?\}")


def concrete(path: str) -> str:
    """A URL for a route template: each parameter filled with a harmless value."""
    return _PARAM.sub(lambda m: "walk/x" if m.group(2) else "walk-x", path)


def auth_config(tmp_path: Path, overrides: dict[str, dict[str, Any]]) -> Config:
    """A service's Config with the test tokens and reads that need a token."""
    return Config(overrides=with_auth(overrides, open_reads=False))


@asynccontextmanager
async def asgi_client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``app`` in process (its middleware and routes, no server needed)."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        yield c
