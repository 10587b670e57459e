"""Serve the console page and its static files from the query API's FastAPI app.

The page is one HTML document plus ES modules and a vendored uPlot, all
under ``static/``: no build step and no CDN. The document carries a strict
Content-Security-Policy so that nothing outside this origin can load even if
a file is edited to reference it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, RedirectResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from services.common.auth import Credentials, Role, token_from_headers
from services.common.http import public, requires
from services.query_api.console import proxy
from services.query_api.context import ApiContext

STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC_PREFIX = "/console/static"

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; font-src 'self'; object-src 'none'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
"""uPlot positions its elements through inline styles, hence 'unsafe-inline' for styles only."""

PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class _RevalidatingStatic(StaticFiles):
    """Static files the browser must revalidate (ETag), so an upgrade is seen at once."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers["Cache-Control"] = "no-cache"
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response


def mount(app: FastAPI) -> None:
    """Add the console to ``app`` (a query API app whose ``state.ctx`` is its ApiContext)."""
    ctx: ApiContext = app.state.ctx
    read = requires(Role.READ)
    pages = APIRouter(include_in_schema=False, dependencies=[public()])

    @pages.get("/")
    async def index() -> FileResponse:
        # The page itself is public so that a user can enter the token it then sends.
        return FileResponse(STATIC_DIR / "index.html", headers=PAGE_HEADERS)

    @pages.get("/console")
    async def console() -> RedirectResponse:
        return RedirectResponse("/", status_code=308)

    @pages.get("/console/auth")
    async def auth_state(request: Request) -> dict[str, Any]:
        """How this query API authenticates, and the role of the token sent (if any): the
        console shows a banner when auth is off and asks for a token when it needs one."""
        creds = request.app.state.credentials if hasattr(request.app.state, "credentials") else None
        creds = creds if isinstance(creds, Credentials) else Credentials()
        held = creds.role_of(token_from_headers(request.headers.get))
        auth = getattr(request.app.state, "auth", None)
        return {
            "mode": "none" if auth is not None and auth.insecure else "token",
            "open_roles": sorted(r.value for r in creds.open_roles),
            "role": held.value if held else None,
        }

    @pages.get("/favicon.ico")
    async def favicon() -> FileResponse:
        return FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml")

    info = APIRouter(include_in_schema=False, dependencies=[read])

    @info.get("/console/info")
    async def console_info() -> dict[str, Any]:
        """What the console adapts to: ``profile`` (``demo`` = the simulated hall under
        ``kelvin up --demo``; ``up``, ``run``: the allocator's reference hall is no real hall)."""
        return {"profile": ctx.profile}

    app.include_router(pages)
    app.include_router(info)
    app.include_router(proxy.router(app, ctx, read))
    app.mount(STATIC_PREFIX, _RevalidatingStatic(directory=STATIC_DIR), name="console-static")
