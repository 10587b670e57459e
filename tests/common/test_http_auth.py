"""A browser cannot drive a Kelvin service: the guard in front of every route, over a real socket.

One app with one read and one admin route, served by the embedded uvicorn on loopback
with the credentials a loopback ``kelvin up`` has (reads open); requests are crafted
the way a hostile page's browser would send them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from services.common.auth import AuthConfig, BrowserPolicy, Role, build_credentials, resolve_tokens
from services.common.auth_settings import ServiceAuth
from services.common.http import HttpServer, health_router, install_auth, requires
from services.common.metrics import ServiceMetrics
from tests.support.auth import AUTH_SECTION, headers


@pytest.fixture
async def url() -> AsyncIterator[str]:
    metrics = ServiceMetrics("guarded")
    cfg = AuthConfig.from_mapping(AUTH_SECTION)
    tokens = resolve_tokens(cfg)
    auth = ServiceAuth(
        cfg,
        tokens,
        build_credentials(cfg, tokens, "127.0.0.1"),
        BrowserPolicy.for_bind(cfg, "127.0.0.1"),
    )
    app = FastAPI()
    install_auth(app, auth, metrics)
    app.include_router(health_router(metrics))

    @app.get("/data", dependencies=[requires(Role.READ)])
    async def data() -> dict[str, int]:
        return {"secret_readings": 42}

    @app.post("/config", dependencies=[requires(Role.ADMIN)])
    async def config() -> dict[str, bool]:
        return {"changed": True}

    server = HttpServer(app, "127.0.0.1", 0, "guarded HTTP")
    await server.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.stop()


async def test_dns_rebinding_is_refused_even_for_open_reads(url: str) -> None:
    async with httpx.AsyncClient(base_url=url) as c:
        assert (await c.get("/data")).json() == {"secret_readings": 42}  # open on loopback
        rebound = await c.get("/data", headers={"Host": "attacker.example.com:8080"})
        assert rebound.status_code == 403 and rebound.json()["error"] == "forbidden_host"
        assert "DNS rebinding" in rebound.json()["detail"]
        assert (await c.get("/data", headers={"Host": "localhost"})).status_code == 200
        metrics = (await c.get("/metrics")).text
        assert 'kelvin_guarded_auth_refused_total{reason="host"} 1.0' in metrics


async def test_cross_site_posts_are_refused_whatever_they_carry(url: str) -> None:
    port = url.rsplit(":", 1)[1]
    async with httpx.AsyncClient(base_url=url) as c:
        # a <form> or text/plain fetch from another site (the browser adds the Origin)
        for extra in (
            {"Origin": "https://attacker.example.com", "Content-Type": "text/plain"},
            {"Origin": "null", "Content-Type": "application/x-www-form-urlencoded"},
            {"Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"},
        ):
            r = await c.post("/config", content=b"x=1", headers={**headers(Role.ADMIN), **extra})
            assert r.status_code == 403 and r.json()["error"] == "forbidden_origin", extra
        # the service's own page (the console) is its origin
        same = {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"}
        ok = await c.post("/config", headers={**headers(Role.ADMIN), **same})
        assert ok.status_code == 200
        # without a token a same-origin request is still refused by its role
        assert (await c.post("/config", headers=same)).status_code == 401
        metrics = (await c.get("/metrics")).text
        assert 'kelvin_guarded_auth_refused_total{reason="origin"} 3.0' in metrics
        assert 'kelvin_guarded_auth_refused_total{reason="missing"} 1.0' in metrics
