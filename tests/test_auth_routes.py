"""Every route of every service, taken from the apps themselves, refuses what it must.

For each route the walk sends no credential, an unknown one and every token of a
role that does not satisfy the route's, and expects 401, 401 and 403. Reads are
walked too (the services run with ``auth.open_reads: false``, as the chart does).
Only the health, metrics and console-page routes may be public, and no route may
declare nothing. A route added anywhere is walked without touching this file; an
app not yet walked is added in tests/support/route_targets.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tests.support.route_targets  # noqa: F401  (registers the targets)
from services.common.auth import Role, satisfies
from tests.support.auth import TOKENS, headers
from tests.support.route_walk import TARGETS, UNDECLARED, RouteInfo, concrete

PUBLIC = {
    "/healthz",
    "/readyz",
    "/metrics",
    "/ping",
    "/",
    "/console",
    "/favicon.ico",
    "/console/auth",
    "/console/static/{path}",
    # FastAPI's own API description pages
    "/openapi.json",
    "/docs",
    "/docs/oauth2-redirect",
    "/redoc",
}
"""The only paths that may answer without a credential."""
SAFE = {"GET", "HEAD", "OPTIONS"}


def test_every_service_is_walked() -> None:
    assert {"collect-agent", "query-api", "allocator", "pusher", "slurm-bridge"} <= set(TARGETS)


@pytest.mark.parametrize("name", sorted(TARGETS))
async def test_every_route_refuses_a_missing_unknown_or_lower_credential(
    name: str, tmp_path: Path
) -> None:
    async with TARGETS[name](tmp_path) as (routes, client):
        assert len(routes) >= 5, f"{name}: found only {routes}"
        undeclared = [r for r in routes if r.role is UNDECLARED]
        assert not undeclared, f"{name}: routes declaring neither a role nor public(): {undeclared}"
        public = [r for r in routes if r.role is None]
        assert not [r for r in public if r.path not in PUBLIC], f"{name}: public {public}"
        assert not [r for r in public if r.method not in SAFE], f"{name}: a public change"
        walked = 0
        for route in routes:
            if isinstance(route.role, Role):
                await _refuses(client, route, route.role)
                walked += 1
        assert walked, f"{name}: no route needs a role"


async def _refuses(client: object, route: RouteInfo, role: Role) -> None:
    import httpx

    assert isinstance(client, httpx.AsyncClient)
    url = concrete(route.path)
    what = f"{route.method} {route.path} (needs {role.value})"
    r = await client.request(route.method, url)
    assert r.status_code == 401, f"{what} without a credential: {r.status_code} {r.text[:200]}"
    assert "www-authenticate" in r.headers, what
    unknown = {"Authorization": "Bearer not-a-token-of-this-service-at-all"}
    r = await client.request(route.method, url, headers=unknown)
    assert r.status_code == 401, f"{what} with an unknown token: {r.status_code}"
    for held in Role:
        if satisfies(held, role):
            continue
        r = await client.request(route.method, url, headers=headers(held))
        assert r.status_code == 403, f"{what} with a {held.value} token: {r.status_code}"
    # the other ways /write clients send a credential are refused just the same
    r = await client.request(route.method, url, params={"p": "not-a-token-of-this-service"})
    assert r.status_code == 401, f"{what} with an unknown p=: {r.status_code}"
    assert TOKENS[role] not in r.text
