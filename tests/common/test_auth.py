"""Roles and the one decision: who may call a route that needs a given role."""

from __future__ import annotations

import base64

import httpx
import pytest
from fastapi import FastAPI

from services.common.auth import Credentials, Role, satisfies, token_from_headers
from services.common.http import requires, route_role

CREDS = Credentials.from_roles(
    {Role.READ: ["r-tok"], Role.WRITE: ["w-tok"], Role.ADMIN: ["a-tok", None, ""]}
)


@pytest.mark.parametrize(
    ("held", "required", "ok"),
    [
        (Role.ADMIN, Role.READ, True),
        (Role.ADMIN, Role.WRITE, True),
        (Role.ADMIN, Role.ADMIN, True),
        (Role.WRITE, Role.WRITE, True),
        (Role.WRITE, Role.READ, False),
        (Role.WRITE, Role.ADMIN, False),
        (Role.READ, Role.READ, True),
        (Role.READ, Role.WRITE, False),
        (Role.READ, Role.ADMIN, False),
    ],
)
def test_grants(held: Role, required: Role, ok: bool) -> None:
    assert satisfies(held, required) is ok


def test_decide_distinguishes_missing_unknown_and_too_low() -> None:
    assert CREDS.decide("a-tok", Role.ADMIN) is None
    missing = CREDS.decide(None, Role.READ)
    assert missing is not None and missing.status == 401 and "missing" in missing.message
    unknown = CREDS.decide("nope", Role.READ)
    assert unknown is not None and unknown.status == 401 and "unknown" in unknown.message
    low = CREDS.decide("r-tok", Role.WRITE)
    assert low is not None and low.status == 403
    assert CREDS.role_of("") is None, "empty tokens are never credentials"


def test_open_roles_need_no_credential_but_others_still_do() -> None:
    c = Credentials.from_roles({Role.ADMIN: ["a"]}, open_roles=[Role.READ])
    assert c.decide(None, Role.READ) is None
    assert c.decide(None, Role.WRITE) is not None


def test_token_from_headers_takes_the_forms_influx_clients_send() -> None:
    def h(value: str | None) -> dict[str, str]:
        return {"authorization": value} if value else {}

    assert token_from_headers(h("Bearer abc").get) == "abc"
    assert token_from_headers(h("Token abc").get) == "abc"
    basic = base64.b64encode(b"user:secret").decode()
    assert token_from_headers(h(f"Basic {basic}").get) == "secret"
    assert token_from_headers(h("Basic !!!").get) is None
    assert token_from_headers(h(None).get, "qp") == "qp"
    assert token_from_headers(h(None).get) is None


async def test_requires_refuses_by_role_and_declares_it() -> None:
    app = FastAPI()
    app.state.credentials = lambda: CREDS

    @app.post("/cfg", dependencies=[requires(Role.ADMIN)])
    async def cfg() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/unset", dependencies=[requires(Role.READ)])
    async def unset() -> dict[str, bool]:
        return {"ok": True}

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        assert (await c.post("/cfg")).status_code == 401
        assert (await c.post("/cfg", headers={"authorization": "Bearer w-tok"})).status_code == 403
        assert (await c.post("/cfg", headers={"authorization": "Bearer a-tok"})).status_code == 200
        app.state.credentials = None  # never configured: refuse, never open
        assert (await c.get("/unset", headers={"authorization": "Bearer a-tok"})).status_code == 401
    roles = {
        r.path: route_role([d.call for d in r.dependant.dependencies])  # type: ignore[attr-defined]
        for r in app.routes
        if hasattr(r, "dependant")
    }
    assert roles["/cfg"] is Role.ADMIN and roles["/unset"] is Role.READ
