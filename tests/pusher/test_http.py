"""The pusher's own HTTP server: roles per route, browsers kept out, bounded clients.

A real pusher (no broker needed) on a loopback port, called with httpx and with
raw sockets for what a well-behaved client never does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from services.common.auth import Role
from services.common.config import Config
from services.pusher.api import route_table
from services.pusher.app import PusherService
from services.pusher.http import Guard, HttpLimits, HttpServer, Router
from tests.pusher.conftest import running
from tests.support.servers import free_port

READ, WRITE, ADMIN = "r" * 20, "w" * 20, "a" * 20


def config(tmp_path: Path, auth: dict[str, Any], **pusher: Any) -> Config:
    section = {
        "host": "127.0.0.1",
        "port": 0,
        "prefix": "/h",
        "brokers": [f"127.0.0.1:{free_port()}"],  # nobody listens: these tests need none
        "state_dir": str(tmp_path / "state"),
        "plugins": {"tester": {"sensors": 2, "interval": 1000}},
        **pusher,
    }
    path = tmp_path / "kelvin.yaml"
    path.write_text(yaml.safe_dump({"pusher": section, "auth": auth}))
    return Config(path)


@pytest.fixture
async def svc(tmp_path: Path) -> AsyncIterator[PusherService]:
    auth = {"read_token": READ, "write_token": WRITE, "admin_token": ADMIN, "open_reads": False}
    async with running(config(tmp_path, auth)) as s:
        yield s


def client(s: PusherService, token: str | None = None, **headers: str) -> httpx.AsyncClient:
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{s.port}", headers=headers)


def test_every_route_declares_its_role() -> None:
    table = route_table()
    public = {p for m, p, role in table if role is None}
    assert public == {"/healthz", "/readyz", "/metrics"}
    for method, path, role in table:
        if method != "GET":
            assert role is Role.ADMIN, f"{method} {path} changes state: admin"
        elif role is not None:
            assert role is Role.READ, f"{method} {path} reads: read"
    assert ("POST", "/api/v1/plugins/{name}/load", Role.ADMIN) in table


async def test_reads_need_read_and_control_needs_admin(svc: PusherService) -> None:
    async with contextlib.AsyncExitStack() as stack:
        anon, r, w, a, wrong = [
            await stack.enter_async_context(client(svc, t))
            for t in (None, READ, WRITE, ADMIN, "x" * 20)
        ]
        assert (await anon.get("/api/v1/plugins")).status_code == 401
        assert (await wrong.get("/api/v1/plugins")).status_code == 401
        assert (await w.get("/api/v1/plugins")).status_code == 403, "write cannot read"
        assert (await r.get("/api/v1/plugins")).status_code == 200
        assert (await a.get("/api/v1/sensors")).status_code == 200, "admin includes read"
        for who in (anon, r, w):
            resp = await who.post("/api/v1/plugins/tester/stop")
            assert resp.status_code in (401, 403), resp.text
            assert resp.headers["www-authenticate"].startswith("Bearer")
            assert "detail" in resp.json()
        assert svc.manager.get("tester").state == "running"
        assert (await a.post("/api/v1/plugins/tester/stop")).json()["state"] == "stopped"
        for path in ("/healthz", "/metrics"):
            assert (await anon.get(path)).status_code == 200, path
        assert (await anon.get("/readyz")).status_code == 503, "no broker: not ready"
    refused = svc.metrics.http_refused.labels("auth")._value.get()
    assert refused >= 6


async def test_browsers_cannot_drive_a_loopback_pusher(svc: PusherService) -> None:
    async with client(svc, ADMIN, Host="evil.example") as rebound:
        r = await rebound.get("/api/v1/plugins")
        assert r.status_code == 403 and "host" in r.json()["detail"]
    async with client(svc, ADMIN, Origin="http://evil.example") as page:
        r = await page.post("/api/v1/plugins/tester/stop")
        assert r.status_code == 403 and "origin" in r.json()["detail"]
    async with client(svc, ADMIN, **{"Sec-Fetch-Site": "cross-site"}) as form:
        assert (await form.post("/api/v1/plugins/tester/stop")).status_code == 403
    async with client(svc, ADMIN) as a:
        r = await a.post(
            "/api/v1/plugins/more/load",
            content=json.dumps({"plugin": "tester"}),
            headers={"Content-Type": "text/plain"},
        )
        assert r.status_code == 415, "a text/plain body (a form a page may send) is refused"
        assert "more" not in svc.manager.instances
        ok = await a.post("/api/v1/plugins/more/load", json={"plugin": "tester", "sensors": 1})
        assert ok.status_code == 200
    assert svc.manager.get("tester").state == "running"


async def test_unknown_routes_methods_and_bad_bodies_are_json_answers(svc: PusherService) -> None:
    async with client(svc, ADMIN) as a:
        r = await a.get("/api/v1/nope")
        assert r.status_code == 404 and r.json() == {"detail": "Not Found"}
        r = await a.delete("/api/v1/plugins/tester/stop")
        assert r.status_code == 405
        r = await a.post(
            "/api/v1/plugins/x/load",
            content=b"{not json",
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body"]
        r = await a.post("/api/v1/plugins/x/load", json=[1, 2])
        assert r.status_code == 422
        r = await a.get("/api/v1/plugins/nope")
        assert r.status_code == 404 and r.json()["error"] == "not_found"
        r = await a.get("/api/v1/cache/h/tester/s0000?readings=maybe")
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "readings"]
        spec = (await a.get("/openapi.json")).json()
        op = spec["paths"]["/api/v1/plugins/{name}/stop"]["post"]
        assert op["x-kelvin-role"] == "admin"
        assert (await a.head("/healthz")).status_code == 200


async def test_generated_tokens_are_kept_0600_next_to_the_state_directory(
    tmp_path: Path,
) -> None:
    async with running(config(tmp_path, {"open_reads": False})) as s:
        path = tmp_path / "auth" / "tokens.json"
        tokens = json.loads(path.read_text())
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        async with client(s, tokens["admin"]) as a, client(s, tokens["read"]) as r:
            assert (await a.post("/api/v1/plugins/tester/stop")).status_code == 200
            assert (await r.post("/api/v1/plugins/tester/start")).status_code == 403
    async with running(config(tmp_path, {"mode": "none"})) as s, client(s) as anyone:
        assert (await anyone.post("/api/v1/plugins/tester/stop")).status_code == 200


async def _server(**limits: Any) -> HttpServer:
    from services.common.auth import BrowserPolicy, Credentials

    router = Router()

    @router.add("POST", "/echo", None)
    async def echo(req: Any) -> Any:
        return {"bytes": len(req.body)}

    guard = Guard(lambda: Credentials(), lambda: BrowserPolicy(None))
    server = HttpServer(router, guard, "127.0.0.1", 0, limits=HttpLimits(**limits))
    await server.start()
    return server


async def test_slow_and_oversized_clients_are_cut_off() -> None:
    server = await _server(header_timeout_s=0.2, body_timeout_s=0.2, max_body_bytes=1000)
    assert server.port is not None
    try:
        # Headers that never end: the connection is closed, no worker is held.
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\n")
        async with asyncio.timeout(10):
            assert await reader.read() == b""
        writer.close()
        # A body announced but never sent: 408.
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
        async with asyncio.timeout(10):
            assert (await reader.read()).startswith(b"HTTP/1.1 408")
        writer.close()
        # Too large a body: 413 before reading it.
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n")
        async with asyncio.timeout(10):
            assert (await reader.read()).startswith(b"HTTP/1.1 413")
        writer.close()
        # Headers beyond the bound: 431.
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /echo HTTP/1.1\r\nX: " + b"y" * 40_000 + b"\r\n\r\n")
        async with asyncio.timeout(10):
            assert (await reader.read()).startswith(b"HTTP/1.1 431")
        writer.close()
        # And a well-behaved client on one keep-alive connection still gets answers.
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as c:
            for _ in range(3):
                r = await c.post(
                    "/echo", content=b'{"a": 1}', headers={"Content-Type": "application/json"}
                )
                assert r.json() == {"bytes": 8}
    finally:
        await server.stop()
