"""The console's server side: the page, its static files, and the read-only proxies.

A real query API service and a real upstream HTTP server (standing in for the
allocator and collect agent: a small FastAPI app on a free loopback port).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from services.common.auth import Role
from services.common.http import HttpServer
from services.query_api.app import create_service
from services.query_api.console.mount import STATIC_DIR
from tests.query_api.conftest import admin_client, make_config
from tests.support.auth import TOKENS, headers
from tests.support.servers import free_port


@pytest.fixture
async def upstream() -> AsyncIterator[str]:
    app = FastAPI()

    @app.get("/api/v1/hall")
    async def hall(request: Request) -> dict[str, Any]:
        return {
            "echo": request.query_params.multi_items(),
            "auth": request.headers.get("authorization"),
        }

    @app.get("/api/v1/broken")
    async def broken() -> JSONResponse:
        return JSONResponse({"error": "sick"}, status_code=503)

    @app.get("/docs-private")
    async def private() -> dict[str, str]:
        return {"secret": "x"}

    server = HttpServer(app, "127.0.0.1", 0, "fake upstream")
    await server.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.stop()


async def _service(tmp_path: Path, auth: dict[str, Any] | None = None, **settings: object) -> Any:
    svc = create_service(make_config(tmp_path, auth, **settings))
    await svc.start()
    return svc


async def test_page_is_self_contained_and_strictly_same_origin(tmp_path: Path) -> None:
    svc = await _service(tmp_path)
    try:
        async with admin_client(svc.port) as c:
            page = await c.get("/")
            assert page.status_code == 200
            assert page.headers["content-type"].startswith("text/html")
            csp = page.headers["content-security-policy"]
            assert "default-src 'self'" in csp and "connect-src 'self'" in csp
            refs = re.findall(r'(?:src|href)="([^"]+)"', page.text)
            assert refs, "the page references no resources"
            for ref in refs:
                if ref.startswith("#"):
                    continue
                assert ref.startswith("/console/static/"), f"{ref} is not served by the console"
                r = await c.get(ref)
                assert r.status_code == 200, ref
                assert r.headers["cache-control"] == "no-cache"
            # Every ES module import resolves to a file that is served.
            for js in sorted((STATIC_DIR / "js").glob("*.js")):
                for dep in re.findall(r'from "\./([\w.]+)"', js.read_text()):
                    r = await c.get(f"/console/static/js/{dep}")
                    assert r.status_code == 200, f"{js.name} imports missing {dep}"
                    assert "javascript" in r.headers["content-type"]
            assert (await c.get("/console", follow_redirects=False)).headers["location"] == "/"
            assert (await c.get("/favicon.ico")).status_code == 200
    finally:
        await svc.stop()


def test_no_file_of_the_console_reaches_outside() -> None:
    """Offline: no http(s) URL in any script, style or page (the licence text aside)."""
    for f in STATIC_DIR.rglob("*"):
        if f.suffix not in (".js", ".css", ".html", ".svg"):
            continue
        text = f.read_text(encoding="utf-8")
        text = text.replace("http://www.w3.org/2000/svg", "")  # a namespace name, not fetched
        text = re.sub(r"/\*! https://github\.com/leeoniya/uPlot[^*]*\*/", "", text)
        assert not re.search(r"https?://", text), f"{f.relative_to(STATIC_DIR)} names a URL"
    licence = STATIC_DIR / "vendor" / "uplot" / "LICENSE"
    assert "MIT License" in licence.read_text()


async def test_proxy_forwards_reads_with_their_query(tmp_path: Path, upstream: str) -> None:
    svc = await _service(tmp_path, allocator_url=upstream, collect_agent_url=upstream)
    try:
        async with admin_client(svc.port) as c:
            r = await c.get(
                "/console/api/allocator/api/v1/hall?a=1&b=x%20y&a=2",
                headers={"Authorization": "Bearer not-for-upstream"},
            )
            assert r.status_code == 200
            # the caller's credential is not passed on; the query API sends its own read token
            own = f"Bearer {TOKENS[Role.READ]}"
            assert r.json() == {"echo": [["a", "1"], ["b", "x y"], ["a", "2"]], "auth": own}
            r = await c.get("/console/api/agent/api/v1/broken")
            assert r.status_code == 503 and r.json() == {"error": "sick"}
            metrics = (await c.get("/metrics")).text
            assert (
                'kelvin_query_api_console_upstream_errors_total{reason="http_503",upstream="agent"} 1.0'
                in metrics
            )
    finally:
        await svc.stop()


@pytest.mark.parametrize(
    ("path", "status", "reason"),
    [
        ("/console/api/allocator/docs-private", 404, "console_path"),
        ("/console/api/allocator/api/v1/%2e%2e/%2E%2E/docs-private", 404, "console_path"),
        ("/console/api/allocator/api/v1/%2e/hall", 404, "console_path"),
        ("/console/api/pusher/api/v1/hall", 404, "console_upstream"),
    ],
)
async def test_proxy_refuses_what_it_does_not_forward(
    tmp_path: Path, upstream: str, path: str, status: int, reason: str
) -> None:
    svc = await _service(tmp_path, allocator_url=upstream)
    try:
        async with admin_client(svc.port) as c:
            r = await c.send(c.build_request("GET", path))  # no client-side path normalising
            assert r.status_code == status
            assert "secret" not in r.text
            assert r.json()["error"] == "not_found"
            metrics = (await c.get("/metrics")).text
            assert f'kelvin_query_api_rejects_total{{reason="{reason}"}} 1.0' in metrics
            r = await c.post("/console/api/allocator/api/v1/hall")
            assert r.status_code == 405
    finally:
        await svc.stop()


async def test_unreachable_upstream_is_a_502_naming_it(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    svc = await _service(tmp_path, allocator_url=dead)
    try:
        async with admin_client(svc.port) as c:
            r = await c.get("/console/api/allocator/api/v1/hall")
            assert r.status_code == 502
            body = r.json()
            assert body["error"] == "upstream_unavailable"
            assert dead in body["detail"] and "allocator" in body["detail"]
            metrics = (await c.get("/metrics")).text
            assert (
                'kelvin_query_api_console_upstream_errors_total{reason="unreachable",upstream="allocator"} 1.0'
                in metrics
            )
    finally:
        await svc.stop()


async def test_proxy_needs_the_read_token_but_the_page_does_not(
    tmp_path: Path, upstream: str
) -> None:
    svc = await _service(tmp_path, allocator_url=upstream, auth={"open_reads": False})
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.port}") as c:
            assert (await c.get("/")).status_code == 200
            assert (await c.get("/console/static/js/main.js")).status_code == 200
            assert (await c.get("/console/api/allocator/api/v1/hall")).status_code == 401
            ok = await c.get("/console/api/allocator/api/v1/hall", headers=headers(Role.READ))
            assert ok.status_code == 200
    finally:
        await svc.stop()
